package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// randomJSON makes a random JSON value of at most depth levels, its
// strings full of what an indenter must not take for structure.
func randomJSON(r *rand.Rand, depth int) any {
	strs := []string{"", "a", `quo"te`, `back\slash`, "{[,:]}", "tab\tnew\nline", "ünï 日本", "\\\"", "<&>", "\u2028", "\x01"}
	switch k := r.IntN(8); {
	case depth > 0 && k < 2:
		m := map[string]any{}
		for range r.IntN(4) {
			m[strs[r.IntN(len(strs))]+fmt.Sprint(r.IntN(100))] = randomJSON(r, depth-1)
		}
		return m
	case depth > 0 && k < 4:
		var a []any
		if r.IntN(4) > 0 {
			a = []any{}
		}
		for range r.IntN(4) {
			a = append(a, randomJSON(r, depth-1))
		}
		return a
	case k == 4:
		return r.NormFloat64() * 1e6
	case k == 5:
		return r.IntN(2) == 0
	case k == 6:
		return nil
	}
	return strs[r.IntN(len(strs))]
}

// indentPieces indents src given to an indenter in pieces cut at random.
func indentPieces(t *testing.T, r *rand.Rand, src []byte) string {
	t.Helper()
	var out bytes.Buffer
	w := bufio.NewWriter(&out)
	x := &indenter{w: w}
	for rest := src; len(rest) > 0; {
		n := 1 + r.IntN(min(len(rest), 64))
		x.Write(rest[:n])
		rest = rest[n:]
	}
	if err := x.Close(); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	w.Flush()
	return out.String()
}

// TestIndenterMatchesIndent checks the indenter against json.Indent (and
// json.Encoder's indented output, which vipd status -o json printed) on
// random values and on the status package's golden snapshots, given in
// pieces cut anywhere, inside strings and escapes too.
func TestIndenterMatchesIndent(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var srcs [][]byte
	for range 2000 {
		b, err := json.Marshal(randomJSON(r, 4))
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, b)
	}
	golden, _ := filepath.Glob("../../monitor/status/testdata/*.json")
	if len(golden) == 0 {
		t.Fatal("no golden snapshots in monitor/status/testdata")
	}
	for _, g := range golden {
		b, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		var c bytes.Buffer
		if err := json.Compact(&c, b); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, c.Bytes())
	}
	for _, src := range srcs {
		var want bytes.Buffer
		if err := json.Indent(&want, src, "", "  "); err != nil {
			t.Fatal(err)
		}
		want.WriteByte('\n')
		if got := indentPieces(t, r, src); got != want.String() {
			t.Fatalf("%s\nindented:\n%s\nwant:\n%s", src, got, want.String())
		}
	}
}

// TestIndenterCutShort checks that a text that ends early is reported.
func TestIndenterCutShort(t *testing.T) {
	for _, src := range []string{`{"a":1`, `{"a":"b`, `[`, `{"a":[1,2]`, `"x\`} {
		x := &indenter{w: bufio.NewWriter(new(strings.Builder))}
		x.Write([]byte(src))
		if err := x.Close(); err == nil {
			t.Errorf("%s: no error", src)
		}
	}
}
