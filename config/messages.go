package config

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds on what errors print, so that a file vipd should never have read
// (a credentials file an include pattern or a symbolic link reaches) is
// not echoed into logs and command output, and a file of errors cannot
// flood them.
const (
	// MaxErrors is the most errors Errors prints: the first ones, then
	// a count of the others.
	MaxErrors = 100
	// MaxMessageLen is the most bytes of an Error's context and of its
	// message that it prints; a longer one is cut.
	MaxMessageLen = 512
)

// hiddenValue replaces a value of the file in a decoder's message.
const hiddenValue = "(value not shown)"

// redactValues returns a TOML decoder's message msg without the text of
// the file it quotes: a quoted string of more than one character that is
// not part of key (the key the decoder names, which the message may
// quote), and a word with a digit in it (the decoders print numbers and
// dates they refuse unquoted). What remains names what is wrong; the
// error's file, line and key say where.
func redactValues(msg, key string) string {
	var b strings.Builder
	for i := 0; i < len(msg); {
		c := msg[i]
		switch {
		case c == '"' || c == '\'':
			end := quoteEnd(msg, i)
			if end < 0 {
				b.WriteString(hiddenValue)
				return b.String()
			}
			q := msg[i : end+1]
			if showQuoted(q[1:len(q)-1], key) {
				b.WriteString(q)
			} else {
				b.WriteString(hiddenValue)
			}
			i = end + 1
		case c == ' ':
			b.WriteByte(c)
			i++
		default:
			// A word, up to a blank or a quote.
			j := i
			for j < len(msg) && msg[j] != ' ' && msg[j] != '"' && msg[j] != '\'' {
				j++
			}
			w := msg[i:j]
			if strings.ContainsAny(w, "0123456789") && !knownWord(w) {
				b.WriteString(hiddenValue)
				// Keep the punctuation that ends the word.
				b.WriteString(w[len(strings.TrimRightFunc(w, unicode.IsPunct)):])
			} else {
				b.WriteString(w)
			}
			i = j
		}
	}
	return b.String()
}

// quoteEnd returns the offset of the quote that closes the one at msg[i],
// or -1.
func quoteEnd(msg string, i int) int {
	q := msg[i]
	for j := i + 1; j < len(msg); j++ {
		switch {
		case q == '"' && msg[j] == '\\':
			j++
		case msg[j] == q:
			return j
		}
	}
	return -1
}

// showQuoted reports whether a quoted part of a decoder's message may be
// shown: one character (what the decoder stopped at), TOML's own quotes
// ('"""'), or a part of key.
func showQuoted(s, key string) bool {
	if utf8.RuneCountInString(s) <= 1 || len(s) <= 2 && strings.HasPrefix(s, `\`) {
		return true
	}
	if strings.Trim(s, `"'`) == "" {
		return true
	}
	return key != "" && strings.Contains(key, s)
}

// knownWord reports whether w, a word of a decoder's message with a digit
// in it, is one of the decoders' own words.
func knownWord(w string) bool {
	switch strings.TrimRightFunc(w, unicode.IsPunct) {
	case "int64", "float64", "UTF-8", "UTF-16", "int32", "uint64":
		return true
	}
	return false
}

// capText returns s cut to at most max bytes, on a character boundary,
// marked when cut.
func capText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes cut)", s[:cut], len(s)-cut)
}
