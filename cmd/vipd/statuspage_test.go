package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// chromiumPath finds Debian's chromium; without it the browser tests
// skip, or fail under CI=true (test/deps.sh installs it).
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (make deps installs it)")
	}
	t.Skip("chromium is not installed (make deps installs it)")
	return ""
}

// chromium runs headless Chromium with args and returns its standard
// output. It sends nothing beyond loopback: no first run, no component
// updates, no background networking, no sync, no QUIC.
func chromium(t testing.TB, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-default-apps", "--disable-extensions", "--no-default-browser-check", "--metrics-recording-only",
		"--user-data-dir=" + t.TempDir(), "--window-size=1400,1000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return string(out)
}

// pageElector is an election the node always wins: the status page shows
// the role it reports.
type pageElector struct{ opts agent.ElectorOptions }

func (e *pageElector) Run(ctx context.Context) error {
	e.opts.Report(agent.RoleChange{Master: true, Reason: "no master heard (test)", Cause: "test", MasterAddr: netip.MustParseAddr("192.0.2.1")})
	<-ctx.Done()
	return nil
}
func (e *pageElector) SetPriority(uint8) error              { return nil }
func (e *pageElector) Resign(context.Context, string) error { return nil }
func (e *pageElector) Resume()                              {}

// pageServices is a realistic configuration besides checkedServices: a
// direct-routing UDP service, a persistent one with weights, and a
// tunnelled one.
const pageServices = `
[[service]]
name = "dns"
vip = "192.0.2.12"
port = 53
protocol = "udp"
scheduler = "rr"
forward = "droute"
backend = [{ address = "10.0.1.1" }, { address = "10.0.1.2" }, { address = "10.0.1.3" }]

[[service]]
name = "shop"
vip = "2001:db8::20"
port = 443
scheduler = "wrr"
persistence = "5m"
backend = [{ address = "2001:db8:1::1", weight = 10 }, { address = "2001:db8:1::2", weight = 5 }]
`

// startPageDaemon starts a daemon on the fake kernel with the status
// page on a loopback port, [ha] with an election it wins, the "web"
// service's backends checked against srv, and more services.
func startPageDaemon(t *testing.T, srv [2]*checkServer) (*harness, string) {
	h := newHarness(t, t.TempDir(), lbtest.New())
	h.options = func(o *daemonOptions) {
		o.OpenElector = func(opts agent.ElectorOptions) (agent.Elector, error) { return &pageElector{opts: opts}, nil }
	}
	addr := freeAddr(t)
	h.write(pageConfig(h, addr, srv, pageServices))
	h.run()
	h.eventually("both checked backends up", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "10.0.0.1:80 masq weight=1") && strings.Contains(d, "10.0.0.2:80 masq weight=1")
	})
	return h, "http://" + addr + "/"
}

// fakeTraffic makes up connections and rates in the fake kernel's
// counters, varying over time, until stop; no packet is sent.
func fakeTraffic(h *harness) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			h.k.Edit(func(st *lb.State) {
				for key, ss := range st.Services {
					wave := uint64(20 + 15*math.Sin(float64(n)/8+float64(key.Port)))
					ss.Stats.CPS, ss.Stats.InBPS, ss.Stats.OutBPS = wave*uint64(len(ss.Dests)), wave*9_000, wave*60_000
					for a, d := range ss.Dests {
						d.ActiveConns, d.InactiveConns = uint32(wave)*3, uint32(wave)
						d.Stats = &lb.Stats{CPS: wave, InBPS: wave * 9_000, OutBPS: wave * 60_000}
						ss.Dests[a] = d
					}
				}
			})
		}
	}()
	return func() { close(done) }
}

// pageConfig is startPageDaemon's configuration with services.
func pageConfig(h *harness, addr string, srv [2]*checkServer, services string) string {
	ha := "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 51\npriority = 150\n"
	return strings.Replace(h.header("stats_interval = \"1s\"\nreload_guard = 1.0"), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) +
		ha + checkedServices(srv, baseCheck, false) + services
}

