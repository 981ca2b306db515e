package health

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The system calls of a probe's hot path (socket, the reset on close,
// connect, close) are made raw, without telling the Go scheduler: on a
// non-blocking socket they do not block, and a scheduler told that a
// goroutine is in a system call lets its monitor take the goroutine's P
// away from calls that run the loopback handshake for tens of
// microseconds, a thread hand-off each time.

// rawAddr is a socket address in the kernel's form.
type rawAddr struct {
	sa  unix.RawSockaddrInet6 // or a RawSockaddrInet4 at its start
	len uint32
}

// socketAddr is a socket address for the poller.
type socketAddr = rawAddr

// rawAddrOf returns a in the kernel's form.
func rawAddrOf(a netip.AddrPort) rawAddr {
	var r rawAddr
	port := (*[2]byte)(unsafe.Pointer(&r.sa.Port))
	port[0], port[1] = byte(a.Port()>>8), byte(a.Port())
	if a.Addr().Is4() {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sa))
		sa4.Family = unix.AF_INET
		sa4.Addr = a.Addr().As4()
		r.len = unix.SizeofSockaddrInet4
		return r
	}
	r.sa.Family = unix.AF_INET6
	r.sa.Addr = a.Addr().As16()
	_, sa := sockaddr(a)
	r.sa.Scope_id = sa.(*unix.SockaddrInet6).ZoneId
	r.len = unix.SizeofSockaddrInet6
	return r
}

// family returns r's address family.
func (r *rawAddr) family() int { return int(r.sa.Family) }

// rawSocket opens a non-blocking TCP socket of family.
func rawSocket(family int) (int, error) {
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, uintptr(family), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// rawResetOnClose sets SO_LINGER 0 on fd: its close sends a reset.
func rawResetOnClose(fd int) error {
	l := unix.Linger{Onoff: 1}
	_, _, e := unix.RawSyscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER, uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
	if e != 0 {
		return e
	}
	return nil
}

// rawConnect connects fd to r. Non-blocking, it returns EINPROGRESS
// while the handshake is under way, then (asked again) nil once it is
// established, or the error that ended it.
func rawConnect(fd int, r *rawAddr) error {
	_, _, e := unix.RawSyscall(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&r.sa)), uintptr(r.len))
	if e != 0 {
		return e
	}
	return nil
}

// rawClose closes fd.
func rawClose(fd int) {
	_, _, _ = unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

// rawSend writes b to fd, without SIGPIPE.
func rawSend(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MSG_NOSIGNAL, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawRead reads from fd into b.
func rawRead(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawPeek reads from fd into b without taking the bytes off the socket.
func rawPeek(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawEpollWait polls epoll instance epfd for events, without waiting.
func rawEpollWait(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawEpollCtl is epoll_ctl(2).
func rawEpollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
