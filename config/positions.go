package config

import (
	"math"
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
//
// The paths are kept as a tree of their parts, each node a part and a
// reference to its parent, so that the index takes memory in proportion to
// the number of keys and containers in the file, not to the length of
// their paths: a file's paths can be as long as it is deep, and a deep
// file has as many of them. A second tree holds the paths without array
// indices, for the keys the decoder reports without them (matching).
type positions struct {
	nodes []posNode
	// edges leads from a node to its children: a key part, or an array
	// index (idx > 0, for index idx-1).
	edges map[posEdge]int32
	// plainEdges is the tree of paths without indices; heads holds, for
	// each of its nodes, the first node of nodes whose path it is.
	plainEdges map[posEdge]int32
	heads      []int32
}

// posNode is one path. Node 0 is the root, the empty path.
type posNode struct {
	line  int32 // 0 when the path has no line of its own
	plain int32 // the node of the path without indices
	next  int32 // the next node with the same plain path, or -1
}

type posEdge struct {
	parent int32
	idx    int32
	part   string
}

func newPositions() *positions {
	return &positions{
		nodes:      []posNode{{next: -1}},
		edges:      map[posEdge]int32{},
		plainEdges: map[posEdge]int32{},
		heads:      []int32{-1},
	}
}

// child returns the node of parent's child part, or with index of its
// element index, making it if need be.
func (p *positions) child(parent int32, part string, index bool, i int) int32 {
	e := posEdge{parent: parent, part: part}
	if index {
		e = posEdge{parent: parent, idx: int32(i) + 1}
	}
	if n, ok := p.edges[e]; ok {
		return n
	}
	plain := p.nodes[parent].plain
	if !index {
		pe := posEdge{parent: plain, part: part}
		q, ok := p.plainEdges[pe]
		if !ok {
			q = int32(len(p.heads))
			p.heads = append(p.heads, -1)
			p.plainEdges[pe] = q
		}
		plain = q
	}
	n := int32(len(p.nodes))
	p.nodes = append(p.nodes, posNode{plain: plain, next: -1})
	p.edges[e] = n
	return n
}

// path returns the node of parent's descendant by the key parts.
func (p *positions) path(parent int32, parts []string) int32 {
	for _, s := range parts {
		parent = p.child(parent, s, false, 0)
	}
	return parent
}

// set records that node n is defined on line.
func (p *positions) set(n int32, line int) {
	nd := &p.nodes[n]
	if nd.line == 0 {
		nd.next = p.heads[nd.plain]
		p.heads[nd.plain] = n
	}
	nd.line = int32(line)
}

// lookup returns parent's child named s in a path: an array index when s
// is one, else a key part.
func (p *positions) lookup(parent int32, s string) (int32, bool) {
	if i, err := strconv.Atoi(s); err == nil && i >= 0 && i < math.MaxInt32 && strconv.Itoa(i) == s {
		if n, ok := p.edges[posEdge{parent: parent, idx: int32(i) + 1}]; ok {
			return n, true
		}
	}
	n, ok := p.edges[posEdge{parent: parent, part: s}]
	return n, ok
}

// exact returns the line of path itself, and whether the file has it.
func (p *positions) exact(path string) (int, bool) {
	n := int32(0)
	for _, s := range strings.Split(path, ".") {
		var ok bool
		if n, ok = p.lookup(n, s); !ok {
			return 0, false
		}
	}
	return int(p.nodes[n].line), true
}

// line returns the line of path, or of its nearest ancestor, or 0.
func (p *positions) line(path string) int {
	n, line := int32(0), 0
	for path != "" {
		s := path
		if i := strings.IndexByte(path, '.'); i >= 0 {
			s, path = path[:i], path[i+1:]
		} else {
			path = ""
		}
		var ok bool
		if n, ok = p.lookup(n, s); !ok {
			break
		}
		if l := p.nodes[n].line; l > 0 {
			line = int(l)
		}
	}
	return line
}

// matching returns the lines of every indexed path equal to key once
// array indices are removed, for keys the decoder reports without them.
func (p *positions) matching(key []string) []int {
	q := int32(0)
	for _, s := range key {
		var ok bool
		if q, ok = p.plainEdges[posEdge{parent: q, part: s}]; !ok {
			return nil
		}
	}
	var lines []int
	for n := p.heads[q]; n >= 0; n = p.nodes[n].next {
		lines = append(lines, int(p.nodes[n].line))
	}
	return lines
}

type frame struct {
	node    int32
	array   bool
	n       int  // next element index of an array
	wantKey bool // an inline table expects a key next
}

type scanner struct {
	pos      *positions
	counters map[int32]int   // array of tables -> elements seen
	latest   map[int32]int32 // array of tables, by its plain node -> current element
	cur      int32           // current table
	stack    []frame
	line     int
}

func indexPositions(data []byte) *positions {
	s := &scanner{pos: newPositions(), counters: map[int32]int{}, latest: map[int32]int32{}}
	text := string(data)
	for s.line = 1; ; s.line++ {
		l := text
		i := strings.IndexByte(text, '\n')
		if i >= 0 {
			l, text = text[:i], text[i+1:]
		}
		s.scanLine(l)
		if i < 0 {
			break
		}
	}
	return s.pos
}

// resolve turns the parts of a header name into a node, following the
// latest element of each array of tables on the way.
func (s *scanner) resolve(parts []string) int32 {
	n := int32(0)
	for _, part := range parts {
		n = s.pos.child(n, part, false, 0)
		if cur, ok := s.latest[s.pos.nodes[n].plain]; ok {
			n = cur
		}
	}
	return n
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
			parts := splitKey(t[2:end])
			if len(parts) == 0 {
				return
			}
			arr := s.pos.child(s.resolve(parts[:len(parts)-1]), parts[len(parts)-1], false, 0)
			n := s.counters[arr]
			s.counters[arr] = n + 1
			s.cur = s.pos.child(arr, "", true, n)
			s.latest[s.pos.nodes[arr].plain] = s.cur
			s.pos.set(s.cur, s.line)
			return
		case strings.HasPrefix(t, "["):
			end := strings.IndexByte(t, ']')
			if end < 0 {
				return
			}
			s.cur = s.resolve(splitKey(t[1:end]))
			s.pos.set(s.cur, s.line)
			return
		}
		s.scanKeyValue(l, s.cur)
		return
	}
	s.scanValue(l)
}

