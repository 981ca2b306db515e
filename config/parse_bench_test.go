package config

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/test/bench"
)

// benchFixture returns the TOML of the benchmark fixture (test/bench) of
// n services of m backends, and the fixture.
func benchFixture(tb testing.TB, n, m int) ([]byte, *bench.Fixture) {
	tb.Helper()
	f, err := bench.New(bench.Spec{Services: n, Backends: m})
	if err != nil {
		tb.Fatal(err)
	}
	return fixtureTOML(tb, f), f
}

func fixtureTOML(tb testing.TB, f *bench.Fixture) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := f.WriteTOML(&buf, bench.Daemon{}); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkParse parses fixtures of `make bench` from scratch: 10,000 x
// 10 (5.3 MB) and 100 x 1,000 (4.4 MB, services of a thousand backends).
func BenchmarkParse(b *testing.B) {
	for _, sz := range []struct{ n, m int }{{10000, 10}, {100, 1000}} {
		b.Run(fmt.Sprintf("%dx%d", sz.n, sz.m), func(b *testing.B) {
			data, _ := benchFixture(b, sz.n, sz.m)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse("bench.toml", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseFromOneChange re-parses the 10,000 x 10 fixture after the
// weight of one backend of the middle service changed.
func BenchmarkParseFromOneChange(b *testing.B) { benchOneChange(b, 10000) }

// BenchmarkParseFromOneChange100 is BenchmarkParseFromOneChange for 100
// services: mostly the cost of decoding one block.
func BenchmarkParseFromOneChange100(b *testing.B) { benchOneChange(b, 100) }

// benchOneChange re-parses the fixture of n services of 10 backends after
// the weight of one backend of the middle service changed.
func benchOneChange(b *testing.B, n int) {
	data, f := benchFixture(b, n, 10)
	changed := fixtureTOML(b, f.WithWeight(n/2, 3, 7))
	prev, err := Parse("bench.toml", data)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		cfg, d, err := ParseFrom(prev, "bench.toml", changed)
		if err != nil {
			b.Fatal(err)
		}
		if d.Full || d.From != n/2 || d.OldTo != n/2+1 || d.NewTo != n/2+1 {
			b.Fatalf("delta = %+v", d)
		}
		// Alternate, so that every round parses from the last result.
		prev, changed = cfg, prev.Source()
	}
}

// BenchmarkLoadSplit loads the 10,000 x 10 fixture in the split layout of
// `make bench` (a main file including services.d/*.toml, 100 services to a
// file) from scratch.
func BenchmarkLoadSplit(b *testing.B) {
	_, f := benchFixture(b, 10000, 10)
	dir := b.TempDir()
	if _, err := f.WriteSplit(dir, bench.Daemon{}, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(filepath.Join(dir, "vipd.toml")); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseFromSplitOneChange re-parses one included file of the
// split 10,000 x 10 fixture after the weight of one backend of the middle
// service changed.
func BenchmarkParseFromSplitOneChange(b *testing.B) {
	const n = 10000
	_, f := benchFixture(b, n, 10)
	dir := b.TempDir()
	parts, err := f.WriteSplit(dir, bench.Daemon{}, 0)
	if err != nil {
		b.Fatal(err)
	}
	p := parts[n/2/bench.PerFile]
	var v1, v2 bytes.Buffer
	if err := f.WriteServices(&v1, p); err != nil {
		b.Fatal(err)
	}
	if err := f.WithWeight(n/2, 3, 7).WriteServices(&v2, p); err != nil {
		b.Fatal(err)
	}
	prev, err := Load(filepath.Join(dir, "vipd.toml"))
	if err != nil {
		b.Fatal(err)
	}
	file, changed := filepath.Join(dir, p.Name), v2.Bytes()
	b.ReportAllocs()
	for b.Loop() {
		cfg, d, err := ParseFrom(prev, file, changed)
		if err != nil {
			b.Fatal(err)
		}
		if d.Full || d.From != n/2 || d.OldTo != n/2+1 || d.NewTo != n/2+1 {
			b.Fatalf("delta = %+v", d)
		}
		prev, changed = cfg, prev.Texts()[1+n/2/bench.PerFile].Data
	}
}
