//go:build linux

package healthbench

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The floor is the least any checker does for a workload's checks, run
// in the same place as the checkers so that their CPU can be read against
// it. It is the design both vipd's and keepalived's checkers follow, with
// nothing else: one thread that wakes every FloorTick, starts the probes
// due, and waits in epoll_wait for the ones under way until the next
// tick. A probe is a non-blocking socket closed with a reset (socket,
// SO_LINGER, connect, and a second connect that finds a local handshake
// done); an HTTP probe then writes the request and reads the response's
// head. No scheduler, timer heap, state machine, metric or log: what a
// checker costs above it is what it adds to the kernel's work.

// floorRequest is the floor's HTTP request: the one vipd's check sends.
func floorRequest(b Backend) []byte {
	return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n", HealthPath, b.Addr)
}

// FloorCounts is what a floor run did.
type FloorCounts struct {
	Probes, Failures int
	// First is the first failure's error, if any.
	First error
}

// floorOp is a probe under way.
type floorOp struct {
	b        Backend
	req      []byte
	deadline time.Time
	// reading says the request is written: the probe waits for the
	// response, of which n bytes are in buf.
	reading bool
	n       int
	buf     []byte
}

// floorLoop runs probes on one epoll instance.
type floorLoop struct {
	epfd    int
	ops     map[int32]*floorOp
	timeout time.Duration
	counts  FloorCounts
	events  []unix.EpollEvent
}

func newFloorLoop(timeout time.Duration) (*floorLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	return &floorLoop{epfd: epfd, ops: map[int32]*floorOp{}, timeout: timeout, events: make([]unix.EpollEvent, 256)}, nil
}

// close ends the probes under way, uncounted, and the epoll instance.
func (l *floorLoop) close() {
	for fd := range l.ops {
		unix.Close(int(fd))
	}
	unix.Close(l.epfd)
}

// end closes fd and counts its probe's result.
func (l *floorLoop) end(fd int, err error) {
	if _, ok := l.ops[int32(fd)]; ok {
		delete(l.ops, int32(fd))
		_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
	}
	unix.Close(fd)
	l.counts.Probes++
	if err != nil {
		l.counts.Failures++
		if l.counts.First == nil {
			l.counts.First = err
		}
	}
}

// start begins a probe of b.
func (l *floorLoop) start(b Backend, req []byte, now time.Time) {
	if !b.Addr.Addr().Is4() {
		l.end(-1, fmt.Errorf("%s: the floor probes IPv4 backends only", b.Addr))
		return
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		l.end(-1, fmt.Errorf("socket: %w", err))
		return
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1}); err != nil {
		l.end(fd, fmt.Errorf("linger: %w", err))
		return
	}
	op := &floorOp{b: b, req: req, deadline: now.Add(l.timeout)}
	sa := &unix.SockaddrInet4{Addr: b.Addr.Addr().As4(), Port: int(b.Addr.Port())}
	err = unix.Connect(fd, sa)
	if errors.Is(err, unix.EINPROGRESS) {
		// A local handshake is done by now: the second connect says so.
		err = unix.Connect(fd, sa)
	}
	switch {
	case err == nil || errors.Is(err, unix.EISCONN):
		l.connected(fd, op)
	case errors.Is(err, unix.EALREADY) || errors.Is(err, unix.EINPROGRESS):
		l.watch(fd, op, unix.EPOLLOUT)
	default:
		l.end(fd, fmt.Errorf("connect %s: %w", b.Addr, err))
	}
}

// watch waits for events of fd, under way as op.
func (l *floorLoop) watch(fd int, op *floorOp, events uint32) {
	ctl := unix.EPOLL_CTL_ADD
	if _, ok := l.ops[int32(fd)]; ok {
		ctl = unix.EPOLL_CTL_MOD
	}
	if err := unix.EpollCtl(l.epfd, ctl, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)}); err != nil {
		l.end(fd, fmt.Errorf("epoll: %w", err))
		return
	}
	l.ops[int32(fd)] = op
}

// connected goes on with a probe whose connect is done: a TCP probe
// ends, an HTTP one writes its request and waits for the response.
func (l *floorLoop) connected(fd int, op *floorOp) {
	if op.b.Kind == TCP {
		l.end(fd, nil)
		return
	}
	if _, err := unix.Write(fd, op.req); err != nil {
		l.end(fd, fmt.Errorf("write %s: %w", op.b.Addr, err))
		return
	}
	op.reading, op.buf = true, make([]byte, 1024)
	l.watch(fd, op, unix.EPOLLIN)
}

