package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// fakeIPVS is an adapter on a fake kernel with n sockets.
func fakeIPVS(t *testing.T, n, chunk int) (*IPVS, *fakeTable, []*fakeConn) {
	t.Helper()
	tab := newFakeTable()
	i := &IPVS{family: fakeFamily, chunk: chunk}
	var conns []*fakeConn
	for range n {
		c := &fakeConn{t: tab}
		conns = append(conns, c)
		i.conns = append(i.conns, c)
	}
	return i, tab, conns
}

func addSvc(s lb.Service) lb.Op { return lb.Op{Kind: lb.OpAddService, Service: s} }
func addDest(s lb.Service, d lb.Destination) lb.Op {
	return lb.Op{Kind: lb.OpAddDest, Service: s, Dest: d}
}

// requests splits a datagram into its requests.
func requests(t *testing.T, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		if len(b) < unix.NLMSG_HDRLEN {
			t.Fatalf("%d trailing bytes", len(b))
		}
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			t.Fatalf("bad length %d of %d", l, len(b))
		}
		out = append(out, b[:l])
		b = b[nlmAlign(l):]
	}
	return out
}

// attrsOf returns the attributes nested in the top-level attribute typ
// of a request.
func attrsOf(t *testing.T, req []byte, typ uint16) map[uint16][]byte {
	t.Helper()
	top, err := nl.ParseRouteAttr(req[unix.NLMSG_HDRLEN+nl.SizeofGenlmsg:])
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range top {
		if a.Attr.Type&nlaTypeMask != typ {
			continue
		}
		inner, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			t.Fatal(err)
		}
		m := map[uint16][]byte{}
		for _, x := range inner {
			m[x.Attr.Type] = x.Value
		}
		return m
	}
	return nil
}

