package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/test/bench"
)

// processCPU is this process's CPU time so far: the daemon's, which runs
// in it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestStatusPageCPU measures what an open status page costs a daemon of
// 10,000 services x 10 backends (VIPD_PAGE_CPU_SIZE) on the fake kernel (stats_interval 5s):
// the daemon's CPU over a quiet window, then over as long with headless
// Chromium holding the page open (its script polling once a second),
// then with the page open on page 2 of a filter; the page's weight and
// the time to its first byte. It takes minutes: VIPD_PAGE_CPU=1 runs it
// (make bench's results: test/bench/results/*-statuspage.txt).
func TestStatusPageCPU(t *testing.T) {
	if os.Getenv("VIPD_PAGE_CPU") == "" {
		t.Skip("VIPD_PAGE_CPU=1 runs it")
	}
	bin := chromiumPath(t)
	window := 60 * time.Second
	if s := os.Getenv("VIPD_PAGE_CPU_WINDOW"); s != "" {
		window, _ = time.ParseDuration(s)
	}
	// VIPD_PAGE_CPU_SIZE=NxM measures N services of M backends instead.
	n, m := 10000, 10
	if s := os.Getenv("VIPD_PAGE_CPU_SIZE"); s != "" {
		if _, err := fmt.Sscanf(s, "%dx%d", &n, &m); err != nil {
			t.Fatalf("VIPD_PAGE_CPU_SIZE=%q: %v", s, err)
		}
	}
	t.Logf("%d services x %d backends, windows of %v", n, m, window)
	f, err := bench.New(bench.Spec{Services: n, Backends: m})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	var cfg bytes.Buffer
	if err := f.WriteTOML(&cfg, bench.Daemon{StateDir: filepath.Join(dir, "state"), ControlSocket: h.socket}); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	body := strings.Replace(cfg.String(), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1)
	if err := os.WriteFile(h.path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	h.run()
	page := "http://" + addr + "/"

	// Time to first byte and weight of the page, and of the data.
	for _, p := range []string{"", "?page=200", "?q=s99", "status.json", "static/page.css", "static/page.js"} {
		var best time.Duration
		var n int
		for range 5 {
			start := time.Now()
			n = len(fetch(t, page+p))
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		t.Logf("GET /%s: %d bytes, best of 5 %v", p, n, best.Round(time.Microsecond))
	}

	// Chromium's own timing of the page at 10,000 x 10: a loopback proxy
	// adds a script (and drops the page's Content-Security-Policy, which
	// would refuse it) that reports the navigation timing once loaded.
	timing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(page + strings.TrimPrefix(r.URL.RequestURI(), "/"))
		if err != nil {
			http.Error(w, err.Error(), 502)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		if r.URL.Path == "/" {
			b = bytes.Replace(b, []byte("</body>"), []byte(timingScript+"</body>"), 1)
		}
		w.Write(b)
	}))
	defer timing.Close()
	for _, p := range []string{"", "?page=200"} {
		for range 3 {
			start := time.Now()
			d := chromium(t, bin, "--virtual-time-budget=2000", "--dump-dom", timing.URL+"/"+p)
			m := regexp.MustCompile(`data-timing="([^"]*)"`).FindStringSubmatch(d)
			if m == nil {
				t.Fatalf("no timing in the DOM of /%s", p)
			}
			t.Logf("chromium /%s: %s; chromium's run %v", p, m[1], time.Since(start).Round(time.Millisecond))
		}
	}

	// Chromium reaches the daemon through a loopback proxy that counts
	// the requests; the proxy runs in this process, so its CPU counts as
	// the daemon's: the figures are upper bounds.
	var requests, changed atomic.Int64
	target, _ := url.Parse(page)
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		rec := &statusRecorder{ResponseWriter: w}
		rp.ServeHTTP(rec, r)
		if r.URL.Path == "/status.json" && rec.code == 200 {
			changed.Add(1)
		}
	}))
	defer proxy.Close()

	measure := func(what, u string) {
		t.Helper()
		var cmd *exec.Cmd
		if u != "" {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cmd = exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
				"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
				"--user-data-dir="+t.TempDir(), "--window-size=1400,1000", u)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Let it load the page before measuring.
			time.Sleep(5 * time.Second)
		}
		requests.Store(0)
		changed.Store(0)
		// VIPD_PAGE_CPU_PROFILE=DIR keeps a CPU profile of each window,
		// to tell the page's own work (package statuspage) from the
		// snapshots it has the daemon take.
		if dir := os.Getenv("VIPD_PAGE_CPU_PROFILE"); dir != "" {
			pf, err := os.Create(filepath.Join(dir, strings.NewReplacer(" ", "-", ",", "").Replace(what)+".pprof"))
			if err != nil {
				t.Fatal(err)
			}
			defer pf.Close()
			if err := pprof.StartCPUProfile(pf); err != nil {
				t.Fatal(err)
			}
			defer pprof.StopCPUProfile()
		}
		before, start := processCPU(), time.Now()
		time.Sleep(window)
		used, took := processCPU()-before, time.Since(start)
		t.Logf("%s: daemon CPU %v over %v (%.2f%% of a core); %d requests to the page, %d with news",
			what, used.Round(time.Millisecond), took.Round(time.Second), 100*used.Seconds()/took.Seconds(), requests.Load(), changed.Load())
		if cmd != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}
	measure("no page open", "")
	// A scraper every 5 s (Prometheus at stats_interval) takes the same
	// snapshots an open page has the daemon take.
	stopScrape, scraperDone := make(chan struct{}), make(chan struct{})
	var scrapes atomic.Int64
	go func() {
		defer close(scraperDone)
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopScrape:
				return
			case <-tick.C:
				if resp, err := http.Get(page + "metrics"); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					scrapes.Add(1)
				}
			}
		}
	}()
	measure("scraped every 5s, no page open", "")
	close(stopScrape)
	<-scraperDone
	t.Logf("%d scrapes", scrapes.Load())
	// Let the last snapshot and its garbage go.
	time.Sleep(10 * time.Second)
	measure("page open", proxy.URL+"/")
	measure("page open, filtered, page 2", proxy.URL+"/?q=s1&page=2")
}

// timingScript reports the page's navigation timing (ms from the start
// of navigation) in the body's data-timing once loaded.
const timingScript = `<script>addEventListener("load", function () { setTimeout(function () {
var n = performance.getEntriesByType("navigation")[0], p = performance.getEntriesByType("paint");
var s = "response " + n.responseEnd.toFixed(0) + " ms, DOM interactive " + n.domInteractive.toFixed(0) + " ms, loaded " + n.loadEventEnd.toFixed(0) + " ms";
p.forEach(function (e) { s += ", " + e.name + " " + e.startTime.toFixed(0) + " ms"; });
document.body.dataset.timing = s; }, 50); });</script>`

// statusRecorder notes the status code of a response it passes on.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.ResponseWriter.Write(b)
}
