package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// testPoller returns a poller closed when t ends.
func testPoller(t *testing.T) *poller {
	t.Helper()
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

// pollProbe runs one probe of pp on p with timeout and returns its
// result.
func pollProbe(t *testing.T, p *poller, pp pollProber, timeout time.Duration) error {
	t.Helper()
	ch := make(chan error, 2)
	pp.start(p, time.Now().Add(timeout), func(err error) { ch <- err })
	p.flush()
	select {
	case err := <-ch:
		select {
		case err2 := <-ch:
			t.Fatalf("done called twice: %v, then %v", err, err2)
		case <-time.After(10 * time.Millisecond):
		}
		return err
	case <-time.After(time.Minute):
		t.Fatal("the probe never ended")
		return nil
	}
}

// tcpPaths runs f for both ways a tcp probe on the poller can end: in
// the connect's call, and through the poller.
func tcpPaths(t *testing.T, f func(t *testing.T, probe func(c *TCPCheck) error)) {
	for _, path := range []struct {
		name string
		skip int
	}{{"at once", 0}, {"polled", sameCallRetry}} {
		t.Run(path.name, func(t *testing.T) {
			p := testPoller(t)
			f(t, func(c *TCPCheck) error {
				c.skip = path.skip
				return pollProbe(t, p, c, 5*time.Second)
			})
		})
	}
}

// fullListener returns the address of a listener that accepts nothing and
// whose queue is full, so that a connect to it waits for an answer that
// never comes (the kernel drops the SYNs of a full queue).
func fullListener(t *testing.T) netip.AddrPort {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port))
	// A backlog of 0 holds one connection: fill it.
	for range 2 {
		c, err := net.DialTimeout("tcp4", addr.String(), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr
}

func TestPollTCPCheck(t *testing.T) {
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	closed := closedTCPPort(t)
	tcpPaths(t, func(t *testing.T, probe func(*TCPCheck) error) {
		c := NewTCPCheck(up, DialOptions{})
		for i := range 3 {
			if err := probe(c); err != nil {
				t.Errorf("listening port, probe %d: %v", i, err)
			}
		}
		err := probe(NewTCPCheck(closed, DialOptions{}))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("closed port: %v, want connection refused", err)
		}
		// It reads as the net package's error does.
		if want := "dial tcp " + closed.String() + ": connect: connection refused"; err.Error() != want {
			t.Errorf("closed port: %q, want %q", err, want)
		}
	})
}

func TestPollTCPCheckIPv6(t *testing.T) {
	up := listenTCP(t, "tcp6", "[::1]:0")
	tcpPaths(t, func(t *testing.T, probe func(*TCPCheck) error) {
		if err := probe(NewTCPCheck(up, DialOptions{})); err != nil {
			t.Errorf("listening port: %v", err)
		}
		ln, err := net.Listen("tcp6", "[::1]:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		if err := probe(NewTCPCheck(closed, DialOptions{})); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("closed port: %v, want connection refused", err)
		}
	})
}

// TestPollTCPCheckSource binds probes to 127.0.0.2, which the listener on
// 127.0.0.1 sees them come from.
func TestPollTCPCheckSource(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	from := make(chan netip.Addr, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
			c.Close()
		}
	}()
	target := ln.Addr().(*net.TCPAddr).AddrPort()
	src := netip.MustParseAddr("127.0.0.2")
	tcpPaths(t, func(t *testing.T, probe func(*TCPCheck) error) {
		if err := probe(NewTCPCheck(target, DialOptions{Source: src})); err != nil {
			t.Fatal(err)
		}
		if got := <-from; got != src {
			t.Errorf("connection from %s, want %s", got, src)
		}
	})
	// A source of the other family fails, as the net package's dial does.
	p := testPoller(t)
	err = pollProbe(t, p, NewTCPCheck(target, DialOptions{Source: netip.MustParseAddr("::1")}), 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "different families") {
		t.Errorf("an IPv6 source for an IPv4 target: %v", err)
	}
	// A source that is no local address fails at bind.
	err = pollProbe(t, p, NewTCPCheck(target, DialOptions{Source: netip.MustParseAddr("192.0.2.1")}), 5*time.Second)
	if !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("a foreign source: %v, want EADDRNOTAVAIL", err)
	}
}