// TestBatchEncoding checks every kind of request a batch sends: header,
// command and attributes.
func TestBatchEncoding(t *testing.T) {
	i, _, conns := fakeIPVS(t, 1, 100)
	s := persistent(flags(svc(tcp4("192.0.2.1", 443), "sh"), lb.SHPort), 300, 24)
	s6 := svc(key(lb.IPv6, lb.UDP, "2001:db8::1", 53), "rr")
	d := withThresh(withWeight(tunnel("10.0.0.1:443", lb.GUE, 6080, lb.Csum), 7), 100, 50)
	d6 := dest("[2001:db8:1::1]:53", lb.DirectRoute)
	ops := []lb.Op{
		addSvc(s),
		{Kind: lb.OpUpdateService, Service: s},
		addDest(s, d),
		{Kind: lb.OpUpdateDest, Service: s, Dest: d},
		{Kind: lb.OpDrainDest, Service: s, Dest: withWeight(d, 0)},
		{Kind: lb.OpDeleteDest, Service: s, Dest: d},
		{Kind: lb.OpDeleteService, Service: s},
		addSvc(s6),
		addDest(s6, d6),
	}
	i.Apply(ops)
	if len(conns[0].sends) != 1 {
		t.Fatalf("%d datagrams, want 1", len(conns[0].sends))
	}
	reqs := requests(t, conns[0].sends[0])
	if len(reqs) != len(ops) {
		t.Fatalf("%d requests, want %d", len(reqs), len(ops))
	}
	wantCmd := []uint8{cmdNewService, cmdSetService, cmdNewDest, cmdSetDest, cmdSetDest, cmdDelDest, cmdDelService, cmdNewService, cmdNewDest}
	var seq uint32
	for n, r := range reqs {
		typ := binary.NativeEndian.Uint16(r[4:6])
		fl := binary.NativeEndian.Uint16(r[6:8])
		sq := binary.NativeEndian.Uint32(r[8:12])
		if typ != fakeFamily || fl != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
			t.Errorf("request %d: type %d flags %#x, want %d and REQUEST|ACK", n, typ, fl, fakeFamily)
		}
		if n > 0 && sq != seq+1 {
			t.Errorf("request %d: sequence %d after %d", n, sq, seq)
		}
		seq = sq
		if r[unix.NLMSG_HDRLEN] != wantCmd[n] || r[unix.NLMSG_HDRLEN+1] != ipvsGenlVersion {
			t.Errorf("request %d: command %d version %d, want %d and %d", n, r[unix.NLMSG_HDRLEN], r[unix.NLMSG_HDRLEN+1], wantCmd[n], ipvsGenlVersion)
		}
	}

	// A service's settings: as moby/ipvs sends them.
	flagsAttr := make([]byte, 8)
	binary.NativeEndian.PutUint32(flagsAttr, svcFlagPersistent|svcFlagSched2)
	binary.NativeEndian.PutUint32(flagsAttr[4:], 0xffffffff)
	wantSvc := map[uint16][]byte{
		svcAttrAF:        nl.Uint16Attr(unix.AF_INET),
		svcAttrProtocol:  nl.Uint16Attr(unix.IPPROTO_TCP),
		svcAttrAddr:      {192, 0, 2, 1},
		svcAttrPort:      {0x01, 0xbb},
		svcAttrSchedName: []byte("sh\x00"),
		svcAttrFlags:     flagsAttr,
		svcAttrTimeout:   nl.Uint32Attr(300),
		svcAttrNetmask:   nl.Uint32Attr(nativeMask(255, 255, 255, 0)),
	}
	for _, n := range []int{0, 1} {
		got := attrsOf(t, reqs[n], cmdAttrService)
		if len(got) != len(wantSvc) {
			t.Errorf("request %d: service attributes %v, want %v", n, got, wantSvc)
		}
		for a, w := range wantSvc {
			if string(got[a]) != string(w) {
				t.Errorf("request %d: service attribute %d = %x, want %x", n, a, got[a], w)
			}
		}
	}
	// Deleting a service sends its key only; destination commands the
	// service's key and the destination.
	for _, n := range []int{2, 3, 4, 5, 6} {
		if got := attrsOf(t, reqs[n], cmdAttrService); len(got) != 4 || got[svcAttrSchedName] != nil {
			t.Errorf("request %d: service key attributes %v", n, got)
		}
	}
	if got := attrsOf(t, reqs[2], cmdAttrDest); string(got[destAttrWeight]) != string(nl.Uint32Attr(7)) ||
		string(got[destAttrTunPort]) != string([]byte{0x17, 0xc0}) || string(got[destAttrUThresh]) != string(nl.Uint32Attr(100)) {
		t.Errorf("add backend attributes %v", got)
	}
	if got := attrsOf(t, reqs[4], cmdAttrDest); string(got[destAttrWeight]) != string(nl.Uint32Attr(0)) {
		t.Errorf("drain sends weight %x, want 0", got[destAttrWeight])
	}
	if got := attrsOf(t, reqs[5], cmdAttrDest); len(got) != 3 {
		t.Errorf("delete backend attributes %v, want address, family and port", got)
	}
	if got := attrsOf(t, reqs[8], cmdAttrDest); string(got[destAttrAddrFamily]) != string(nl.Uint16Attr(unix.AF_INET6)) || len(got[destAttrAddr]) != 16 {
		t.Errorf("ipv6 backend attributes %v", got)
	}
}

