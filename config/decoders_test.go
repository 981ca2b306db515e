package config

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// normalizeDecoded returns v as go-toml decodes it: arrays of tables as
// []any, NaN as a string (NaN is not equal to itself). It reports false
// for a date or a time, which fill never takes.
func normalizeDecoded(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			n, ok := normalizeDecoded(e)
			if !ok {
				return nil, false
			}
			out[k] = n
		}
		return out, true
	case []map[string]any:
		out := make([]any, len(x))
		for i, e := range x {
			n, ok := normalizeDecoded(e)
			if !ok {
				return nil, false
			}
			out[i] = n
		}
		return out, true
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			n, ok := normalizeDecoded(e)
			if !ok {
				return nil, false
			}
			out[i] = n
		}
		return out, true
	case float64:
		if math.IsNaN(x) {
			return "NaN", true
		}
		return x, true
	case string, int64, bool:
		return x, true
	}
	return nil, false
}

// checkDecoders checks that whatever go-toml decodes for the block
// parser, BurntSushi decodes too, into the same values, and that what
// fill takes from those BurntSushi decodes into the same raw structure.
func checkDecoders(t *testing.T, data []byte) {
	t.Helper()
	m, ok := decodeFast(data)
	if !ok {
		return
	}
	got, ok := normalizeDecoded(m)
	if !ok {
		return
	}
	var bm map[string]any
	if _, err := toml.NewDecoder(bytesReader(data)).Decode(&bm); err != nil {
		t.Fatalf("go-toml accepts what BurntSushi rejects: %q: %v", data, err)
	}
	want, ok := normalizeDecoded(bm)
	if !ok {
		t.Fatalf("BurntSushi decodes a date where go-toml does not: %q", data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\n go-toml    %#v\n BurntSushi %#v", data, got, want)
	}
	// What fill takes, BurntSushi decodes into the same raw structure.
	var filled rawConfig
	if !onlyKeys(m, []string{"include", "daemon", "service"}) || !fill(reflect.ValueOf(&filled).Elem(), m) {
		return
	}
	var raw rawConfig
	md, err := toml.NewDecoder(bytesReader(data)).Decode(&raw)
	if err != nil || len(md.Undecoded()) > 0 {
		t.Fatalf("fill takes what BurntSushi does not: %q: %v, undecoded %v", data, err, md.Undecoded())
	}
	if !reflect.DeepEqual(filled, raw) {
		t.Fatalf("%q:\n fill       %+v\n BurntSushi %+v", data, filled, raw)
	}
}

// FuzzDecoders compares go-toml, which decodes blocks, with BurntSushi,
// the reference, on any text.
func FuzzDecoders(f *testing.F) {
	files, _ := exampleFiles()
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range decoderSeeds {
		f.Add([]byte(s))
	}
	for _, s := range decoderEdges {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecoders(t, data) })
}

