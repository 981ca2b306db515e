package health

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const (
	// halfOpenPorts is how many ports the process reserves for the
	// SYNs of half-open probes. Probes of different backends share
	// them; concurrent probes of one backend's address and port (checks
	// of it with different settings) need one each. Probes take them in
	// turn, so that a probe rarely reuses the 4-tuple of the one before
	// it, whose half-open connection the backend may still hold if a
	// reset was lost.
	halfOpenPorts = 32
	// resolveEvery is how many probes use a looked-up source address
	// before a probe looks it up again; a probe that failed has it
	// looked up again at once.
	resolveEvery = 64
	// synLen is the length of a probe's SYN: a TCP header with an MSS
	// option, which some stacks and middleboxes want of a SYN.
	synLen = 24
	// synSnap is how much of a reply the socket filter keeps: an IPv4
	// header with options and the TCP header's first 14 bytes fit.
	synSnap = 128
)

// TCP flags.
const (
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// synKey is what a reply to a probe is matched on, with the probe's
// sequence number: the backend's address and port, and the probe's port.
type synKey struct {
	peer     netip.Addr // unmapped, without a zone
	peerPort uint16
	port     uint16
}

// synSocket is the raw TCP socket of one address family that sends the
// SYNs of every half-open probe of the process and receives the replies.
//
// Nothing waits on it for replies, which would wake the process for each
// (the runtime's network poller, and a goroutine, at every arrival): they
// queue on it until collected, by the pollers with half-open probes in
// flight once per their slack (see poller.plan), and by Probe while it
// waits. A reply waits at most a slack, which is far below any timeout.
type synSocket struct {
	family int
	fd     int
	ports  []uint16
	next   atomic.Uint32
	// err is why reading the socket failed, if it did.
	err atomic.Pointer[error]

	// collectMu serializes collect, whose buffer is replies.
	collectMu sync.Mutex
	replies   *replies

	mu    sync.Mutex
	waits map[synKey]*pollOp

	// queue holds the SYNs of probes started on a poller since the last
	// flush, sent together by one sendmmsg; hdrs is its buffer.
	sendMu sync.Mutex
	queue  []queuedSYN
	hdrs   []mmsghdr
}

// queuedSYN is a probe whose SYN waits for a flush.
type queuedSYN struct {
	c  *HalfOpenCheck
	op *pollOp
	p  *poller
}

// mmsghdr is the kernel's struct mmsghdr, of sendmmsg and recvmmsg: a
// message and the number of bytes it carried.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// recvBatch is how many replies one recvmmsg reads at most.
const recvBatch = 64

// halfOpen holds the process's raw sockets and reserved ports, opened by
// the first half-open check of each family and kept open.
var halfOpen struct {
	mu sync.Mutex
	// ports are the reserved ports; reserve holds the sockets bound to
	// them; dual says that they are reserved for IPv6 too.
	ports   []uint16
	reserve []int
	dual    bool
	socks   [2]*synSocket // IPv4, IPv6
}

// synSocketFor returns the process's raw TCP socket of family, opening
// it, and reserving the ports, the first time.
func synSocketFor(family int) (*synSocket, error) {
	halfOpen.mu.Lock()
	defer halfOpen.mu.Unlock()
	i := 0
	if family == unix.AF_INET6 {
		i = 1
	}
	if s := halfOpen.socks[i]; s != nil {
		return s, nil
	}
	if halfOpen.ports == nil {
		ports, fds, dual, err := reservePorts(halfOpenPorts)
		if err != nil {
			return nil, fmt.Errorf("reserve ports for half-open tcp checks: %w", err)
		}
		halfOpen.ports, halfOpen.reserve, halfOpen.dual = ports, fds, dual
	}
	if family == unix.AF_INET6 && !halfOpen.dual {
		return nil, errors.New("half-open tcp checks of IPv6 need IPv6 sockets")
	}
	s, err := newSynSocket(family, halfOpen.ports)
	if err != nil {
		return nil, err
	}
	halfOpen.socks[i] = s
	return s, nil
}

// OpenHalfOpen opens the process's raw sockets of half-open tcp checks of
// IPv4 (v4) and IPv6 (v6), and reserves their ports, if no check has, and
// returns why it cannot: the daemon refuses a configuration with
// half-open checks that cannot run, at start and on reload, rather than
// letting them fail. Once open, they stay open.
func OpenHalfOpen(v4, v6 bool) error {
	for _, f := range []struct {
		want   bool
		family int
	}{{v4, unix.AF_INET}, {v6, unix.AF_INET6}} {
		if f.want {
			if _, err := synSocketFor(f.family); err != nil {
				return err
			}
		}
	}
	return nil
}

// reservePorts binds n TCP sockets to ports the kernel picks, without
// listening, and returns the ports and the sockets, which must stay open.
// A port bound (without SO_REUSEADDR) is one the kernel gives no
// connect of its own, and no listener can take; and since no socket
// listens or is connected on it, the kernel answers a SYN-ACK sent to it
// with a reset, as the end of a half-open probe wants. The sockets are
// IPv6 sockets bound to the unspecified address that take IPv4 too,
// which reserves a port of both families, or IPv4 ones where IPv6 is
// missing (dual is false).
func reservePorts(n int) (ports []uint16, fds []int, dual bool, err error) {
	dual = true
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}()
	for len(ports) < n {
		family := unix.AF_INET
		var sa unix.Sockaddr = &unix.SockaddrInet4{}
		if dual {
			family, sa = unix.AF_INET6, &unix.SockaddrInet6{}
		}
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err == unix.EAFNOSUPPORT && dual && len(fds) == 0 {
			dual = false
			continue
		}
		if err != nil {
			return nil, fds, false, os.NewSyscallError("socket", err)
		}
		fds = append(fds, fd)
		if dual {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
				return nil, fds, false, os.NewSyscallError("setsockopt", err)
			}
		}
		if err := unix.Bind(fd, sa); err != nil {
			return nil, fds, false, os.NewSyscallError("bind", err)
		}
		got, err := unix.Getsockname(fd)
		if err != nil {
			return nil, fds, false, os.NewSyscallError("getsockname", err)
		}
		switch a := got.(type) {
		case *unix.SockaddrInet4:
			ports = append(ports, uint16(a.Port))
		case *unix.SockaddrInet6:
			ports = append(ports, uint16(a.Port))
		}
	}
	return ports, fds, dual, nil
}