// TestPollTCPCheckTimeout probes a listener that never answers: the probe
// ends at its deadline, by the poller's heap, with the net package's
// timeout error, and a probe with a later deadline outlives it.
func TestPollTCPCheckTimeout(t *testing.T) {
	full := fullListener(t)
	p := testPoller(t)
	c := NewTCPCheck(full, DialOptions{})
	c.skip = sameCallRetry
	type result struct {
		err error
		at  time.Time
	}
	long, short := make(chan result, 1), make(chan result, 1)
	// The later deadline first: the earlier one must wake the poller.
	NewTCPCheck(full, DialOptions{}).start(p, time.Now().Add(time.Hour), func(err error) { long <- result{err, time.Now()} })
	start := time.Now()
	c.start(p, start.Add(100*time.Millisecond), func(err error) { short <- result{err, time.Now()} })
	r := <-short
	if !errors.Is(r.err, os.ErrDeadlineExceeded) {
		t.Fatalf("unanswered connect: %v, want a timeout", r.err)
	}
	if want := "dial tcp " + full.String() + ": i/o timeout"; r.err.Error() != want {
		t.Errorf("unanswered connect: %q, want %q", r.err, want)
	}
	if r.at.Before(start.Add(100 * time.Millisecond)) {
		t.Errorf("timed out %s after the start, before its deadline", r.at.Sub(start))
	}
	select {
	case r := <-long:
		t.Fatalf("the probe with an hour's deadline ended: %v", r.err)
	default:
	}
	// Closing the poller ends it.
	p.close()
	if r := <-long; !errors.Is(r.err, errPollerClosed) {
		t.Errorf("probe in flight at close: %v, want %v", r.err, errPollerClosed)
	}
	// A closed poller refuses new probes.
	if err := pollProbe(t, p, NewTCPCheck(listenTCP(t, "tcp4", "127.0.0.1:0"), DialOptions{}), time.Second); err == nil {
		// The probe may have ended in the connect's call: only the
		// polled path needs the poller.
		c := NewTCPCheck(full, DialOptions{})
		c.skip = sameCallRetry
		if err := pollProbe(t, p, c, time.Second); !errors.Is(err, errPollerClosed) {
			t.Errorf("probe on a closed poller: %v", err)
		}
	}
}

// TestPollerMany runs many probes at once, up and refused, on one poller:
// each ends once, with its own result, and no socket is left open.
func TestPollerMany(t *testing.T) {
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	closed := closedTCPPort(t)
	before := openFDs(t)
	p := testPoller(t)
	const n = 500
	var wg sync.WaitGroup
	errs := make([]error, n)
	calls := make([]int, n)
	for i := range n {
		target := up
		if i%3 == 0 {
			target = closed
		}
		c := NewTCPCheck(target, DialOptions{})
		c.skip = i % 2 * sameCallRetry
		wg.Add(1)
		c.start(p, time.Now().Add(30*time.Second), func(err error) {
			errs[i] = err
			calls[i]++
			wg.Done()
		})
	}
	wg.Wait()
	for i := range n {
		switch {
		case calls[i] != 1:
			t.Errorf("probe %d: done called %d times", i, calls[i])
		case i%3 == 0 && !errors.Is(errs[i], syscall.ECONNREFUSED):
			t.Errorf("probe %d of a closed port: %v", i, errs[i])
		case i%3 != 0 && errs[i] != nil:
			t.Errorf("probe %d of a listening port: %v", i, errs[i])
		}
	}
	p.mu.Lock()
	inFlight, queued := len(p.ops), len(p.deadlines)
	p.mu.Unlock()
	if inFlight != 0 || queued != 0 {
		t.Errorf("%d ops, %d deadlines left", inFlight, queued)
	}
	// The poller holds its epoll and timer descriptors; the sockets are
	// closed (the listener closes its ends of them in its own time).
	waitFor(t, "the probes' sockets closed", func() bool { return openFDs(t) <= before+2 })
}

