package config

import (
	"bytes"
	"reflect"
	"slices"
	"sync"

	"github.com/BurntSushi/toml"
	gotoml "github.com/pelletier/go-toml/v2"
)

// Two TOML libraries: the block parser decodes each block (the preamble,
// each [[service]]) with github.com/pelletier/go-toml/v2 into generic
// values (tables as map[string]any, arrays as []any, integers int64,
// floats float64) and fills the raw structures from those here. BurntSushi
// (github.com/BurntSushi/toml) is the decoder of record: the whole-file
// parse (parseWhole) that reports every error with its line uses it, and
// so does every block that the fast path declines. go-toml stays because
// it decodes a valid file several times faster, with a fraction of the
// memory, which the cold start of a large configuration needs
// (BenchmarkParse; BurntSushi's lexer passes every token through a
// channel).
//
// The keys are those of the raw structures' toml tags, read by reflection
// (fill): there is no second list of them. The filling is strict: it
// takes each key by its exact name and each value by the one type
// BurntSushi takes for its field, and it gives up on anything else (a key
// spelt in another case, which BurntSushi matches to a field, a value of
// another type, an unknown key, a date), which BurntSushi then decodes.
// What the two libraries accept differs at the edges: BurntSushi v1.6.0
// accepts some invalid TOML that go-toml rejects (a table header for a
// table already defined by dotted keys, a key that extends an inline
// table, a byte order mark), which then takes the BurntSushi path. The
// other way round, go-toml accepting what BurntSushi rejects or decoding a
// value differently, would make the block parser diverge from the whole
// file: TestDecoders and FuzzDecoders look for it, and TestFillEveryKey
// checks that every key of the raw structures takes the fast path.

// decodeFast decodes one block with go-toml into generic values. It
// declines a block that would cost go-toml too much (see tooManyKeys).
func decodeFast(data []byte) (map[string]any, bool) {
	if tooManyKeys(data) {
		return nil, false
	}
	var m map[string]any
	if err := gotoml.Unmarshal(data, &m); err != nil {
		return nil, false
	}
	return m, true
}

// decodeRaw decodes one block into out, a pointer to a raw structure:
// with go-toml when fill takes what it decodes, else, for a block that is
// not large (see largeBlock), with BurntSushi. It reports false for a
// block go-toml declines or cannot fill that is large, when BurntSushi
// fails or leaves keys undecoded, and for a key at the top level other
// than those of top, spelt exactly so: the decoder also matches keys such
// as "Service" to fields, which the whole file could spell both ways.
func decodeRaw(data []byte, out any, top ...string) bool {
	if m, ok := decodeFast(data); ok {
		rv := reflect.ValueOf(out).Elem()
		if onlyKeys(m, top) && fill(rv, m) {
			return true
		}
		rv.SetZero()
	}
	if largeBlock(data) {
		// BurntSushi is linear but costs so much memory per key that
		// decoding a large block and then, when it fails, the whole file
		// would cost twice what the whole-file parse costs once.
		return false
	}
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(out)
	if err != nil || len(md.Undecoded()) > 0 {
		return false
	}
	return !slices.ContainsFunc(md.Keys(), func(k toml.Key) bool { return !slices.Contains(top, k[0]) })
}

// onlyKeys reports whether every key of m is one of keys.
func onlyKeys(m map[string]any, keys []string) bool {
	for k := range m {
		if !slices.Contains(keys, k) {
			return false
		}
	}
	return true
}

// largeBlock reports whether a block may hold more than blockMaxKeys keys,
// tables and arrays, counting each "=", "[" and "{": a cheap bound, true
// of every block whose decoding could cost more than its size.
func largeBlock(data []byte) bool {
	return bytes.Count(data, []byte("="))+bytes.Count(data, []byte("["))+bytes.Count(data, []byte("{")) > blockMaxKeys
}

// tooManyKeys reports whether go-toml's key tracker could cost more than
// blockMaxCost on a block (see trackerCost): a block of many keys in one
// table, many table headers or an inline table of many keys. A service of
// a thousand backends written as inline tables passes; the block parser
// leaves the others to the whole-file parse, which decodes them once,
// with BurntSushi.
func tooManyKeys(data []byte) bool {
	return largeBlock(data) && trackerCost(data) > blockMaxCost
}