var decoderSeeds = []string{
	"a = \"x\\ty\\u00e9\\U0001F600\"\nb = 'lit'\n",
	"a = \"\"\"\nx\\\n   y\n\"\"\"\nb = '''\r\nz\r\n'''\n",
	"a = 0x_ff\nb = 1_000\nc = 0o17\nd = 0b1\ne = +1\nf = -0\n",
	"a = 1.5e3\nb = inf\nc = -nan\nd = 1e-5\ne = 6.02_2e23\n",
	"[t]\na.b = 1\n[t.c]\nd = 2\n",
	"[[s]]\nx = 1\n[s.c]\ny = 2\n[[s.b]]\nz = 3\n[[s.b]]\nz = 4\n",
	"t = { a = 1, b = { c = [1, 2] } }\n",
	"a = [\n  1,\n  2, # c\n]\n",
	"\"quoted key\" = 1\n'lit key' = 2\n\"\" = 3\n",
	"a = \"\\e\\x41\"\n",
	"t = {\n a = 1,\n}\n",
	"a = 1 # comment\r\n",
	"[a . b]\nc = 1\n",
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// decoderEdges are texts at the edges of TOML, where parsers tend to
// differ: control characters, line endings, escapes, numbers, redefined
// tables and keys.
var decoderEdges = []string{
	"a = 1 # \x00\n", "# \x7f\n", "# \x1b\n", "# \xff\n", "a = \"\xff\"\n", "a = '\xc3'\n",
	"a = 1\r", "a = 1\rb = 2\n", "a = 1\r\r\n", "a = \"x\r\"\n",
	"a = \"\"\"\\  \n  b\"\"\"", "a = \"\"\"\\ b\"\"\"", "a = \"\"\"\\\t\r\n b\"\"\"", "a = \"\"\"\\\r b\"\"\"",
	"a = \"\"\"\"\"x\"\"\"\"\"", "a = \"\"\"x\"\"\"\"", "a = \"\"\"x\"\"\"\"\"\"", "a = '''''x'''''", "a = '''x''''''",
	"a.b = 1\na = 2\n", "[a]\nb.c = 1\n[a.b]\nd = 2\n", "[a.b]\n[a]\nb.c = 1\n", "a = {b = 1}\n[a]\n", "[[a]]\n[a]\n",
	"a = []\n[[a]]\n", "[a]\n[[a]]\n", "a.b = 1\n[a]\n", "[a.b.c]\n[a]\nb.d=1\n", "[a]\nb = 1\n[a.b]\n",
	"[[a.b]]\n[a]\nb = 1\n", "[[a]]\nb = {c = 1}\n[a.b.d]\n", "[[a]]\n[a.b]\n[[a]]\n[a.b]\n",
	"a = +0x1\n", "a = 0_1\n", "a = 1__0\n", "a = 01\n", "a = -0x1\n", "a = 9223372036854775808\n", "a = -9223372036854775808\n",
	"a = 1.\n", "a = .5\n", "a = 1e\n", "a = 1_e2\n", "a = 1e_2\n", "a = +inf\n", "a = 01.5\n", "a = 1.5E+3\n", "a = -0.0\n",
	"a = 1e400\n", "a = 1e-400\n", "a = 0.1e-400\n", "a = 1e01\n", "a = 00.1\n", "a = -01\n", "a = 0e0\n", "a = 0.0e-0\n",
	"a = \"\t\"\n", "a = \"\x7f\"\n", "a = \"\\u0000\"\n", "é = 1\n", "a = 07:32\n", "= 1\n", "a=1\n", "a\t=\t1\n",
	"a = 1 b = 2\n", "[a]b = 1\n", "a = [1, \"x\"]\n", "a = [,]\n", "a = [1,,]\n", "a = {a=1,}\n", "a = {\na=1\n}\n",
	"a = \"\\xZZ\"\n", "a = \"\\ud800\"\n", "a = \"\\U00110000\"\n", "a = 1\n\ufeffb = 2\n", "\ufeffa = 1\n", "a = true1\n", "a = truee\n",
	"a = \"x\"#c\n", "[ a ]\n", "[a]]\n", "[[a] ]\n", "[ [a]]\n", "[a]\n[a]\n", "a.b.c = 1\n[a.b]\n", "a = 'x\n'\n",
	"a = 1_000_\n", "a = 0x\n", "a = 0xG\n", "a = 1e1_0\n", "a = 0x7FFFFFFFFFFFFFFF\n", "a = 0x8000000000000000\n",
	"a = 0o777777777777777777777\n", "a = 0b\n", "a = 0B1\n", "a = 0X1\n", "a = 1E2\n", "a = nan\n", "a = NaN\n", "a = Inf\n",
	"a = \"\"\"\n\"\"\"\n", "a = \"\"\"\r\nx\"\"\"\n", "a = '''\r\nx\r\ny'''\n", "a = \"\"\"x\ry\"\"\"\n", "a = \"\\r\\n\"\n",
	"a = { b = 1, b = 2 }\n", "a = { b.c = 1, b.d = 2 }\n", "a = { b.c = 1, b = 2 }\n", "a = {}\na.b = 1\n", "a = [{}]\n[[a]]\n",
	"\"a\" = 1\na = 2\n", "'a' = 1\n\"a\" = 2\n", "\"\\u0061\" = 1\na = 2\n", "a.\"b\".c = 1\n", "[\"a\".b]\n", "[a.\"\"]\n",
	"a = \"\\a\"\n", "a = \"\\/\"\n", "a = \"\\ \"\n", "a = [\n# c\n1 # d\n,2]\n", "a = [1\n,\n2\n]\n", "a = [ 1 2 ]\n",
	"a = 1\n[b]\nc = 1\n[b.c]\n", "a = 1979-05-27T07:32:00Z\n", "a = 1\n\n\n[b]  # x \n c = 2", "a = \"x\" \t # y\n",
	"[a]\n\tb = 1\n", "a = -\n", "a = +\n", "a = ++1\n", "a = 1.0_0\n", "a = 1_0.0\n", "a = 1._0\n", "a = 0.e1\n",
	"a = 1\x00\n", "\x00", "a = [1]x\n", "a = {b=1}x\n", "a = \"x\"y\n", "a = 'x'y\n", "a = 1x\n", "a = truex\n",
	"[a]\n[a.b]\n[a]\n", "[a.b]\n[a.b.c]\n[a.b]\n", "a = 1\r\n\r\nb = 2\r\n", "a = 1 \r\n", "[a] \r\n",
	"a.b = 1\n[a.c]\n", "[x]\na.b = 1\n[x.a.c]\n", "[x]\na.b = 1\n[x.a]\n", "[x.a]\n[x]\na.b = 1\n",
}

// TestDecoders checks that go-toml accepts nothing that BurntSushi rejects
// and decodes what both accept alike.
func TestDecoders(t *testing.T) {
	for _, s := range slices.Concat(decoderSeeds, decoderEdges) {
		checkDecoders(t, []byte(s))
	}
}

// TestFillEveryKey writes a configuration that sets every key of the raw
// structures, read from their toml tags as fill reads them, and checks
// that the fast path takes it and fills exactly what BurntSushi decodes:
// the fast path knows every key and every type of value there is.
func TestFillEveryKey(t *testing.T) {
	var b strings.Builder
	writeEveryKey(&b, "", reflect.TypeFor[rawConfig]())
	data := []byte(b.String())
	var want rawConfig
	md, err := toml.Decode(b.String(), &want)
	if err != nil {
		t.Fatalf("%s\n%v", data, err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("undecoded keys %v in\n%s", u, data)
	}
	m, ok := decodeFast(data)
	if !ok {
		t.Fatalf("go-toml declines\n%s", data)
	}
	var got rawConfig
	if !fill(reflect.ValueOf(&got).Elem(), m) {
		t.Fatalf("fill declines\n%s", data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fill differs from BurntSushi:\n got %+v\nwant %+v", got, want)
	}
	// Every key was written: each leaf of the structure is set.
	keys := map[string]bool{}
	for _, k := range md.Keys() {
		keys[k.String()] = true
	}
	for _, k := range []string{"include", "daemon.check_user", "service.backend.check.headers.k", "service.sorry", "service.check.jitter"} {
		if !keys[k] {
			t.Errorf("%s not written", k)
		}
	}
	if n := len(md.Keys()); n < 100 {
		t.Errorf("only %d keys written", n)
	}
}

// writeEveryKey writes a table of type t at path (the top level for ""):
// its values first, then its tables and arrays of tables.
func writeEveryKey(b *strings.Builder, path string, t reflect.Type) {
	var tables []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		k := f.Tag.Get("toml")
		ft := f.Type
		if ft.Kind() == reflect.Pointer && !reflect.PointerTo(ft.Elem()).Implements(unmarshalerType) {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct || ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			tables = append(tables, f)
			continue
		}
		fmt.Fprintf(b, "%s = %s\n", k, everyKeyValue(ft))
	}
	for _, f := range tables {
		k := f.Tag.Get("toml")
		if path != "" {
			k = path + "." + k
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice {
			fmt.Fprintf(b, "[[%s]]\n", k)
			writeEveryKey(b, k, ft.Elem())
			continue
		}
		fmt.Fprintf(b, "[%s]\n", k)
		writeEveryKey(b, k, ft)
	}
}

// everyKeyValue returns a TOML value for a field of type t.
func everyKeyValue(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		if reflect.PointerTo(t.Elem()).Implements(unmarshalerType) {
			return "1" // a duration or a number
		}
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return `"x"`
	case reflect.Int64:
		return "7"
	case reflect.Float64:
		return "0.5"
	case reflect.Bool:
		return "true"
	case reflect.Slice:
		return "[" + everyKeyValue(t.Elem()) + "]"
	case reflect.Map:
		return "{ k = " + everyKeyValue(t.Elem()) + " }"
	case reflect.Struct:
		var kv []string
		for i := range t.NumField() {
			kv = append(kv, t.Field(i).Tag.Get("toml")+" = "+everyKeyValue(t.Field(i).Type))
		}
		return "{ " + strings.Join(kv, ", ") + " }"
	}
	panic("unknown type " + t.String())
}

// TestTooManyKeys: the block parser hands go-toml a large block only when
// its key tracker's cost stays near that of a small block: a service of
// thousands of backends written as inline tables goes (and decodes as
// BurntSushi decodes it); many keys in one table, many table headers or
// an inline table of many keys do not.
func TestTooManyKeys(t *testing.T) {
	var backends strings.Builder
	backends.WriteString("[[service]]\nname = \"big\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [\n")
	for i := range 5000 {
		fmt.Fprintf(&backends, "  { address = \"10.0.%d.%d\", port = 8080, weight = %d },\n", i>>8, i&255, i%7+1)
	}
	backends.WriteString("]\n")
	// gen writes head, then each formatted with 0..n-1, then tail.
	gen := func(head, each, tail string, n int) string {
		var b strings.Builder
		b.WriteString(head)
		for i := range n {
			fmt.Fprintf(&b, each, i)
		}
		b.WriteString(tail)
		return b.String()
	}
	flat := func(n int) string { return gen("[[service]]\n", "k%d = 1\n", "", n) }
	headers := func(n int) string { return gen("[[service]]\n", "[service.t%d]\n", "", n) }
	inline := func(n int) string { return gen("[[service]]\nx = {", " k%d = 1,", " z = 1 }\n", n) }
	for _, c := range []struct {
		name string
		data string
		want bool
	}{
		{"a service of 5,000 inline backends", backends.String(), false},
		{"1,000 keys in one table", flat(1000), false},
		{"1,500 keys in one table", flat(1500), true},
		{"1,500 table headers", headers(1500), true},
		{"an inline table of 1,500 keys", inline(1500), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := tooManyKeys([]byte(c.data)); got != c.want {
				t.Errorf("tooManyKeys = %v, want %v (tracker cost %d)", got, c.want, trackerCost([]byte(c.data)))
			}
			checkDecoders(t, []byte(c.data))
		})
	}
	// The large service takes the fast path into the same configuration
	// the whole-file parse gives.
	var raw rawConfig
	if !decodeRaw([]byte(backends.String()), &raw, "service") || len(raw.Service) != 1 || len(raw.Service[0].Backend) != 5000 {
		t.Fatalf("the block of 5,000 backends did not decode on the block path")
	}
	cfg, err := Parse("big.toml", []byte(backends.String()))
	if err != nil {
		t.Fatal(err)
	}
	whole, err := parseWhole(Text{File: "big.toml", Data: []byte(backends.String())}, func(*Config) ([]includedText, error) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Spec, whole.Spec) {
		t.Error("the block parser and the whole-file parse differ on a service of 5,000 backends")
	}
}
