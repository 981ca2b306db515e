package ipvs

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// fakeFamily is the generic netlink family id of the fake kernel.
const fakeFamily = 0x2a

// fakeTable is an IPVS table as the fake kernel keeps it: services and
// destinations by their encoded keys, with the attributes they were
// written with.
type fakeTable struct {
	mu    sync.Mutex
	svcs  map[string]*fakeService
	order []string
	// fail makes requests fail: it is asked for each request, by its
	// command and the text of its service and destination keys.
	fail func(cmd uint8, svc, dest string) unix.Errno
	// interrupt marks this many of the next dumps of destinations
	// interrupted (NLM_F_DUMP_INTR), as the kernel does when the table
	// changes during a dump.
	interrupt int
	// reorder, when set, says which services (keys of order) the next
	// service dump sends, in which order: it is used once. Changes in
	// other network namespaces between the parts of a real dump make it
	// skip or repeat services.
	reorder func(order []string) []string
}

type fakeService struct {
	attrs []byte // the nested service attributes as written
	dests map[string][]byte
	order []string
}

func newFakeTable() *fakeTable { return &fakeTable{svcs: map[string]*fakeService{}} }

// fakeConn is one socket on a fake table.
type fakeConn struct {
	t   *fakeTable
	seq uint32
	// queue holds the datagrams the kernel sent and the socket has not
	// read; ackRoom, when nonzero, is how many acknowledgements it holds
	// before the kernel drops them and reports ENOBUFS.
	queue   [][]byte
	ackRoom int
	overrun bool
	// sends records every datagram sent.
	sends [][]byte
}

func (c *fakeConn) nextSeq() uint32 { c.seq++; return c.seq }
func (c *fakeConn) close() error    { return nil }

func (c *fakeConn) recv(large bool, fn func(m message) error) error {
	if len(c.queue) == 0 {
		if c.overrun {
			c.overrun = false
			return unix.ENOBUFS
		}
		return unix.EAGAIN // the real socket's timeout
	}
	// Like recvmmsg: several datagrams per call.
	n := min(len(c.queue), 3)
	batch := c.queue[:n]
	c.queue = c.queue[n:]
	for _, d := range batch {
		if err := parseDatagram(d, fn); err != nil {
			return err
		}
	}
	return nil
}

// msg builds one netlink message.
func fakeMsg(typ, flags uint16, seq uint32, payload []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(payload)+4)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.NLMSG_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], flags)
	binary.NativeEndian.PutUint32(b[8:12], seq)
	return b
}

func (c *fakeConn) ack(seq uint32, errno unix.Errno, req []byte) {
	if c.ackRoom > 0 {
		acks := 0
		for _, d := range c.queue {
			if binary.NativeEndian.Uint16(d[4:6]) == unix.NLMSG_ERROR {
				acks++
			}
		}
		if acks >= c.ackRoom {
			c.overrun = true
			return
		}
	}
	p := make([]byte, 4, 4+unix.NLMSG_HDRLEN)
	binary.NativeEndian.PutUint32(p, uint32(-int32(errno)))
	p = append(p, req[:unix.NLMSG_HDRLEN]...) // NETLINK_CAP_ACK: the header only
	c.queue = append(c.queue, fakeMsg(unix.NLMSG_ERROR, 0, seq, p))
}

// send handles each request of the datagram in turn, as netlink_rcv_skb
// does.
func (c *fakeConn) send(b []byte) error {
	// The kernel copies a datagram: the table keeps no reference to the
	// sender's buffer, which the adapter reuses.
	b = slices.Clone(b)
	c.sends = append(c.sends, b)
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return fmt.Errorf("fake kernel: bad message length %d", l)
		}
		req := b[:l]
		b = b[nlmAlign(l):]
		flags := binary.NativeEndian.Uint16(req[6:8])
		seq := binary.NativeEndian.Uint32(req[8:12])
		if binary.NativeEndian.Uint16(req[4:6]) != fakeFamily || flags&unix.NLM_F_REQUEST == 0 {
			c.ack(seq, unix.EINVAL, req)
			continue
		}
		errno := c.handle(req[unix.NLMSG_HDRLEN:], seq, flags&unix.NLM_F_DUMP == unix.NLM_F_DUMP)
		if errno != 0 || flags&unix.NLM_F_ACK != 0 {
			c.ack(seq, errno, req)
		}
	}
	return nil
}

