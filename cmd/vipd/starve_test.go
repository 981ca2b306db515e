package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scrapeBound is how long a scrape may take while the metrics endpoint is
// under attack: well under Prometheus' default scrape timeout (10s), and
// under the header timeout (5s), so that waiting a slow loris out does
// not pass.
const scrapeBound = 2 * time.Second

// attacker holds connections to the metrics endpoint from a loopback
// address of its own (127.0.0.2 and up; the scraper's is 127.0.0.1):
// each connection is re-made 50 ms after the server closes it.
type attacker struct {
	addr   string // the endpoint
	idle   time.Duration
	dials  atomic.Int64 // connections made
	served atomic.Int64 // responses read
}

// keepAlive holds one connection from src: a request, then another just
// before the idle timeout, and so on.
func (a *attacker) keepAlive(ctx context.Context, src net.IP) {
	a.hold(ctx, src, func(c net.Conn) error {
		r := bufio.NewReader(c)
		for ctx.Err() == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: vipd\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.Close {
				return io.EOF
			}
			a.served.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(a.idle * 8 / 10):
			}
		}
		return nil
	})
}

// slowLoris holds one connection from src: a request whose headers never
// end, a line every 100 ms.
func (a *attacker) slowLoris(ctx context.Context, src net.IP) {
	a.hold(ctx, src, func(c net.Conn) error {
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: vipd\r\n"); err != nil {
			return err
		}
		for i := 0; ctx.Err() == nil; i++ {
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := fmt.Fprintf(c, "X-%d: %d\r\n", i, i); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		return nil
	})
}

// hold makes connections from src and runs use on each until ctx ends.
func (a *attacker) hold(ctx context.Context, src net.IP, use func(net.Conn) error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 2 * time.Second}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", a.addr)
		if err == nil {
			a.dials.Add(1)
			stop := context.AfterFunc(ctx, func() { c.Close() })
			use(c)
			stop()
			c.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestMetricsStarvation: clients holding the metrics endpoint's
// connections, from one loopback address or from many (127.0.0.2 and
// up), with keep-alive requests each made just before the idle timeout
// or with headers that never end (a slow loris), do not keep a
// scraper's requests from 127.0.0.1 out: each of five scrapes, over
// more than an idle timeout, is answered within scrapeBound, on one
// keep-alive client as Prometheus' is.
func TestMetricsStarvation(t *testing.T) {
	lim := metricsLimits
	lim.IdleTimeout = time.Second // the attack's period, shortened
	_, addr := startMetricsDaemon(t, "resync_interval = \"1h\"\nwatch = false", 0, func(o *daemonOptions) {
		o.MetricsLimits = lim
	})
	for _, c := range []struct {
		name      string
		slowLoris bool
		addrs     int // source addresses, from 127.0.0.2
		each      int // connections from each
	}{
		{"keep-alive from one address", false, 1, lim.MaxConns},
		{"keep-alive from 16 addresses", false, 16, lim.MaxConns / 8},
		{"slow loris from one address", true, 1, lim.MaxConns},
		{"slow loris from 16 addresses", true, 16, lim.MaxConns / 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			a := &attacker{addr: addr, idle: lim.IdleTimeout}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			for i := range c.addrs {
				src := net.IPv4(127, 0, 0, byte(2+i))
				for range c.each {
					if c.slowLoris {
						wg.Go(func() { a.slowLoris(ctx, src) })
					} else {
						wg.Go(func() { a.keepAlive(ctx, src) })
					}
				}
			}
			// The attack is under way: as many connections made, and
			// for keep-alive answered, as the server holds, or 3 s.
			n := int64(min(c.addrs*c.each, lim.MaxConns))
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) && (a.dials.Load() < n || !c.slowLoris && a.served.Load() < n) {
				time.Sleep(10 * time.Millisecond)
			}
			if a.dials.Load() == 0 || !c.slowLoris && a.served.Load() == 0 {
				t.Fatalf("no attack: %d connections, %d answers", a.dials.Load(), a.served.Load())
			}
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			var worst time.Duration
			for i := range 5 {
				sctx, scancel := context.WithTimeout(context.Background(), scrapeBound)
				began := time.Now()
				code, body, err := scrape(sctx, client, addr)
				took := time.Since(began)
				scancel()
				worst = max(worst, took)
				if err != nil || code != http.StatusOK || !strings.Contains(body, "vipd_backend_weight{") {
					t.Errorf("scrape %d: %d %v after %v (attack: %d connections made, %d answers)", i, code, err, took.Round(time.Millisecond), a.dials.Load(), a.served.Load())
				}
				time.Sleep(300 * time.Millisecond)
			}
			t.Logf("five scrapes, the slowest %v; attack: %d connections made, %d answers", worst.Round(time.Millisecond), a.dials.Load(), a.served.Load())
		})
	}
}
