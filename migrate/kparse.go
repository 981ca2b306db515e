package migrate

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vipd/vipd/config"
)

// Limits bound what a keepalived configuration may cost to read, so that a
// hostile or broken one (an include loop, a bomb of includes, a huge file,
// deep nesting) fails with an issue instead of exhausting the host.
type Limits struct {
	// Bytes is the most the main file and its includes may hold together.
	Bytes int64
	// Files is the most files that may be read, the main one included.
	Files int
	// IncludeDepth is the deepest chain of includes.
	IncludeDepth int
	// Depth is the deepest nesting of blocks.
	Depth int
	// Services is the most services virtual_server_group ranges may
	// expand to.
	Services int
	// Words is the most words (keywords, values, braces) all files may
	// hold together: with Bytes it bounds the memory of a read.
	Words int
}

// DefaultLimits are generous for any real configuration. Bytes is vipd's
// own limit on a configuration file (16 MiB).
var DefaultLimits = Limits{Bytes: 16 << 20, Files: 1024, IncludeDepth: 16, Depth: 32, Services: 100000, Words: 4 << 20}

// node is one statement of a keepalived configuration: a keyword, its
// arguments, and the statements of its block, if it has one.
type node struct {
	file  string
	line  int
	key   string
	args  []string
	block bool
	kids  []*node
}

func (n *node) String() string { return strings.Join(append([]string{n.key}, n.args...), " ") }

// token is one word of a configuration; file indexes reader.order.
type token struct {
	text   string
	file   int32
	line   int32
	quoted bool
}

// reader reads a keepalived configuration and the files it includes into
// tokens.
type reader struct {
	fsys   fs.FS // nil: the operating system's files
	limits Limits
	bytes  int64
	files  int
	issues []Issue
	// more counts the issues past MaxIssues, not kept.
	more int
	toks []token
	// order lists the files read, in order.
	order []string
	// stopped is set when a limit was hit: reading stops.
	stopped bool
}

func (r *reader) issue(file string, line int, what, why string) {
	if len(r.issues) >= MaxIssues {
		r.more++
		return
	}
	r.issues = append(r.issues, Issue{File: file, Line: line, What: what, Why: why})
}

// errNotRegular says that a file to read is not a regular file: a FIFO, a
// device, a socket or a directory, which may block a read forever or
// never end.
var errNotRegular = errors.New("not a regular file")

// errTooLarge says that the files read exceed Limits.Bytes.
var errTooLarge = errors.New("too large")

// readFile reads the file name: a regular file (it never blocks on a
// FIFO: the path is checked, opened without blocking, and checked again
// once open), within what is left of Limits.Bytes, which it checks
// against the file's size before reading.
func (r *reader) readFile(name string) ([]byte, error) {
	var f fs.File
	var err error
	if r.fsys != nil {
		f, err = r.fsys.Open(filepath.ToSlash(strings.TrimPrefix(name, "/")))
	} else {
		var fi fs.FileInfo
		if fi, err = os.Stat(name); err != nil {
			return nil, err
		}
		if err := r.checkFile(fi); err != nil {
			return nil, err
		}
		f, err = os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := r.checkFile(fi); err != nil {
		return nil, err
	}
	left := r.limits.Bytes - r.bytes
	data, err := io.ReadAll(io.LimitReader(f, left+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > left {
		return nil, r.tooLarge()
	}
	r.bytes += int64(len(data))
	return data, nil
}

// checkFile returns an error unless fi is a regular file that fits in
// what is left of Limits.Bytes.
func (r *reader) checkFile(fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w (%s)", errNotRegular, config.FileKind(fi.Mode()))
	}
	if fi.Size() > r.limits.Bytes-r.bytes {
		return r.tooLarge()
	}
	return nil
}

func (r *reader) tooLarge() error {
	n := r.limits.Bytes
	size := fmt.Sprintf("%d bytes", n)
	if n >= 1<<20 && n%(1<<20) == 0 {
		size += fmt.Sprintf(" (%d MiB)", n>>20)
	}
	return fmt.Errorf("%w: the configuration and its includes exceed %s", errTooLarge, size)
}

func (r *reader) glob(pattern string) ([]string, error) {
	if r.fsys != nil {
		m, err := fs.Glob(r.fsys, filepath.ToSlash(strings.TrimPrefix(pattern, "/")))
		for i := range m {
			if strings.HasPrefix(pattern, "/") {
				m[i] = "/" + m[i]
			}
		}
		return m, err
	}
	return filepath.Glob(pattern)
}

// file tokenizes one file; chain holds the files including it, the last
// one at line.
func (r *reader) file(name string, chain []string, line int) {
	if r.stopped {
		return
	}
	r.files++
	if r.files > r.limits.Files {
		r.issue(chain[len(chain)-1], 0, "include "+name, fmt.Sprintf("more than %d files: reading stopped", r.limits.Files))
		r.stopped = true
		return
	}
	data, err := r.readFile(name)
	if err != nil {
		file := name
		if len(chain) > 0 {
			file = chain[len(chain)-1]
		}
		r.issue(file, line, "read "+name, err.Error())
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) || errors.Is(err, errNotRegular) {
			return
		}
		r.stopped = true
		return
	}
	chain = append(chain, name)
	fi := int32(len(r.order))
	r.order = append(r.order, name)
	// A word and its separator take about 4 bytes or more: room for
	// the file's words at once spares the copies of a growing slice.
	r.toks = slices.Grow(r.toks, max(0, min(len(data)/4, r.limits.Words-len(r.toks))))
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if r.stopped {
			return
		}
		r.line(name, fi, i+1, strings.TrimSuffix(l, "\r"), chain)
	}
}

