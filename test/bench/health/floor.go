//go:build linux

package healthbench

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The floor is the least any checker does for a workload's checks, run
// in the same place as the checkers so that their CPU can be read against
// it: one thread that wakes every FloorTick, and for each check due makes
// the system calls a probe cannot do without. A TCP probe is a blocking
// socket closed with a reset (socket, SO_LINGER, connect, close); an HTTP
// probe also writes the request and reads the response's head. No
// scheduler, timer, poller, state machine, metric or log: what a checker
// costs above it is what it adds to the kernel's work.

// floorRequest is the floor's HTTP request: the one vipd's check sends.
func floorRequest(b Backend) []byte {
	return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n", HealthPath, b.Addr)
}

// floorProbe probes b once, giving up after timeout, and returns nil if
// it answers: a connect for TCP, a 200 for HTTP. req is b's request.
func floorProbe(b Backend, req []byte, timeout time.Duration, buf []byte) error {
	if !b.Addr.Addr().Is4() {
		return fmt.Errorf("%s: the floor probes IPv4 backends only", b.Addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1}); err != nil {
		return fmt.Errorf("linger: %w", err)
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	// A blocking connect gives up after the send timeout.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return fmt.Errorf("send timeout: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: b.Addr.Addr().As4(), Port: int(b.Addr.Port())}); err != nil {
		return fmt.Errorf("connect %s: %w", b.Addr, err)
	}
	if b.Kind == TCP {
		return nil
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("receive timeout: %w", err)
	}
	if _, err := unix.Write(fd, req); err != nil {
		return fmt.Errorf("write %s: %w", b.Addr, err)
	}
	n := 0
	for !bytes.Contains(buf[:n], []byte("\r\n\r\n")) {
		if n == len(buf) {
			return fmt.Errorf("%s: response head over %d bytes", b.Addr, len(buf))
		}
		m, err := unix.Read(fd, buf[n:])
		if err != nil {
			return fmt.Errorf("read %s: %w", b.Addr, err)
		}
		if m == 0 {
			return fmt.Errorf("%s: connection closed before the response's head", b.Addr)
		}
		n += m
	}
	status, _, _ := bytes.Cut(buf[:n], []byte("\r\n"))
	if f := bytes.Fields(status); len(f) < 2 || !bytes.HasPrefix(f[0], []byte("HTTP/1.")) || string(f[1]) != "200" {
		return fmt.Errorf("%s: answered %q", b.Addr, status)
	}
	return nil
}

// FloorCounts is what a floor run did.
type FloorCounts struct {
	Probes, Failures int
	// First is the first failure's error, if any.
	First error
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
// returns the counts. A probe that fails counts as one and the schedule
// goes on.
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
	var c FloorCounts
	buf := make([]byte, 4096)
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		c.First = fmt.Errorf("clock: %w", err)
		return c
	}
	base := mono.Nano()
	t0 := time.Now()
	for tick := 1; ; tick++ {
		select {
		case <-stop:
			return c
		default:
		}
		now := time.Since(t0)
		for _, k := range kinds {
			for ; k.due(k.j) <= now; k.j++ {
				i := k.j % len(k.backends)
				c.Probes++
				if err := floorProbe(k.backends[i], k.reqs[i], w.Timeout, buf); err != nil {
					c.Failures++
					if c.First == nil {
						c.First = err
					}
				}
			}
		}
		// Sleep on the thread itself until the next tick: no runtime
		// timer, no hand-off.
		ts := unix.NsecToTimespec(base + int64(tick)*int64(FloorTick))
		if err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
			time.Sleep(FloorTick)
		}
	}
}