// newSynSocket opens a raw TCP socket of family whose filter lets
// through only SYN-ACKs and resets sent to ports.
func newSynSocket(family int, ports []uint16) (*synSocket, error) {
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, fmt.Errorf("open a raw TCP socket for half-open tcp checks (it needs CAP_NET_RAW): %w", os.NewSyscallError("socket", err))
	}
	fail := func(what string, err error) (*synSocket, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("open a raw TCP socket for half-open tcp checks: %w", os.NewSyscallError(what, err))
	}
	prog, err := synFilter(family, ports)
	if err != nil {
		return fail("assemble filter", err)
	}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, prog); err != nil {
		return fail("setsockopt", err)
	}
	// Bursts of probes, and of their replies, fit: beyond
	// net.core.rmem_max and wmem_max where vipd may (CAP_NET_ADMIN), else
	// up to them.
	for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], 4<<20) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], 4<<20)
		}
	}
	// What came before the filter did is no reply to a probe.
	var b [synSnap]byte
	for {
		if _, _, err := unix.Recvfrom(fd, b[:], unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	return &synSocket{family: family, fd: fd, ports: ports, replies: newReplies(), waits: map[synKey]*pollOp{}}, nil
}

// synFilter returns the socket filter of a raw TCP socket of family that
// keeps, of a TCP segment sent to one of ports, a reset, or a SYN-ACK,
// and drops everything else: the socket does not wake for the host's
// other TCP traffic. An IPv4 raw socket's filter sees the IP header, an
// IPv6 one's the TCP header.
func synFilter(family int, ports []uint16) (*unix.SockFprog, error) {
	n := len(ports)
	if n == 0 || n > 200 {
		return nil, fmt.Errorf("%d ports", n)
	}
	var prog []bpf.Instruction
	if family == unix.AF_INET {
		prog = append(prog,
			// A fragment but the first: drop.
			bpf.LoadAbsolute{Off: 6, Size: 2},
			bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: uint8(n + 6)},
			// X: the length of the IP header.
			bpf.LoadMemShift{Off: 0},
		)
	} else {
		prog = append(prog, bpf.LoadConstant{Dst: bpf.RegX, Val: 0})
	}
	prog = append(prog,
		bpf.LoadIndirect{Off: 13, Size: 1}, // flags
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: tcpRST, SkipTrue: 2},
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: tcpSYN | tcpACK},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: tcpSYN | tcpACK, SkipTrue: uint8(n + 1)},
		bpf.LoadIndirect{Off: 2, Size: 2}, // destination port
	)
	for i, p := range ports {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p), SkipTrue: uint8(n - i)})
	}
	prog = append(prog, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: synSnap})
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, err
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}, nil
}

