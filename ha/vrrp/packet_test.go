package vrrp

import (
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParseKeepalivedCaptures decodes advertisements keepalived 2.2.7 sent
// (captured by TestNetnsKeepalivedPackets) and encodes them back to the
// same bytes, checksum included.
func TestParseKeepalivedCaptures(t *testing.T) {
	files, err := filepath.Glob("testdata/keepalived-*.txt")
	if err != nil || len(files) != 4 {
		t.Fatalf("captures %v, %v: want 4", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 3 {
				t.Fatalf("%d lines", len(lines))
			}
			addrs := strings.Fields(lines[1])
			src, dst := netip.MustParseAddr(addrs[0]), netip.MustParseAddr(addrs[1])
			raw, err := hex.DecodeString(lines[2])
			if err != nil {
				t.Fatal(err)
			}
			p, err := Parse(raw, src, dst)
			if err != nil {
				t.Fatal(err)
			}
			want := []netip.Addr{netip.MustParseAddr("10.19.0.100")}
			if src.Is6() {
				want = []netip.Addr{netip.MustParseAddr("fe80::19:100"), netip.MustParseAddr("fd19::100")}
			}
			if p.VRID != 19 || p.Priority != 200 || p.Interval != 10 || !slices.Equal(p.Addrs, want) {
				t.Errorf("decoded %+v", p)
			}
			again, err := p.Marshal(src, dst)
			if err != nil || !slices.Equal(again, raw) {
				t.Errorf("encoded % x, %v; want % x", again, err, raw)
			}
			// The checksum covers the pseudo-header: another destination
			// fails it.
			other := netip.MustParseAddr("10.19.0.9")
			if src.Is6() {
				other = netip.MustParseAddr("fd19::9")
			}
			if _, err := Parse(raw, src, other); !errors.Is(err, ErrChecksum) {
				t.Errorf("to %v: %v, want a checksum error", other, err)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	src, dst := netip.MustParseAddr("10.0.0.1"), Group4
	good, err := Packet{VRID: 7, Priority: 100, Interval: 100, Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.100")}}.Marshal(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	for name, c := range map[string]struct {
		b        []byte
		src, dst netip.Addr
		want     error
	}{
		"short":            {good[:7], src, dst, ErrShort},
		"truncated":        {good[:11], src, dst, ErrShort},
		"version 2":        {mod(func(b []byte) []byte { b[0] = 0x21; return b }), src, dst, ErrVersion},
		"type 2":           {mod(func(b []byte) []byte { b[0] = 0x32; return b }), src, dst, ErrType},
		"checksum":         {mod(func(b []byte) []byte { b[6]++; return b }), src, dst, ErrChecksum},
		"priority changed": {mod(func(b []byte) []byte { b[2]++; return b }), src, dst, ErrChecksum},
		"more addresses":   {mod(func(b []byte) []byte { b[3] = 2; return b }), src, dst, ErrShort},
		"family":           {good, src, Group6, ErrFamily},
		"no source":        {good, netip.Addr{}, dst, ErrFamily},
	} {
		if _, err := Parse(c.b, c.src, c.dst); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Reserved bits of the interval are ignored; bytes after the
	// addresses are covered by the checksum but not decoded.
	b := mod(func(b []byte) []byte { b[4] |= 0xf0; return b })
	fixChecksum(b, src, dst)
	if p, err := Parse(b, src, dst); err != nil || p.Interval != 100 {
		t.Errorf("reserved bits: %+v, %v", p, err)
	}
	b = append(slices.Clone(good), 0, 0, 0, 0)
	fixChecksum(b, src, dst)
	if p, err := Parse(b, src, dst); err != nil || len(p.Addrs) != 1 {
		t.Errorf("trailing bytes: %+v, %v", p, err)
	}
}

func fixChecksum(b []byte, src, dst netip.Addr) {
	b[6], b[7] = 0, 0
	c := checksum(b, src, dst)
	b[6], b[7] = byte(c>>8), byte(c)
}

func TestMarshalRejects(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fe80::1")
	many := make([]netip.Addr, 256)
	for i := range many {
		many[i] = v4
	}
	for name, c := range map[string]struct {
		p        Packet
		src, dst netip.Addr
	}{
		"interval":       {Packet{Interval: 4096, Addrs: []netip.Addr{v4}}, v4, Group4},
		"mixed families": {Packet{Interval: 1, Addrs: []netip.Addr{v6}}, v4, Group4},
		"mapped address": {Packet{Interval: 1, Addrs: []netip.Addr{netip.AddrFrom16(v4.As16())}}, v6, Group6},
		"src and dst":    {Packet{Interval: 1, Addrs: []netip.Addr{v4}}, v4, Group6},
		"256 addresses":  {Packet{Interval: 1, Addrs: many}, v4, Group4},
	} {
		if _, err := c.p.Marshal(c.src, c.dst); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	for _, c := range []struct {
		src, dst netip.Addr
		p        Packet
	}{
		{netip.MustParseAddr("192.0.2.1"), Group4, Packet{VRID: 1, Priority: 255, Interval: MaxInterval, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}}},
		{netip.MustParseAddr("fe80::1"), Group6, Packet{VRID: 255, Priority: 0, Interval: 1, Addrs: []netip.Addr{netip.MustParseAddr("fe80::10"), netip.MustParseAddr("2001:db8::10")}}},
		{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), Packet{VRID: 9, Priority: 1, Interval: 10, Addrs: []netip.Addr{}}},
	} {
		b, err := c.p.Marshal(c.src, c.dst)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(b, c.src, c.dst)
		if err != nil {
			t.Fatal(err)
		}
		if got.VRID != c.p.VRID || got.Priority != c.p.Priority || got.Interval != c.p.Interval || !slices.Equal(got.Addrs, c.p.Addrs) {
			t.Errorf("%+v became %+v", c.p, got)
		}
	}
}

// FuzzParse checks that Parse never panics, and that what it accepts
// encodes back to the bytes it decoded (less reserved bits and trailing
// bytes).
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/keepalived-*.txt")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		raw, _ := hex.DecodeString(lines[2])
		f.Add(raw, strings.Fields(lines[1])[0] == "10.19.0.2")
	}
	f.Fuzz(func(t *testing.T, in []byte, v4 bool) {
		b := slices.Clone(in)
		src, dst := netip.MustParseAddr("fd19::2"), Group6
		if v4 {
			src, dst = netip.MustParseAddr("10.19.0.2"), Group4
		}
		// Half the inputs get a right checksum, so that the decoder's
		// later checks see them.
		if len(b) >= headerLen && b[1]&1 == 0 {
			fixChecksum(b, src, dst)
		}
		p, err := Parse(b, src, dst)
		if err != nil {
			return
		}
		again, err := p.Marshal(src, dst)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", p, err)
		}
		n := len(again)
		want := slices.Clone(b[:n])
		want[4] &= 0x0f
		if len(b) == n && b[4]&0xf0 == 0 && !slices.Equal(again, want) {
			t.Fatalf("% x decoded to %+v, encoded to % x", b, p, again)
		}
		if !slices.Equal(again[:6], want[:6]) || !slices.Equal(again[8:], want[8:]) {
			t.Fatalf("% x decoded to %+v, encoded to % x", b, p, again)
		}
	})
}
