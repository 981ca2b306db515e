package ipvs

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// conn is a generic netlink socket that the adapter reads and writes
// itself, without the per-call allocations of the netlink library: the
// batch path sends many requests in one datagram and reads many
// acknowledgements per system call (recvmmsg). The socket is not
// registered with Go's network poller: the kernel answers a request
// before sendto returns, so a read rarely waits, and a registered socket
// would wake the poller's thread for every datagram the kernel queues
// (about a quarter of a destination dump's cost, measured once in the
// test guest). When a read must wait, it waits in poll(2).
type conn struct {
	fd  int
	seq uint32
	// rcvbuf is the socket's receive buffer as the kernel reports it.
	rcvbuf int

	// Receive slots, allocated on first use: many small ones for
	// acknowledgements, two large ones for dumps.
	ackSlots  *slots
	dumpSlots *slots
}

// transport is what the batch and dump code needs of a socket; tests
// replace it with a fake kernel.
type transport interface {
	// nextSeq returns the sequence number for the next request.
	nextSeq() uint32
	// send writes one datagram holding one or more requests.
	send(b []byte) error
	// recv reads one or more datagrams, as many as are queued (at least
	// one), and calls fn for each message in them. large selects the
	// receive slots sized for dumps.
	recv(large bool, fn func(m message) error) error
	// close releases the socket.
	close() error
}

// message is one netlink message of a datagram the kernel sent.
type message struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte // the payload after the netlink header
}

// Receive slots: an acknowledgement with NETLINK_CAP_ACK is 36 bytes; a
// dump reads at most two datagrams per call (its entries, then the end).
const (
	ackSlotSize   = 1024
	ackSlotCount  = 128
	dumpSlotCount = 2
)

// dumpSlotSize is the size of a dump's receive slot. The kernel sizes a
// dump datagram by the largest buffer the socket ever read with (up to
// 32 KiB), but at least NLMSG_GOODSIZE (a page less the skb's overhead, or
// 8 KiB less it on larger pages), so a buffer of a page keeps its dump
// buffers in the slab caches: 32 KiB ones come from the page allocator
// and made a destination dump twice as slow in the test guest.
var dumpSlotSize = min(max(os.Getpagesize(), 4096), 8192)

// wantRcvbuf is the receive buffer the adapter asks for: acknowledgements
// of a whole chunk of requests must fit in it, or the kernel drops them.
const wantRcvbuf = 4 << 20

// openConn opens a generic netlink socket in the network namespace ns
// (the caller's when ns is not open).
func openConn(ns netns.NsHandle) (*conn, error) {
	fd, err := socketAt(ns)
	if err != nil {
		return nil, err
	}
	// Acknowledgements of failed requests carry only the request's
	// header, not the request itself.
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set NETLINK_CAP_ACK: %w", err)
	}
	// Raising the buffer beyond rmem_max needs CAP_NET_ADMIN, which IPVS
	// needs anyway; without it the kernel's limit applies and batches are
	// cut to fit.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, wantRcvbuf) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, wantRcvbuf)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, wantRcvbuf)
	rcvbuf, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("read SO_RCVBUF: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind netlink socket: %w", err)
	}
	return &conn{fd: fd, rcvbuf: rcvbuf, seq: uint32(time.Now().UnixNano())}, nil
}

// socketAt creates a non-blocking generic netlink socket in ns.
func socketAt(ns netns.NsHandle) (int, error) {
	if !ns.IsOpen() {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_GENERIC)
		if err != nil {
			return -1, fmt.Errorf("open netlink socket: %w", err)
		}
		return fd, nil
	}
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// A thread that fails to return to its namespace must not run
		// other goroutines: it stays locked and exits with this one.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{-1, fmt.Errorf("open netlink socket: current network namespace: %w", err)}
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			ch <- result{-1, fmt.Errorf("open netlink socket: enter network namespace: %w", err)}
			return
		}
		fd, err := socketAt(netns.None())
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

// close closes the socket.
func (c *conn) close() error { return unix.Close(c.fd) }

func (c *conn) nextSeq() uint32 {
	c.seq++
	return c.seq
}

// send implements transport.
func (c *conn) send(b []byte) error {
	for {
		err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if err != unix.EAGAIN {
			return err
		}
		if err := c.wait(unix.POLLOUT); err != nil {
			return err
		}
	}
}

// wait waits up to socketTimeout for the socket to become readable or
// writable (events), and fails with EAGAIN when it does not.
func (c *conn) wait(events int16) error {
	deadline := time.Now().Add(socketTimeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.EAGAIN
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: events}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n > 0:
			return nil
		}
	}
}

// slots are receive buffers for recvmmsg.
type slots struct {
	bufs []byte
	size int
	iov  []unix.Iovec
	hdrs []mmsghdr
}

// mmsghdr is struct mmsghdr; Go pads it as C does.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

func newSlots(count, size int) *slots {
	s := &slots{bufs: make([]byte, count*size), size: size, iov: make([]unix.Iovec, count), hdrs: make([]mmsghdr, count)}
	for i := range count {
		s.iov[i].Base = &s.bufs[i*size]
		s.iov[i].SetLen(size)
		s.hdrs[i].hdr.Iov = &s.iov[i]
		s.hdrs[i].hdr.SetIovlen(1)
	}
	return s
}

// recv implements transport.
func (c *conn) recv(large bool, fn func(m message) error) error {
	s := c.ackSlots
	if large {
		if c.dumpSlots == nil {
			c.dumpSlots = newSlots(dumpSlotCount, dumpSlotSize)
		}
		s = c.dumpSlots
	} else if s == nil {
		c.ackSlots = newSlots(ackSlotCount, ackSlotSize)
		s = c.ackSlots
	}
	var n int
	for {
		for i := range s.hdrs {
			s.hdrs[i].n = 0
			s.hdrs[i].hdr.Flags = 0
		}
		r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(len(s.hdrs)), 0, 0, 0)
		if errno == 0 {
			n = int(r)
			break
		}
		if errno == unix.EINTR {
			continue
		}
		if errno != unix.EAGAIN {
			return errno
		}
		if err := c.wait(unix.POLLIN); err != nil {
			return err
		}
	}
	for i := range n {
		h := &s.hdrs[i]
		if h.hdr.Flags&unix.MSG_TRUNC != 0 {
			return fmt.Errorf("netlink datagram larger than %d bytes", s.size)
		}
		if err := parseDatagram(s.bufs[i*s.size:i*s.size+int(h.n)], fn); err != nil {
			return err
		}
	}
	return nil
}

// parseDatagram calls fn for each netlink message in b.
func parseDatagram(b []byte, fn func(m message) error) error {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return fmt.Errorf("bad netlink message length %d (%d bytes left)", l, len(b))
		}
		m := message{
			typ:   binary.NativeEndian.Uint16(b[4:6]),
			flags: binary.NativeEndian.Uint16(b[6:8]),
			seq:   binary.NativeEndian.Uint32(b[8:12]),
			data:  b[unix.NLMSG_HDRLEN:l],
		}
		if err := fn(m); err != nil {
			return err
		}
		b = b[min(nlmAlign(l), len(b)):]
	}
	return nil
}

func nlmAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

// ackError decodes an NLMSG_ERROR message: ok is false when it is too
// short, err nil for an acknowledgement.
func ackError(data []byte) (ok bool, err error) {
	if len(data) < 4 {
		return false, nil
	}
	code := int32(binary.NativeEndian.Uint32(data[0:4]))
	if code == 0 {
		return true, nil
	}
	return true, unix.Errno(-code)
}
