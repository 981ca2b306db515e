package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// halfOpenPeer is a backend host for half-open probes: a namespace joined
// to the test's by a veth pair, 10.38.0.2 and fd38::2 on its end, 10.38.0.1
// and fd38::1 on the test's. A veth, unlike loopback, checks the SYNs'
// checksums.
type halfOpenPeer struct {
	*nstest.Peer
	addrs map[string]netip.Addr // by family name: "v4", "v6"
}

var halfOpenPeerMu sync.Mutex

func newHalfOpenPeer(t *testing.T) *halfOpenPeer {
	t.Helper()
	nstest.Need(t)
	// One peer at a time: the links' names and addresses are fixed.
	halfOpenPeerMu.Lock()
	t.Cleanup(halfOpenPeerMu.Unlock)
	p := nstest.NewPeer(t, "ho0", "hp0")
	for _, a := range []string{"10.38.0.1/24", "fd38::1/64"} {
		if err := nstest.AddAddr("ho0", a); err != nil {
			t.Fatal(err)
		}
	}
	p.Do(t, func() error {
		for _, a := range []string{"10.38.0.2/24", "fd38::2/64"} {
			if err := nstest.AddAddr("hp0", a); err != nil {
				return err
			}
		}
		return nil
	})
	hp := &halfOpenPeer{Peer: p, addrs: map[string]netip.Addr{
		"v4": netip.MustParseAddr("10.38.0.2"), "v6": netip.MustParseAddr("fd38::2"),
	}}
	// The first packets to a new neighbour wait for its address to be
	// resolved, an IPv6 one a second or more when the first solicitation
	// goes out before the link is ready: resolve both ways before the
	// tests time anything, with a probe of a closed port.
	for _, fam := range families {
		_, target := hp.listen(t, hp.addrs[fam], false)
		c := newTestHalfOpen(t, target)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.Probe(ctx)
		cancel()
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("warm-up probe of closed %s: %v", target, err)
		}
	}
	return hp
}

// listen opens a listener (or, with listen false, a bound socket that
// does not listen: a closed port) in the peer on addr, and returns it and
// its address. It is closed when t ends.
func (p *halfOpenPeer) listen(t *testing.T, addr netip.Addr, listen bool) (int, netip.AddrPort) {
	t.Helper()
	var fd int
	var bound netip.AddrPort
	p.Do(t, func() error {
		family, sa := sockaddr(netip.AddrPortFrom(addr, 0))
		var err error
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, sa); err != nil {
			return err
		}
		if listen {
			if err := unix.Listen(fd, 128); err != nil {
				return err
			}
		}
		got, err := unix.Getsockname(fd)
		if err != nil {
			return err
		}
		switch a := got.(type) {
		case *unix.SockaddrInet4:
			bound = netip.AddrPortFrom(addr, uint16(a.Port))
		case *unix.SockaddrInet6:
			bound = netip.AddrPortFrom(addr, uint16(a.Port))
		}
		return nil
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd, bound
}

// tcpStates returns the states (as /proc/net/tcp numbers them: 01
// established, 03 SYN received...) of the peer's TCP sockets on port.
func (p *halfOpenPeer) tcpStates(t *testing.T, port uint16) []string {
	t.Helper()
	var states []string
	p.Do(t, func() error {
		for _, name := range []string{"tcp", "tcp6"} {
			f, err := os.Open("/proc/thread-self/net/" + name)
			if err != nil {
				return err
			}
			sc := bufio.NewScanner(f)
			sc.Scan() // header
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				if len(fields) < 4 {
					continue
				}
				_, hexPort, _ := strings.Cut(fields[1], ":")
				if n, err := strconv.ParseUint(hexPort, 16, 16); err == nil && uint16(n) == port {
					states = append(states, fields[3])
				}
			}
			f.Close()
		}
		return nil
	})
	return states
}

// iptables runs ip(6)tables in the peer.
func (p *halfOpenPeer) iptables(t *testing.T, v6 bool, args ...string) {
	t.Helper()
	cmd := "iptables"
	if v6 {
		cmd = "ip6tables"
	}
	if _, err := exec.LookPath(cmd); err != nil {
		t.Skipf("%s: %v", cmd, err)
	}
	p.Do(t, func() error {
		// The child starts on this thread, in the peer's namespace.
		out, err := exec.Command(cmd, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, out)
		}
		return nil
	})
}