// TestBatchApplies writes a table through batches and reads it back
// through the dump path, stats included.
func TestBatchApplies(t *testing.T) {
	i, _, _ := fakeIPVS(t, 3, 7)
	var ops []lb.Op
	want := map[lb.ServiceKey]*lb.ServiceState{}
	for n := range 100 {
		s := svc(tcp4("192.0.2.1", uint16(1000+n)), "wrr")
		if n%10 == 0 {
			s = persistent(s, 60, 24)
		}
		ops = append(ops, addSvc(s))
		st := &lb.ServiceState{Service: s, Dests: map[netip.AddrPort]lb.Destination{}}
		for m := range 3 {
			d := withWeight(dest(fmt.Sprintf("10.0.%d.%d:8080", n, m), lb.Masq), m)
			ops = append(ops, addDest(s, d))
			st.Dests[d.Addr] = d
		}
		want[s.Key] = st
	}
	for n, err := range i.Apply(ops) {
		if err != nil {
			t.Errorf("op %d: %v", n, err)
		}
	}
	got, err := i.Services()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diff(want, got) {
		t.Error(d)
	}
	wantStats := lb.Stats{Conns: 1, InPkts: 2, OutPkts: 3, InBytes: 4, OutBytes: 5, CPS: 6, InPPS: 7, OutPPS: 8, InBPS: 9, OutBPS: 10}
	for k, st := range got {
		if st.Stats != wantStats {
			t.Errorf("%s: stats %+v, want %+v", k, st.Stats, wantStats)
		}
		for _, d := range st.Dests {
			if d.Stats == nil || *d.Stats != wantStats {
				t.Errorf("%s -> %s: stats %+v, want %+v", k, d.Addr, d.Stats, wantStats)
			}
		}
	}
	one, err := i.Service(tcp4("192.0.2.1", 1042))
	if err != nil || one == nil || len(one.Dests) != 3 || one.Scheduler != "wrr" {
		t.Errorf("Service: %+v, %v", one, err)
	}
	if none, err := i.Service(tcp4("192.0.2.99", 1)); none != nil || err != nil {
		t.Errorf("Service of a missing key: %+v, %v", none, err)
	}
}

// TestServiceOneExchange: Service sends the service's query and the dump
// of its destinations in one datagram, reads both answers, and reports a
// missing service as nil; a dump the kernel marks interrupted is read
// again alone.
func TestServiceOneExchange(t *testing.T) {
	i, tab, conns := fakeIPVS(t, 1, 256)
	a := svc(tcp4("192.0.2.1", 80), "wrr")
	d1, d2 := dest("10.0.0.1:80", lb.Masq), dest("10.0.0.2:80", lb.Masq)
	d2.Weight = 7
	for n, err := range i.Apply([]lb.Op{addSvc(a), addDest(a, d1), addDest(a, d2)}) {
		if err != nil {
			t.Fatalf("op %d: %v", n, err)
		}
	}
	c := conns[0]
	check := func(what string, wantSends int) *lb.ServiceState {
		t.Helper()
		before := len(c.sends)
		st, err := i.Service(a.Key)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := len(c.sends) - before; got != wantSends {
			t.Errorf("%s: %d datagrams sent, want %d", what, got, wantSends)
		}
		if reqs := requests(t, c.sends[before]); len(reqs) != 2 {
			t.Errorf("%s: the first datagram holds %d requests, want the query and the dump", what, len(reqs))
		}
		if len(c.queue) != 0 {
			t.Errorf("%s: %d datagrams of the answers left unread", what, len(c.queue))
		}
		return st
	}
	st := check("existing service", 1)
	if st == nil || st.Scheduler != "wrr" || len(st.Dests) != 2 || st.Dests[d2.Addr].Weight != 7 || st.Stats.Conns != 1 {
		t.Errorf("Service: %+v", st)
	}
	tab.interrupt = 1
	if st := check("interrupted dump", 2); st == nil || len(st.Dests) != 2 {
		t.Errorf("Service after an interrupted dump: %+v", st)
	}
	before := len(c.sends)
	if none, err := i.Service(tcp4("192.0.2.99", 80)); none != nil || err != nil {
		t.Errorf("Service of a missing key: %+v, %v", none, err)
	}
	if len(c.sends)-before != 1 || len(c.queue) != 0 {
		t.Errorf("missing service: %d datagrams sent, %d answers unread; want 1 and 0", len(c.sends)-before, len(c.queue))
	}
	// The next request reads its own answer, not a leftover.
	if st := check("again", 1); st == nil || len(st.Dests) != 2 {
		t.Errorf("Service again: %+v", st)
	}
}

