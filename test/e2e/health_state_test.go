//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestVipdHealthSurvivesEdits: in the real kernel, editing only the
// settings of the checks of up backends (timeout, interval, rise and
// fall, http path, expected status) changes no weight, and traffic
// through the VIP after each edit reaches both backends without a failed
// request.
func TestVipdHealthSurvivesEdits(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	be := tp.BackendIPs
	cfg := func(settings string) string {
		return d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\n[service.check]\ntype = \"http\"\n"+settings, be...)
	}
	settings := "interval = \"500ms\"\ntimeout = \"300ms\"\nrise = 2\nfall = 2\njitter = 0\npath = \"/healthz\"\nstatus = \"200\"\n"
	d.write(cfg(settings))
	d.start()
	for _, b := range be {
		Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return weightOf(t, b) == 1 }, "%s never came up", b)
	}
	reloads := func() int { return strings.Count(d.logSince(), `msg=reconciled why="file changed"`) }
	weights := func() int { return strings.Count(d.logSince(), "op=update-backend") }
	for _, e := range []struct{ name, from, to string }{
		{"timeout", `timeout = "300ms"`, `timeout = "400ms"`},
		{"interval", `interval = "500ms"`, `interval = "400ms"`},
		{"rise and fall", "rise = 2\nfall = 2", "rise = 3\nfall = 3"},
		{"http path", `path = "/healthz"`, `path = "/"`},
		{"expected status", `status = "200"`, `status = "200-299"`},
	} {
		if !strings.Contains(settings, e.from) {
			t.Fatalf("%s: the settings lack %q", e.name, e.from)
		}
		settings = strings.Replace(settings, e.from, e.to, 1)
		n, w := reloads(), weights()
		d.write(cfg(settings))
		Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool { return reloads() > n }, "%s: the edit was not applied", e.name)
		// Traffic right after the edit, then a few probes with the new
		// settings.
		checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)
		time.Sleep(2 * time.Second)
		if got := weights() - w; got != 0 {
			t.Errorf("%s: the edit changed weights %d times:\n%s", e.name, got, d.logSince())
		}
		for _, b := range be {
			if got := weightOf(t, b); got != 1 {
				t.Errorf("%s: %s has weight %d", e.name, b, got)
			}
		}
	}
	if strings.Contains(d.logSince(), "backend down") {
		t.Errorf("a backend went down:\n%s", d.logSince())
	}
}
