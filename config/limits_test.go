package config

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/pelletier/go-toml/v2/unstable"
)

// TestLimits checks each limit at its bound and one past it, the message
// and position of each violation, and that strings and comments hide
// what they hold from the count.
func TestLimits(t *testing.T) {
	parts := func(n int) string { return strings.TrimSuffix(strings.Repeat("a.", n), ".") }
	nest := func(n int, open, close string) string { return strings.Repeat(open, n) + strings.Repeat(close, n) }
	elems := func(n int) string { return strings.TrimSuffix(strings.Repeat("1,", n), ",") }
	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "k%d=1", i)
		}
		return b.String()
	}
	long := strings.Repeat("k", MaxKeyLen)
	for _, tt := range []struct{ name, in, want string }{
		{"dotted key", parts(MaxKeyParts) + " = 1\n", ""},
		{"dotted key past", "\n\n" + parts(16000) + " = 1\n", "t.toml:3:1: key has 16000 dotted parts, more than 8"},
		{"header", "[" + parts(MaxKeyParts) + "]\n", ""},
		{"header past", "[" + parts(MaxKeyParts+1) + "]\n", "t.toml:1:1: table header has 9 dotted parts, more than 8"},
		{"array table header past", "[[" + parts(MaxKeyParts+1) + "]]\n", "t.toml:1:1: table header has 9 dotted parts, more than 8"},
		{"key under header", "[" + parts(4) + "]\n" + parts(4) + " = 1\n", ""},
		{"key under header past", "[" + parts(4) + "]\n  " + parts(5) + " = 1\n", "t.toml:2:3: key has 9 parts with those of its table and inline tables, more than 8"},
		{"inline tables", "a = " + strings.Repeat("{a = ", MaxKeyParts-1) + "1" + strings.Repeat("}", MaxKeyParts-1) + "\n", ""},
		{"inline tables past", "a = " + strings.Repeat("{a = ", MaxKeyParts) + "1" + strings.Repeat("}", MaxKeyParts) + "\n",
			fmt.Sprintf("t.toml:1:%d: key has 9 parts with those of its table and inline tables, more than 8", 5+5*(MaxKeyParts-1)+1)},
		{"arrays", "x = " + nest(MaxNesting, "[", "]") + "\n", ""},
		{"arrays past", "x = " + nest(200000, "[", "]") + "\n", "t.toml:1:37: arrays and inline tables nested more than 32 deep"},
		{"arrays and tables", "x = [[[[" + strings.Repeat("[[[{a = ", 7) + "1" + strings.Repeat("}]]]", 7) + "]]]]\n", ""},
		{"array elements", "x = [" + elems(MaxArrayLen) + "]\n", ""},
		{"array elements past", "x = [\n" + elems(MaxArrayLen+1) + "]\n", fmt.Sprintf("t.toml:2:%d: array has more than 65536 elements", 2*MaxArrayLen+1)},
		{"array elements trailing comma", "x = [" + elems(MaxArrayLen) + ",]\n", ""},
		{"inline table keys", "x = {" + keys(MaxArrayLen) + "}\n", ""},
		{"inline table keys past", "x = {" + keys(MaxArrayLen+1) + "}\n", fmt.Sprintf("t.toml:1:%d: inline table has more than 65536 keys", 6+len(keys(MaxArrayLen))+1)},
		{"key length", long + " = 1\n", ""},
		{"key length past", "a = 1\n" + long + "k = 1\n", "t.toml:2:1: key is 129 bytes long, more than 128"},
		{"quoted key length", `"` + long[2:] + `" = 1` + "\n", ""},
		{"quoted key length past", `"` + long[1:] + `" = 1` + "\n", "t.toml:1:1: key is 129 bytes long, more than 128"},
		{"full name length past", "[" + long[:64] + "]\n" + long[:64] + " = 1\n", "t.toml:2:1: key is 129 bytes long with the names of its table and inline tables, more than 128"},
		{"header length past", "[" + long[:64] + "." + long[:64] + "]\n", "t.toml:1:1: table header is 129 bytes long, more than 128"},
		// What strings and comments hold does not count.
		{"strings", "a = \"[[[[{{{{\\\"[[[[\"\nb = '[[[[{{{{'\nc = \"\"\"\n[[[[\n\\\"\"\"[[[\n\"\"\"\nd = '''\n[[[[''\n'''\n", ""},
		{"quoted dots", `"` + parts(20) + `" = 1` + "\n" + `'` + parts(20) + `' = 1` + "\n[\"" + parts(20) + "\"]\n", ""},
		{"comments", "# " + nest(100, "[", "]") + "\na = [ # [[[[[\n 1, # {{{{\n]\n", ""},
		{"multi-line string ends with quotes", "a = \"\"\"x\"\"\"\"\"\nb = " + nest(MaxNesting+1, "[", "]") + "\n", "t.toml:2:37: arrays and inline tables nested more than 32 deep"},
		{"multi-line literal ends with quotes", "a = '''x'''''\nb = " + nest(MaxNesting+1, "[", "]") + "\n", "t.toml:2:37: arrays and inline tables nested more than 32 deep"},
		{"escaped quote", "a = \"\\\"[\"\nb = " + nest(MaxNesting+1, "[", "]") + "\n", "t.toml:2:37: arrays and inline tables nested more than 32 deep"},
		{"array of arrays over lines", "a = [\n  [1, 2],\n  [\n" + nest(MaxNesting-1, "[", "]") + "\n]]\n", "t.toml:4:31: arrays and inline tables nested more than 32 deep"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := checkLimits("t.toml", []byte(tt.in))
			if got := errString(errOrNil(err)); got != tt.want {
				t.Fatalf("checkLimits:\n got %s\nwant %s", got, tt.want)
			}
			// Parse refuses the file with this error alone.
			if tt.want == "" {
				return
			}
			if _, err := Parse("t.toml", []byte(tt.in)); errString(err) != tt.want {
				t.Fatalf("Parse:\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func errOrNil(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}

// refShape measures the shape of a document as go-toml's parser sees it:
// the reference for limitScan. It reports false for a document go-toml
// rejects.
func refShape(data []byte) (shape, bool) {
	var p unstable.Parser
	p.Reset(data)
	var got shape
	table := 0
	var value func(n *unstable.Node, parts, depth int)
	keyValue := func(n *unstable.Node, base, depth int) {
		parts, bytes := base, 0
		for it := n.Key(); it.Next(); {
			parts++
			bytes += len(it.Node().Data) + 1
		}
		got.parts = max(got.parts, parts)
		value(n.Value(), parts, depth)
	}
	value = func(n *unstable.Node, parts, depth int) {
		switch n.Kind {
		case unstable.Array, unstable.InlineTable:
			depth++
			got.nesting = max(got.nesting, depth)
			k := 0
			for it := n.Children(); it.Next(); {
				c := it.Node()
				if c.Kind == unstable.Comment {
					continue
				}
				k++
				if n.Kind == unstable.Array {
					value(c, parts, depth)
				} else {
					keyValue(c, parts, depth)
				}
			}
			got.elems = max(got.elems, k)
		}
	}
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = 0
			for it := e.Key(); it.Next(); {
				table++
			}
			got.parts = max(got.parts, table)
		case unstable.KeyValue:
			keyValue(e, table, 0)
		}
	}
	return got, p.Error() == nil
}

// checkLimitScan checks limitScan against both decoders on data: where
// go-toml parses the document, the scan must measure the same shape (but
// for the bytes of names, which the scan counts with their quotes and
// escapes); where BurntSushi does, no key it reports may have more parts
// or bytes than the scan measured; and the scan with the real limits must
// refuse data exactly when its shape exceeds them.
func checkLimitScan(t *testing.T, data []byte) {
	t.Helper()
	s := limitScan{data: data, line: 1, max: shape{math.MaxInt, math.MaxInt, 10000, math.MaxInt}}
	s.document()
	if s.err != "" {
		return // deeper than the reference parser goes
	}
	if ref, ok := refShape(data); ok {
		got := s.got
		got.bytes = 0
		if got != (shape{ref.parts, 0, ref.nesting, ref.elems}) {
			t.Fatalf("%q: the scan measures %+v, go-toml's parser %+v", data, s.got, ref)
		}
	}
	var m map[string]any
	if md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&m); err == nil {
		for _, k := range md.Keys() {
			if len(k) > s.got.parts || len(strings.Join(k, ".")) > s.got.bytes {
				t.Fatalf("%q: BurntSushi's key %q is longer than the scan's longest, %+v", data, k, s.got)
			}
		}
	}
	g := s.got
	over := g.parts > MaxKeyParts || g.bytes > MaxKeyLen || g.nesting > MaxNesting || g.elems > MaxArrayLen
	if e := checkLimits("f.toml", data); (e != nil) != over {
		t.Fatalf("%q: shape %+v, checkLimits says %v", data, g, e)
	}
}

// limitSeeds are texts at the edges of what limitScan must tell apart.
var limitSeeds = []string{
	"a.b.c = 1\n[x.y]\nz.w = [1, [2, {q = 3}]]\n",
	"a = [[[[[[1]]]]]]\nb = {c = {d = {e = 1}}}\n",
	"[[a.b]]\nc = [{d = [{e = 1}]}]\n",
	"a = \"[{\\\"\"\nb = '[{'\n",
	"a = \"\"\"\n[[x]]\n\"\"\"\nb = '''\n{{\n'''\n",
	"a = \"\"\"x\"\"\"\"\"\nb = '''y'''''\n",
	"a = [ # [\n 1, # ]\n]\n",
	"\"a.b\" = 1\n'c.d'.e = 2\n[ \"f.g\" . h ]\n",
	"a = {b = 1, c = [1, 2,], d = {}}\n",
	"a = [\n\n[\n1\n],\n]\n",
	"a = 1979-05-27 07:32:00Z\nb = [1979-05-27T07:32:00Z, 1]\n",
	"a = \"\\u00e9\"\n\"\\u00e9\" = 1\n",
	"a = {\nb = 1,\n}\n",
	"[a]\n[[b]]\n[c.d]\ne = 1\n",
	"a = \"\"\"\\\n  x\"\"\"\nb = [1]\n",
	"a = [\"]\", ']', \"\"\"]\"\"\", ''']''']\n",
}

// TestLimitScan runs checkLimitScan on the seeds and the examples.
func TestLimitScan(t *testing.T) {
	files, _ := exampleFiles()
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		checkLimitScan(t, data)
	}
	for _, s := range limitSeeds {
		checkLimitScan(t, []byte(s))
	}
	for _, s := range decoderEdges {
		checkLimitScan(t, []byte(s))
	}
}

// FuzzLimits compares limitScan with both decoders on any text.
func FuzzLimits(f *testing.F) {
	for _, s := range limitSeeds {
		f.Add([]byte(s))
	}
	for _, s := range decoderSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkLimitScan(t, data) })
}
