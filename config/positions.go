package config

import (
	"strconv"
	"strings"
)

// positions maps a key path with array indices, such as
// "service.2.backend.0.weight", to the line it is defined on. The TOML
// library does not expose key positions, so this is a small scanner of its
// own that understands what vipd configs use: table headers, arrays of
// tables, dotted and quoted keys, and inline arrays of inline tables. It
// never rejects input (the decoder does that); at worst a position falls
// back to the enclosing table's line.
type positions map[string]int

// line returns the line of path, or of its nearest ancestor, or 0.
func (p positions) line(path string) int {
	for path != "" {
		if l, ok := p[path]; ok {
			return l
		}
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// matching returns the lines of every indexed path equal to key once
// array indices are removed, for keys the decoder reports without them.
func (p positions) matching(key string) []int {
	var lines []int
	for path, l := range p {
		if stripIndices(path) == key {
			lines = append(lines, l)
		}
	}
	return lines
}

func stripIndices(path string) string {
	parts := strings.Split(path, ".")
	out := parts[:0]
	for _, s := range parts {
		if _, err := strconv.Atoi(s); err != nil {
			out = append(out, s)
		}
	}
	return strings.Join(out, ".")
}

type frame struct {
	path    string
	array   bool
	n       int  // next element index of an array
	wantKey bool // an inline table expects a key next
}

type scanner struct {
	pos      positions
	counters map[string]int    // resolved array-of-tables path -> elements seen
	latest   map[string]string // unindexed array-of-tables name -> current element path
	cur      string            // current table path
	stack    []frame
	line     int
}

func indexPositions(data []byte) positions {
	s := &scanner{pos: positions{}, counters: map[string]int{}, latest: map[string]string{}}
	for i, l := range strings.Split(string(data), "\n") {
		s.line = i + 1
		s.scanLine(l)
	}
	return s.pos
}

func (s *scanner) join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "." + b
}

// resolve turns a header name into an indexed path, following the latest
// element of each array of tables on the way.
func (s *scanner) resolve(name string) (resolved, plain string) {
	for _, seg := range splitKey(name) {
		plain = s.join(plain, seg)
		resolved = s.join(resolved, seg)
		if cur, ok := s.latest[plain]; ok {
			resolved = cur
		}
	}
	return resolved, plain
}

func (s *scanner) scanLine(l string) {
	if len(s.stack) == 0 {
		t := strings.TrimSpace(stripComment(l))
		switch {
		case t == "":
			return
		case strings.HasPrefix(t, "[["):
			end := strings.Index(t, "]]")
			if end < 0 {
				return
			}
			_, plain := s.resolve(t[2:end])
			parent, _ := s.resolve(parentOf(t[2:end]))
			arr := s.join(parent, lastSeg(t[2:end]))
			n := s.counters[arr]
			s.counters[arr] = n + 1
			s.cur = arr + "." + strconv.Itoa(n)
			s.latest[plain] = s.cur
			s.pos[s.cur] = s.line
			return
		case strings.HasPrefix(t, "["):
			end := strings.IndexByte(t, ']')
			if end < 0 {
				return
			}
			s.cur, _ = s.resolve(t[1:end])
			s.pos[s.cur] = s.line
			return
		}
		s.scanKeyValue(l, s.cur)
		return
	}
	s.scanValue(l)
}

// scanKeyValue handles "key = value..." at the top level of a table.
func (s *scanner) scanKeyValue(l, table string) {
	eq := strings.IndexByte(l, '=')
	if eq < 0 {
		return
	}
	path := s.join(table, strings.Join(splitKey(l[:eq]), "."))
	s.pos[path] = s.line
	s.stack = append(s.stack, frame{path: path})
	s.scanValue(l[eq+1:])
	// A scalar value leaves its placeholder frame on the stack: drop it.
	if len(s.stack) > 0 && !s.stack[len(s.stack)-1].array && !s.stack[len(s.stack)-1].wantKey && s.stack[len(s.stack)-1].path == path {
		s.stack = s.stack[:len(s.stack)-1]
	}
}

// scanValue walks value text, tracking inline arrays and tables.
func (s *scanner) scanValue(l string) {
	for i := 0; i < len(l); i++ {
		c := l[i]
		top := func() *frame {
			if len(s.stack) == 0 {
				return nil
			}
			return &s.stack[len(s.stack)-1]
		}
		switch c {
		case '#':
			return
		case '"', '\'':
			i = skipString(l, i)
		case ' ', '\t', '\r':
		case '[':
			f := top()
			path := ""
			if f != nil {
				path = f.path
				if f.array {
					path = f.path + "." + strconv.Itoa(f.n)
				} else if !f.wantKey {
					// The placeholder frame of "key =" becomes the array.
					s.stack = s.stack[:len(s.stack)-1]
				}
			}
			s.stack = append(s.stack, frame{path: path, array: true})
		case '{':
			f := top()
			path := ""
			if f != nil {
				path = f.path
				if f.array {
					path = f.path + "." + strconv.Itoa(f.n)
				} else if !f.wantKey {
					s.stack = s.stack[:len(s.stack)-1]
				}
			}
			s.pos[path] = s.line
			s.stack = append(s.stack, frame{path: path, wantKey: true})
		case ']', '}':
			if len(s.stack) > 0 {
				s.stack = s.stack[:len(s.stack)-1]
			}
			// A closed container that was the value of "key =" inside an
			// inline table lets that table expect its next key.
		case ',':
			if f := top(); f != nil {
				if f.array {
					f.n++
				} else {
					f.wantKey = true
				}
			}
		default:
			f := top()
			if f == nil || !f.wantKey {
				continue
			}
			eq := strings.IndexByte(l[i:], '=')
			if eq < 0 {
				return
			}
			path := s.join(f.path, strings.Join(splitKey(l[i:i+eq]), "."))
			s.pos[path] = s.line
			f.wantKey = false
			// Values inside an inline table: a nested container pushes a
			// frame of its own; a scalar needs nothing.
			s.stack = append(s.stack, frame{path: path})
			rest := l[i+eq+1:]
			before := len(s.stack)
			s.scanInline(rest, before)
			return
		}
	}
}

// scanInline scans the remainder of a line after "key =" inside an inline
// table: it pops the scalar placeholder at the first ',' or '}' that
// belongs to the enclosing table and continues there.
func (s *scanner) scanInline(l string, depth int) {
	for i := 0; i < len(l); i++ {
		switch l[i] {
		case '"', '\'':
			i = skipString(l, i)
		case '[', '{':
			// The placeholder becomes a container: let scanValue do it.
			s.scanValue(l[i:])
			return
		case ',', '}':
			if len(s.stack) == depth {
				s.stack = s.stack[:len(s.stack)-1] // placeholder
			}
			s.scanValue(l[i:])
			return
		case '#':
			return
		}
	}
}

func skipString(l string, i int) int {
	q := l[i]
	for j := i + 1; j < len(l); j++ {
		if q == '"' && l[j] == '\\' {
			j++
			continue
		}
		if l[j] == q {
			return j
		}
	}
	return len(l)
}

func stripComment(l string) string {
	for i := 0; i < len(l); i++ {
		switch l[i] {
		case '"', '\'':
			i = skipString(l, i)
		case '#':
			return l[:i]
		}
	}
	return l
}

// splitKey splits a possibly dotted, possibly quoted key into segments.
func splitKey(k string) []string {
	var segs []string
	k = strings.TrimSpace(k)
	for k != "" {
		var seg string
		if k[0] == '"' || k[0] == '\'' {
			end := skipString(k, 0)
			if end >= len(k) {
				seg, k = k[1:], ""
			} else {
				seg, k = k[1:end], k[end+1:]
			}
		} else {
			i := strings.IndexByte(k, '.')
			if i < 0 {
				seg, k = k, ""
			} else {
				seg, k = k[:i], k[i:]
			}
		}
		segs = append(segs, strings.TrimSpace(seg))
		k = strings.TrimSpace(k)
		k = strings.TrimPrefix(k, ".")
		k = strings.TrimSpace(k)
	}
	return segs
}

func parentOf(name string) string {
	segs := splitKey(name)
	if len(segs) <= 1 {
		return ""
	}
	return strings.Join(segs[:len(segs)-1], ".")
}

func lastSeg(name string) string {
	segs := splitKey(name)
	if len(segs) == 0 {
		return ""
	}
	return segs[len(segs)-1]
}
