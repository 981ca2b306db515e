package bgpproc

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzRead feeds the daemon's reader of the program's frames anything:
// it never panics, and what it takes is a message the wire has.
func FuzzRead(f *testing.F) {
	frame := func(data string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(data))), data...)
	}
	f.Add(frame(`{"id":1,"op":"reply"}`))
	f.Add(frame(`{"id":2,"op":"reply","peers":[{"Address":"192.0.2.254","ASN":65000,"State":"established","Routes":3}]}`))
	f.Add(frame(`{"op":"peer","peers":[{"Address":"2001:db8::1","State":"idle","BFDStatus":{"State":3,"Packets":{"Received":1}}}]}`))
	f.Add(frame(`{"id":3,"op":"set","routes":[{"Prefix":"198.51.100.1/32","Attrs":{"Communities":[1]}}]}`))
	f.Add(frame(`{"id":4,"op":"start","version":1,"start":{"ASN":65001,"Peers":[{"Password":"x"}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for {
			m, err := read(r)
			if err != nil {
				return
			}
			if err := m.check(); err != nil {
				t.Fatalf("read returned a message check refuses: %v", err)
			}
			if m.Op == opPeer && len(m.Peers) != 1 {
				t.Fatalf("a peer event with %d peers", len(m.Peers))
			}
		}
	})
}
