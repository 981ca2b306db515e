package health

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// listenersEnv makes the test binary a listener process for the benchmark
// instead of running tests: see serveListeners.
const listenersEnv = "VIPD_HEALTH_BENCH_LISTENERS"

func TestMain(m *testing.M) {
	if n := os.Getenv(listenersEnv); n != "" {
		if err := serveListeners(n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	runTests(m)
}

// serveListeners opens n TCP listeners, a hundred on each of 127.0.0.1,
// 127.0.0.2 and so on, prints their addresses, and accepts and closes
// connections on them until its standard input closes; with arg "n/http"
// it answers an HTTP request on each connection first, with 200 and a
// short body, and then, if the request asked for keep-alive, the next
// requests on the connection until the checker closes it. With arg
// "n@first" (or "n/http@first") its listeners are those from the first
// on, as numbered on the addresses: a process of its own serves each
// part of a set of listeners too large for one's descriptors. It runs in
// its own process so that the benchmark measures the checker's CPU
// alone.
func serveListeners(arg string) error {
	arg, at, _ := strings.Cut(arg, "@")
	first := 0
	if at != "" {
		var err error
		if first, err = strconv.Atoi(at); err != nil || first < 0 {
			return fmt.Errorf("first listener %q is not a number", at)
		}
	}
	arg, http := strings.CutSuffix(arg, "/http")
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 || first+n > 25400 {
		return fmt.Errorf("listener count %q from %d is not within 1-25400", arg, first)
	}
	out := bufio.NewWriter(os.Stdout)
	for i := first; i < first+n; i++ {
		ip := netip.AddrFrom4([4]byte{127, 0, 0, byte(1 + i/100)})
		ln, err := net.Listen("tcp4", netip.AddrPortFrom(ip, 0).String())
		if err != nil {
			return fmt.Errorf("listen on %s: %w", ip, err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				if !http {
					c.Close()
					continue
				}
				go func() {
					defer c.Close()
					var req []byte
					buf := make([]byte, 1024)
					for {
						end := strings.Index(string(req), "\r\n\r\n")
						if end < 0 {
							n, err := c.Read(buf)
							if err != nil {
								return
							}
							req = append(req, buf[:n]...)
							continue
						}
						head := strings.ToLower(string(req[:end]))
						req = req[end+4:]
						if !strings.Contains(head, "\r\nconnection: keep-alive") {
							_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"))
							return
						}
						if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")); err != nil {
							return
						}
					}
				}()
			}
		}()
		fmt.Fprintln(out, ln.Addr())
	}
	if err := out.Flush(); err != nil {
		return err
	}
	// The parent closes our standard input when it is done, or dies.
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return nil
}

// startListeners runs serveListeners in a child process and returns the
// addresses it listens on.
func startListeners(b *testing.B, n int, http bool) []netip.AddrPort {
	b.Helper()
	addrs, _ := startListenersProc(b, n, http)
	return addrs
}

// startListenersProc is startListeners, which also returns a function
// that reads the CPU time the listener processes have used. http
// listeners, which may hold a kept-alive connection each as well, come
// from a process per listenersPerProc.
func startListenersProc(b *testing.B, n int, http bool) ([]netip.AddrPort, func() time.Duration) {
	b.Helper()
	per := n
	if http {
		per = listenersPerProc
	}
	var addrs []netip.AddrPort
	var pids []int
	for first := 0; first < n; first += per {
		a, pid := startListenerProc(b, first, min(per, n-first), http)
		addrs = append(addrs, a...)
		pids = append(pids, pid)
	}
	return addrs, func() time.Duration {
		var t time.Duration
		for _, pid := range pids {
			t += procCPU(b, pid)
		}
		return t
	}
}

// listenersPerProc is how many http listeners one process serves: with a
// connection each, twice their number of descriptors stays under a
// limit of 20,000.
const listenersPerProc = 5000

// startListenerProc runs serveListeners in a child process for n
// listeners from the first, and returns their addresses and its pid.
func startListenerProc(b *testing.B, first, n int, http bool) ([]netip.AddrPort, int) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	arg := strconv.Itoa(n)
	if http {
		arg += "/http"
	}
	arg += "@" + strconv.Itoa(first)
	cmd.Env = append(os.Environ(), listenersEnv+"="+arg)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	var addrs []netip.AddrPort
	sc := bufio.NewScanner(stdout)
	for len(addrs) < n && sc.Scan() {
		a, err := netip.ParseAddrPort(sc.Text())
		if err != nil || !a.Addr().IsLoopback() {
			b.Fatalf("listener process printed %q", sc.Text())
		}
		addrs = append(addrs, a)
	}
	if len(addrs) < n {
		b.Fatalf("listener process opened %d of %d listeners: %v", len(addrs), n, sc.Err())
	}
	return addrs, cmd.Process.Pid
}

// procCPU returns the CPU time process pid has used, user and system, at
// the clock tick's resolution (assumed 100 Hz, Linux's USER_HZ).
func procCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command's name, which ends at the last ")":
	// utime and stime are the 12th and 13th.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// cpuTime returns the CPU time this process has used, in all and in the
// kernel.
func cpuTime(b *testing.B) (total, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}

