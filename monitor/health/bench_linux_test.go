package health

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// probeWay is one way to run a probe, which calls done with its result.
type probeWay struct {
	name  string
	probe func(done func(error))
}

// benchProbes runs each of ways for every target in rounds, 64 probes in
// flight, and reports the CPU each costs per probe, in all and in the
// kernel (which includes most of the listener's side of each loopback
// connection), and the ratios of the first way's to the second's.
func benchProbes(b *testing.B, ways [][]probeWay) {
	const inFlight = 64
	cpu := make([]time.Duration, len(ways[0]))
	sys := make([]time.Duration, len(ways[0]))
	var failed atomic.Int64
	probes := 0
	for b.Loop() {
		for i := range ways[0] {
			slots := make(chan struct{}, inFlight)
			var wg sync.WaitGroup
			c0, s0 := cpuTime(b)
			for _, target := range ways {
				slots <- struct{}{}
				wg.Add(1)
				target[i].probe(func(err error) {
					if err != nil {
						failed.Add(1)
					}
					<-slots
					wg.Done()
				})
			}
			wg.Wait()
			c1, s1 := cpuTime(b)
			cpu[i] += c1 - c0
			sys[i] += s1 - s0
		}
		probes += len(ways)
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d probes failed", n)
	}
	for i, w := range ways[0] {
		b.ReportMetric(float64(cpu[i].Microseconds())/float64(probes), w.name+"-cpu-µs/probe")
		b.ReportMetric(float64(sys[i].Microseconds())/float64(probes), w.name+"-sys-µs/probe")
	}
	name := ways[0][0].name + "/" + ways[0][1].name
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), name)
	b.ReportMetric(float64(cpu[0]-sys[0])/float64(cpu[1]-sys[1]), name+"-user")
}

// onGoroutine runs p's probes as the Manager's workers do: on a
// goroutine, with a context that ends at the timeout.
func onGoroutine(p Prober) func(done func(error)) {
	return func(done func(error)) {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			done(p.Probe(ctx))
			cancel()
		}()
	}
}

// BenchmarkProbeTCP probes 1,000 listeners on loopback (in a child
// process), each way a tcp probe can run: through the net package on
// goroutines, as Probe (dialer), and on a poller, ending in the connect's
// call where it can (poller) or always through epoll (polled).
func BenchmarkProbeTCP(b *testing.B) {
	addrs := startListeners(b, 1000, false)
	p, err := newPoller()
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	ways := make([][]probeWay, len(addrs))
	for i, a := range addrs {
		c := NewTCPCheck(a, DialOptions{})
		ways[i] = []probeWay{
			{"dialer", onGoroutine(c)},
			{"poller", func(done func(error)) {
				c.skip = 0
				c.start(p, time.Now().Add(time.Second), done)
			}},
			{"polled", func(done func(error)) {
				c.skip = sameCallRetry
				c.start(p, time.Now().Add(time.Second), done)
			}},
		}
	}
	benchProbes(b, ways)
}

// BenchmarkProbeHTTP probes 1,000 HTTP listeners on loopback (in a child
// process), which answer 200 with a short body, through net/http on
// goroutines, as Probe, and on a poller; with and without a body match.
func BenchmarkProbeHTTP(b *testing.B) {
	addrs := startListeners(b, 1000, true)
	p, err := newPoller()
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	for _, bc := range []struct {
		name string
		opts HTTPOptions
	}{{"status", HTTPOptions{}}, {"body", HTTPOptions{Body: "ok"}}} {
		b.Run(bc.name, func(b *testing.B) {
			ways := make([][]probeWay, len(addrs))
			for i, a := range addrs {
				c, err := NewHTTPCheck(a, false, bc.opts, DialOptions{})
				if err != nil {
					b.Fatal(err)
				}
				ways[i] = []probeWay{
					{"net/http", onGoroutine(c)},
					{"poller", func(done func(error)) { c.start(p, time.Now().Add(time.Second), done) }},
				}
			}
			benchProbes(b, ways)
		})
	}
}