// TestBatchPartialFailure: one bad operation in the middle of a batch
// fails alone, with the one-at-a-time wording; the rest apply.
func TestBatchPartialFailure(t *testing.T) {
	i, tab, conns := fakeIPVS(t, 1, 256)
	a := svc(tcp4("192.0.2.1", 80), "rr")
	b := svc(tcp4("192.0.2.2", 80), "twos")
	missing := svc(tcp4("192.0.2.99", 80), "rr")
	tab.fail = func(cmd uint8, s, d string) unix.Errno {
		if cmd == cmdNewService && strings.Contains(s, "c0000202") { // 192.0.2.2: the kernel lacks twos
			return unix.ENOENT
		}
		return 0
	}
	d1, d2 := dest("10.0.0.1:80", lb.Masq), dest("10.0.0.2:80", lb.Masq)
	ops := []lb.Op{
		addSvc(a),
		addSvc(b),
		addSvc(a), // exists
		addDest(a, d1),
		addDest(a, withThresh(d2, 10, 20)), // refused before the kernel
		addDest(missing, d1),
		addDest(a, d2),
		addDest(a, d1), // exists
		{Kind: lb.OpUpdateDest, Service: a, Dest: dest("10.0.0.3:80", lb.Masq)},
		{Kind: lb.OpDeleteDest, Service: a, Dest: dest("10.0.0.3:80", lb.Masq)},
		{Kind: lb.OpUpdateService, Service: missing},
		{Kind: lb.OpDeleteService, Service: missing},
		{Kind: lb.OpBindVIP, Addr: netip.MustParseAddr("192.0.2.1")},
	}
	want := []string{
		"",
		`add service tcp 192.0.2.2:80: scheduler "twos" is not supported by this kernel (no ip_vs_twos module): no such file or directory`,
		"add service tcp 192.0.2.1:80: service exists: file exists",
		"",
		"add backend tcp 192.0.2.1:80 -> 10.0.0.2:80: lower threshold 20 is above upper threshold 10 (the kernel needs lower <= upper, also without an upper threshold)",
		"add backend tcp 192.0.2.99:80 -> 10.0.0.1:80: no such service: no such process",
		"",
		"add backend tcp 192.0.2.1:80 -> 10.0.0.1:80: backend exists: file exists",
		"update backend tcp 192.0.2.1:80 -> 10.0.0.3:80: no such backend: no such file or directory",
		"delete backend tcp 192.0.2.1:80 -> 10.0.0.3:80: no such backend: no such file or directory",
		"update service tcp 192.0.2.99:80: no such service: no such process",
		"delete service tcp 192.0.2.99:80: no such service: no such process",
		"bind vip 192.0.2.1: bind-vip is not an ipvs operation",
	}
	errs := i.Apply(ops)
	for n := range ops {
		got := ""
		if errs[n] != nil {
			got = errs[n].Error()
		}
		if got != want[n] {
			t.Errorf("op %d (%s):\n got %q\nwant %q", n, ops[n], got, want[n])
		}
	}
	if !errors.Is(errs[5], unix.ESRCH) || !errors.Is(errs[1], unix.ENOENT) {
		t.Errorf("errors do not wrap the kernel's errno: %v, %v", errs[5], errs[1])
	}
	// Two operations never reached the kernel.
	if n := len(requests(t, conns[0].sends[0])); n != len(ops)-2 {
		t.Errorf("%d requests sent, want %d", n, len(ops)-2)
	}
	tb := map[lb.ServiceKey]*lb.ServiceState{a.Key: {Service: a, Dests: map[netip.AddrPort]lb.Destination{d1.Addr: d1, d2.Addr: d2}}}
	got, err := i.Services()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diff(tb, got) {
		t.Error(d)
	}
}