// replies is collect's buffer: recvBatch messages of synSnap bytes
// and their senders' addresses.
type replies struct {
	hdrs [recvBatch]mmsghdr
	iovs [recvBatch]unix.Iovec
	bufs [recvBatch][synSnap]byte
	from [recvBatch]unix.RawSockaddrInet6
}

func newReplies() *replies {
	r := &replies{}
	for i := range r.hdrs {
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(synSnap)
		h := &r.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&r.from[i]))
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
	}
	return r
}

// collect reads the replies the filter let through, recvBatch a system
// call, and ends the probes they answer. If reading fails, the socket
// takes no more probes, and those in flight time out.
func (s *synSocket) collect() {
	if s.err.Load() != nil {
		return
	}
	s.collectMu.Lock()
	defer s.collectMu.Unlock()
	if err := s.drain(uintptr(s.fd), s.replies); err != nil {
		err = fmt.Errorf("half-open tcp checks' raw socket failed: %w", err)
		s.err.Store(&err)
	}
}

// collectSYNs collects the replies to half-open probes.
func collectSYNs() { eachSYNSocket((*synSocket).collect) }

// eachSYNSocket calls f with each open raw socket of half-open checks.
func eachSYNSocket(f func(*synSocket)) {
	halfOpen.mu.Lock()
	socks := halfOpen.socks
	halfOpen.mu.Unlock()
	for _, s := range socks {
		if s != nil {
			f(s)
		}
	}
}

// drain reads the replies waiting on fd, recvBatch at a time, and ends
// the probes they answer.
func (s *synSocket) drain(fd uintptr, r *replies) error {
	for {
		for i := range r.hdrs {
			r.hdrs[i].hdr.Namelen = unix.SizeofSockaddrInet6
			r.hdrs[i].hdr.Flags = 0
		}
		n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), recvBatch, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return nil
		default:
			return os.NewSyscallError("recvmmsg", e)
		}
		for i := range int(n) {
			s.reply(r.bufs[i][:min(int(r.hdrs[i].n), synSnap)], &r.from[i])
		}
		if int(n) < recvBatch {
			// Without waiting, recvmmsg returns fewer only when no
			// more are queued.
			return nil
		}
	}
}

// enqueue adds the SYN of q.c's probe q.op to the next flush.
func (s *synSocket) enqueue(q queuedSYN) {
	s.sendMu.Lock()
	s.queue = append(s.queue, q)
	s.sendMu.Unlock()
}

