package main

import (
	"errors"
	"io"
)

// indenter writes compact JSON, given in pieces, indented as json.Indent
// indents it with no prefix and two blanks: byte for byte the same for
// valid JSON, without holding the whole text. It does not validate: what
// it is given comes from vipd's own encoder. Close reports a text that
// ended inside a string or a value, and the first error of w.
type indenter struct {
	w                            io.Writer
	buf                          []byte // what is indented, until 64 KiB of it go to w
	err                          error
	depth                        int
	inString, escaped, needsLine bool
}

// Write indents p, which continues what came before.
func (x *indenter) Write(p []byte) (int, error) {
	b := x.buf
	for i := 0; i < len(p); i++ {
		c := p[i]
		if x.inString {
			if x.escaped { // the byte after a backslash
				x.escaped = false
				b = append(b, c)
				continue
			}
			// The string's bytes up to its end or an escape, at once.
			j := i
			for j < len(p) && p[j] != '"' && p[j] != '\\' {
				j++
			}
			b = append(b, p[i:j]...)
			if j == len(p) {
				break
			}
			c, i = p[j], j
			b = append(b, c)
			if c == '\\' {
				x.escaped = true
			} else { // the closing quote
				x.inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		// An object or array begun: its first element goes on a line of
		// its own, unless it is empty ({} and [] stay so).
		if x.needsLine && c != '}' && c != ']' {
			x.needsLine = false
			x.depth++
			b = x.newline(b)
		}
		switch c {
		case '"':
			x.inString = true
			b = append(b, c)
		case '{', '[':
			x.needsLine = true
			b = append(b, c)
		case ',':
			b = x.newline(append(b, c))
		case ':':
			b = append(b, ':', ' ')
		case '}', ']':
			if x.needsLine {
				x.needsLine = false
			} else {
				x.depth--
				b = x.newline(b)
			}
			b = append(b, c)
		default:
			b = append(b, c)
		}
	}
	x.buf = b
	if len(x.buf) >= 64<<10 {
		x.flush()
	}
	return len(p), nil
}

func (x *indenter) newline(b []byte) []byte {
	b = append(b, '\n')
	for range x.depth {
		b = append(b, ' ', ' ')
	}
	return b
}

func (x *indenter) flush() {
	if x.err == nil {
		_, x.err = x.w.Write(x.buf)
	}
	x.buf = x.buf[:0]
}

// Close ends the text with a newline, as json.Encoder does, and writes
// what is left. It reports a text cut short, and w's first error.
func (x *indenter) Close() error {
	if x.inString || x.depth != 0 || x.needsLine {
		return errors.New("the JSON text ends early")
	}
	x.buf = append(x.buf, '\n')
	x.flush()
	return x.err
}