// scanKeyValue handles "key = value..." at the top level of a table.
func (s *scanner) scanKeyValue(l string, table int32) {
	eq := strings.IndexByte(l, '=')
	if eq < 0 {
		return
	}
	n := s.pos.path(table, splitKey(l[:eq]))
	s.pos.set(n, s.line)
	s.stack = append(s.stack, frame{node: n})
	s.scanValue(l[eq+1:])
	// A scalar value leaves its placeholder frame on the stack: drop it.
	if len(s.stack) > 0 && !s.stack[len(s.stack)-1].array && !s.stack[len(s.stack)-1].wantKey && s.stack[len(s.stack)-1].node == n {
		s.stack = s.stack[:len(s.stack)-1]
	}
}

// container returns the node of an array or inline table that opens
// where the frame on top of the stack expects a value, dropping the
// placeholder frame of "key =" that it replaces.
func (s *scanner) container() int32 {
	if len(s.stack) == 0 {
		return 0
	}
	f := s.stack[len(s.stack)-1]
	switch {
	case f.array:
		return s.pos.child(f.node, "", true, f.n)
	case !f.wantKey:
		// The placeholder frame of "key =" becomes the container.
		s.stack = s.stack[:len(s.stack)-1]
	}
	return f.node
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
			s.stack = append(s.stack, frame{node: s.container(), array: true})
		case '{':
			n := s.container()
			s.pos.set(n, s.line)
			s.stack = append(s.stack, frame{node: n, wantKey: true})
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
			n := s.pos.path(f.node, splitKey(l[i:i+eq]))
			s.pos.set(n, s.line)
			f.wantKey = false
			// Values inside an inline table: a nested container pushes a
			// frame of its own; a scalar needs nothing.
			s.stack = append(s.stack, frame{node: n})
			rest := i + eq + 1
			// Continue where the scalar ends, or at the container.
			i = rest + s.scanInline(l[rest:], len(s.stack)) - 1
		}
	}
}

// scanInline scans the remainder of a line after "key =" inside an inline
// table: it pops the scalar placeholder at the first ',' or '}' that
// belongs to the enclosing table, and returns where scanValue goes on: at
// that ',' or '}', at a container that the placeholder becomes, or at the
// end of the line.
func (s *scanner) scanInline(l string, depth int) int {
	for i := 0; i < len(l); i++ {
		switch l[i] {
		case '"', '\'':
			i = skipString(l, i)
		case '[', '{':
			// The placeholder becomes a container: let scanValue do it.
			return i
		case ',', '}':
			if len(s.stack) == depth {
				s.stack = s.stack[:len(s.stack)-1] // placeholder
			}
			return i
		case '#':
			return len(l)
		}
	}
	return len(l)
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