// halfOpen returns a half-open check of target.
func newTestHalfOpen(t testing.TB, target netip.AddrPort) *HalfOpenCheck {
	t.Helper()
	c, err := NewHalfOpenCheck(target, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// halfOpenWays runs f for both ways a half-open probe runs: on a poller,
// and through Probe.
func halfOpenWays(t *testing.T, f func(t *testing.T, probe func(c *HalfOpenCheck, timeout time.Duration) error)) {
	t.Run("poller", func(t *testing.T) {
		p := testPoller(t)
		f(t, func(c *HalfOpenCheck, timeout time.Duration) error { return pollProbe(t, p, c, timeout) })
	})
	t.Run("probe", func(t *testing.T) {
		f(t, func(c *HalfOpenCheck, timeout time.Duration) error {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			return c.Probe(ctx)
		})
	})
}

var families = []string{"v4", "v6"}

// TestHalfOpenListener: a listener answers the SYN, which is up; the
// listener's application accepts nothing and the backend keeps no
// connection, established or half-open, since the checker's kernel
// resets the SYN-ACK.
func TestHalfOpenListener(t *testing.T) {
	peer := newHalfOpenPeer(t)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			lfd, target := peer.listen(t, peer.addrs[fam], true)
			halfOpenWays(t, func(t *testing.T, probe func(*HalfOpenCheck, time.Duration) error) {
				c := newTestHalfOpen(t, target)
				for range 3 {
					if err := probe(c, 5*time.Second); err != nil {
						t.Fatalf("probe of a listener: %v", err)
					}
				}
				// The accept queue is empty.
				if err := unix.SetNonblock(lfd, true); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(100 * time.Millisecond)
				for time.Now().Before(deadline) {
					if nfd, _, err := unix.Accept(lfd); err == nil {
						unix.Close(nfd)
						t.Fatal("the listener's queue holds a connection")
					} else if err != unix.EAGAIN {
						t.Fatal(err)
					}
					time.Sleep(5 * time.Millisecond)
				}
				// Nothing established, nothing half-open: the reset
				// of the SYN-ACK ended the backend's half.
				for {
					states := peer.tcpStates(t, target.Port())
					other := slicesWithout(states, "0A") // the listener
					if len(other) == 0 {
						break
					}
					if time.Now().After(deadline.Add(time.Second)) {
						t.Fatalf("backend sockets on port %d in states %v, want the listener (0A) alone", target.Port(), states)
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		})
	}
}

func slicesWithout(s []string, v string) []string {
	var out []string
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// TestHalfOpenClosed: a closed port resets the SYN, which is down, as
// connection refused, long before the timeout.
func TestHalfOpenClosed(t *testing.T) {
	peer := newHalfOpenPeer(t)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			_, target := peer.listen(t, peer.addrs[fam], false)
			halfOpenWays(t, func(t *testing.T, probe func(*HalfOpenCheck, time.Duration) error) {
				c := newTestHalfOpen(t, target)
				start := time.Now()
				err := probe(c, 5*time.Second)
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("probe of a closed port: %v, want connection refused", err)
				}
				if d := time.Since(start); d > time.Second {
					t.Errorf("refused after %s", d)
				}
				if !strings.Contains(err.Error(), target.String()) {
					t.Errorf("error %q does not name %s", err, target)
				}
			})
		})
	}
}