// event handles fd's readiness.
func (l *floorLoop) event(fd int, events uint32) {
	op := l.ops[int32(fd)]
	if op == nil {
		return
	}
	if !op.reading {
		if events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			errno, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil {
				err = unix.Errno(errno)
			}
			l.end(fd, fmt.Errorf("connect %s: %w", op.b.Addr, err))
			return
		}
		l.connected(fd, op)
		return
	}
	for {
		if op.n == len(op.buf) {
			l.end(fd, fmt.Errorf("%s: response head over %d bytes", op.b.Addr, len(op.buf)))
			return
		}
		m, err := unix.Read(fd, op.buf[op.n:])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return
		}
		if err != nil {
			l.end(fd, fmt.Errorf("read %s: %w", op.b.Addr, err))
			return
		}
		if m == 0 {
			l.end(fd, fmt.Errorf("%s: connection closed before the response's head", op.b.Addr))
			return
		}
		op.n += m
		if bytes.Contains(op.buf[:op.n], []byte("\r\n\r\n")) {
			status, _, _ := bytes.Cut(op.buf[:op.n], []byte("\r\n"))
			if f := bytes.Fields(status); len(f) < 2 || !bytes.HasPrefix(f[0], []byte("HTTP/1.")) || string(f[1]) != "200" {
				l.end(fd, fmt.Errorf("%s: answered %q", op.b.Addr, status))
				return
			}
			l.end(fd, nil)
			return
		}
	}
}

// wait handles events until `until`, and ends the probes whose deadline
// has passed.
func (l *floorLoop) wait(until time.Time) {
	for {
		// Rounded up: a wait of 0 would spin until the tick.
		ms := int((time.Until(until) + time.Millisecond - 1) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		n, err := unix.EpollWait(l.epfd, l.events, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			l.counts.First = cmp.Or(l.counts.First, fmt.Errorf("epoll_wait: %w", err))
			return
		}
		for _, ev := range l.events[:max(n, 0)] {
			l.event(int(ev.Fd), ev.Events)
		}
		now := time.Now()
		for fd, op := range l.ops {
			if now.After(op.deadline) {
				l.end(int(fd), fmt.Errorf("%s: timed out", op.b.Addr))
			}
		}
		if !now.Before(until) {
			return
		}
	}
}

// floorKind is the schedule of one kind's checks: probe j (counting from
// the start) is due at j×interval/n and goes to backends[j mod n], which
// spreads each kind's probes evenly over its interval.
type floorKind struct {
	backends []Backend
	reqs     [][]byte
	interval time.Duration
	j        int
}

func (k *floorKind) due(j int) time.Duration {
	return time.Duration(int64(j) * int64(k.interval) / int64(len(k.backends)))
}

// RunFloor probes backends with w's intervals and timeout, from the
// calling goroutine locked to its thread, until stop is closed, and
// returns the counts (the probes under way then are not counted). A
// probe that fails counts as one and the schedule goes on.
func RunFloor(w Workload, backends []Backend, stop <-chan struct{}) FloorCounts {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var kinds []*floorKind
	for _, kind := range []Kind{TCP, HTTP} {
		k := &floorKind{interval: w.interval(kind)}
		for _, b := range backends {
			if b.Kind == kind {
				k.backends = append(k.backends, b)
				k.reqs = append(k.reqs, floorRequest(b))
			}
		}
		if len(k.backends) > 0 {
			kinds = append(kinds, k)
		}
	}
	l, err := newFloorLoop(w.Timeout)
	if err != nil {
		return FloorCounts{First: err}
	}
	defer l.close()
	t0 := time.Now()
	for tick := 1; ; tick++ {
		select {
		case <-stop:
			return l.counts
		default:
		}
		now := time.Now()
		since := now.Sub(t0)
		for _, k := range kinds {
			for ; k.due(k.j) <= since; k.j++ {
				i := k.j % len(k.backends)
				l.start(k.backends[i], k.reqs[i], now)
			}
		}
		l.wait(t0.Add(time.Duration(tick) * FloorTick))
	}
}