// TestBatchChunks: requests go chunk to a datagram, and each answer finds
// its operation whatever the order and whatever else the socket reads.
func TestBatchChunks(t *testing.T) {
	i, _, conns := fakeIPVS(t, 1, 4)
	var ops []lb.Op
	for n := range 10 {
		ops = append(ops, addSvc(svc(tcp4("192.0.2.1", uint16(n+1)), "rr")))
	}
	for n, err := range i.Apply(ops) {
		if err != nil {
			t.Errorf("op %d: %v", n, err)
		}
	}
	var sizes []int
	for _, d := range conns[0].sends {
		sizes = append(sizes, len(requests(t, d)))
	}
	if fmt.Sprint(sizes) != "[4 4 2]" {
		t.Errorf("requests per datagram %v, want [4 4 2]", sizes)
	}
}

// scripted is a transport whose kernel answers with given datagrams.
type scripted struct {
	seq     uint32
	answers func(sent []byte) [][]byte
	queue   [][]byte
	err     error // returned once the queue is empty
}

func (s *scripted) nextSeq() uint32 { s.seq++; return s.seq }
func (s *scripted) close() error    { return nil }
func (s *scripted) send(b []byte) error {
	s.queue = append(s.queue, s.answers(b)...)
	return nil
}

func (s *scripted) recv(large bool, fn func(m message) error) error {
	if len(s.queue) == 0 {
		return s.err
	}
	d := s.queue[0]
	s.queue = s.queue[1:]
	return parseDatagram(d, fn)
}

