package health

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// start begins a probe on p: a non-blocking connect whose completion p
// reports, ending at deadline; done gets the result, from p's goroutine,
// or from start's caller when the probe ends at once. It always runs on
// p.
//
// A connect to a local address has often finished by the time connect
// returns (the kernel runs both ends of the handshake in the call), so
// for a check whose last probe found that, start asks again at once (a
// second connect reports the first's result, if it has one) and ends the
// probe without the poller. A check whose probes do not finish at once
// asks only every sameCallRetry probes, to notice a change.
func (c *TCPCheck) start(p *poller, deadline time.Time, done func(error)) bool {
	if c.sa.len == 0 {
		c.sa = rawAddrOf(c.target)
	}
	fd, err := dialConnect(c.dial, c.target, &c.sa)
	if err != nil {
		done(c.dialError(err))
		return true
	}
	if c.skip == 0 {
		switch err := rawConnect(fd, &c.sa); err {
		case unix.EALREADY, unix.EINPROGRESS, unix.EINTR:
			c.skip = sameCallRetry - 1
		case nil, unix.EISCONN:
			rawClose(fd)
			done(nil)
			return true
		default:
			rawClose(fd)
			done(c.dialError(os.NewSyscallError("connect", err)))
			return true
		}
	} else {
		c.skip--
	}
	op := &pollOp{fd: fd, deadline: p.at(deadline), handler: c, done: done}
	if err := p.add(op, unix.EPOLLOUT|unix.EPOLLET); err != nil {
		unix.Close(fd)
		done(c.dialError(err))
	}
	return true
}

// event ends the probe when the connect has: established, or failed.
func (c *TCPCheck) event(op *pollOp, events uint32) (bool, error) {
	if err := connected(op.fd, events); err != nil || events&unix.EPOLLOUT != 0 {
		return true, c.dialError(err)
	}
	return false, nil
}

// timeout returns the error the net package gives a dial that timed out.
func (c *TCPCheck) timeout(*pollOp) error { return c.dialError(os.ErrDeadlineExceeded) }

// dialError returns err, if not nil, as the net package reports a failed
// dial, so that an error reads the same whichever way the probe ran.
func (c *TCPCheck) dialError(err error) error {
	if err == nil {
		return nil
	}
	return dialErr(c.dial, c.target, err)
}

// dialError wraps err in a net.OpError for a dial of target.
func dialErr(o DialOptions, target netip.AddrPort, err error) error {
	e := &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(target), Err: err}
	if o.Source.IsValid() {
		e.Source = net.TCPAddrFromAddrPort(netip.AddrPortFrom(o.Source, 0))
	}
	return e
}

// connected returns the error of the connect that fd, with readiness
// events, reports: nil when it is established or still under way.
func connected(fd int, events uint32) error {
	if events&(unix.EPOLLERR|unix.EPOLLHUP) == 0 {
		// Writable without an error: established (or, without
		// EPOLLOUT, under way), with no system call to ask.
		return nil
	}
	errno, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return os.NewSyscallError("getsockopt", err)
	}
	if errno != 0 {
		return os.NewSyscallError("connect", syscall.Errno(errno))
	}
	if events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 && events&unix.EPOLLOUT == 0 {
		return os.NewSyscallError("connect", unix.ECONNRESET)
	}
	return nil
}

// connect opens a non-blocking TCP socket with o's options, closing with
// a reset, and starts connecting it to target. It returns the socket,
// whose connect may be under way still.
func dialConnect(o DialOptions, target netip.AddrPort, sa *rawAddr) (int, error) {
	fd, err := rawSocket(sa.family())
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if err := dialPrepare(o, fd, target); err != nil {
		rawClose(fd)
		return -1, err
	}
	if err := rawConnect(fd, sa); err != nil && err != unix.EINPROGRESS {
		rawClose(fd)
		return -1, os.NewSyscallError("connect", err)
	}
	return fd, nil
}

// prepare sets the options of fd, a socket to connect to
// target: a reset on close, o's mark and device, and o's source address.
func dialPrepare(o DialOptions, fd int, target netip.AddrPort) error {
	if err := rawResetOnClose(fd); err != nil {
		return os.NewSyscallError("setsockopt", err)
	}
	if o.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark)); err != nil {
			return fmt.Errorf("set mark %#x: %w", o.Mark, err)
		}
	}
	if o.Device != "" {
		if err := unix.BindToDevice(fd, o.Device); err != nil {
			return fmt.Errorf("bind to device %s: %w", o.Device, err)
		}
	}
	if !o.Source.IsValid() {
		return nil
	}
	src := o.Source.Unmap()
	if src.Is4() != target.Addr().Is4() {
		return fmt.Errorf("source address %s and target %s are of different families", src, target)
	}
	// The port is picked at connect, for the whole 4-tuple, rather than
	// at bind, for the source address alone: probes of many backends
	// from one source do not run out of ports. IPv6 sockets take the
	// option too.
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	_, sa := sockaddr(netip.AddrPortFrom(src, 0))
	if err := unix.Bind(fd, sa); err != nil {
		return os.NewSyscallError("bind", err)
	}
	return nil
}

// sockaddr returns the address family and socket address of a.
func sockaddr(a netip.AddrPort) (int, unix.Sockaddr) {
	if a.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	sa := &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
	if z := a.Addr().Zone(); z != "" {
		if ifi, err := net.InterfaceByName(z); err == nil {
			sa.ZoneId = uint32(ifi.Index)
		} else if n, err := strconv.ParseUint(z, 10, 32); err == nil {
			sa.ZoneId = uint32(n)
		}
	}
	return unix.AF_INET6, sa
}

var _ pollProber = (*TCPCheck)(nil)

// sameCallRetry is how often start asks at once for the result of the
// connect of a check whose connects do not finish in the call.
const sameCallRetry = 16
