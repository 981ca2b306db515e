package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
)

// slowIPVS is the fake kernel whose dumps of the table take delay, as a
// large table's do (seconds at 10,000 services).
type slowIPVS struct {
	*lbtest.Kernel
	delay time.Duration
}

func (s slowIPVS) Services() (map[lb.ServiceKey]*lb.ServiceState, error) {
	time.Sleep(s.delay)
	return s.Kernel.Services()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startMetricsDaemon starts a daemon serving metrics, with the two
// services and extra [daemon] settings, whose dumps of the table take
// delay.
func startMetricsDaemon(t *testing.T, extra string, delay time.Duration, options func(*daemonOptions)) (*harness, string) {
	h := newHarness(t, t.TempDir(), lbtest.New())
	if delay > 0 {
		h.ipvs = slowIPVS{h.k, delay}
	}
	h.options = options
	addr := freeAddr(t)
	h.write(strings.Replace(h.header(extra), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) + twoServices)
	h.run()
	h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	return h, addr
}

// dumps returns how many times the table was read whole since the last
// call.
func (h *harness) dumps() int {
	n := 0
	for _, r := range h.k.Reads() {
		if r == "services" {
			n++
		}
	}
	return n
}

func scrape(ctx context.Context, c *http.Client, addr string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metricValue returns the value of one series in a scrape, or -1.
func metricValue(body, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// counts tallies the answers of a flood.
type counts struct{ ok, busy, other atomic.Int64 }

func (c *counts) String() string {
	return fmt.Sprintf("%d ok, %d busy, %d other", c.ok.Load(), c.busy.Load(), c.other.Load())
}

// TestStatsFlood: 200 concurrent scrapes and 200 concurrent status
// requests, while the first read of the table takes half a second, read
// the table once; the requests beyond the limit are refused at once and
// counted; 200 more of each, four at a time, read nothing.
//
// The flood comes from one address: the metrics endpoint's limits per
// client (TestMetricsStarvation's) would refuse most of it before it is a
// request, and a scrape would wait for a rendering rather than be refused.
// It runs with neither.
func TestStatsFlood(t *testing.T) {
	h, addr := startMetricsDaemon(t, "stats_interval = \"1m\"\nresync_interval = \"1h\"\nwatch = false", 500*time.Millisecond, func(o *daemonOptions) {
		o.MetricsLimits = metricsLimits
		o.MetricsLimits.MaxConnsPerClient, o.MetricsLimits.RequestWait = 0, 0
	})
	h.dumps()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	var metricsN, statusN counts
	scrapeOnce := func() {
		code, body, err := scrape(context.Background(), client, addr)
		switch {
		case err == nil && code == http.StatusOK && strings.Contains(body, "vipd_backend_weight{"):
			metricsN.ok.Add(1)
		case err == nil && code == http.StatusServiceUnavailable:
			metricsN.busy.Add(1)
		default:
			metricsN.other.Add(1)
			t.Errorf("scrape: %d %v %.200s", code, err, body)
		}
	}
	statusOnce := func() {
		rep, err := control.Call(h.socket, "GET", "/v1/status")
		switch {
		case err == nil && rep.Error == "" && rep.Status != nil && len(rep.Status.Services) == 2:
			statusN.ok.Add(1)
		case err == nil && strings.HasPrefix(rep.Error, "busy"):
			statusN.busy.Add(1)
		default:
			statusN.other.Add(1)
			t.Errorf("status: %+v %v", rep, err)
		}
	}
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(scrapeOnce)
		wg.Go(statusOnce)
	}
	wg.Wait()
	t.Logf("flood: metrics %v; status %v", &metricsN, &statusN)
	if n := h.dumps(); n != 1 {
		t.Errorf("400 concurrent requests read the table %d times, want once", n)
	}
	if metricsN.ok.Load() == 0 || statusN.ok.Load() == 0 || metricsN.busy.Load() == 0 || statusN.busy.Load() == 0 {
		t.Errorf("want some requests served and some refused: metrics %v; status %v", &metricsN, &statusN)
	}

	// Four at a time, within the limit: every one is served, from what
	// the flood read.
	for range 4 {
		wg.Go(func() {
			for range 50 {
				scrapeOnce()
				statusOnce()
			}
		})
	}
	wg.Wait()
	if n := h.dumps(); n != 0 {
		t.Errorf("400 requests within the interval read the table %d more times, want none", n)
	}
	if metricsN.other.Load()+statusN.other.Load() > 0 {
		t.Errorf("unexpected answers: metrics %v; status %v", &metricsN, &statusN)
	}

	// The refusals are counted, and the snapshot's time exported.
	_, body, err := scrape(context.Background(), client, addr)
	if err != nil {
		t.Fatal(err)
	}
	for server, c := range map[string]*counts{"metrics": &metricsN, "control": &statusN} {
		series := `vipd_http_requests_rejected_total{server="` + server + `"}`
		if got := metricValue(body, series); got != float64(c.busy.Load()) {
			t.Errorf("%s = %v, want %d", series, got, c.busy.Load())
		}
	}
	if ts := metricValue(body, "vipd_status_timestamp_seconds"); ts < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("vipd_status_timestamp_seconds = %v", ts)
	}
}

// TestStatsAbandoned: scrapes and status requests whose clients give up
// while the table is read cost that one read and nothing afterwards.
func TestStatsAbandoned(t *testing.T) {
	h, addr := startMetricsDaemon(t, "stats_interval = \"1m\"\nresync_interval = \"1h\"\nwatch = false", time.Second, nil)
	h.dumps()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	ctl := control.Client(h.socket)
	// Ten waves of four of each, within the limit, each given up after
	// 20 ms. Refused (503) is fine too: that costs nothing either.
	var abandoned, refused atomic.Int64
	answer := func(code int, err error) {
		switch {
		case err != nil:
			abandoned.Add(1)
		case code == http.StatusServiceUnavailable:
			refused.Add(1)
		}
	}
	for range 10 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				code, _, err := scrape(ctx, client, addr)
				answer(code, err)
			})
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://vipd/v1/status", nil)
				resp, err := ctl.Do(req)
				if err == nil {
					resp.Body.Close()
					answer(resp.StatusCode, nil)
					return
				}
				answer(0, err)
			})
		}
		wg.Wait()
	}
	t.Logf("80 requests: %d abandoned, %d refused", abandoned.Load(), refused.Load())
	if abandoned.Load() == 0 {
		t.Fatal("no request was abandoned")
	}
	time.Sleep(1500 * time.Millisecond) // the read under way ends; nothing follows
	if n := h.dumps(); n > 1 {
		t.Errorf("80 abandoned requests read the table %d times, want at most once", n)
	}
	time.Sleep(500 * time.Millisecond)
	if n := h.dumps(); n != 0 {
		t.Errorf("the table was read %d times after the abandoned requests ended", n)
	}
	// The read they started serves the next request.
	if rep, err := control.Call(h.socket, "GET", "/v1/status"); err != nil || rep.Status == nil {
		t.Fatalf("status: %+v %v", rep, err)
	}
	if n := h.dumps(); n != 0 {
		t.Errorf("a status request after the abandoned ones read the table %d times, want none", n)
	}
}