// flush sends the queued SYNs, as few sendmmsg calls as the kernel
// allows, and ends the probe of each SYN it could not send with the
// error.
func (s *synSocket) flush() {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	q := s.queue
	if len(q) == 0 {
		return
	}
	hdrs := s.hdrs[:0]
	for _, e := range q {
		hdrs = append(hdrs, mmsghdr{hdr: e.c.msg})
	}
	for i := 0; i < len(q); {
		n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&hdrs[i])), uintptr(len(hdrs)-i), 0, 0, 0)
		switch e {
		case 0:
			i += int(n)
			continue
		case unix.EINTR:
			continue
		}
		// The SYN at i failed; those after it go in the next call.
		f := q[i]
		f.c.stale.Store(true)
		if f.c.drop(f.op) {
			f.p.finish(f.op, f.c.dialError(os.NewSyscallError("sendmmsg", e)))
		}
		i++
	}
	clear(hdrs)
	s.hdrs = hdrs[:0]
	clear(q)
	s.queue = q[:0]
}

// flushSYNs sends the SYNs that half-open probes started on pollers
// have queued.
func flushSYNs() { eachSYNSocket((*synSocket).flush) }

// reply ends the probe that b, a reply from from, answers, if any.
func (s *synSocket) reply(b []byte, from *unix.RawSockaddrInet6) {
	var peer netip.Addr
	tcp := b
	if s.family == unix.AF_INET {
		if len(b) < 20 || b[0]>>4 != 4 {
			return
		}
		ihl := int(b[0]&0xf) * 4
		if ihl < 20 || len(b) < ihl+14 {
			return
		}
		peer = netip.AddrFrom4([4]byte(b[12:16]))
		tcp = b[ihl:]
	} else {
		if len(b) < 14 {
			return
		}
		peer = netip.AddrFrom16(from.Addr)
	}
	flags := tcp[13]
	refused := flags&tcpRST != 0
	if !refused && flags&(tcpSYN|tcpACK) != tcpSYN|tcpACK {
		return
	}
	k := synKey{peer: peer, peerPort: binary.BigEndian.Uint16(tcp[0:]), port: binary.BigEndian.Uint16(tcp[2:])}
	ack := binary.BigEndian.Uint32(tcp[8:])
	s.mu.Lock()
	op := s.waits[k]
	if op == nil || op.seq+1 != ack {
		s.mu.Unlock()
		return
	}
	delete(s.waits, k)
	s.mu.Unlock()
	var err error
	if refused {
		err = op.handler.(*HalfOpenCheck).dialError(os.NewSyscallError("connect", unix.ECONNREFUSED))
	}
	if op.owner != nil {
		op.owner.finish(op, err)
	} else {
		op.done(err)
	}
}

// halfOpenState is a HalfOpenCheck's on Linux.
type halfOpenState struct {
	sock *synSocket
	key  synKey // port unset
	// dst is the target's socket address, with port 0 as raw sockets
	// want; src is the source address the probes' checksum covers and
	// their packets leave from, looked up uses probes ago.
	dst   rawAddr
	src   netip.Addr
	uses  int
	stale atomic.Bool
	// The SYN and the message that sends it, with the source address
	// as control data.
	pkt  [synLen]byte
	iov  unix.Iovec
	cmsg [5]uint64 // room for an in6_pktinfo's control message, aligned
	msg  unix.Msghdr
}

// NewHalfOpenCheck returns a check that sends SYNs to target. It opens
// the process's raw socket of target's family, and reserves the probes'
// ports, if no check did before, and fails if it cannot: without
// CAP_NET_RAW, say.
func NewHalfOpenCheck(target netip.AddrPort, dial DialOptions) (*HalfOpenCheck, error) {
	if dial.Mark != 0 || dial.Device != "" {
		return nil, errors.New("half-open tcp checks do not work with dial mark or device")
	}
	target = netip.AddrPortFrom(target.Addr().Unmap(), target.Port())
	family := unix.AF_INET
	if target.Addr().Is6() {
		family = unix.AF_INET6
	}
	if dial.Source.IsValid() && dial.Source.Unmap().Is4() != target.Addr().Is4() {
		return nil, fmt.Errorf("source address %s and target %s are of different families", dial.Source, target)
	}
	s, err := synSocketFor(family)
	if err != nil {
		return nil, err
	}
	c := &HalfOpenCheck{target: target, dial: dial}
	c.sock = s
	c.key = synKey{peer: target.Addr().WithZone(""), peerPort: target.Port()}
	c.dst = rawAddrOf(netip.AddrPortFrom(target.Addr(), 0))
	p := c.pkt[:]
	binary.BigEndian.PutUint16(p[2:], target.Port())
	p[12] = synLen / 4 << 4 // data offset
	p[13] = tcpSYN
	binary.BigEndian.PutUint16(p[14:], 64240) // window
	copy(p[20:], []byte{2, 4, 0x05, 0xb4})    // MSS 1460
	c.iov.Base = &c.pkt[0]
	c.iov.SetLen(synLen)
	c.msg.Name = (*byte)(unsafe.Pointer(&c.dst.sa))
	c.msg.Namelen = c.dst.len
	c.msg.Iov = &c.iov
	c.msg.SetIovlen(1)
	c.msg.Control = (*byte)(unsafe.Pointer(&c.cmsg[0]))
	return c, nil
}

