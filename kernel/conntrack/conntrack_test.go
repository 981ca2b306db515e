package conntrack

import (
	"encoding/hex"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
)

func TestFlowOf(t *testing.T) {
	c4 := ipvs.Connection{Proto: lb.TCP, Client: netip.MustParseAddrPort("192.0.2.2:40000"), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
		Backend: netip.MustParseAddrPort("203.0.113.3:8080"), State: "ESTABLISHED", Expires: 899 * time.Second}
	src4, src6 := netip.MustParseAddr("203.0.113.99"), netip.MustParseAddr("2001:db8::99")
	with := func(f func(*ipvs.Connection)) ipvs.Connection { c := c4; f(&c); return c }
	for _, tc := range []struct {
		name string
		c    ipvs.Connection
		src  netip.Addr
		ok   bool
		want Flow
	}{
		{"established", c4, src4, true, Flow{Proto: lb.TCP, Client: c4.Client, Virtual: c4.Virtual, Backend: c4.Backend, Source: src4, State: TCPEstablished, Timeout: 899 * time.Second}},
		{"client closing", with(func(c *ipvs.Connection) { c.State, c.Expires = "CLOSE_WAIT", 5*time.Second }), src4, true,
			Flow{Proto: lb.TCP, Client: c4.Client, Virtual: c4.Virtual, Backend: c4.Backend, Source: src4, State: TCPFinWait, Timeout: time.Minute}},
		{"udp", with(func(c *ipvs.Connection) { c.Proto, c.State = lb.UDP, "UDP" }), src4, true,
			Flow{Proto: lb.UDP, Client: c4.Client, Virtual: c4.Virtual, Backend: c4.Backend, Source: src4, Timeout: 899 * time.Second}},
		{"template", with(func(c *ipvs.Connection) { c.State = "NONE" }), src4, false, Flow{}},
		{"time wait", with(func(c *ipvs.Connection) { c.State = "TIME_WAIT" }), src4, false, Flow{}},
		{"sctp", with(func(c *ipvs.Connection) { c.Proto = lb.SCTP }), src4, false, Flow{}},
		{"source of the other family", c4, src6, false, Flow{}},
		{"no source", c4, netip.Addr{}, false, Flow{}},
		{"backend of the other family", with(func(c *ipvs.Connection) { c.Backend = netip.MustParseAddrPort("[2001:db8::3]:80") }), src4, false, Flow{}},
	} {
		got, ok := FlowOf(tc.c, tc.src)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: got %+v, %t; want %+v, %t", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestRequest checks the request's bytes against the layout of
// linux/netfilter/nfnetlink_conntrack.h, attribute by attribute.
func TestRequest(t *testing.T) {
	f := Flow{Proto: lb.TCP, Client: netip.MustParseAddrPort("192.0.2.2:40000"), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
		Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), State: TCPEstablished, Timeout: 90 * time.Second}
	b := f.request().Serialize()
	// netlink header: type CTNETLINK<<8|NEW, flags REQUEST|ACK|EXCL|CREATE.
	if typ, flags := le16(b[4:]), le16(b[6:]); typ != 0x100 || flags != 0x1|0x4|0x200|0x400 {
		t.Fatalf("header type %#x flags %#x", typ, flags)
	}
	// nfgenmsg: AF_INET, version 0.
	if b[16] != 2 || b[17] != 0 {
		t.Fatalf("nfgenmsg % x", b[16:20])
	}
	attrs := parse(t, b[20:])
	want := []string{
		"1/1/1 c0000202", "1/1/2 c633640a", "1/2/1 06", "1/2/2 9c40", "1/2/3 0050",
		"2/1/1 cb007103", "2/1/2 c0000202", "2/2/1 06", "2/2/2 1f90", "2/2/3 9c40",
		"3 0000000e",
		"4/1/1 03", "4/1/4 0808", "4/1/5 0808",
		"6/1 cb007163", "6/2 cb007163", "6/3/1 9c40", "6/3/2 9c40",
		"7 0000005a",
	}
	if len(attrs) != len(want) {
		t.Fatalf("attributes\n%q\nwant\n%q", attrs, want)
	}
	for i := range want {
		if attrs[i] != want[i] {
			t.Errorf("attribute %d: %s, want %s", i, attrs[i], want[i])
		}
	}
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

// parse flattens netlink attributes into "type/type/... hex" leaves,
// recursing into nested ones.
func parse(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	var walk func(prefix string, b []byte)
	walk = func(prefix string, b []byte) {
		for len(b) >= 4 {
			l, typ := int(le16(b)), le16(b[2:])
			if l < 4 || l > len(b) {
				t.Fatalf("attribute length %d of %d bytes", l, len(b))
			}
			name := prefix + strconv.Itoa(int(typ&^0x8000))
			if typ&0x8000 != 0 {
				walk(name+"/", b[4:l])
			} else {
				out = append(out, name+" "+hex.EncodeToString(b[4:l]))
			}
			b = b[(l+3)&^3:]
		}
	}
	walk("", b)
	return out
}
