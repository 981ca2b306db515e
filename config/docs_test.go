package config

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/BurntSushi/toml"
)

// referenceFile is the configuration reference, relative to this package.
const referenceFile = "../docs/configuration.md"

// TestReferenceListsEveryKey checks that docs/configuration.md documents
// exactly the keys the decoder accepts: a key of the raw structures that
// no row of the reference names fails, and so does a key the reference
// names that the decoder would refuse as unknown.
func TestReferenceListsEveryKey(t *testing.T) {
	accepted := acceptedKeys()
	documented, errs := documentedKeys(t, referenceFile)
	for _, e := range errs {
		t.Error(e)
	}
	for _, k := range slices.Sorted(maps.Keys(accepted)) {
		if _, ok := documented[k]; !ok {
			t.Errorf("%s: key %s is accepted by the decoder but not documented (add a row to the table of [%s])",
				referenceFile, k, tableOf(k))
		}
	}
	types := keyTypes()
	for _, k := range slices.Sorted(maps.Keys(documented)) {
		d := documented[k]
		switch {
		case !accepted[k]:
			t.Errorf("%s:%d: key %s is documented but the decoder refuses it", referenceFile, d.line, k)
		case d.typ != types[k]:
			t.Errorf("%s:%d: key %s is documented as %q but the decoder takes %q", referenceFile, d.line, k, d.typ, types[k])
		}
	}
	if len(accepted) < 100 {
		t.Errorf("only %d keys found in the raw structures", len(accepted))
	}
}

// TestAcceptedKeysAreTheDecoders checks acceptedKeys against the decoder
// itself: a file that sets every key the structures hold decodes with no
// key left over, and the leaves the decoder saw are exactly those keys.
func TestAcceptedKeysAreTheDecoders(t *testing.T) {
	var b strings.Builder
	writeEveryKey(&b, "", reflect.TypeFor[rawConfig]())
	var raw rawConfig
	md, err := toml.Decode(b.String(), &raw)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("the decoder refuses %v", u)
	}
	seen := map[string]bool{}
	for _, k := range md.Keys() {
		if p, leaf := normalKey(reflect.TypeFor[rawConfig](), k); leaf {
			seen[p] = true
		}
	}
	want := acceptedKeys()
	if !maps.Equal(seen, want) {
		t.Errorf("decoded leaves %v\ndiffer from the structures' keys %v", slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(want)))
	}
	// A key the structures do not hold is refused, so a documented key
	// that acceptedKeys lacks would be refused too.
	md, err = toml.Decode("[daemon]\nno_such_key = 1\n", &raw)
	if err != nil || len(md.Undecoded()) != 1 {
		t.Errorf("an unknown key: err %v, undecoded %v", err, md.Undecoded())
	}
}

// acceptedKeys returns the dotted path of every key the decoder accepts,
// read from the toml tags of the raw structures: tables and arrays of
// tables are walked, a map of tables is written NAME (bgp.service.NAME.med),
// and a map of values (headers) is one key.
func acceptedKeys() map[string]bool {
	out := map[string]bool{}
	for k := range keyTypes() {
		out[k] = true
	}
	return out
}

// keyTypes returns the type of every key acceptedKeys returns, in the
// words of the reference's type column.
func keyTypes() map[string]string {
	out := map[string]string{}
	walkKeys(reflect.TypeFor[rawConfig](), "", out)
	return out
}

// typeNames are the reference's words for the raw structures' types.
var typeNames = map[reflect.Type]string{
	reflect.TypeFor[string]():            "string",
	reflect.TypeFor[int64]():             "integer",
	reflect.TypeFor[float64]():           "number",
	reflect.TypeFor[number]():            "number",
	reflect.TypeFor[bool]():              "boolean",
	reflect.TypeFor[duration]():          "duration",
	reflect.TypeFor[[]string]():          "array of strings",
	reflect.TypeFor[map[string]string](): "table of strings",
}

// typeName returns the reference's word for a key's type.
func typeName(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n, ok := typeNames[t]; ok {
		return n
	}
	return "unknown type " + t.String()
}

func walkKeys(t reflect.Type, prefix string, out map[string]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if sub, table := tableType(f.Type); table {
			walkKeys(sub.t, path+sub.suffix, out)
			continue
		}
		out[path] = typeName(f.Type)
	}
}

// tableType reports whether a field of type t is a table (a struct, an
// array of them or a map of them) and, if so, the struct type and what
// the path gains before its keys (".NAME" for a map).
func tableType(t reflect.Type) (sub struct {
	t      reflect.Type
	suffix string
}, table bool) {
	if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return sub, false
	}
	if t.Kind() == reflect.Pointer {
		return tableType(t.Elem())
	}
	switch {
	case t.Kind() == reflect.Struct:
		sub.t = t
		return sub, true
	case t.Kind() == reflect.Slice:
		s, ok := tableType(t.Elem())
		return s, ok && s.suffix == ""
	case t.Kind() == reflect.Map:
		s, ok := tableType(t.Elem())
		if ok && s.suffix == "" {
			s.suffix = ".NAME"
			return s, true
		}
	}
	return sub, false
}