// dialError wraps err, if not nil, as the net package reports a failed
// dial of c's target, so that its errors read as a full tcp check's.
func (c *HalfOpenCheck) dialError(err error) error {
	if err == nil {
		return nil
	}
	return dialErr(c.dial, c.target, err)
}

// source returns the source address of c's SYNs: Dial.Source, or the one
// the kernel picks for a connection to the target, which a connected UDP
// socket tells.
func (c *HalfOpenCheck) source() (netip.Addr, error) {
	if c.dial.Source.IsValid() {
		return c.dial.Source.Unmap(), nil
	}
	fd, err := unix.Socket(c.dst.family(), unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return netip.Addr{}, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	dst := rawAddrOf(c.target)
	if err := rawConnect(fd, &dst); err != nil {
		return netip.Addr{}, os.NewSyscallError("connect", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.Addr{}, os.NewSyscallError("getsockname", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr), nil
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr), nil
	}
	return netip.Addr{}, fmt.Errorf("getsockname: unknown address %T", sa)
}

// setSource makes src the source of c's SYNs: the address their
// checksum covers, and, through a pktinfo control message, the one the
// kernel sends them from whatever its routes say by then.
func (c *HalfOpenCheck) setSource(src netip.Addr) {
	c.src = src
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c.cmsg[0])), len(c.cmsg)*8)
	clear(b)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	if src.Is4() {
		h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
		h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
		pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
		pi.Spec_dst = src.As4()
		c.msg.SetControllen(unix.CmsgSpace(unix.SizeofInet4Pktinfo))
		return
	}
	h.Level, h.Type = unix.IPPROTO_IPV6, unix.IPV6_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet6Pktinfo))
	pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&b[unix.CmsgLen(0)]))
	pi.Addr = src.As16()
	pi.Ifindex = c.dst.sa.Scope_id
	c.msg.SetControllen(unix.CmsgSpace(unix.SizeofInet6Pktinfo))
}

// begin readies a probe, op: it picks the probe's port and sequence
// number, registers op for the reply, and builds the SYN.
func (c *HalfOpenCheck) begin(op *pollOp) error {
	s := c.sock
	if p := s.err.Load(); p != nil {
		return *p
	}
	if !c.src.IsValid() || c.uses >= resolveEvery || c.stale.Swap(false) {
		src, err := c.source()
		if err != nil {
			c.stale.Store(true)
			return c.dialError(err)
		}
		c.setSource(src)
		c.uses = 0
	}
	c.uses++
	op.seq = rand.Uint32()
	n := uint32(len(s.ports))
	first := s.next.Add(1)
	k := c.key
	s.mu.Lock()
	for i := range n {
		k.port = s.ports[(first+i)%n]
		if _, busy := s.waits[k]; !busy {
			op.port = k.port
			s.waits[k] = op
			break
		}
	}
	s.mu.Unlock()
	if op.port == 0 {
		return c.dialError(fmt.Errorf("all %d ports of half-open probes are probing it", n))
	}
	p := c.pkt[:]
	binary.BigEndian.PutUint16(p[0:], op.port)
	binary.BigEndian.PutUint32(p[4:], op.seq)
	p[16], p[17] = 0, 0
	binary.BigEndian.PutUint16(p[16:], tcpChecksum(c.src, c.target.Addr(), p))
	return nil
}

