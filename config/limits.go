package config

import (
	"bytes"
	"fmt"
)

// Limits on the shape of a configuration file. Every file, main or
// included, is checked against them by one linear pass over its text
// before either TOML decoder or the position index reads it, so that the
// decoders' costs, which grow with the depth of what they decode and the
// length of the keys' full names, stay within a small multiple of the
// file's size. They refuse no valid configuration: the longest key vipd
// knows is service.backend.check.headers.NAME (5 parts), and the deepest
// value, a service written out in inline tables, is 6 arrays and inline
// tables deep; a file beyond them has unknown keys or values of the wrong
// type anyway, and the limits only make it fail early and cheaply.
const (
	// MaxKeyParts is the largest number of parts of a key's full name:
	// the parts of the table header it is under, of the keys of the inline
	// tables around it and of its own dotted key. A table header may have
	// as many parts.
	MaxKeyParts = 8
	// MaxKeyLen is the longest full name of a key (counted as
	// MaxKeyParts counts its parts) or of a table header, in bytes of the
	// file: the parts with their quotes and escapes, and a dot between
	// each two.
	MaxKeyLen = 128
	// MaxNesting is the largest number of arrays and inline tables nested
	// in one another in one value.
	MaxNesting = 32
	// MaxArrayLen is the largest number of elements of one array, and of
	// keys of one inline table, written in one value. Arrays of tables
	// ([[service]]) are not limited by it: MaxFileSize limits them.
	MaxArrayLen = 65536
)

// shape is what the limits bound, for a file: the most parts and bytes of
// a key's full name, the deepest nesting of arrays and inline tables, the
// most elements of an array or keys of an inline table.
type shape struct{ parts, bytes, nesting, elems int }

// limits is the shape no file may exceed.
var limits = shape{parts: MaxKeyParts, bytes: MaxKeyLen, nesting: MaxNesting, elems: MaxArrayLen}

// checkLimits returns an error naming file, line and column of the first
// place where data exceeds one of the limits above, or nil. It knows
// enough TOML to tell keys, strings, comments and brackets apart in any
// text the decoders accept; on text they reject it may stop checking, but
// only where they stop decoding too (see limitScan).
func checkLimits(file string, data []byte) *Error {
	s := limitScan{data: data, line: 1, max: limits}
	s.document()
	if s.err == "" {
		return nil
	}
	return &Error{File: file, Line: s.errLine, Col: s.errCol, Msg: s.err}
}

// withinLimits reports whether data is within the limits: the block parser
// asks it before it decodes a block, and leaves a block that is not to the
// whole-file parse, which reports the error.
func withinLimits(data []byte) bool {
	s := limitScan{data: data, line: 1, max: limits}
	s.document()
	return s.err == ""
}

// limitScan is the pass of checkLimits: a recursive-descent scanner of
// TOML's structure (table headers, keys, strings, arrays, inline tables,
// comments) that measures what the limits bound and accepts anything else.
// It is lenient where TOML is strict (a stray character, a missing comma,
// a newline in an inline table, a bad escape): on such text the decoders
// fail at the same place or earlier, without reading further, so the
// scanner may count there as it likes. What it must get right is where
// strings and comments start and end, so that no bracket or key the
// decoders see escapes it. Its recursion is bounded by max.nesting.
type limitScan struct {
	data      []byte
	i         int
	line      int
	lineStart int

	// max is the shape not to exceed; got is the largest seen so far.
	max, got shape

	// What go-toml's key tracker costs on the text (see trackerCost), in
	// key parts: all of them and the headers' (entries, headers), the
	// most under one table header outside inline tables (section, the
	// current one), and the most in one inline table.
	entries, headers, section, maxSection, maxInline int

	err             string
	errLine, errCol int
}

// fail records the first violation, at offset at.
func (s *limitScan) fail(at int, format string, args ...any) {
	if s.err != "" {
		return
	}
	// The line of at: at is never before the start of the current line.
	s.err = fmt.Sprintf(format, args...)
	s.errLine = s.line
	s.errCol = at - s.lineStart + 1
	// Stop scanning.
	s.i = len(s.data)
}

func (s *limitScan) eof() bool { return s.i >= len(s.data) }

func (s *limitScan) newline() {
	s.i++
	s.line++
	s.lineStart = s.i
}

// blanks skips spaces and tabs (and carriage returns, which the decoders
// take only before a newline).
func (s *limitScan) blanks() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\r':
			s.i++
		default:
			return
		}
	}
}

// comment skips a comment that starts at s.i, up to the newline.
func (s *limitScan) comment() {
	if j := bytes.IndexByte(s.data[s.i:], '\n'); j >= 0 {
		s.i += j
	} else {
		s.i = len(s.data)
	}
}