func ackMsg(seq uint32, errno unix.Errno) []byte {
	p := make([]byte, 4+unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(p, uint32(-int32(errno)))
	return fakeMsg(unix.NLMSG_ERROR, 0, seq, p)
}

// TestExchangeMatching feeds acknowledgements out of order, several to a
// datagram, among stale answers, duplicates and other messages.
func TestExchangeMatching(t *testing.T) {
	var b batch
	for n := range 5 {
		if err := b.add(fakeFamily, n, addSvc(svc(tcp4("192.0.2.1", uint16(n+1)), "rr"))); err != nil {
			t.Fatal(err)
		}
	}
	tr := &scripted{seq: 100, answers: func(sent []byte) [][]byte {
		// Requests are 101..105.
		return [][]byte{
			append(ackMsg(99, unix.EIO), ackMsg(103, unix.EEXIST)...), // stale, then 103
			fakeMsg(unix.NLMSG_DONE, 0, 101, make([]byte, 4)),         // not an answer
			append(ackMsg(105, 0), ackMsg(101, 0)...),
			ackMsg(103, 0), // duplicate: the first answer counts
			append(ackMsg(102, unix.ENOENT), ackMsg(104, 0)...),
		}
	}}
	res := exchange(tr, b.buf, b.reqs, 10, make([]error, len(b.reqs)))
	want := []error{nil, unix.ENOENT, unix.EEXIST, nil, nil}
	for n := range want {
		if !errors.Is(res[n], want[n]) || (want[n] == nil) != (res[n] == nil) {
			t.Errorf("request %d: %v, want %v", n, res[n], want[n])
		}
	}
}

// TestExchangeLostAcks: when acknowledgements never come (the receive
// buffer overflowed, or the socket failed), the operations without one
// fail saying so, and the next chunk still runs.
func TestExchangeLostAcks(t *testing.T) {
	i, tab, conns := fakeIPVS(t, 1, 6)
	conns[0].ackRoom = 4 // the buffer holds 4 acknowledgements
	var ops []lb.Op
	for n := range 10 {
		ops = append(ops, addSvc(svc(tcp4("192.0.2.1", uint16(n+1)), "rr")))
	}
	errs := i.Apply(ops)
	for n, err := range errs {
		lost := n == 4 || n == 5
		switch {
		case lost && (err == nil || !strings.Contains(err.Error(), "acknowledgement lost (netlink receive buffer overrun; the kernel may have applied it)") || !errors.Is(err, unix.ENOBUFS)):
			t.Errorf("op %d: %v, want a lost acknowledgement", n, err)
		case !lost && err != nil:
			t.Errorf("op %d: %v", n, err)
		}
	}
	// The kernel applied them all: only the answers were lost.
	if len(tab.svcs) != 10 {
		t.Errorf("%d services in the table, want 10", len(tab.svcs))
	}

	var b batch
	for n := range 3 {
		_ = b.add(fakeFamily, n, addSvc(svc(tcp4("192.0.2.1", uint16(n+1)), "rr")))
	}
	tr := &scripted{answers: func([]byte) [][]byte { return [][]byte{ackMsg(1, 0)} }, err: unix.EAGAIN}
	res := exchange(tr, b.buf, b.reqs, 10, make([]error, len(b.reqs)))
	if res[0] != nil || res[1] == nil || !strings.Contains(res[1].Error(), "no acknowledgement from the kernel") || !errors.Is(res[2], unix.EAGAIN) {
		t.Errorf("timeout: %v", res)
	}
}

func TestChunkFor(t *testing.T) {
	for _, c := range []struct{ rcvbuf, want int }{
		{0, 8}, {212992 * 2, 208}, {8 << 20, maxChunk},
	} {
		if got := chunkFor(c.rcvbuf); got != c.want {
			t.Errorf("chunkFor(%d) = %d, want %d", c.rcvbuf, got, c.want)
		}
	}
}

// TestParseServiceMsg decodes a service as Linux 6.1 sends it, with both
// stats attributes (the 64-bit one wins).
func TestParseServiceMsg(t *testing.T) {
	a := nl.NewRtAttr(cmdAttrService|unix.NLA_F_NESTED, nil)
	a.AddRtAttr(svcAttrAF, nl.Uint16Attr(unix.AF_INET))
	a.AddRtAttr(svcAttrProtocol, nl.Uint16Attr(unix.IPPROTO_TCP))
	a.AddRtAttr(svcAttrAddr, append([]byte{192, 0, 2, 1}, make([]byte, 12)...))
	a.AddRtAttr(svcAttrPort, []byte{0, 80})
	a.AddRtAttr(svcAttrSchedName, []byte("wlc\x00"))
	fl := make([]byte, 8)
	binary.NativeEndian.PutUint32(fl, svcFlagHashed|svcFlagPersistent)
	binary.NativeEndian.PutUint32(fl[4:], 0xffffffff)
	a.AddRtAttr(svcAttrFlags, fl)
	a.AddRtAttr(svcAttrTimeout, nl.Uint32Attr(300))
	a.AddRtAttr(svcAttrNetmask, nl.Uint32Attr(nativeMask(255, 255, 255, 0)))
	s32 := a.AddRtAttr(svcAttrStats, nil)
	s32.AddRtAttr(statsConns, nl.Uint32Attr(7))
	s32.AddRtAttr(statsInBytes, nl.Uint64Attr(1<<40))
	s64 := a.AddRtAttr(svcAttrStats64, nil)
	s64.AddRtAttr(statsConns, nl.Uint64Attr(1<<33))
	s64.AddRtAttr(statsInBytes, nl.Uint64Attr(1<<40))
	s64.AddRtAttr(statsOutBPS, nl.Uint64Attr(99))
	s64.AddRtAttr(11, nil) // IPVS_STATS_ATTR_PAD
	msg := append((&nl.Genlmsg{Command: cmdNewService, Version: 1}).Serialize(), a.Serialize()...)
	ms, st, err := parseServiceMsg(msg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := fromKernelService(ms)
	if err != nil {
		t.Fatal(err)
	}
	if want := persistent(svc(tcp4("192.0.2.1", 80), "wlc"), 300, 24); s != want {
		t.Errorf("service %s, want %s", s, want)
	}
	if want := (lb.Stats{Conns: 1 << 33, InBytes: 1 << 40, OutBPS: 99}); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	for name, bad := range map[string][]byte{
		"short":      {1},
		"no service": (&nl.Genlmsg{}).Serialize(),
	} {
		if _, _, err := parseServiceMsg(bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestDumpErrors: a dump the kernel refuses, or whose entries do not
// parse, fails, and the socket is read to the end of the answer.
func TestDumpErrors(t *testing.T) {
	tr := &scripted{answers: func(sent []byte) [][]byte {
		seq := binary.NativeEndian.Uint32(sent[8:12])
		return [][]byte{ackMsg(seq, unix.EBUSY)}
	}}
	err := dump(tr, fakeFamily, cmdGetService, nil, func([]byte) error { return nil })
	if !errors.Is(err, unix.EBUSY) {
		t.Errorf("refused dump: %v", err)
	}
	tr = &scripted{answers: func(sent []byte) [][]byte {
		seq := binary.NativeEndian.Uint32(sent[8:12])
		bad := fakeMsg(fakeFamily, unix.NLM_F_MULTI, seq, []byte{cmdNewService, 1, 0, 0})
		return [][]byte{append(bad, bad...), fakeMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, seq, make([]byte, 4))}
	}}
	calls := 0
	err = dump(tr, fakeFamily, cmdGetService, nil, func(data []byte) error {
		calls++
		_, _, err := parseServiceMsg(data)
		return err
	})
	if err == nil || calls != 1 || len(tr.queue) != 0 {
		t.Errorf("bad entry: %v after %d calls, %d datagrams unread", err, calls, len(tr.queue))
	}
	// An interrupted dump is retried.
	n := 0
	tr = &scripted{answers: func(sent []byte) [][]byte {
		seq := binary.NativeEndian.Uint32(sent[8:12])
		n++
		fl := uint16(unix.NLM_F_MULTI)
		if n < 3 {
			fl |= unix.NLM_F_DUMP_INTR
		}
		return [][]byte{fakeMsg(unix.NLMSG_DONE, fl, seq, make([]byte, 4))}
	}}
	if err := retryDump(func() error { return dump(tr, fakeFamily, cmdGetService, nil, func([]byte) error { return nil }) }); err != nil || n != 3 {
		t.Errorf("interrupted dump: %v after %d tries", err, n)
	}
}

// TestEncoderMatchesRtAttr checks the adapter's encoder byte for byte
// against the netlink library's, which the one-at-a-time path used: the
// same key, service and destination attributes.
func TestEncoderMatchesRtAttr(t *testing.T) {
	be := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	keyRt := func(k kernelKey) *nl.RtAttr {
		a := nl.NewRtAttr(cmdAttrService, nil)
		a.AddRtAttr(svcAttrAF, nl.Uint16Attr(k.family))
		if k.fwmark != 0 {
			a.AddRtAttr(svcAttrFWMark, nl.Uint32Attr(k.fwmark))
			return a
		}
		a.AddRtAttr(svcAttrProtocol, nl.Uint16Attr(k.proto))
		a.AddRtAttr(svcAttrAddr, k.addr.AsSlice())
		a.AddRtAttr(svcAttrPort, be(k.port))
		return a
	}
	for _, e := range everything() {
		k, err := toKernelKey(e.svc.Key)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := keyAttr(k).Serialize(), keyRt(k).Serialize(); string(got) != string(want) {
			t.Errorf("%s key:\n got %x\nwant %x", e.svc.Key, got, want)
		}
		ms, err := toKernelService(e.svc)
		if err != nil {
			t.Fatal(err)
		}
		// moby/ipvs's fillService, with vipd's attribute order.
		sa := keyRt(k)
		sa.AddRtAttr(svcAttrSchedName, nl.ZeroTerminated(ms.SchedName))
		fl := make([]byte, 8)
		binary.NativeEndian.PutUint32(fl, ms.Flags)
		binary.NativeEndian.PutUint32(fl[4:], 0xffffffff)
		sa.AddRtAttr(svcAttrFlags, fl)
		sa.AddRtAttr(svcAttrTimeout, nl.Uint32Attr(ms.Timeout))
		sa.AddRtAttr(svcAttrNetmask, nl.Uint32Attr(ms.Netmask))
		if got, want := serviceAttr(k, ms).Serialize(), sa.Serialize(); string(got) != string(want) {
			t.Errorf("%s service:\n got %x\nwant %x", e.svc, got, want)
		}
		for _, d := range e.dests {
			kd, err := toKernelDest(d)
			if err != nil {
				t.Fatal(err)
			}
			for _, full := range []bool{true, false} {
				a := nl.NewRtAttr(cmdAttrDest, nil)
				a.AddRtAttr(destAttrAddrFamily, nl.Uint16Attr(kd.family))
				a.AddRtAttr(destAttrAddr, kd.addr.AsSlice())
				a.AddRtAttr(destAttrPort, be(kd.port))
				if full {
					a.AddRtAttr(destAttrFwdMethod, nl.Uint32Attr(kd.fwd))
					a.AddRtAttr(destAttrWeight, nl.Uint32Attr(kd.weight))
					a.AddRtAttr(destAttrUThresh, nl.Uint32Attr(kd.upper))
					a.AddRtAttr(destAttrLThresh, nl.Uint32Attr(kd.lower))
					if kd.tunType != tunIPIP || kd.tunPort != 0 || kd.tunFlags != 0 {
						a.AddRtAttr(destAttrTunType, nl.Uint8Attr(kd.tunType))
						a.AddRtAttr(destAttrTunPort, be(kd.tunPort))
						a.AddRtAttr(destAttrTunFlags, nl.Uint16Attr(kd.tunFlags))
					}
				}
				if got, want := destAttr(kd, full).Serialize(), a.Serialize(); string(got) != string(want) {
					t.Errorf("%s (full %v):\n got %x\nwant %x", d, full, got, want)
				}
			}
		}
	}
}

// BenchmarkEncode measures encoding a cold start's worth of requests.
func BenchmarkEncode(b *testing.B) {
	ops := opsOf(bulk(1000, 10))
	b.ReportAllocs()
	for b.Loop() {
		var bt batch
		for x, op := range ops {
			if err := bt.add(fakeFamily, x, op); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(ops)), "requests")
}

// acker is a transport that acknowledges every request without
// allocating: it stands for the kernel when counting the adapter's own
// allocations.
type acker struct {
	seq  uint32
	pend []uint32
	ack  [4 + unix.NLMSG_HDRLEN]byte
}

func (a *acker) nextSeq() uint32 { a.seq++; return a.seq }
func (a *acker) close() error    { return nil }

func (a *acker) send(b []byte) error {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		a.pend = append(a.pend, binary.NativeEndian.Uint32(b[8:12]))
		b = b[nlmAlign(l):]
	}
	return nil
}

func (a *acker) recv(_ bool, fn func(m message) error) error {
	for _, seq := range a.pend {
		if err := fn(message{typ: unix.NLMSG_ERROR, seq: seq, data: a.ack[:]}); err != nil {
			return err
		}
	}
	a.pend = a.pend[:0]
	return nil
}

// TestApplyAllocations: the adapter keeps its request buffer from one
// batch to the next, so that a cold start's hundred batches of a thousand
// backends allocate little more than their results; allocations at that
// rate kept the garbage collector running over the whole plan.
func TestApplyAllocations(t *testing.T) {
	var ops []lb.Op
	for _, op := range opsOf(bulk(200, 10)) {
		if op.Kind == lb.OpAddDest && len(ops) < 1024 {
			ops = append(ops, op)
		}
	}
	const chunk = 256
	i := &IPVS{family: fakeFamily, chunk: chunk, conns: []transport{&acker{pend: make([]uint32, 0, chunk)}}}
	check := func() {
		for x, err := range i.Apply(ops) {
			if err != nil {
				t.Fatalf("op %d: %v", x, err)
			}
		}
	}
	check()
	// The result slice, and the acknowledgements' handler with its state.
	const want = 3
	if got := testing.AllocsPerRun(20, check); got > want {
		t.Errorf("Apply of %d backends: %.0f allocations, want at most %d", len(ops), got, want)
	}
}