// blockMaxKeys is the size of a block below which go-toml's cost is never
// in question: a service with 300 backends written as inline tables
// counts about 900 (an "=" for each key, a "{" for each backend).
// blockMaxCost bounds go-toml's key tracker on larger blocks, about what
// it costs on a block of blockMaxKeys keys in one table.
const (
	blockMaxKeys = 1024
	blockMaxCost = 2 * blockMaxKeys * blockMaxKeys
)

var unmarshalerType = reflect.TypeFor[toml.Unmarshaler]()

// fill sets rv, a raw structure, from v, a value go-toml decoded, as
// BurntSushi would decode it. It reports false for anything it does not
// take (see above); rv is then partly set.
func fill(rv reflect.Value, v any) bool { return fillerOf(rv.Type())(rv, v) }

// A filler sets a value of one type from a value go-toml decoded, or
// reports false.
type filler func(rv reflect.Value, v any) bool

// fillers holds the filler of each type, made once: the raw structures
// are few.
var fillers sync.Map // reflect.Type -> filler

// fillerOf returns the filler of values of type t.
func fillerOf(t reflect.Type) filler {
	if f, ok := fillers.Load(t); ok {
		return f.(filler)
	}
	f := makeFiller(t)
	fillers.Store(t, f)
	return f
}

func makeFiller(t reflect.Type) filler {
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		// A type of its own (duration, number): only scalars, which
		// both decoders give alike, and only what it accepts.
		return func(rv reflect.Value, v any) bool {
			switch v.(type) {
			case int64, float64, string, bool:
				return rv.Addr().Interface().(toml.Unmarshaler).UnmarshalTOML(v) == nil
			}
			return false
		}
	}
	switch t.Kind() {
	case reflect.Pointer:
		elem := fillerOf(t.Elem())
		return func(rv reflect.Value, v any) bool {
			p := reflect.New(t.Elem())
			if !elem(p.Elem(), v) {
				return false
			}
			rv.Set(p)
			return true
		}
	case reflect.Struct:
		type field struct {
			i int
			f filler
		}
		fields := map[string]field{}
		for i := range t.NumField() {
			if k := t.Field(i).Tag.Get("toml"); k != "" && k != "-" {
				fields[k] = field{i, fillerOf(t.Field(i).Type)}
			}
		}
		return func(rv reflect.Value, v any) bool {
			m, ok := v.(map[string]any)
			if !ok {
				return false
			}
			for k, e := range m {
				f, ok := fields[k]
				if !ok || !f.f(rv.Field(f.i), e) {
					return false
				}
			}
			return true
		}
	case reflect.Slice:
		// An empty array is an empty, not a nil, slice, as BurntSushi
		// makes it.
		elem := fillerOf(t.Elem())
		return func(rv reflect.Value, v any) bool {
			list, ok := v.([]any)
			if !ok {
				return false
			}
			s := reflect.MakeSlice(t, len(list), len(list))
			for i, e := range list {
				if !elem(s.Index(i), e) {
					return false
				}
			}
			rv.Set(s)
			return true
		}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			break
		}
		elem := fillerOf(t.Elem())
		return func(rv reflect.Value, v any) bool {
			m, ok := v.(map[string]any)
			if !ok {
				return false
			}
			out := reflect.MakeMapWithSize(t, len(m))
			for k, e := range m {
				ev := reflect.New(t.Elem()).Elem()
				if !elem(ev, e) {
					return false
				}
				out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), ev)
			}
			rv.Set(out)
			return true
		}
	case reflect.String:
		return func(rv reflect.Value, v any) bool {
			s, ok := v.(string)
			rv.SetString(s)
			return ok
		}
	case reflect.Int64:
		return func(rv reflect.Value, v any) bool {
			n, ok := v.(int64)
			rv.SetInt(n)
			return ok
		}
	case reflect.Float64:
		// BurntSushi also takes an integer for a float; leave that to it.
		return func(rv reflect.Value, v any) bool {
			f, ok := v.(float64)
			rv.SetFloat(f)
			return ok
		}
	case reflect.Bool:
		return func(rv reflect.Value, v any) bool {
			b, ok := v.(bool)
			rv.SetBool(b)
			return ok
		}
	}
	return func(reflect.Value, any) bool { return false }
}
