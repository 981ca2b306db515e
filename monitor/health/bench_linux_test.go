package health

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkProbeTCP probes 1,000 listeners on loopback (in a child
// process) in rounds, 64 probes in flight, each way a tcp probe can run:
// through the net package on goroutines, as Probe (dialer), and on a
// poller, ending in the connect's call where it can (poller) or always
// through epoll (polled). It reports the CPU each costs per probe, in all
// and in the kernel (which includes most of the listener's side of each
// loopback handshake), and the ratio of the dialer's to the poller's.
func BenchmarkProbeTCP(b *testing.B) {
	const listeners, inFlight = 1000, 64
	addrs := startListeners(b, listeners)
	checks := make([]*TCPCheck, len(addrs))
	for i, a := range addrs {
		checks[i] = NewTCPCheck(a, DialOptions{})
	}
	p, err := newPoller()
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	ways := []struct {
		name  string
		probe func(c *TCPCheck, done func(error))
	}{
		{"dialer", func(c *TCPCheck, done func(error)) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				done(c.Probe(ctx))
				cancel()
			}()
		}},
		{"poller", func(c *TCPCheck, done func(error)) {
			c.skip = 0
			c.start(p, time.Now().Add(time.Second), done)
		}},
		{"polled", func(c *TCPCheck, done func(error)) {
			c.skip = sameCallRetry
			c.start(p, time.Now().Add(time.Second), done)
		}},
	}
	cpu := make([]time.Duration, len(ways))
	sys := make([]time.Duration, len(ways))
	var failed atomic.Int64
	probes := 0
	for b.Loop() {
		for i, w := range ways {
			slots := make(chan struct{}, inFlight)
			var wg sync.WaitGroup
			c0, s0 := cpuTime(b)
			for _, c := range checks {
				slots <- struct{}{}
				wg.Add(1)
				w.probe(c, func(err error) {
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
		probes += len(checks)
	}
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d probes failed", n)
	}
	for i, w := range ways {
		b.ReportMetric(float64(cpu[i].Microseconds())/float64(probes), w.name+"-cpu-µs/probe")
		b.ReportMetric(float64(sys[i].Microseconds())/float64(probes), w.name+"-sys-µs/probe")
	}
	b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "dialer/poller")
	b.ReportMetric(float64(cpu[0]-sys[0])/float64(cpu[1]-sys[1]), "dialer/poller-user")
}