// normalKey maps a key the decoder saw to the form of acceptedKeys, and
// reports whether it is a leaf (not a table).
func normalKey(t reflect.Type, k toml.Key) (string, bool) {
	var parts []string
	for i := 0; i < len(k); i++ {
		f, ok := fieldByTag(t, k[i])
		if !ok {
			return strings.Join(append(parts, k[i:]...), "."), true
		}
		parts = append(parts, k[i])
		sub, table := tableType(f.Type)
		if !table {
			// A value, or a map of values (headers.NAME): the key.
			return strings.Join(parts, "."), true
		}
		if sub.suffix != "" {
			if i+1 == len(k) {
				return strings.Join(parts, "."), false
			}
			parts = append(parts, "NAME")
			i++
		}
		t = sub.t
	}
	return strings.Join(parts, "."), false
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if n, _, _ := strings.Cut(f.Tag.Get("toml"), ","); n == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

var (
	headingRe = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*$`)
	codeRe    = regexp.MustCompile("`([^`]+)`")
	tableRe   = regexp.MustCompile(`^\[\[?([A-Za-z0-9_.]+)\]\]?$`)
	keyRe     = regexp.MustCompile(`^[a-z0-9_]+$`)
)

// docKey is a key as the reference documents it: the line of its row
// and the type the row gives it.
type docKey struct {
	line int
	typ  string
}

// documentedKeys reads the reference: a heading names the tables its
// rows belong to in backticks (`[daemon]`, `[[bgp.peer]]`,
// `[bgp.service.NAME]`; "Top level" for keys outside any table), and
// every table headed "key | type" names keys in backticks in its first
// column and their type in its second: one type for all the row's keys,
// or one per key, separated by commas. It returns each key's dotted path
// with its row's line and type, and the format's errors.
func documentedKeys(t *testing.T, file string) (map[string]docKey, []string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]docKey{}
	var errs []string
	var tables []string // nil: the heading names no table
	heading := ""
	inFence, inComment, inKeyTable := false, false, false
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		trim := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trim, "```"):
			inFence = !inFence
			continue
		case inFence:
			continue
		case inComment:
			inComment = !strings.Contains(trim, "-->")
			continue
		case strings.HasPrefix(trim, "<!--"):
			inComment = !strings.Contains(trim, "-->")
			continue
		}
		if m := headingRe.FindStringSubmatch(line); m != nil {
			heading, tables, inKeyTable = m[2], nil, false
			for _, c := range codeRe.FindAllStringSubmatch(m[2], -1) {
				if tm := tableRe.FindStringSubmatch(c[1]); tm != nil {
					tables = append(tables, tm[1])
				}
			}
			if tables == nil && strings.HasPrefix(m[2], "Top level") {
				tables = []string{""}
			}
			continue
		}
		if !strings.HasPrefix(trim, "|") {
			inKeyTable = false
			continue
		}
		cells := strings.Split(strings.Trim(trim, "|"), "|")
		first := strings.TrimSpace(cells[0])
		switch {
		case first == "key":
			inKeyTable = true
			if len(cells) < 2 || strings.TrimSpace(cells[1]) != "type" {
				errs = append(errs, fmt.Sprintf("%s:%d: a table of keys without a type column second", file, n))
			}
			if tables == nil {
				errs = append(errs, fmt.Sprintf("%s:%d: a table of keys under the heading %q, which names no table (such as `[daemon]`)", file, n, heading))
			}
			continue
		case !inKeyTable || strings.HasPrefix(first, "---") || tables == nil:
			continue
		}
		spans := codeRe.FindAllStringSubmatch(first, -1)
		if len(spans) == 0 {
			errs = append(errs, fmt.Sprintf("%s:%d: the row names no key in backticks", file, n))
		}
		var typs []string
		if len(cells) > 1 {
			typs = strings.Split(strings.TrimSpace(cells[1]), ", ")
		}
		if len(typs) != 1 && len(typs) != len(spans) {
			errs = append(errs, fmt.Sprintf("%s:%d: %d keys and %d types: give one type for all or one per key", file, n, len(spans), len(typs)))
			continue
		}
		for j, c := range spans {
			if !keyRe.MatchString(c[1]) {
				errs = append(errs, fmt.Sprintf("%s:%d: %q in the key column is not a key", file, n, c[1]))
				continue
			}
			for _, tb := range tables {
				k := c[1]
				if tb != "" {
					k = tb + "." + k
				}
				if prev, dup := out[k]; dup {
					errs = append(errs, fmt.Sprintf("%s:%d: key %s is documented twice (also at line %d)", file, n, k, prev.line))
				}
				out[k] = docKey{n, typs[min(j, len(typs)-1)]}
			}
		}
	}
	return out, errs
}