// handle runs one request; dumps queue their answer.
func (c *fakeConn) handle(p []byte, seq uint32, isDump bool) unix.Errno {
	t := c.t
	t.mu.Lock()
	defer t.mu.Unlock()
	cmd := p[0]
	attrs, err := nl.ParseRouteAttr(p[nl.SizeofGenlmsg:])
	if err != nil {
		return unix.EINVAL
	}
	var svcAttrs, destAttrs []byte
	for _, a := range attrs {
		switch a.Attr.Type & nlaTypeMask {
		case cmdAttrService:
			svcAttrs = a.Value
		case cmdAttrDest:
			destAttrs = a.Value
		}
	}
	sk, dk := fakeKey(svcAttrs, true), fakeKey(destAttrs, false)
	if t.fail != nil {
		if e := t.fail(cmd, sk, dk); e != 0 {
			return e
		}
	}
	s := t.svcs[sk]
	switch cmd {
	case cmdGetService:
		if isDump {
			order := t.order
			if t.reorder != nil {
				order, t.reorder = t.reorder(slices.Clone(order)), nil
			}
			for _, k := range order {
				c.dumpEntry(seq, cmdNewService, cmdAttrService, t.svcs[k].attrs, svcAttrStats64)
			}
			c.queue = append(c.queue, fakeMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI, seq, make([]byte, 4)))
			return 0
		}
		if s == nil {
			return unix.ESRCH
		}
		c.dumpEntry(seq, cmdNewService, cmdAttrService, s.attrs, svcAttrStats64)
		return 0
	case cmdGetDest:
		if s != nil {
			// Like the kernel: the entries in one datagram, then DONE in
			// another.
			var d []byte
			for _, k := range s.order {
				d = append(d, c.entry(seq, cmdNewDest, cmdAttrDest, s.dests[k], destAttrStats64)...)
			}
			if d != nil {
				c.queue = append(c.queue, d)
			}
		}
		flags := uint16(unix.NLM_F_MULTI)
		if t.interrupt > 0 {
			t.interrupt--
			flags |= unix.NLM_F_DUMP_INTR
		}
		c.queue = append(c.queue, fakeMsg(unix.NLMSG_DONE, flags, seq, make([]byte, 4)))
		return 0
	case cmdNewService:
		if s != nil {
			return unix.EEXIST
		}
		t.svcs[sk] = &fakeService{attrs: svcAttrs, dests: map[string][]byte{}}
		t.order = append(t.order, sk)
	case cmdSetService:
		if s == nil {
			return unix.ESRCH
		}
		s.attrs = svcAttrs
	case cmdDelService:
		if s == nil {
			return unix.ESRCH
		}
		delete(t.svcs, sk)
		t.order = slices.DeleteFunc(t.order, func(k string) bool { return k == sk })
	case cmdNewDest, cmdSetDest, cmdDelDest:
		if s == nil {
			return unix.ESRCH
		}
		_, ok := s.dests[dk]
		switch {
		case cmd == cmdNewDest && ok:
			return unix.EEXIST
		case cmd != cmdNewDest && !ok:
			return unix.ENOENT
		case cmd == cmdDelDest:
			delete(s.dests, dk)
			s.order = slices.DeleteFunc(s.order, func(k string) bool { return k == dk })
		default:
			if !ok {
				s.order = append(s.order, dk)
			}
			s.dests[dk] = destAttrs
		}
	default:
		return unix.EOPNOTSUPP
	}
	return 0
}

// entry encodes one dump entry: the attributes as written, plus a 64-bit
// stats attribute whose counters are 1..10.
func (c *fakeConn) entry(seq uint32, cmd uint8, nest uint16, attrs []byte, statsType uint16) []byte {
	st := nl.NewRtAttr(int(statsType)|unix.NLA_F_NESTED, nil)
	for n := 1; n <= 10; n++ {
		st.AddRtAttr(n, nl.Uint64Attr(uint64(n)))
	}
	inner := append(slices.Clone(attrs), st.Serialize()...)
	outer := nl.NewRtAttr(int(nest)|unix.NLA_F_NESTED, inner)
	p := append([]byte{cmd, 1, 0, 0}, outer.Serialize()...)
	return fakeMsg(fakeFamily, unix.NLM_F_MULTI, seq, p)
}

func (c *fakeConn) dumpEntry(seq uint32, cmd uint8, nest uint16, attrs []byte, statsType uint16) {
	c.queue = append(c.queue, c.entry(seq, cmd, nest, attrs, statsType))
}

// fakeKey names a service or destination by its key attributes.
func fakeKey(b []byte, svc bool) string {
	if b == nil {
		return ""
	}
	attrs, _ := nl.ParseRouteAttr(b)
	m := map[uint16][]byte{}
	for _, a := range attrs {
		m[a.Attr.Type&nlaTypeMask] = a.Value
	}
	if svc {
		if v := m[svcAttrFWMark]; v != nil {
			return fmt.Sprintf("fwmark %x/%x", v, m[svcAttrAF])
		}
		return fmt.Sprintf("%x %x %x %x", m[svcAttrAF], m[svcAttrProtocol], m[svcAttrAddr], m[svcAttrPort])
	}
	return fmt.Sprintf("%x %x", m[destAttrAddr], m[destAttrPort])
}