// line tokenizes one line, following an include.
func (r *reader) line(file string, fi int32, n int, l string, chain []string) {
	toks := splitLine(l)
	if len(toks) == 0 {
		return
	}
	first := toks[0]
	switch {
	case strings.HasPrefix(first, "@"):
		r.issue(file, n, first, "conditional configuration (keepalived -i): the line is not imported")
		return
	case strings.HasPrefix(first, "$") && strings.Contains(first, "="):
		r.issue(file, n, first, "parameter definition: keepalived's parameter substitution is not imported")
		return
	case first == "include":
		if len(toks) < 2 {
			r.issue(file, n, "include", "no file named")
			return
		}
		r.include(file, n, toks[1], chain)
		return
	}
	if len(r.toks)+len(toks) > r.limits.Words {
		r.issue(file, n, "configuration", fmt.Sprintf("more than %d words: reading stopped", r.limits.Words))
		r.stopped = true
		return
	}
	for _, t := range toks {
		if strings.Contains(t, "$") && !strings.HasPrefix(t, "\"") {
			r.issue(file, n, t, "parameter substitution is not imported")
		}
		quoted := len(t) >= 2 && t[0] == '"'
		if quoted {
			t = strings.TrimSuffix(t[1:], "\"")
		}
		r.toks = append(r.toks, token{text: t, file: fi, line: int32(n), quoted: quoted})
	}
	r.toks = append(r.toks, token{file: fi, line: int32(n)}) // end of line
}

func (r *reader) include(file string, n int, pattern string, chain []string) {
	pattern = strings.Trim(pattern, "\"")
	if !filepath.IsAbs(pattern) {
		pattern = filepath.Join(filepath.Dir(file), pattern)
	}
	if len(chain) >= r.limits.IncludeDepth {
		r.issue(file, n, "include "+pattern, fmt.Sprintf("includes nest deeper than %d files: not read", r.limits.IncludeDepth))
		return
	}
	matches, err := r.glob(pattern)
	if err != nil {
		r.issue(file, n, "include "+pattern, err.Error())
		return
	}
	if len(matches) == 0 {
		r.issue(file, n, "include "+pattern, "matches no file")
		return
	}
	for _, m := range matches {
		m = filepath.Clean(m)
		loop := false
		for _, c := range chain {
			if filepath.Clean(c) == m {
				loop = true
			}
		}
		if loop {
			r.issue(file, n, "include "+m, "include loop: the file includes itself, not read again")
			continue
		}
		r.file(m, chain, n)
	}
}

// splitLine splits a line into words: braces are words of their own, a
// quoted string is one word (kept with its quotes), and '#' or '!'
// outside quotes starts a comment.
func splitLine(l string) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			out = append(out, cur.String())
			cur.Reset()
		}
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case c == '"':
			flush()
			j := strings.IndexByte(l[i+1:], '"')
			if j < 0 {
				out = append(out, l[i:]+"\"")
				return out
			}
			out = append(out, l[i:i+j+2])
			i += j + 1
		case c == '#' || c == '!':
			flush()
			return out
		case c == '{' || c == '}':
			flush()
			out = append(out, string(c))
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			flush()
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return out
}

// parse builds the statement tree from the tokens.
func (r *reader) parse() []*node {
	p := &parser{toks: r.toks, r: r}
	return p.block(0, nil)
}

// pos returns the file and line of t.
func (p *parser) pos(t token) (string, int) {
	return p.r.order[t.file], int(t.line)
}

type parser struct {
	toks []token
	i    int
	r    *reader
}

// block parses statements until a closing brace or the end. open is the
// statement whose block this is (nil at the top).
func (p *parser) block(depth int, open *node) []*node {
	var out []*node
	var cur *node
	for p.i < len(p.toks) {
		t := p.toks[p.i]
		p.i++
		file, line := p.pos(t)
		switch {
		case t.text == "" && !t.quoted: // end of line
			cur = nil
		case t.text == "}" && !t.quoted:
			if open == nil {
				p.r.issue(file, line, "}", "closes no block: ignored")
				continue
			}
			return out
		case t.text == "{" && !t.quoted:
			target := cur
			if target == nil && len(out) > 0 && !out[len(out)-1].block {
				target = out[len(out)-1] // "{" on the line after its keyword
			}
			if target == nil {
				target = &node{file: file, line: line, key: "{"}
				out = append(out, target)
			}
			if depth+1 > p.r.limits.Depth {
				p.r.issue(file, line, target.key, fmt.Sprintf("blocks nest deeper than %d: the block is not imported", p.r.limits.Depth))
				p.skip()
				target.block = true
				cur = nil
				continue
			}
			target.block = true
			target.kids = p.block(depth+1, target)
			cur = nil
		case cur == nil:
			cur = &node{file: file, line: line, key: t.text}
			out = append(out, cur)
		default:
			cur.args = append(cur.args, t.text)
		}
	}
	if open != nil {
		p.r.issue(open.file, open.line, open.key, "block is not closed")
	}
	return out
}

// skip passes over a block whose opening brace was read.
func (p *parser) skip() {
	depth := 1
	for p.i < len(p.toks) && depth > 0 {
		t := p.toks[p.i]
		p.i++
		if t.quoted {
			continue
		}
		switch t.text {
		case "{":
			depth++
		case "}":
			depth--
		}
	}
}