// liveHeap collects garbage and returns the heap it found live.
func liveHeap() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// rss returns this process's resident set size in bytes.
func rss(b *testing.B) uint64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("parse %q: %v", line, err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkManagerTCP runs 10,000 TCP checks at a 1s interval against
// 10,000 listeners on loopback (127.0.0.1-127.0.0.100) in a child process,
// and reports the checker's cost once it is steady: CPU seconds per wall
// second (cpu-cores, the share of one core, and sys-cores, the part spent
// in the kernel, which includes much of the listener's side of each
// loopback handshake),
// the live heap the Manager adds, the process's resident set size, and the
// probe rate it achieved. It runs for a fixed wall time,
// VIPD_HEALTH_BENCH_SECONDS (default 5) after a 2-second warm-up, however
// many iterations the framework asks for.
func BenchmarkManagerTCP(b *testing.B) {
	benchManager(b, Spec{Kind: KindTCP, Interval: time.Second, Timeout: time.Second})
}

// BenchmarkManagerHalfOpen is BenchmarkManagerTCP with half-open checks
// (Linux).
func BenchmarkManagerHalfOpen(b *testing.B) {
	benchManager(b, Spec{Kind: KindTCP, TCP: TCPOptions{HalfOpen: true}, Interval: time.Second, Timeout: time.Second})
}

// BenchmarkManagerHTTP is BenchmarkManagerTCP with plain http checks
// (status only), against listeners that answer HTTP; each probe opens a
// connection.
func BenchmarkManagerHTTP(b *testing.B) {
	benchManager(b, Spec{Kind: KindHTTP, Interval: time.Second, Timeout: time.Second})
}

// BenchmarkManagerHTTPKeepAlive is BenchmarkManagerHTTP with keep-alive:
// each check keeps one connection to its listener.
func BenchmarkManagerHTTPKeepAlive(b *testing.B) {
	benchManager(b, Spec{Kind: KindHTTP, HTTP: HTTPOptions{KeepAlive: true}, Interval: time.Second, Timeout: time.Second})
}

// benchManager runs BenchmarkManagerTCP's measure with checks of spec.
func benchManager(b *testing.B, spec Spec) {
	const checks = 10000
	seconds := 5
	if s := os.Getenv("VIPD_HEALTH_BENCH_SECONDS"); s != "" {
		var err error
		if seconds, err = strconv.Atoi(s); err != nil || seconds < 1 || seconds > 600 {
			b.Fatalf("VIPD_HEALTH_BENCH_SECONDS=%q is not within 1-600", s)
		}
	}
	addrs := startListeners(b, checks, spec.Kind == KindHTTP)

	targets := make([]Target, len(addrs))
	for i, a := range addrs {
		targets[i] = Target{Service: "svc-" + strconv.Itoa(i/10), Backend: a, Spec: spec}
	}
	heapBefore := liveHeap()
	m := NewManager(Options{})
	if err := m.Update(targets); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	b.ResetTimer()
	time.Sleep(2 * time.Second)
	runtime.GC()
	s0, t0 := m.Stats(), time.Now()
	cpu0, sys0 := cpuTime(b)
	time.Sleep(time.Duration(seconds) * time.Second)
	s1, wall := m.Stats(), time.Since(t0)
	cpu1, sys1 := cpuTime(b)
	b.StopTimer()

	heap := liveHeap() - heapBefore
	down := 0
	var failed []error
	for _, tg := range targets {
		st, _ := m.Status(tg.Service, tg.Backend)
		if st.State != Up {
			down++
		}
		for _, cs := range st.Checks {
			if cs.LastError != nil && len(failed) < 3 {
				failed = append(failed, cs.LastError)
			}
		}
	}
	probes := s1.Probes - s0.Probes
	b.ReportMetric(float64(probes)/wall.Seconds(), "probes/s")
	b.ReportMetric((cpu1-cpu0).Seconds()/wall.Seconds(), "cpu-cores")
	b.ReportMetric((sys1-sys0).Seconds()/wall.Seconds(), "sys-cores")
	b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(rss(b))/(1<<20), "rss-MiB")
	b.ReportMetric(float64(s1.Failures-s0.Failures), "failures")
	b.ReportMetric(float64(down), "down")
	if down > 0 || s1.Failures > s0.Failures {
		b.Errorf("%d backends down, %d probes failed, as: %v", down, s1.Failures-s0.Failures, failed)
	}
}

// BenchmarkManagerUpdate measures Update at 10,000 services of 10 checked
// backends each: an Update that changes nothing, one that edits every
// check's timeout and its undoing, and one that removes half the
// backends and its undoing (a rolled-back reload).
func BenchmarkManagerUpdate(b *testing.B) {
	const services, backends = 10000, 10
	spec := Spec{Kind: KindTCP, Interval: time.Second, Timeout: time.Second}
	edited := spec
	edited.Timeout = 2 * time.Second
	all := make([]Target, 0, services*backends)
	for s := range services {
		for i := range backends {
			addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(s >> 8), byte(s), byte(i)}), 80)
			all = append(all, Target{Service: "svc-" + strconv.Itoa(s), Backend: addr, Spec: spec})
		}
	}
	retimed := slices.Clone(all)
	for i := range retimed {
		retimed[i].Spec = edited
	}
	var half []Target
	for i, t := range all {
		if i%2 == 0 {
			half = append(half, t)
		}
	}
	newProber := func(Spec, netip.AddrPort) (Prober, error) {
		return ProberFunc(func(context.Context) error { return nil }), nil
	}
	for _, bc := range []struct {
		name  string
		steps [][]Target
	}{
		{"unchanged", [][]Target{all}},
		{"timeout edited and back", [][]Target{retimed, all}},
		{"half removed and back", [][]Target{half, all}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			m := NewManager(Options{NewProber: newProber, Clock: newFakeClock()})
			if err := m.Update(all); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				for _, targets := range bc.steps {
					if err := m.Update(targets); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			if st := m.Stats(); st.Checks != len(all) {
				b.Fatalf("%d checks after the last Update, want %d", st.Checks, len(all))
			}
		})
	}
}