// tableOf returns the table a dotted key belongs to ("" at the top).
func tableOf(k string) string {
	i := strings.LastIndexByte(k, '.')
	if i < 0 {
		return ""
	}
	return k[:i]
}

// TestDocumentParser checks the reference's parser on a small document:
// nested and repeated tables, several keys to a row, a key table under a
// heading without a table, a row that names no key, and code blocks and
// comments left alone.
func TestDocumentParser(t *testing.T) {
	doc := "# Reference\n\n## Top level\n\n| key | type | default |\n| --- | --- | --- |\n| `include` | array of strings | x |\n\n" +
		"```toml\n| key | type |\n| `not_read` | string |\n```\n\n<!-- | key | type |\n| `nor_this` | string | -->\n\n" +
		"## `[bgp]`\n\n| key | type | d |\n|---|---|---|\n| `asn`, `router_id` | integer, string | — |\n| `a`, `b`, `c` | x, y | |\n\n" +
		"### `[bgp.service.NAME]`\n\n| key | type | d |\n| --- | --- | --- |\n| `med` | integer | |\n\n" +
		"### `[service.check]` and `[service.backend.check]`\n\n| key | type | d |\n| --- | --- | --- |\n| `type`, `path` | string | |\n| no key | | |\n| `a b` | string | |\n\n" +
		"### Notes\n\n| key | d |\n| --- | --- |\n| `x` | |\n"
	f := filepath.Join(t.TempDir(), "ref.md")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	got, errs := documentedKeys(t, f)
	want := map[string]string{
		"bgp.asn": "integer", "bgp.router_id": "string", "bgp.service.NAME.med": "integer", "include": "array of strings",
		"service.backend.check.path": "string", "service.backend.check.type": "string", "service.check.path": "string", "service.check.type": "string",
	}
	gotTypes := map[string]string{}
	for k, d := range got {
		gotTypes[k] = d.typ
	}
	if !maps.Equal(gotTypes, want) {
		t.Errorf("keys %v, want %v", gotTypes, want)
	}
	wantErrs := []string{"3 keys and 2 types", "the row names no key", `"a b" in the key column is not a key`,
		"without a type column", `under the heading "Notes", which names no table`}
	if len(errs) != len(wantErrs) {
		t.Fatalf("errors %q, want %d", errs, len(wantErrs))
	}
	for i, w := range wantErrs {
		if !strings.Contains(errs[i], w) {
			t.Errorf("error %q lacks %q", errs[i], w)
		}
	}
}

// TestDocsLinks checks every relative link of README.md, docs/*.md and
// the benchmark's history: the file it names exists, and an anchor into
// a markdown file matches one of its headings.
func TestDocsLinks(t *testing.T) {
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md", "../test/bench/results/history.md"}, files...)
	if len(files) < 3 {
		t.Fatalf("found only %v", files)
	}
	n := 0
	for _, f := range files {
		for _, l := range links(t, f) {
			n++
			if msg := checkLink(t, f, l.target); msg != "" {
				t.Errorf("%s:%d: link %s: %s", strings.TrimPrefix(f, "../"), l.line, l.target, msg)
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d links found", n)
	}
}

// TestDocsLinksRefuse checks that the link checker refuses a missing
// file and a missing anchor, in the same file and in another.
func TestDocsLinksRefuse(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.md")
	b := filepath.Join(dir, "b.md")
	if err := os.WriteFile(a, []byte("# A\n\n## Some `[table]`, and more\n\n[x](b.md#no) [y](#nope) [z](c.md) [w](b.md#b-title) [v](#some-table-and-more) [u](https://example.com/x)\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte("# B title\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, l := range links(t, a) {
		if checkLink(t, a, l.target) != "" {
			bad = append(bad, l.target)
		}
	}
	if want := []string{"b.md#no", "#nope", "c.md"}; !slices.Equal(bad, want) {
		t.Errorf("refused %v, want %v", bad, want)
	}
}

type link struct {
	line   int
	target string
}

var linkRe = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// links returns the links of a markdown file outside its code blocks.
func links(t *testing.T, file string) []link {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []link
	inFence := false
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range linkRe.FindAllStringSubmatch(line, -1) {
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// checkLink returns why a link of file does not resolve, or "".
func checkLink(t *testing.T, file, target string) string {
	t.Helper()
	if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, anchor, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), path)
		if _, err := os.Stat(dest); err != nil {
			return "no such file"
		}
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(dest, ".md") {
		return "an anchor into a file that is not markdown"
	}
	if !slices.Contains(anchors(t, dest), anchor) {
		return fmt.Sprintf("no heading of %s has the anchor #%s", filepath.Base(dest), anchor)
	}
	return ""
}

// anchors returns the anchors GitHub gives a markdown file's headings:
// lower case, punctuation dropped, spaces as hyphens, a repeated one
// numbered from -1.
func anchors(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		m := headingRe.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[2]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if c := seen[a]; c > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, c))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}