// send sends the SYN begin built.
func (c *HalfOpenCheck) send() error {
	_, _, e := unix.RawSyscall(unix.SYS_SENDMSG, uintptr(c.sock.fd), uintptr(unsafe.Pointer(&c.msg)), 0)
	if e != 0 {
		c.stale.Store(true)
		return c.dialError(os.NewSyscallError("sendmsg", e))
	}
	return nil
}

// drop takes op off c's socket's table, and reports whether it was
// there: if not, a reply has ended it, or will.
func (c *HalfOpenCheck) drop(op *pollOp) bool {
	k := c.key
	k.port = op.port
	s := c.sock
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waits[k] != op {
		return false
	}
	delete(s.waits, k)
	return true
}

// start begins a probe on p: its deadline on p's heap, its SYN queued
// for the poller's next flush (which the Manager asks for once it has
// started the probes due), its reply left on the socket for the next
// collect (the Manager's next round, or p's loop), which ends it with
// p.finish. It always runs on p.
func (c *HalfOpenCheck) start(p *poller, deadline time.Time, done func(error)) bool {
	op := &pollOp{fd: -1, deadline: p.at(deadline), handler: c, done: done, owner: p}
	if err := c.begin(op); err != nil {
		done(err)
		return true
	}
	if err := p.add(op, 0); err != nil {
		c.drop(op)
		done(err)
		return true
	}
	c.sock.enqueue(queuedSYN{c: c, op: op, p: p})
	return true
}

// event is never called: the probe has no socket on the poller.
func (c *HalfOpenCheck) event(*pollOp, uint32) (bool, error) { return false, nil }

// timeout returns the error of a probe that got no reply, and has the
// next probe look the source address up again.
func (c *HalfOpenCheck) timeout(*pollOp) error {
	c.stale.Store(true)
	return c.dialError(os.ErrDeadlineExceeded)
}

// release takes a probe the poller ended off the socket's table.
func (c *HalfOpenCheck) release(op *pollOp) { c.drop(op) }

// probeWait is the longest Probe waits on the raw socket before it looks
// at its context again.
const probeWait = 10 * time.Millisecond

// Probe sends a SYN and waits for the reply, or for ctx to end. It waits
// in poll(2) on the raw socket, a thread blocked in a system call: the
// way of a probe when there is no poller, not of the Manager's.
func (c *HalfOpenCheck) Probe(ctx context.Context) error {
	ch := make(chan error, 1)
	op := &pollOp{fd: -1, handler: c, done: func(err error) { ch <- err }}
	if err := c.begin(op); err != nil {
		return err
	}
	if err := c.send(); err != nil {
		c.drop(op)
		return err
	}
	s := c.sock
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
	for {
		s.collect()
		select {
		case err := <-ch:
			return err
		default:
		}
		if ctx.Err() != nil {
			if c.drop(op) {
				c.stale.Store(true)
				return c.dialError(ctx.Err())
			}
			return <-ch
		}
		wait := probeWait
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		_, _ = unix.Poll(fds, int(max(wait.Milliseconds(), 1))) // EINTR: look again
	}
}

// tcpChecksum returns the checksum of seg, a TCP segment from src to
// dst, whose checksum field is zero.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	sum := uint32(unix.IPPROTO_TCP) + uint32(len(seg))
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		sum += sumWords(a[:]) + sumWords(b[:])
	} else {
		a, b := src.As16(), dst.As16()
		sum += sumWords(a[:]) + sumWords(b[:])
	}
	sum += sumWords(seg)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// sumWords adds b's big-endian 16-bit words, b of even length.
func sumWords(b []byte) uint32 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	return sum
}

var (
	_ pollProber   = (*HalfOpenCheck)(nil)
	_ pollHandler  = (*HalfOpenCheck)(nil)
	_ pollReleaser = (*HalfOpenCheck)(nil)
)