// BenchmarkProbeHalfOpen compares half-open tcp probes with full ones
// (on the poller, ending in the connect's call where they can) of 1,000
// listeners on loopback (in a child process, in the test's namespace):
// per probe, 64 in flight, the wall time (ns/op), allocations, and the
// CPU in all and in the kernel, which on loopback includes the
// listener's side of each exchange; then both ways in rounds, for the
// ratio of their CPU.
func BenchmarkProbeHalfOpen(b *testing.B) {
	addrs := startListeners(b, 1000, false)
	p, err := newPoller()
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	ways := make([][]probeWay, len(addrs))
	for i, a := range addrs {
		h, err := NewHalfOpenCheck(a, DialOptions{})
		if err != nil {
			b.Fatal(err)
		}
		c := NewTCPCheck(a, DialOptions{})
		ways[i] = []probeWay{
			{"halfopen", func(done func(error)) {
				h.start(p, time.Now().Add(time.Second), done)
				p.flush()
			}},
			{"tcp", func(done func(error)) {
				c.skip = 0
				c.start(p, time.Now().Add(time.Second), done)
			}},
		}
	}
	for w, name := range []string{"halfopen", "tcp"} {
		b.Run(name, func(b *testing.B) { benchWay(b, ways, w, nil) })
	}
	b.Run("ratio", func(b *testing.B) { benchProbes(b, ways) })
}

// benchWay runs way w of ways, target after target, 64 probes in
// flight, and reports per probe the wall time (ns/op), allocations, and
// the CPU in all and in the kernel, which on loopback includes much of
// the listener's side of each exchange; and, with peer (which reads the
// listener process's CPU time), the listener's own CPU.
func benchWay(b *testing.B, ways [][]probeWay, w int, peer func() time.Duration) {
	const inFlight = 64
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	b.ReportAllocs()
	var p0 time.Duration
	if peer != nil {
		p0 = peer()
	}
	c0, s0 := cpuTime(b)
	n := 0
	for b.Loop() {
		slots <- struct{}{}
		wg.Add(1)
		ways[n%len(ways)][w].probe(func(err error) {
			if err != nil {
				failed.Add(1)
			}
			<-slots
			wg.Done()
		})
		n++
	}
	wg.Wait()
	c1, s1 := cpuTime(b)
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d of %d probes failed", f, n)
	}
	b.ReportMetric(float64((c1-c0).Nanoseconds())/1000/float64(n), "cpu-µs/probe")
	b.ReportMetric(float64((s1-s0).Nanoseconds())/1000/float64(n), "sys-µs/probe")
	if peer != nil {
		b.ReportMetric(float64((peer()-p0).Nanoseconds())/1000/float64(n), "listener-cpu-µs/probe")
	}
}

// BenchmarkProbeHTTPKeepAlive compares http probes with keep-alive,
// which reuse one connection per listener, with probes that open one
// each (both on the poller, status only) of 1,000 HTTP listeners on
// loopback (in a child process): per probe, 64 in flight, the wall time
// (ns/op), allocations and CPU of each way, the checker's and the
// listener process's; then both ways in rounds, for the ratio of the
// checker's CPU. On loopback the checker's kernel time includes much of
// the listener's side of each exchange (its half of the handshake, for
// new connections).
func BenchmarkProbeHTTPKeepAlive(b *testing.B) {
	addrs, peer := startListenersProc(b, 1000, true)
	p, err := newPoller()
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	ways := make([][]probeWay, len(addrs))
	for i, a := range addrs {
		ka, err := NewHTTPCheck(a, false, HTTPOptions{KeepAlive: true}, DialOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(ka.closeIdle)
		c, err := NewHTTPCheck(a, false, HTTPOptions{}, DialOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ways[i] = []probeWay{
			{"keepalive", func(done func(error)) { ka.start(p, time.Now().Add(time.Second), done) }},
			{"new", func(done func(error)) { c.start(p, time.Now().Add(time.Second), done) }},
		}
	}
	for w, name := range []string{"keepalive", "new"} {
		b.Run(name, func(b *testing.B) { benchWay(b, ways, w, peer) })
	}
	b.Run("ratio", func(b *testing.B) { benchProbes(b, ways) })
}
