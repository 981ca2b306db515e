package main

import (
	"bufio"
	"errors"
)

// indenter writes compact JSON, given in pieces, indented as json.Indent
// indents it with no prefix and two blanks: byte for byte the same for
// valid JSON, without holding the whole text. It does not validate: what
// it is given comes from vipd's own encoder. Close reports a text that
// ended inside a string or a value.
type indenter struct {
	w                            *bufio.Writer
	depth                        int
	inString, escaped, needsLine bool
}

// Write indents p, which continues what came before.
func (x *indenter) Write(p []byte) (int, error) {
	for _, c := range p {
		if x.inString {
			x.w.WriteByte(c)
			switch {
			case x.escaped:
				x.escaped = false
			case c == '\\':
				x.escaped = true
			case c == '"':
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
			x.newline()
		}
		switch c {
		case '"':
			x.inString = true
			x.w.WriteByte(c)
		case '{', '[':
			x.needsLine = true
			x.w.WriteByte(c)
		case ',':
			x.w.WriteByte(c)
			x.newline()
		case ':':
			x.w.WriteString(": ")
		case '}', ']':
			if x.needsLine {
				x.needsLine = false
			} else {
				x.depth--
				x.newline()
			}
			x.w.WriteByte(c)
		default:
			x.w.WriteByte(c)
		}
	}
	return len(p), nil
}

func (x *indenter) newline() {
	x.w.WriteByte('\n')
	for range x.depth {
		x.w.WriteString("  ")
	}
}

// Close ends the text with a newline, as json.Encoder does, and reports
// a text cut short.
func (x *indenter) Close() error {
	if x.inString || x.depth != 0 || x.needsLine {
		return errors.New("the JSON text ends early")
	}
	x.w.WriteByte('\n')
	return nil
}