// openFDs counts this process's descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestManagerPollShutdown stops a Manager while its tcp probe waits for
// an answer that never comes: Run returns at once, and the probe's
// ending is not recorded as a failure.
func TestManagerPollShutdown(t *testing.T) {
	full := fullListener(t)
	m := NewManager(Options{StartSpread: -1})
	spec := Spec{Kind: KindTCP, Interval: time.Hour, Timeout: time.Hour, Initial: Up}
	if err := m.Update([]Target{{Service: "s", Backend: full, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	waitFor(t, "the probe to start", func() bool { return m.Stats().InFlight == 1 })
	cancel()
	<-done
	st := m.Stats()
	if st.Probes != 0 || st.Failures != 0 || st.InFlight != 0 {
		t.Errorf("after shutdown: %d probes, %d failures, %d in flight; want none", st.Probes, st.Failures, st.InFlight)
	}
	if s, _ := m.Status("s", full); s.State != Up {
		t.Errorf("backend %s after shutdown, want up", s.State)
	}
}

// TestManagerPollTCP runs real tcp checks through a Manager, both ways a
// probe ends (at once, and polled), and takes one backend away: it goes
// down, the others stay up, and the probe lateness is recorded.
func TestManagerPollTCP(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	gone := ln.Addr().(*net.TCPAddr).AddrPort()
	full := fullListener(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	var mu sync.Mutex
	var evs []Transition
	m := NewManager(Options{StartSpread: -1, OnTransition: func(tr Transition) {
		mu.Lock()
		evs = append(evs, tr)
		mu.Unlock()
	}})
	spec := Spec{Kind: KindTCP, Interval: 20 * time.Millisecond, Timeout: 50 * time.Millisecond, Rise: 1, Fall: 2}
	if err := m.Update([]Target{
		{Service: "s", Backend: up, Spec: spec},
		{Service: "s", Backend: gone, Spec: spec},
		{Service: "s", Backend: full, Spec: spec},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "both listening backends up", func() bool {
		h := m.Health("s")
		return h[up] == Up && h[gone] == Up
	})
	ln.Close()
	waitFor(t, "the closed backend down", func() bool { return m.Health("s")[gone] == Down })
	st, _ := m.Status("s", gone)
	if !errors.Is(st.Err, syscall.ECONNREFUSED) {
		t.Errorf("closed backend's error: %v, want connection refused", st.Err)
	}
	waitFor(t, "the silent backend to time out", func() bool {
		st, _ := m.Status("s", full)
		return st.Checks[0].Failures >= 2
	})
	st, _ = m.Status("s", full)
	if st.State != Down || !strings.HasPrefix(st.Err.Error(), "timed out after 50ms: dial tcp") || !errors.Is(st.Err, os.ErrDeadlineExceeded) {
		t.Errorf("silent backend: %s, %v", st.State, st.Err)
	}
	if m.Health("s")[up] != Up {
		t.Error("the listening backend went down")
	}
	s := m.Stats()
	var n uint64
	for _, c := range s.Lateness.Counts {
		n += c
	}
	if n != s.Probes || n == 0 {
		t.Errorf("lateness counts %d probes of %d", n, s.Probes)
	}
}

// TestPollTCPCheckMarkDevice checks the socket options of a probe's
// socket, and that probes with them pass, or fail on a missing device.
func TestPollTCPCheckMarkDevice(t *testing.T) {
	needRoot(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	opts := DialOptions{Mark: 0x1234, Device: "lo"}
	tcpPaths(t, func(t *testing.T, probe func(*TCPCheck) error) {
		if err := probe(NewTCPCheck(up, opts)); err != nil {
			t.Fatalf("marked probe bound to lo: %v", err)
		}
		err := probe(NewTCPCheck(up, DialOptions{Device: "vipdnope0"}))
		if err == nil || !strings.Contains(err.Error(), "bind to device vipdnope0") {
			t.Errorf("probe bound to a missing device: %v", err)
		}
	})
	sa := rawAddrOf(up)
	fd, err := dialConnect(opts, up, &sa)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	mark, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK)
	if err != nil || mark != 0x1234 {
		t.Errorf("socket mark %#x (%v), want 0x1234", mark, err)
	}
	dev, err := unix.GetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE)
	if err != nil || dev != "lo" {
		t.Errorf("socket device %q (%v), want lo", dev, err)
	}
	l, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER)
	if err != nil || l.Onoff != 1 || l.Linger != 0 {
		t.Errorf("socket linger %+v (%v), want on, 0 s: a close resets", l, err)
	}
}

// TestPollTCPCheckUnreachable runs in a private network namespace with a
// link to a peer that has no address, from 10.99.0.1/24: a probe of an address without a route fails
// at once, one of a silent neighbour times out, and a marked probe
// follows its policy route (here to no route at all).
func TestPollTCPCheckUnreachable(t *testing.T) {
	nstest.Need(t)
	nstest.NewPeer(t, "vipdtest0", "vipdtest1") // no address: silent
	for _, args := range [][]string{
		{"addr", "add", "10.99.0.1/24", "dev", "vipdtest0"},
		{"rule", "add", "fwmark", "0x77", "lookup", "77", "pref", "77"},
		{"route", "add", "unreachable", "10.99.0.0/24", "table", "77"},
	} {
		if err := runIP(args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = runIP("route", "del", "unreachable", "10.99.0.0/24", "table", "77")
		_ = runIP("rule", "del", "pref", "77")
	})
	tcpPaths(t, func(t *testing.T, probe func(*TCPCheck) error) {
		if err := probe(NewTCPCheck(netip.MustParseAddrPort("192.0.2.1:80"), DialOptions{})); !errors.Is(err, syscall.ENETUNREACH) {
			t.Errorf("no route: %v, want ENETUNREACH", err)
		}
		if err := probe(NewTCPCheck(netip.MustParseAddrPort("10.99.0.2:80"), DialOptions{Mark: 0x77})); !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("marked into an unreachable route: %v, want EHOSTUNREACH", err)
		}
	})
	p := testPoller(t)
	c := NewTCPCheck(netip.MustParseAddrPort("10.99.0.2:80"), DialOptions{})
	if err := pollProbe(t, p, c, 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("silent neighbour: %v, want a timeout", err)
	}
}

// runIP runs ip with args.
func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// httpProbes returns the ways c probes: through net/http, and on a
// poller if c can run there (if it cannot, start must say so).
func httpProbes(t *testing.T, c *HTTPCheck) map[string]func(time.Duration) error {
	ways := map[string]func(time.Duration) error{
		"net/http": func(d time.Duration) error { return c.Probe(probeCtx(t, d)) },
	}
	p := testPoller(t)
	if canPoll := !c.tls && !c.opts.FollowRedirects; !canPoll {
		if c.start(p, time.Now(), func(error) { t.Error("done called for a probe that did not start") }) {
			t.Error("an https check, or one that follows redirects, runs on the poller")
		}
		return ways
	}
	ways["poller"] = func(d time.Duration) error {
		c.skip = 0
		return pollProbe(t, p, c, d)
	}
	ways["polled"] = func(d time.Duration) error {
		c.skip = sameCallRetry
		return pollProbe(t, p, c, d)
	}
	return ways
}

// idleSocket is the handler of test probes on a socket that never gets
// an event, which only time out.
type idleSocket struct{}

func (idleSocket) event(*pollOp, uint32) (bool, error) { return false, nil }
func (idleSocket) timeout(*pollOp) error               { return os.ErrDeadlineExceeded }

// TestPollerSlack checks that the poller wakes for deadlines at most once
// per its slack: of two probes due 20ms apart, the second times out 20ms
// after the first without slack, and a slack after the first's deadline
// with one.
func TestPollerSlack(t *testing.T) {
	for _, slack := range []time.Duration{0, 300 * time.Millisecond} {
		p := testPoller(t)
		p.setSlack(slack)
		t0 := time.Now()
		ended := make(chan time.Duration, 2)
		for _, d := range []time.Duration{50 * time.Millisecond, 70 * time.Millisecond} {
			fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			op := &pollOp{fd: fd, deadline: p.at(t0.Add(d)), handler: idleSocket{}}
			op.done = func(err error) {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("probe due at %v ended with %v, want a timeout", d, err)
				}
				ended <- time.Since(t0)
			}
			if err := p.add(op, 0); err != nil {
				t.Fatal(err)
			}
		}
		first, second := <-ended, <-ended
		if first < 50*time.Millisecond || second < 70*time.Millisecond {
			t.Errorf("slack %v: the probes timed out at %v and %v, before their deadlines", slack, first, second)
		}
		// The loop woke for the first at its deadline or later, and
		// not again within the slack.
		if slack > 0 && second < 50*time.Millisecond+slack {
			t.Errorf("slack %v: the second probe timed out at %v, want at least the first's deadline and the slack, %v", slack, second, 50*time.Millisecond+slack)
		}
		if slack == 0 && second-first > 200*time.Millisecond {
			t.Errorf("no slack: the second probe timed out %v after the first, want about 20ms", second-first)
		}
	}
}

// TestPollerCloseTwice: a second close touches no descriptor, though the
// numbers of the poller's are others' by then.
func TestPollerCloseTwice(t *testing.T) {
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	p.close()
	// The lowest free numbers: the poller's, just closed.
	var files []*os.File
	for range 2 {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	p.close()
	for _, f := range files {
		if _, err := f.Stat(); err != nil {
			t.Errorf("a file opened after the poller's close is closed by its second close: %v", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Errorf("descriptor %d: %v", f.Fd(), err)
		}
	}
}