// TestStatusPageBrowser loads the status page of a daemon on the fake
// kernel in headless Chromium and checks the DOM it renders: the
// services, the HA role, a backend turning unhealthy and back, and the
// page refreshing itself live from a stale copy. It saves a screenshot
// (to $VIPD_SCREENSHOT when set: docs/status-page.png is made so).
func TestStatusPageBrowser(t *testing.T) {
	bin := chromiumPath(t)
	srv := [2]*checkServer{newCheckServer(t), newCheckServer(t)}
	h, page := startPageDaemon(t, srv)
	stopTraffic := fakeTraffic(h)
	defer stopTraffic()
	dom := func(u string) string {
		return chromium(t, bin, "--virtual-time-budget=3000", "--dump-dom", u)
	}
	expect := func(what, d string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(d, w) {
				t.Errorf("%s: the DOM lacks %q", what, w)
			}
		}
		if t.Failed() {
			t.Fatalf("DOM:\n%s", d)
		}
	}
	web1Row := `data-backend="10.0.0.1:80" data-health="%s" data-serving="%t"`
	d := dom(page)
	expect("first load", d,
		`data-service="web" data-state="ok"`, `data-service="api"`, `data-service="dns"`, `data-service="shop"`,
		`192.0.2.12:53/udp`, `[2001:db8::20]:443/tcp`, `droute`, `persist 300s`,
		fmt.Sprintf(web1Row, "up", true), `data-backend="10.0.1.3:53" data-health="unchecked"`,
		`id="ha-role">master</p>`, `VRID 51 · priority 150`,
		// The script ran and its first poll was answered.
		`<span id="live" class="live on"`,
		`4 services`)

	// web1's check fails: the page shows it down, then up again.
	srv[0].fail.Store(true)
	h.eventually("web1 down", func() bool { return h.health("web")[web1].State == "down" })
	// The page as it was before, served as a stale copy: the script
	// must replace it with the live state.
	stale := d
	d = dom(page)
	expect("web1 down", d, fmt.Sprintf(web1Row, "down", false), `data-service="web" data-state="degraded"`, `health-down`, `503`)
	srv[0].fail.Store(false)
	h.eventually("web1 up", func() bool { return h.health("web")[web1].State == "up" })
	d = dom(page)
	expect("web1 up again", d, fmt.Sprintf(web1Row, "up", true), `data-service="web" data-state="ok"`)

	// Live: a proxy serves the page as it was while web1 was up, and
	// the status data from the daemon; take web1 down, and the script
	// swaps the live state in.
	srv[0].fail.Store(true)
	h.eventually("web1 down", func() bool { return h.health("web")[web1].State == "down" })
	target, _ := url.Parse(page)
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			// The stale page: its DOM as dumped, with its version
			// changed so that the script's first poll gets news.
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, "<!DOCTYPE html>"+strings.Replace(strings.Replace(stale, `data-version="`, `data-version="stale`, 1),
				`class="live on"`, `class="live"`, 1))
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	if !strings.Contains(stale, fmt.Sprintf(web1Row, "up", true)) {
		t.Fatal("the stale page does not show web1 up")
	}
	d = dom(proxy.URL + "/")
	expect("live update", d, fmt.Sprintf(web1Row, "down", false))
	srv[0].fail.Store(false)
	h.eventually("web1 up", func() bool { return h.health("web")[web1].State == "up" })

	// A reload: the page says when, why and what it changed.
	u, _ := url.Parse(page)
	h.write(pageConfig(h, u.Host, srv, strings.Replace(pageServices, `{ address = "10.0.1.3" }`, `{ address = "10.0.1.3" }, { address = "10.0.1.4" }`, 1)))
	h.eventually("the reload", func() bool { return strings.Contains(h.k.Dump(), "10.0.1.4:53") })
	d = dom(page)
	expect("reload", d, `<span class="st ok">applied</span>`, `file changed · vipd.toml`, `add-backend 1`, `data-backend="10.0.1.4:53"`)

	// The filter works without JavaScript: the server's HTML is the
	// whole page. (Chromium's --dump-dom needs script, so this reads
	// the HTML as a browser without it would.)
	d = fetch(t, page+"?q=udp")
	expect("filter without JavaScript", d, `data-service="dns"`, `1 of 4 services match`, `<span id="live" class="live"`)
	if strings.Contains(d, `data-service="web"`) {
		t.Error("?q=udp shows the web service")
	}

	// Page weight: the page and its assets.
	weight := 0
	for _, p := range []string{"", "static/page.css", "static/page.js"} {
		weight += len(fetch(t, page+p))
	}
	t.Logf("page weight (4 services, HTML + CSS + JS): %d bytes", weight)

	// The fake kernel's counters show as rates.
	d = dom(page)
	if !regexp.MustCompile(`<td>[1-9][0-9]*k?</td><td>[1-9][0-9]*k?B / [1-9]`).MatchString(d) {
		t.Errorf("no service shows a rate:\n%s", d)
	}

	shot := os.Getenv("VIPD_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "status-page.png")
	}
	// Let the history gather a few points for the sparklines first.
	time.Sleep(3 * time.Second)
	chromium(t, bin, "--virtual-time-budget=3000", "--hide-scrollbars", "--screenshot="+shot, page)
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot %s: %v", shot, err)
	}
}

// fetch returns the body of a GET of u.
func fetch(t testing.TB, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", u, resp.StatusCode, err)
	}
	return string(b)
}

// TestStatusPageSwitch checks that the page is served on the metrics
// listener, read-only, next to the metrics, and that status_page = false
// turns it off and leaves the metrics.
func TestStatusPageSwitch(t *testing.T) {
	for _, on := range []bool{true, false} {
		extra := ""
		if !on {
			extra = "status_page = false"
		}
		_, addr := startMetricsDaemon(t, extra, 0, nil)
		base := "http://" + addr
		code := func(method, path string) int {
			req, _ := http.NewRequest(method, base+path, strings.NewReader(""))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if c := code("GET", "/metrics"); c != 200 {
			t.Errorf("status_page %v: /metrics %d", on, c)
		}
		for _, path := range []string{"/", "/status.json", "/static/page.js"} {
			want := 404
			if on {
				want = 200
			}
			if c := code("GET", path); c != want {
				t.Errorf("status_page %v: GET %s %d, want %d", on, path, c, want)
			}
			if on {
				if c := code("HEAD", path); c != 200 {
					t.Errorf("HEAD %s %d", path, c)
				}
				for _, m := range []string{"POST", "PUT", "DELETE"} {
					if c := code(m, path); c != http.StatusMethodNotAllowed {
						t.Errorf("%s %s %d, want 405", m, path, c)
					}
				}
			}
		}
		if on {
			if body := fetch(t, base+"/"); !strings.Contains(body, `data-service="web"`) || !strings.Contains(body, `data-service="api"`) {
				t.Errorf("the page lacks the services:\n%s", body)
			}
		}
	}
}