// TestHalfOpenDropped: a SYN the backend drops gets no answer: down, by
// the timeout.
func TestHalfOpenDropped(t *testing.T) {
	peer := newHalfOpenPeer(t)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			lfd, target := peer.listen(t, peer.addrs[fam], true)
			port := strconv.Itoa(int(target.Port()))
			peer.iptables(t, fam == "v6", "-A", "INPUT", "-p", "tcp", "--dport", port, "-j", "DROP")
			t.Cleanup(func() { peer.iptables(t, fam == "v6", "-D", "INPUT", "-p", "tcp", "--dport", port, "-j", "DROP") })
			halfOpenWays(t, func(t *testing.T, probe func(*HalfOpenCheck, time.Duration) error) {
				c := newTestHalfOpen(t, target)
				start := time.Now()
				err := probe(c, 200*time.Millisecond)
				if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("probe of a dropping port: %v, want a timeout", err)
				}
				if d := time.Since(start); d < 190*time.Millisecond || d > 2*time.Second {
					t.Errorf("timed out after %s, want 200ms", d)
				}
				// The check's table holds no stale wait.
				k := c.key
				c.sock.mu.Lock()
				for _, p := range c.sock.ports {
					k.port = p
					if c.sock.waits[k] != nil {
						t.Errorf("port %d still waits for %s", p, target)
					}
				}
				c.sock.mu.Unlock()
			})
			if err := unix.SetNonblock(lfd, true); err != nil {
				t.Fatal(err)
			}
			if nfd, _, err := unix.Accept(lfd); err == nil {
				unix.Close(nfd)
				t.Error("the listener accepted a connection")
			}
		})
	}
}

// TestHalfOpenConcurrent: many probes at once, of many ports of both
// families, open and closed, several checks of one port among them, each
// get the answer to their own SYN.
func TestHalfOpenConcurrent(t *testing.T) {
	peer := newHalfOpenPeer(t)
	p := testPoller(t)
	type probe struct {
		c    *HalfOpenCheck
		open bool
	}
	var probes []probe
	for _, fam := range families {
		for i := range 100 {
			open := i%2 == 0
			_, target := peer.listen(t, peer.addrs[fam], open)
			n := 1
			if i%10 == 0 {
				n = 4 // checks of one port with other settings
			}
			for range n {
				probes = append(probes, probe{newTestHalfOpen(t, target), open})
			}
		}
	}
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make([]error, len(probes))
		for i, pr := range probes {
			wg.Add(1)
			pr.c.start(p, time.Now().Add(5*time.Second), func(err error) {
				errs[i] = err
				wg.Done()
			})
		}
		p.flush()
		wg.Wait()
		for i, pr := range probes {
			switch err := errs[i]; {
			case pr.open && err != nil:
				t.Errorf("round %d: probe of open %s: %v", round, pr.c.target, err)
			case !pr.open && !errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("round %d: probe of closed %s: %v, want refused", round, pr.c.target, err)
			}
		}
	}
}

