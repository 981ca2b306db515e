package conntrack

import (
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestTrackKernel makes entries in the kernel, IPv4 and IPv6, and reads
// them back: the reply direction is translated to the SNAT source at the
// client's port, and a second Track finds them there.
func TestTrackKernel(t *testing.T) {
	nstest.Need(t)
	flows := []Flow{
		{Proto: lb.TCP, Client: netip.MustParseAddrPort("192.0.2.2:40000"), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
			Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), State: TCPEstablished, Timeout: time.Minute},
		{Proto: lb.UDP, Client: netip.MustParseAddrPort("[2001:db8::2]:40001"), Virtual: netip.MustParseAddrPort("[2001:db8:100::10]:53"),
			Backend: netip.MustParseAddrPort("[2001:db8:1::3]:5353"), Source: netip.MustParseAddr("2001:db8:1::99"), Timeout: time.Minute},
	}
	forget(t, flows)
	r, err := Tracker{}.Track(flows, Keep)
	if err != nil || r != (Result{Created: 2}) {
		t.Fatalf("Track: %+v, %v", r, err)
	}
	for _, f := range flows {
		family := netlink.InetFamily(unix.AF_INET)
		if f.Client.Addr().Is6() {
			family = unix.AF_INET6
		}
		list, err := netlink.ConntrackTableList(netlink.ConntrackTable, family)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range list {
			fwd, rev := e.Forward, e.Reverse
			if !fwd.SrcIP.Equal(f.Client.Addr().AsSlice()) || fwd.SrcPort != f.Client.Port() {
				continue
			}
			found = true
			if !fwd.DstIP.Equal(f.Virtual.Addr().AsSlice()) || fwd.DstPort != f.Virtual.Port() || fwd.Protocol != protoNumber(f.Proto) {
				t.Errorf("%s: original direction %s", f.Client, e)
			}
			if !rev.SrcIP.Equal(f.Backend.Addr().AsSlice()) || rev.SrcPort != f.Backend.Port() ||
				!rev.DstIP.Equal(f.Source.AsSlice()) || rev.DstPort != f.Client.Port() {
				t.Errorf("%s: reply direction not translated to %s port %d: %s", f.Client, f.Source, f.Client.Port(), e)
			}
		}
		if !found {
			t.Errorf("%s: no entry in %d", f.Client, len(list))
		}
	}
	r, err = Tracker{}.Track(flows, Keep)
	if err != nil || r != (Result{Existing: 2}) {
		t.Fatalf("second Track: %+v, %v", r, err)
	}
}

// TestTrackTraffic sends a backend's UDP answer to the SNAT source through
// a node that tracks the connection: the node translates it back to the
// client, as the peer that made the connection would have.
func TestTrackTraffic(t *testing.T) {
	nstest.Need(t)
	client := nstest.NewPeer(t, "vipd-ct-c0", "vipd-ct-c1")
	backend := nstest.NewPeer(t, "vipd-ct-b0", "vipd-ct-b1")
	for _, s := range [][2]string{{"vipd-ct-c0", "192.0.2.1/24"}, {"vipd-ct-b0", "203.0.113.1/24"}, {"vipd-ct-b0", "203.0.113.99/32"}} {
		if err := nstest.AddAddr(s[0], s[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := nstest.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	// The kernel tracks connections and translates addresses only in a
	// namespace whose rules need it: vipd's SNAT rule, and a nat chain
	// at PREROUTING, where the answers are translated back.
	for _, rule := range [][]string{
		{"-t", "nat", "-A", "PREROUTING", "-j", "RETURN"},
		{"-t", "nat", "-A", "POSTROUTING", "-m", "mark", "--mark", "0x4000000/0x4000000", "-j", "SNAT", "--to-source", "203.0.113.99"},
	} {
		if out, err := exec.Command("iptables", rule...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v: %s", rule, err, out)
		}
	}
	var cconn, bconn *net.UDPConn
	client.Do(t, func() error {
		if err := nstest.AddAddr("vipd-ct-c1", "192.0.2.2/24"); err != nil {
			return err
		}
		var err error
		cconn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("192.0.2.2"), Port: 40000})
		return err
	})
	defer cconn.Close()
	backend.Do(t, func() error {
		if err := nstest.AddAddr("vipd-ct-b1", "203.0.113.3/24"); err != nil {
			return err
		}
		var err error
		bconn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("203.0.113.3"), Port: 8080})
		return err
	})
	defer bconn.Close()
	f := Flow{Proto: lb.UDP, Client: netip.MustParseAddrPort("192.0.2.2:40000"), Virtual: netip.MustParseAddrPort("198.51.100.10:53"),
		Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), Timeout: time.Minute}
	forget(t, []Flow{f})
	if r, err := (Tracker{}).Track([]Flow{f}, Keep); err != nil || r.Created != 1 {
		t.Fatalf("Track: %+v, %v", r, err)
	}
	// The neighbour entries may take a moment: the answer is sent until
	// it arrives, or for 10 s.
	buf := make([]byte, 64)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := bconn.WriteToUDP([]byte("answer"), &net.UDPAddr{IP: net.ParseIP("203.0.113.99"), Port: 40000}); err != nil {
			t.Fatal(err)
		}
		cconn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, from, err := cconn.ReadFromUDP(buf)
		if err == nil {
			if string(buf[:n]) != "answer" || from.AddrPort() != netip.MustParseAddrPort("203.0.113.3:8080") {
				t.Fatalf("client got %q from %s", buf[:n], from)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client never got the backend's answer to %s: %v", f.Source, err)
		}
	}
}