// space skips blanks, comments and newlines, as inside an array.
func (s *limitScan) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\r':
			s.i++
		case '\n':
			s.newline()
		case '#':
			s.comment()
		default:
			return
		}
	}
}

// document scans a whole file: table headers and key/value pairs, one a
// line.
func (s *limitScan) document() {
	var table name // the current table header's
	for !s.eof() {
		s.blanks()
		if s.eof() {
			return
		}
		switch s.data[s.i] {
		case '\n':
			s.newline()
			continue
		case '#':
			s.comment()
			continue
		case '[':
			start := s.i
			s.i++
			if s.i < len(s.data) && s.data[s.i] == '[' {
				s.i++
			}
			s.blanks()
			table = s.key(start, name{}, "table header")
			s.headers += table.parts
			s.section = 0
			s.blanks()
			for s.i < len(s.data) && s.data[s.i] == ']' {
				s.i++
			}
		default:
			at := s.i
			s.section += s.keyValue(table, 0)
			s.maxSection = max(s.maxSection, s.section)
			if s.i == at {
				s.i++ // not a key: an error of the decoders; move on
			}
		}
		// The rest of the line: a comment or nothing (anything else is
		// an error of the decoders, which the loop scans as a key).
		s.blanks()
		if s.i < len(s.data) && s.data[s.i] == '#' {
			s.comment()
		}
		if s.i < len(s.data) && s.data[s.i] == '\n' {
			s.newline()
		}
	}
}

// name is the size of a key's full name: its parts and their bytes.
type name struct{ parts, bytes int }

// key scans a dotted key (or a table header's name) at s.i, under a table
// and inline tables whose names make base, and returns the key's full
// name. The parts are counted to the end however many there are, for the
// message; what names the key in messages, "key" or "table header".
func (s *limitScan) key(start int, base name, what string) name {
	own := name{}
	for !s.eof() {
		ps := s.i
		switch s.data[s.i] {
		case '"':
			s.basicString(false)
		case '\'':
			s.literalString(false)
		default:
			for s.i < len(s.data) && bareKeyByte(s.data[s.i]) {
				s.i++
			}
		}
		if s.i == ps {
			break // not a key: the decoders say why
		}
		own.parts++
		own.bytes += s.i - ps
		s.blanks()
		if s.eof() || s.data[s.i] != '.' {
			break
		}
		s.i++
		s.blanks()
	}
	if own.parts > 1 {
		own.bytes += own.parts - 1 // the dots
	}
	s.entries += own.parts
	full := name{base.parts + own.parts, base.bytes + own.bytes}
	if base.parts > 0 && own.parts > 0 {
		full.bytes++ // the dot between them
	}
	s.got.parts = max(s.got.parts, full.parts)
	s.got.bytes = max(s.got.bytes, full.bytes)
	switch {
	case own.parts > s.max.parts:
		s.fail(start, "%s has %d dotted parts, more than %d", what, own.parts, s.max.parts)
	case full.parts > s.max.parts:
		s.fail(start, "%s has %d parts with those of its table and inline tables, more than %d", what, full.parts, s.max.parts)
	case own.bytes > s.max.bytes:
		s.fail(start, "%s is %d bytes long, more than %d", what, own.bytes, s.max.bytes)
	case full.bytes > s.max.bytes:
		s.fail(start, "%s is %d bytes long with the names of its table and inline tables, more than %d", what, full.bytes, s.max.bytes)
	}
	return full
}

// bareKeyByte reports whether c may be part of a bare key. TOML allows
// A-Za-z0-9_- (and, in 1.1, more of Unicode): anything that does not end a
// key is taken, which at worst counts a longer key.
func bareKeyByte(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '.', '=', '[', ']', '{', '}', ',', '#', '"', '\'':
		return false
	}
	return true
}

// keyValue scans "key = value" at s.i, in a table or inline table whose
// full name is base, depth arrays and inline tables deep, and returns the
// number of parts of its key.
func (s *limitScan) keyValue(base name, depth int) int {
	n := s.key(s.i, base, "key")
	s.blanks()
	if s.eof() || s.data[s.i] != '=' {
		return n.parts - base.parts
	}
	s.i++
	s.blanks()
	s.value(n, depth)
	return n.parts - base.parts
}

// value scans a value at s.i, the value of a key whose full name is n,
// inside depth arrays and inline tables.
func (s *limitScan) value(n name, depth int) {
	if s.eof() {
		return
	}
	switch s.data[s.i] {
	case '"':
		s.basicString(true)
	case '\'':
		s.literalString(true)
	case '[':
		s.array(n, depth+1)
	case '{':
		s.inlineTable(n, depth+1)
	default:
		// A number, a boolean, a date, or an error: up to what ends a
		// value.
		for s.i < len(s.data) {
			switch s.data[s.i] {
			case ',', ']', '}', '#', '\n', '[', '{', '"', '\'':
				return
			}
			s.i++
		}
	}
}