// TestHalfOpenSpec: a tcp check with half_open builds a half-open prober,
// which a Manager runs, and refuses mark and device.
func TestHalfOpenSpec(t *testing.T) {
	peer := newHalfOpenPeer(t)
	lfd, target := peer.listen(t, peer.addrs["v4"], true)
	spec := Spec{Kind: KindTCP, TCP: TCPOptions{HalfOpen: true}, Interval: 50 * time.Millisecond, Rise: 1, Fall: 1}
	pr, err := NewProber(spec, target)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pr.(*HalfOpenCheck); !ok {
		t.Fatalf("prober is a %T", pr)
	}
	for _, d := range []DialOptions{{Mark: 1}, {Device: "lo"}} {
		s := spec
		s.Dial = d
		if _, err := NewProber(s, target); err == nil || !strings.Contains(err.Error(), "mark or device") {
			t.Errorf("dial %+v: %v, want a refusal", d, err)
		}
	}
	s := spec
	s.Dial.Source = netip.MustParseAddr("10.38.0.1")
	if pr, err := NewProber(s, target); err != nil {
		t.Errorf("source: %v", err)
	} else if err := pr.Probe(context.Background()); err != nil {
		t.Errorf("probe from a source: %v", err)
	}

	m := NewManager(Options{StartSpread: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := m.Update([]Target{{Service: "s", Backend: target, Spec: spec}}); err != nil {
		t.Fatal(err)
	}
	wait := func(want State) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for m.Health("s")[target] != want {
			if time.Now().After(deadline) {
				t.Fatalf("the backend never went %s", want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait(Up)
	// The listener stops listening: out; a new one on its port: back.
	if err := unix.Shutdown(lfd, unix.SHUT_RD); err != nil {
		t.Fatal(err)
	}
	wait(Down)
	if st, _ := m.Status("s", target); st.Err == nil || !errors.Is(st.Err, syscall.ECONNREFUSED) {
		t.Errorf("status of a closed port: %+v, want connection refused", st)
	}
	peer.Do(t, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		_, sa := sockaddr(target)
		if err := unix.Bind(fd, sa); err != nil {
			return err
		}
		return unix.Listen(fd, 128)
	})
	wait(Up)
}

// TestHalfOpenNoCapNetRaw: without CAP_NET_RAW the raw socket cannot be
// opened, and the error says what is missing.
func TestHalfOpenNoCapNetRaw(t *testing.T) {
	nstest.Need(t)
	errc := make(chan error, 1)
	go func() {
		// Capabilities are a thread's: this one drops CAP_NET_RAW and
		// dies with the goroutine, never serving another.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[0].Effective &^= 1 << unix.CAP_NET_RAW
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		s, err := newSynSocket(unix.AF_INET, []uint16{40000})
		if err == nil {
			unix.Close(s.fd)
			err = errors.New("opened")
		}
		errc <- err
	}()
	err := <-errc
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "CAP_NET_RAW") {
		t.Fatalf("raw socket without CAP_NET_RAW: %v, want a refusal naming CAP_NET_RAW", err)
	}
	t.Log(err)
}

// TestHalfOpenPollerClose: probes in flight when the poller closes end
// with errPollerClosed, once each, and leave no wait behind.
func TestHalfOpenPollerClose(t *testing.T) {
	peer := newHalfOpenPeer(t)
	_, target := peer.listen(t, peer.addrs["v4"], true)
	port := strconv.Itoa(int(target.Port()))
	peer.iptables(t, false, "-A", "INPUT", "-p", "tcp", "--dport", port, "-j", "DROP")
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	var checks []*HalfOpenCheck
	results := make(chan error, 10)
	for range 5 {
		c := newTestHalfOpen(t, target)
		checks = append(checks, c)
		c.start(p, time.Now().Add(time.Minute), func(err error) { results <- err })
	}
	p.close()
	for range 5 {
		if err := <-results; !errors.Is(err, errPollerClosed) {
			t.Errorf("probe in flight at close: %v, want %v", err, errPollerClosed)
		}
	}
	select {
	case err := <-results:
		t.Errorf("a probe ended twice: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	s := checks[0].sock
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.waits {
		if k.peer == target.Addr() && k.peerPort == target.Port() {
			t.Errorf("a wait of %s is left on port %d", target, k.port)
		}
	}
}

// TestHalfOpenFilter: the raw socket's filter keeps the SYN-ACKs and
// resets sent to the reserved ports, and nothing of the host's other TCP
// traffic (a full connection with data, to a listener of the peer). A
// second raw socket with the process's ports and filter, read here, gets
// a copy of every packet the shared one gets.
func TestHalfOpenFilter(t *testing.T) {
	peer := newHalfOpenPeer(t)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			lfd, target := peer.listen(t, peer.addrs[fam], true)
			_, closed := peer.listen(t, peer.addrs[fam], false)
			c := newTestHalfOpen(t, target)
			family := unix.AF_INET
			if fam == "v6" {
				family = unix.AF_INET6
			}
			s, err := newSynSocket(family, c.sock.ports)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(s.fd)
			count := func() (synacks, resets int) {
				var buf [synSnap]byte
				time.Sleep(50 * time.Millisecond)
				for {
					n, _, err := unix.Recvfrom(s.fd, buf[:], unix.MSG_DONTWAIT)
					if err != nil {
						return
					}
					b := buf[:n]
					if family == unix.AF_INET {
						b = b[int(b[0]&0xf)*4:]
					}
					switch {
					case b[13]&tcpRST != 0:
						resets++
					case b[13]&(tcpSYN|tcpACK) == tcpSYN|tcpACK:
						synacks++
					default:
						t.Errorf("the filter let through flags %#x", b[13])
					}
				}
			}
			count()
			// A full connection with data both ways, closed with a reset.
			cfd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, sa := sockaddr(target)
			if err := unix.Connect(cfd, sa); err != nil {
				t.Fatal(err)
			}
			afd, _, err := unix.Accept(lfd)
			if err != nil {
				t.Fatal(err)
			}
			unix.Write(cfd, []byte("ping"))
			unix.Write(afd, []byte("pong"))
			unix.SetsockoptLinger(cfd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
			unix.Close(cfd)
			unix.Close(afd)
			if sa, rs := count(); sa+rs != 0 {
				t.Errorf("the filter let through %d SYN-ACKs and %d resets of another connection", sa, rs)
			}
			// A half-open probe of the listener and one of a closed port.
			p := testPoller(t)
			if err := pollProbe(t, p, c, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := pollProbe(t, p, newTestHalfOpen(t, closed), 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatal(err)
			}
			if sa, rs := count(); sa != 1 || rs != 1 {
				t.Errorf("the filter let through %d SYN-ACKs and %d resets, want 1 of each", sa, rs)
			}
		})
	}
}

// TestHalfOpenFlush starts probes on a poller: their SYNs leave only at
// the poller's flush, together; one the kernel refuses to send (the
// checker's own firewall drops it, so sendmmsg fails that message) fails
// its own probe at once, and the SYNs after it in the batch still go.
func TestHalfOpenFlush(t *testing.T) {
	peer := newHalfOpenPeer(t)
	_, open := peer.listen(t, peer.addrs["v4"], true)
	_, blocked := peer.listen(t, peer.addrs["v4"], true)
	rule := []string{"OUTPUT", "-p", "tcp", "-d", blocked.Addr().String(), "--dport", strconv.Itoa(int(blocked.Port())), "-j", "DROP"}
	if out, err := exec.Command("iptables", append([]string{"-A"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("iptables", append([]string{"-D"}, rule...)...).Run() })
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()

	targets := []netip.AddrPort{open, blocked, open, open}
	results := make([]chan error, len(targets))
	for i, target := range targets {
		results[i] = make(chan error, 1)
		c := newTestHalfOpen(t, target)
		c.start(p, time.Now().Add(5*time.Second), func(err error) { results[i] <- err })
	}
	// Unflushed, nothing went: no reply, no failure.
	for i, ch := range results {
		select {
		case err := <-ch:
			t.Fatalf("probe %d of %s ended before the flush: %v", i, targets[i], err)
		case <-time.After(100 * time.Millisecond / time.Duration(len(results))):
		}
	}
	p.flush()
	for i, ch := range results {
		err := <-ch
		switch {
		case targets[i] == blocked && !errors.Is(err, syscall.EPERM):
			t.Errorf("probe %d of %s (dropped on the way out): %v, want %v", i, targets[i], err, syscall.EPERM)
		case targets[i] == blocked && !strings.Contains(err.Error(), "sendmmsg"):
			t.Errorf("probe %d: %v does not name the system call", i, err)
		case targets[i] == open && err != nil:
			t.Errorf("probe %d of listening %s: %v", i, targets[i], err)
		}
	}
	// A flush with nothing queued sends nothing and ends nothing.
	p.flush()
}

// TestHalfOpenTend: on a poller that the caller drives, as the Manager
// does, half-open probes end only when it tends them: a reply waits for
// tend, and so does a timeout whose deadline has passed.
func TestHalfOpenTend(t *testing.T) {
	peer := newHalfOpenPeer(t)
	_, up := peer.listen(t, peer.addrs["v4"], true)
	_, dropped := peer.listen(t, peer.addrs["v4"], true)
	peer.iptables(t, false, "-A", "INPUT", "-p", "tcp", "--dport", strconv.Itoa(int(dropped.Port())), "-j", "DROP")
	p := testPoller(t)
	p.drive()
	for _, tc := range []struct {
		target  netip.AddrPort
		timeout time.Duration
		want    error
	}{{up, 5 * time.Second, nil}, {dropped, 100 * time.Millisecond, os.ErrDeadlineExceeded}} {
		ch := make(chan error, 2)
		newTestHalfOpen(t, tc.target).start(p, time.Now().Add(tc.timeout), func(err error) { ch <- err })
		p.flush()
		if !p.pending() {
			t.Fatalf("%s: no probe pending after the start", tc.target)
		}
		select {
		case err := <-ch:
			t.Fatalf("%s: the probe ended untended: %v", tc.target, err)
		case <-time.After(300 * time.Millisecond):
		}
		p.tend()
		select {
		case err := <-ch:
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("%s: tended probe ended with %v, want %v", tc.target, err, tc.want)
			}
		default:
			t.Fatalf("%s: the probe did not end when tended", tc.target)
		}
		if p.pending() {
			t.Errorf("%s: a probe pending after it ended", tc.target)
		}
	}
}