// forget deletes the entries of flows when the test ends, so that a run
// of the tests again (-count) in the same namespace starts from none.
func forget(t *testing.T, flows []Flow) {
	t.Cleanup(func() {
		for _, f := range flows {
			family := netlink.InetFamily(unix.AF_INET)
			if f.Client.Addr().Is6() {
				family = unix.AF_INET6
			}
			filter := &netlink.ConntrackFilter{}
			if err := filter.AddIP(netlink.ConntrackOrigSrcIP, f.Client.Addr().AsSlice()); err != nil {
				t.Error(err)
				continue
			}
			if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, filter); err != nil {
				t.Errorf("delete the entries of %s: %v", f.Client, err)
			}
		}
	})
}

// TestTrackMany tracks more flows than Track keeps in flight, one of
// which the kernel refuses (a TCP state it does not know): every other
// flow is made, the refused one is counted and named, and a second Track
// finds the rest there.
func TestTrackMany(t *testing.T) {
	nstest.Need(t)
	const n = 3*window + 7
	flows := make([]Flow, n)
	for i := range flows {
		flows[i] = Flow{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.7"), uint16(20000+i)), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
			Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), State: TCPEstablished, Timeout: time.Minute}
	}
	const bad = window + 3
	flows[bad].State = 200
	forget(t, flows[:1])
	r, err := Tracker{}.Track(flows, Keep)
	if r != (Result{Created: n - 1, Failed: 1}) {
		t.Fatalf("Track: %+v, %v", r, err)
	}
	if err == nil || !strings.Contains(err.Error(), flows[bad].Client.String()) || !errors.As(err, new(unix.Errno)) {
		t.Errorf("Track's error does not name %s's refusal: %v", flows[bad].Client, err)
	}
	flows = slices.Delete(flows, bad, bad+1)
	if r, err := (Tracker{}).Track(flows, Keep); err != nil || r != (Result{Existing: n - 1}) {
		t.Fatalf("second Track: %+v, %v", r, err)
	}
}

// TestTrackReplace: an entry left in SYN_SENT (the node forwarded the
// client's SYN, and the backend answered the peer) is kept by Keep and
// made again in the peer's state by Replace; a flow with no entry is made
// either way.
func TestTrackReplace(t *testing.T) {
	nstest.Need(t)
	flow := func(port uint16, state TCPState) Flow {
		return Flow{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.8"), port), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
			Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), State: state, Timeout: time.Minute}
	}
	stale := flow(40000, TCPSynSent)
	forget(t, []Flow{stale})
	if r, err := (Tracker{}).Track([]Flow{stale}, Keep); err != nil || r != (Result{Created: 1}) {
		t.Fatalf("Track the stale entry: %+v, %v", r, err)
	}
	peers := []Flow{flow(40000, TCPEstablished), flow(40001, TCPEstablished)}
	if r, err := (Tracker{}).Track(peers, Keep); err != nil || r != (Result{Created: 1, Existing: 1}) {
		t.Fatalf("Track, Keep: %+v, %v", r, err)
	}
	if got := tcpState(t, stale.Client); got != TCPSynSent {
		t.Errorf("Keep left the entry in state %d, want %d", got, TCPSynSent)
	}
	if r, err := (Tracker{}).Track(peers, Replace); err != nil || r != (Result{Replaced: 2}) {
		t.Fatalf("Track, Replace: %+v, %v", r, err)
	}
	for _, f := range peers {
		if got := tcpState(t, f.Client); got != TCPEstablished {
			t.Errorf("%s: state %d after Replace, want %d", f.Client, got, TCPEstablished)
		}
	}
}

// tcpState returns the TCP state of the entry from client.
func tcpState(t *testing.T, client netip.AddrPort) TCPState {
	t.Helper()
	list, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.Forward.SrcIP.Equal(client.Addr().AsSlice()) && e.Forward.SrcPort == client.Port() {
			if p, ok := e.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
				return TCPState(p.State)
			}
			t.Fatalf("%s: entry without TCP state: %s", client, e)
		}
	}
	t.Fatalf("%s: no entry", client)
	return 0
}

// BenchmarkTrack tracks a takeover's handful of flows (15): made anew,
// found and kept, found and made again.
func BenchmarkTrack(b *testing.B) {
	flows := make([]Flow, 15)
	for i := range flows {
		flows[i] = Flow{Proto: lb.TCP, Client: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.9"), uint16(30000+i)), Virtual: netip.MustParseAddrPort("198.51.100.10:80"),
			Backend: netip.MustParseAddrPort("203.0.113.3:8080"), Source: netip.MustParseAddr("203.0.113.99"), State: TCPEstablished, Timeout: time.Minute}
	}
	b.Run("create", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			for _, f := range flows {
				_, _ = f.deleteRequest().Execute(unix.NETLINK_NETFILTER, 0)
			}
			b.StartTimer()
			if r, err := (Tracker{}).Track(flows, Keep); err != nil || r.Created != len(flows) {
				b.Fatal(r, err)
			}
		}
	})
	for _, existing := range []Existing{Keep, Replace} {
		b.Run(map[Existing]string{Keep: "keep", Replace: "replace"}[existing], func(b *testing.B) {
			for b.Loop() {
				if _, err := (Tracker{}).Track(flows, existing); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