func (s *limitScan) array(n name, depth int) {
	s.entries++
	s.container(']', "array has more than %d elements", depth, func() { s.value(n, depth) })
}

func (s *limitScan) inlineTable(n name, depth int) {
	s.entries++
	parts := 0
	s.container('}', "inline table has more than %d keys", depth, func() { parts += s.keyValue(n, depth) })
	s.maxInline = max(s.maxInline, parts)
}

// trackerCost bounds the work of go-toml's key tracker on data, in key
// parts compared. The tracker finds each key, and each table header,
// among the entries seen before it in the document by a linear search
// from its table's entry to the last one (and clears an array of
// tables' element in one pass over them): each search is bounded by all
// the entries, and a table or inline table's searches by its own key
// parts. A block of n keys in one table costs n²; a service of many
// backends written as inline tables costs about as many times its
// entries as a backend and the service have keys.
func trackerCost(data []byte) int {
	s := limitScan{data: data, line: 1, max: limits}
	s.document()
	return (s.maxSection + s.headers + s.maxInline) * s.entries
}

// container scans an array or inline table that opens at s.i, depth deep
// and closed by end: its elements, each scanned by elem and counted
// against the limit (format names it in the message), separated by
// commas.
func (s *limitScan) container(end byte, format string, depth int, elem func()) {
	if !s.nest(depth) {
		return
	}
	s.i++ // [ or {
	elems := 0
	for {
		s.space()
		if s.eof() {
			return
		}
		if s.data[s.i] == end {
			s.i++
			return
		}
		if !s.count(&elems, format) {
			return
		}
		at := s.i
		elem()
		s.space()
		if s.eof() {
			return
		}
		switch s.data[s.i] {
		case ',':
			s.i++
		case end:
		default:
			if s.i == at {
				s.i++ // an error of the decoders; move on
			}
		}
	}
}

// nest reports whether an array or inline table may open at s.i, depth
// deep.
func (s *limitScan) nest(depth int) bool {
	s.got.nesting = max(s.got.nesting, depth)
	if depth > s.max.nesting {
		s.fail(s.i, "arrays and inline tables nested more than %d deep", s.max.nesting)
		return false
	}
	return true
}

// count counts one more element of an array or key of an inline table in
// *n, and reports whether that is within the limit.
func (s *limitScan) count(n *int, format string) bool {
	*n++
	s.got.elems = max(s.got.elems, *n)
	if *n > s.max.elems {
		s.fail(s.i, format, s.max.elems)
		return false
	}
	return true
}

// basicString skips a basic string at s.i ("..." or, with multi, also
// """..."""). A single-line string ends at the newline that the decoders
// reject it at.
func (s *limitScan) basicString(multi bool) {
	if multi && bytes.HasPrefix(s.data[s.i:], []byte(`"""`)) {
		s.i += 3
		for s.i < len(s.data) {
			switch s.data[s.i] {
			case '\\':
				s.i++
				if s.i < len(s.data) && s.data[s.i] == '\n' {
					s.newline()
					continue
				}
			case '\n':
				s.newline()
				continue
			case '"':
				if bytes.HasPrefix(s.data[s.i:], []byte(`"""`)) {
					s.i += 3
					// Up to two more quotes belong to the string.
					for k := 0; k < 2 && s.i < len(s.data) && s.data[s.i] == '"'; k++ {
						s.i++
					}
					return
				}
			}
			s.i++
		}
		return
	}
	s.i++
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			s.i++
			if s.i < len(s.data) && s.data[s.i] == '\n' {
				return
			}
		case '"':
			s.i++
			return
		case '\n':
			return
		}
		s.i++
	}
}

// literalString skips a literal string at s.i: in single quotes or, with
// multi, also in three single quotes.
func (s *limitScan) literalString(multi bool) {
	if multi && bytes.HasPrefix(s.data[s.i:], []byte(`'''`)) {
		s.i += 3
		for s.i < len(s.data) {
			j := bytes.IndexAny(s.data[s.i:], "'\n")
			if j < 0 {
				s.i = len(s.data)
				return
			}
			s.i += j
			if s.data[s.i] == '\n' {
				s.newline()
				continue
			}
			if bytes.HasPrefix(s.data[s.i:], []byte(`'''`)) {
				s.i += 3
				for k := 0; k < 2 && s.i < len(s.data) && s.data[s.i] == '\''; k++ {
					s.i++
				}
				return
			}
			s.i++
		}
		return
	}
	s.i++
	j := bytes.IndexAny(s.data[s.i:], "'\n")
	if j < 0 {
		s.i = len(s.data)
		return
	}
	s.i += j
	if s.data[s.i] == '\'' {
		s.i++
	}
}