// TestStatsShowChanges: within the interval, a drain and a reload show in
// the next status request, which reads the table again for them.
func TestStatsShowChanges(t *testing.T) {
	h, _ := startMetricsDaemon(t, "stats_interval = \"1m\"\nresync_interval = \"1h\"\nwatch = false", 0, nil)
	weight := func() int {
		t.Helper()
		rep, err := control.Call(h.socket, "GET", "/v1/status")
		if err != nil || rep.Status == nil {
			t.Fatalf("status: %+v %v", rep, err)
		}
		for _, s := range rep.Status.Services {
			for _, b := range s.Backends {
				if b.Address.String() == "10.0.0.2:80" {
					return b.Weight
				}
			}
		}
		return -1
	}
	if w := weight(); w != 1 {
		t.Fatalf("weight before the drain = %d", w)
	}
	if rep, err := control.Call(h.socket, "POST", "/v1/drain?service=web&backend=10.0.0.2:80"); err != nil || rep.Error != "" {
		t.Fatalf("drain: %+v %v", rep, err)
	}
	if w := weight(); w != 0 {
		t.Errorf("status after the drain shows weight %d, want 0", w)
	}
	h.write(h.header("stats_interval = \"1m\"\nresync_interval = \"1h\"\nwatch = false") + strings.Replace(twoServices, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.5" }]`, 1))
	if rep, err := control.Call(h.socket, "POST", "/v1/reload"); err != nil || rep.Error != "" {
		t.Fatalf("reload: %+v %v", rep, err)
	}
	rep, err := control.Call(h.socket, "GET", "/v1/status")
	if err != nil || rep.Status == nil {
		t.Fatalf("status: %+v %v", rep, err)
	}
	if !slices.ContainsFunc(rep.Status.Services[0].Backends, func(b status.Backend) bool { return b.Address.String() == "10.0.0.5:80" && b.InKernel }) {
		t.Errorf("status after the reload lacks the new backend: %+v", rep.Status.Services[0].Backends)
	}
}

// TestReloadDuringFlood: a reload while 40 clients scrape and ask for
// status without pause, and each read of the table takes 200 ms, is not
// queued behind them, and the table is read about once per interval.
func TestReloadDuringFlood(t *testing.T) {
	const extra = "stats_interval = \"1s\"\nresync_interval = \"1h\"\nwatch = false"
	h, addr := startMetricsDaemon(t, extra, 200*time.Millisecond, nil)
	h.dumps()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	stop := make(chan struct{})
	var served atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 20 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if code, _, err := scrape(context.Background(), client, addr); err == nil && code == http.StatusOK {
					served.Add(1)
				}
			}
		})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if rep, err := control.Call(h.socket, "GET", "/v1/status"); err == nil && rep.Status != nil {
					served.Add(1)
				}
			}
		})
	}
	time.Sleep(1500 * time.Millisecond)
	h.write(h.header(extra) + strings.Replace(twoServices, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.5" }]`, 1))
	began := time.Now()
	rep, err := control.Call(h.socket, "POST", "/v1/reload")
	took := time.Since(began)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	flood := time.Since(start)
	if err != nil || rep.Error != "" || !strings.Contains(h.k.Dump(), "10.0.0.5:80") {
		t.Fatalf("reload: %+v %v\n%s", rep, err, h.k.Dump())
	}
	n := h.dumps()
	t.Logf("reload took %v during a flood of %v: %d requests served, %d reads of the table", took, flood.Round(time.Millisecond), served.Load(), n)
	// At most one read under way, then the reload's own pass.
	if took > 2*time.Second {
		t.Errorf("the reload took %v during the flood, want under 2s", took)
	}
	// One per interval, one for the change the reload made, one spare.
	if limit := int(flood/time.Second) + 3; n > limit {
		t.Errorf("the flood read the table %d times in %v, want at most %d", n, flood, limit)
	}
	if served.Load() == 0 {
		t.Error("the flood was served nothing")
	}
}

// testLimits are short server limits for the timeout tests.
var testLimits = control.Limits{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 2 * time.Second,
	IdleTimeout: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10, MaxConns: 4, MaxRequests: 4}

// TestServerLimits: on both servers, a client that never finishes its
// request headers is cut off after the header timeout, and so is an idle
// connection after the idle timeout; clients holding every connection
// slot lock nobody out for longer than that; oversized headers are
// refused.
func TestServerLimits(t *testing.T) {
	h, addr := startMetricsDaemon(t, "resync_interval = \"1h\"\nwatch = false", 0, func(o *daemonOptions) {
		o.ControlLimits, o.MetricsLimits = testLimits, testLimits
	})
	for _, srv := range []struct{ name, network, addr, path string }{
		{"metrics", "tcp", addr, "/metrics"},
		{"control", "unix", h.socket, "/v1/status"},
	} {
		t.Run(srv.name, func(t *testing.T) {
			dial := func() net.Conn {
				t.Helper()
				c, err := net.Dial(srv.network, srv.addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			// closedWithin reads c until the server closes it.
			closedWithin := func(c net.Conn, what string, least, most time.Duration) {
				t.Helper()
				began := time.Now()
				c.SetReadDeadline(began.Add(5 * time.Second))
				_, err := io.Copy(io.Discard, c)
				took := time.Since(began)
				if err != nil {
					t.Errorf("%s: still open after %v: %v", what, took, err)
				} else if took < least || took > most {
					t.Errorf("%s: closed after %v, want between %v and %v", what, took, least, most)
				}
			}
			request := "GET " + srv.path + " HTTP/1.1\r\nHost: vipd\r\n"

			// A slow loris: headers begun, never ended.
			c := dial()
			io.WriteString(c, request)
			closedWithin(c, "unfinished headers", 150*time.Millisecond, 2*time.Second)

			// An idle keep-alive connection.
			c = dial()
			io.WriteString(c, request+"\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("request: %v %v", resp, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			closedWithin(c, "idle connection", 200*time.Millisecond, 2*time.Second)

			// Every connection slot held by a silent client: a real one
			// waits for the header timeout to free one, no longer.
			for range testLimits.MaxConns {
				dial()
			}
			began := time.Now()
			c = dial()
			io.WriteString(c, request+"\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err = http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("request behind silent clients: %v %v", resp, err)
			}
			resp.Body.Close()
			if took := time.Since(began); took > 2*time.Second {
				t.Errorf("a request behind silent clients took %v", took)
			}

			// Headers past the limit.
			c = dial()
			io.WriteString(c, request+"X-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err = http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("oversized headers: %v %v", resp, err)
			}
		})
	}
}

// TestDaemonRewatch: the directory of included files removed, its
// services go and vipd_config_watch_up drops to 0; the directory back,
// watching resumes by itself, the file made meanwhile is applied, and so
// is a change made afterwards.
func TestDaemonRewatch(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	addr := freeAddr(t)
	parts := strings.SplitAfter(twoServices, "\n\n")
	api := filepath.Join(dir, "services.d", "api.toml")
	writeAt(t, api, parts[1])
	h.write("include = [\"services.d/*.toml\"]\n" + strings.Replace(h.header("reload_guard = 1.0"), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) + parts[0])
	h.run()
	h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	metric := func(series string) float64 {
		t.Helper()
		_, body, err := scrape(context.Background(), client, addr)
		if err != nil {
			t.Fatal(err)
		}
		return metricValue(body, series)
	}
	if up, failures := metric("vipd_config_watch_up"), metric("vipd_config_watch_failures_total"); up != 1 || failures != 0 {
		t.Fatalf("watch up %v, failures %v at start; want 1 and 0", up, failures)
	}

	if err := os.RemoveAll(filepath.Join(dir, "services.d")); err != nil {
		t.Fatal(err)
	}
	h.eventually("the removal", func() bool { return !strings.Contains(h.k.Dump(), "192.0.2.11") })
	h.eventually("the watch's failure", func() bool { return metric("vipd_config_watch_up") == 0 })
	if n := metric("vipd_config_watch_failures_total"); n != 1 {
		t.Errorf("vipd_config_watch_failures_total = %v, want 1", n)
	}
	time.Sleep(500 * time.Millisecond) // a few tries fail

	writeAt(t, api, parts[1])
	h.eventually("the file made while the watch was down", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	if up := metric("vipd_config_watch_up"); up != 1 {
		t.Errorf("vipd_config_watch_up = %v after the directory came back, want 1", up)
	}
	writeAt(t, api, strings.Replace(parts[1], `{ address = "10.0.0.4" }`, `{ address = "10.0.0.4", weight = 3 }`, 1))
	h.eventually("a change made afterwards", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443 masq weight=3") })
	if f, r := strings.Count(h.log.String(), "watching the configuration files failed"), strings.Count(h.log.String(), "watching the configuration files again"); f != 1 || r != 1 {
		t.Errorf("the log has %d failure and %d recovery lines, want 1 and 1", f, r)
	}
}
