package health

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsAnswer answers a query from a tiny zone:
//
//	.               SOA
//	up.example.     A 127.0.0.1
//	empty.example.  (exists, no records)
//	fail.example.   SERVFAIL
//	big.example.    A, truncated over UDP
//	wrongid.example answered with another ID
//
// and NXDOMAIN for every other name.
func dnsAnswer(query []byte, udp bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	resp := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired},
		Questions: []dnsmessage.Question{q},
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}
	switch name := strings.ToLower(q.Name.String()); {
	case name == "." && q.Type == dnsmessage.TypeSOA:
		resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.SOAResource{
			NS: dnsmessage.MustNewName("ns.example."), MBox: dnsmessage.MustNewName("hostmaster.example."),
			Serial: 1, Refresh: 60, Retry: 60, Expire: 60, MinTTL: 60,
		}})
	case name == "up.example." && q.Type == dnsmessage.TypeA:
		resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}}})
	case name == "up.example." || name == "empty.example." || name == ".":
	case name == "fail.example.":
		resp.RCode = dnsmessage.RCodeServerFailure
	case name == "big.example." && udp:
		resp.Truncated = true
	case name == "big.example.":
		resp.Answers = append(resp.Answers, dnsmessage.Resource{Header: rh, Body: &dnsmessage.AResource{A: [4]byte{127, 0, 0, 2}}})
	case name == "wrongid.example.":
		resp.ID++
	default:
		resp.RCode = dnsmessage.RCodeNameError
	}
	out, err := resp.Pack()
	if err != nil {
		return nil
	}
	return out
}

// dnsServers starts the zone on loopback over UDP and TCP.
func dnsServers(t *testing.T) (udp, tcp netip.AddrPort) {
	t.Helper()
	udp = udpServer(t, "udp4", "127.0.0.1:0", func(q []byte) []byte { return dnsAnswer(q, true) })
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				out := dnsAnswer(q, false)
				binary.BigEndian.PutUint16(l[:], uint16(len(out)))
				_, _ = c.Write(append(l[:], out...))
			}()
		}
	}()
	return udp, ln.Addr().(*net.TCPAddr).AddrPort()
}

func TestDNSCheck(t *testing.T) {
	udp, tcp := dnsServers(t)
	tests := []struct {
		name string
		addr netip.AddrPort
		opts DNSOptions
		err  string
	}{
		{"root soa", udp, DNSOptions{}, ""},
		{"root soa answer", udp, DNSOptions{ExpectAnswer: true}, ""},
		{"a record", udp, DNSOptions{Name: "up.example", Type: "a", ExpectAnswer: true}, ""},
		{"a record over tcp", tcp, DNSOptions{Name: "up.example.", Type: "A", ExpectAnswer: true, TCP: true}, ""},
		{"nodata passes without expect", udp, DNSOptions{Name: "empty.example", Type: "A"}, ""},
		{"nodata fails with expect", udp, DNSOptions{Name: "empty.example", Type: "A", ExpectAnswer: true}, "has no A record"},
		{"wrong type", udp, DNSOptions{Name: "up.example", Type: "AAAA", ExpectAnswer: true}, "has no AAAA record"},
		{"nxdomain", udp, DNSOptions{Name: "missing.example", Type: "A"}, "NameError"},
		{"servfail over tcp", tcp, DNSOptions{Name: "fail.example", Type: "A", TCP: true}, "ServerFailure"},
		{"truncated", udp, DNSOptions{Name: "big.example", Type: "A", ExpectAnswer: true}, "truncated"},
		{"big over tcp", tcp, DNSOptions{Name: "big.example", Type: "A", ExpectAnswer: true, TCP: true}, ""},
		{"wrong id", udp, DNSOptions{Name: "wrongid.example", Type: "A"}, "does not answer the query"},
		{"closed port", closedUDPPort(t), DNSOptions{}, "port unreachable"},
		{"closed tcp port", closedTCPPort(t), DNSOptions{TCP: true}, "refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewDNSCheck(tt.addr, tt.opts, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Probe(probeCtx(t, 2*time.Second))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("probe: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("probe: %v, want error containing %q", err, tt.err)
			}
		})
	}
}

func TestDNSOptionsValidate(t *testing.T) {
	for _, o := range []DNSOptions{{Type: "BOGUS"}, {Name: strings.Repeat("a", 64) + ".example"}} {
		if _, err := NewDNSCheck(netip.MustParseAddrPort("127.0.0.1:53"), o, DialOptions{}); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
