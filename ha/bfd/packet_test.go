package bfd

import (
	"errors"
	"testing"
	"time"
)

func TestPacketRoundTrip(t *testing.T) {
	in := Packet{Diag: DiagTimeExpired, State: Up, Poll: true, DetectMult: 3, MyDisc: 0xdeadbeef, YourDisc: 42,
		DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond, RequiredMinEchoRx: 0}
	b := in.Marshal()
	if len(b) != 24 || b[0] != 0x21 || b[1] != 0xe0 || b[3] != 24 {
		t.Fatalf("wire form % x", b)
	}
	out, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("round trip %+v, want %+v", out, in)
	}
	// A longer datagram than the length field is taken (trailing bytes
	// ignored).
	if _, err := Unmarshal(append(b, 0, 0)); err != nil {
		t.Errorf("trailing bytes: %v", err)
	}
}

// TestPacketRefusals: every check of RFC 5880 §6.8.6 that needs no
// session drops the packet.
func TestPacketRefusals(t *testing.T) {
	good := (&Packet{State: Init, DetectMult: 3, MyDisc: 1, YourDisc: 2, DesiredMinTx: time.Second}).Marshal()
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tt := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", good[:23], ErrShort},
		{"empty", nil, ErrShort},
		{"version 0", edit(func(b []byte) []byte { b[0] &^= 0xe0; return b }), ErrVersion},
		{"version 2", edit(func(b []byte) []byte { b[0] = 2<<5 | b[0]&0x1f; return b }), ErrVersion},
		{"length 23", edit(func(b []byte) []byte { b[3] = 23; return b }), ErrLengthField},
		{"length past the datagram", edit(func(b []byte) []byte { b[3] = 26; return b }), ErrShort},
		{"auth bit", edit(func(b []byte) []byte { b[1] |= 0x04; return b }), ErrAuth},
		{"multipoint", edit(func(b []byte) []byte { b[1] |= 0x01; return b }), ErrMultipoint},
		{"detect mult 0", edit(func(b []byte) []byte { b[2] = 0; return b }), ErrDetectMult},
		{"my disc 0", edit(func(b []byte) []byte { clear(b[4:8]); return b }), ErrMyDisc},
		{"your disc 0 in init", edit(func(b []byte) []byte { clear(b[8:12]); return b }), ErrYourDisc},
		{"your disc 0 in up", edit(func(b []byte) []byte { clear(b[8:12]); b[1] = byte(Up) << 6; return b }), ErrYourDisc},
		{"poll and final", edit(func(b []byte) []byte { b[1] |= 0x30; return b }), ErrPollFinal},
	} {
		if _, err := Unmarshal(tt.b); !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
	}
	// Your discriminator 0 is fine from a peer that is down.
	down := edit(func(b []byte) []byte { clear(b[8:12]); b[1] = byte(Down) << 6; return b })
	if _, err := Unmarshal(down); err != nil {
		t.Errorf("down with your disc 0: %v", err)
	}
}

func FuzzUnmarshal(f *testing.F) {
	f.Add((&Packet{State: Up, DetectMult: 3, MyDisc: 1, YourDisc: 2}).Marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Unmarshal(b)
		if err != nil {
			return
		}
		q, err := Unmarshal(p.Marshal())
		if err != nil || q.State != p.State || q.MyDisc != p.MyDisc || q.YourDisc != p.YourDisc {
			t.Fatalf("a packet taken does not round-trip: %+v → %+v, %v", p, q, err)
		}
	})
}
