package statuspage

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/monitor/status"
)

var t0 = time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC)

// synthetic returns a snapshot of n services of m backends each, every
// tenth service degraded with its first backend down.
func synthetic(n, m int, at time.Time) *status.Snapshot {
	snap := &status.Snapshot{Time: at, HealthChecks: true, Services: make([]status.Service, n), Removed: []status.Service{}}
	for i := range n {
		vip := netip.AddrFrom4([4]byte{10, byte(100 + i>>16), byte(i >> 8), byte(i)})
		s := &snap.Services[i]
		*s = status.Service{Name: fmt.Sprintf("svc-%05d", i), Key: fmt.Sprintf("%s:80/tcp", vip), Family: "ipv4", Protocol: "tcp",
			Address: vip, Port: 80, Scheduler: "wlc", Forwarding: "masq", State: status.OK,
			Stats: status.Stats{ConnRate: uint64(i % 97), InByteRate: 123456, OutByteRate: 654321}}
		if i%2 == 1 {
			s.Source = "kubernetes"
			s.Name = fmt.Sprintf("k8s/ns%d/app%d/http/tcp", i%7, i)
		}
		s.Backends = make([]status.Backend, m)
		for j := range m {
			b := &s.Backends[j]
			*b = status.Backend{Address: netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, byte(16 + j), byte(i >> 8), byte(i)}), 8080),
				Forward: "masq", Configured: true, ConfiguredWeight: 10, InKernel: true, Weight: 10,
				Health: &status.Health{State: "up", Since: at.Add(-time.Hour)}, ActiveConns: uint32(j), InactiveConns: 2}
		}
		if i%10 == 0 {
			s.State = status.Degraded
			s.Backends[0].Weight = 0
			s.Backends[0].Reason = status.HealthDown
			s.Backends[0].Health = &status.Health{State: "down", Since: at.Add(-time.Minute), Error: "connection refused"}
		}
	}
	return snap
}

func server(snap *status.Snapshot, h *History) *Server {
	return New(Options{Status: func(context.Context) (*status.Snapshot, error) { return snap, nil }, History: h,
		Version: "test", Now: func() time.Time { return snap.Time.Add(3 * time.Second) }})
}

func get(t testing.TB, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, target, nil))
	return w
}

var serviceRow = regexp.MustCompile(`<tbody class="svc" data-service="([^"]*)"`)

func services(body string) []string {
	var out []string
	for _, m := range serviceRow.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func TestPageEscapes(t *testing.T) {
	snap := synthetic(3, 2, t0)
	evil := `<script>alert(1)</script>`
	snap.Services[0].Name = evil
	snap.Services[1].Backends[0].Health = &status.Health{State: "down", Since: t0, Error: `"><img src=x onerror=alert(2)>`}
	snap.Services[1].Drift = []string{`</td><script>alert(3)</script>`}
	snap.Sources = []status.Source{{Name: "kubernetes", Services: 1, Error: `<b onmouseover=alert(4)>`}}
	snap.Reload = &status.Reload{Time: t0, Why: "file changed", File: `<i>x.toml</i>`, Result: "failed", Error: `<svg onload=alert(5)>`}
	for _, target := range []string{"/", "/?q=" + "%3Cscript%3E", "/status.json?q=%22%3E%3Cscript%3Ealert(6)%3C/script%3E"} {
		w := get(t, server(snap, nil).Handler(), "GET", target)
		body := w.Body.String()
		if strings.HasPrefix(target, "/status.json") {
			var d dataReply
			if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil {
				t.Fatal(err)
			}
			body = d.Main
		}
		for _, bad := range []string{"<script>alert", "<img", "<b onmouseover", "<svg onload", "<i>x", `onerror=alert(2)>`} {
			if strings.Contains(body, bad) {
				t.Errorf("%s: the page holds %q unescaped", target, bad)
			}
		}
		if target == "/" && !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%s: the evil name is not shown escaped", target)
		}
	}
	w := get(t, server(snap, nil).Handler(), "GET", "/")
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP %q", csp)
	}
	if strings.Contains(w.Body.String(), "<script>") || strings.Contains(w.Body.String(), "style=") {
		t.Error("the page has an inline script or style, which its CSP refuses")
	}
}

func TestPagination(t *testing.T) {
	snap := synthetic(120, 3, t0)
	h := server(snap, nil).Handler()
	for _, tc := range []struct {
		target      string
		first, last string
		n           int
		prev, next  bool
	}{
		{"/", "svc-00000", "k8s/ns0/app49/http/tcp", 50, false, true},
		{"/?page=2", "svc-00050", "k8s/ns1/app99/http/tcp", 50, true, true},
		{"/?page=3", "svc-00100", "k8s/ns0/app119/http/tcp", 20, true, false},
		{"/?page=99", "svc-00100", "k8s/ns0/app119/http/tcp", 20, true, false},
		{"/?page=-4", "svc-00000", "k8s/ns0/app49/http/tcp", 50, false, true},
		{"/?page=x", "svc-00000", "k8s/ns0/app49/http/tcp", 50, false, true},
	} {
		w := get(t, h, "GET", tc.target)
		if w.Code != 200 {
			t.Fatalf("%s: %d", tc.target, w.Code)
		}
		body := w.Body.String()
		got := services(body)
		if len(got) != tc.n || got[0] != tc.first || got[len(got)-1] != tc.last {
			t.Errorf("%s: %d services %s..%s, want %d %s..%s", tc.target, len(got), got[0], got[len(got)-1], tc.n, tc.first, tc.last)
		}
		if strings.Contains(body, `rel="prev"`) != tc.prev || strings.Contains(body, `rel="next"`) != tc.next {
			t.Errorf("%s: prev/next links wrong", tc.target)
		}
		// Every backend of the services shown, and no other.
		if n := strings.Count(body, `<tr class="backend`); n != 3*tc.n {
			t.Errorf("%s: %d backend rows, want %d", tc.target, n, 3*tc.n)
		}
	}
	if body := get(t, h, "GET", "/?page=2").Body.String(); !strings.Contains(body, `href="?page=3"`) || !strings.Contains(body, `href="?"`) {
		t.Error("page 2 does not link pages 1 and 3")
	}
}

func TestFilter(t *testing.T) {
	snap := synthetic(120, 3, t0)
	h := server(snap, nil).Handler()
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"svc-0001", []string{"svc-00010", "svc-00012", "svc-00014", "svc-00016", "svc-00018"}},
		{"SVC-0011", []string{"svc-00110", "svc-00112", "svc-00114", "svc-00116", "svc-00118"}},
		// A backend's address.
		{"172.17.0.7:8080", []string{"k8s/ns0/app7/http/tcp"}},
		// A VIP.
		{"10.100.0.2:80/", []string{"svc-00002"}},
		{"nothing like it", nil},
	} {
		body := get(t, h, "GET", "/?q="+strings.ReplaceAll(tc.q, " ", "+")).Body.String()
		got := services(body)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("q=%q: %v, want %v", tc.q, got, tc.want)
		}
	}
	// State and source are searchable; a filter's pages link with it.
	body := get(t, h, "GET", "/?q=kubernetes").Body.String()
	if got := services(body); len(got) != 50 || !strings.Contains(body, `href="?page=2&amp;q=kubernetes"`) || !strings.Contains(body, "60 of 120 services match") {
		t.Errorf("q=kubernetes: %d services; pager wrong", len(got))
	}
	if got := services(get(t, h, "GET", "/?q=degraded").Body.String()); len(got) != 12 {
		t.Errorf("q=degraded: %d services, want 12", len(got))
	}
	// An overlong filter is cut, not refused.
	if w := get(t, h, "GET", "/?q="+strings.Repeat("a", 5000)); w.Code != 200 || strings.Contains(w.Body.String(), strings.Repeat("a", maxQuery+1)) {
		t.Errorf("an overlong filter: %d", w.Code)
	}
}

func TestPageShows(t *testing.T) {
	snap := synthetic(2, 2, t0)
	snap.Services[1].Backends[1].Reason = status.AdminDrain
	snap.Services[1].Backends[1].AdminDrained = true
	snap.Services[1].Backends[1].Weight = 0
	snap.Removed = []status.Service{{Key: "192.0.2.99:80/tcp", State: status.Removed, ActiveConns: 7}}
	snap.HA = &status.HA{Role: "master", VRID: 51, Priority: 100, Configured: 150, Master: "192.0.2.1", Since: t0.Add(-90 * time.Second), Reason: "master down timer expired"}
	snap.BGP = &status.BGP{ASN: 64512, RouterID: "192.0.2.1", Peers: []status.BGPPeer{
		{Address: "192.0.2.254", ASN: 64513, State: "established", Routes: 2},
		{Address: "192.0.2.253", ASN: 64513, State: "active", BFD: &status.BFD{State: "down", RemoteState: "down", Downs: 2, LastDown: "control detection time expired"}},
	},
		Announced: []string{"10.100.0.0/32", "10.100.0.1/32"}, Withheld: []status.BGPWithheld{{Route: "10.100.0.9/32", Reason: "no backend serving"}}}
	snap.Sources = []status.Source{{Name: "kubernetes", Services: 1}}
	snap.Reload = &status.Reload{Time: t0.Add(-time.Minute), Why: "sighup", Result: "applied", Applied: 3, Changes: []string{"add-service 1", "add-backend 2"}}
	body := get(t, server(snap, nil).Handler(), "GET", "/").Body.String()
	for _, want := range []string{
		`<title>vipd: 2 services, 2/4 backends serving</title>`,
		`id="ha-role">master</p>`, `priority 100 (configured 150)`, `master 192.0.2.1`, `since 1m ago`,
		`<td>192.0.2.254</td><td>64513</td><td><span class="st ok">established</span>`, `2 announced, 1 withheld`,
		`<span class="muted">off</span></td></tr>`,
		`<span class="st down" title="remote down, 2 downs, last: control detection time expired">down</span>`,
		`kubernetes: 1 services`, `applied</span> 1m ago · sighup`, `add-service 1, add-backend 2`,
		`<h2>Drains in progress</h2>`, `admin-drain`, `192.0.2.99:80/tcp`,
		`data-backend="172.16.0.0:8080" data-health="down" data-serving="false"`, `connection refused`,
		`data-service="svc-00000" data-state="degraded"`, `<span class="src">file</span>`, `<span class="src">kubernetes</span>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

func TestData(t *testing.T) {
	snap := synthetic(60, 2, t0)
	h := server(snap, nil).Handler()
	w := get(t, h, "GET", "/status.json?page=2")
	var d dataReply
	if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil || w.Code != 200 {
		t.Fatalf("%d %v", w.Code, err)
	}
	if got := services(d.Main); len(got) != 10 || d.Version != version(snap) || strings.Contains(d.Main, "<html") {
		t.Errorf("data: %d services, version %q", len(got), d.Version)
	}
	if w := get(t, h, "GET", "/status.json?v="+d.Version); w.Code != http.StatusNoContent || w.Body.Len() != 0 {
		t.Errorf("same version: %d, %d bytes", w.Code, w.Body.Len())
	}
	if w := get(t, h, "GET", "/status.json?v=old"); w.Code != 200 {
		t.Errorf("old version: %d", w.Code)
	}
}

func TestReadOnly(t *testing.T) {
	h := server(synthetic(1, 1, t0), nil).Handler()
	for _, target := range []string{"/", "/status.json", "/static/page.css", "/static/page.js"} {
		if w := get(t, h, "HEAD", target); w.Code != 200 {
			t.Errorf("HEAD %s: %d", target, w.Code)
		}
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
			if w := get(t, h, m, target); w.Code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, target, w.Code)
			}
		}
	}
	for _, target := range []string{"/static/x", "/admin", "/static/../page.html"} {
		if w := get(t, h, "GET", target); w.Code == 200 {
			t.Errorf("GET %s: 200", target)
		}
	}
	w := get(t, h, "GET", "/static/page.js")
	if b, _ := io.ReadAll(w.Body); string(b) != string(js) || w.Header().Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Error("page.js not served as is")
	}
	// No snapshot yet: 503, not a broken page.
	none := New(Options{Status: func(context.Context) (*status.Snapshot, error) { return nil, fmt.Errorf("cannot read the kernel") }})
	if w := get(t, none.Handler(), "GET", "/"); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "cannot read the kernel") {
		t.Errorf("no snapshot: %d %q", w.Code, w.Body.String())
	}
}

func TestGzip(t *testing.T) {
	h := server(synthetic(60, 10, t0), nil).Handler()
	plain := get(t, h, "GET", "/")
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("Accept-Encoding", "br;q=1.0, gzip;q=0.8")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Header().Get("Content-Encoding") != "gzip" || w.Body.Len()*5 > plain.Body.Len() {
		t.Fatalf("gzip: %q, %d bytes of %d", w.Header().Get("Content-Encoding"), w.Body.Len(), plain.Body.Len())
	}
	t.Logf("page of 50 services x 10 backends: %d bytes, %d gzipped", plain.Body.Len(), w.Body.Len())
	zr, err := gzip.NewReader(w.Body)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(zr)
	if string(b) != plain.Body.String() {
		t.Error("the gzipped page differs")
	}
}

// TestPageLast checks that the page paints the last snapshot at once when
// it is young, having the cache take a fresh one without waiting, and
// waits for a fresh one when it is old; the data always waits.
func TestPageLast(t *testing.T) {
	old, fresh := synthetic(1, 1, t0), synthetic(2, 1, t0.Add(40*time.Second))
	var asked []time.Duration
	now := t0.Add(10 * time.Second)
	s := New(Options{
		Status: func(ctx context.Context) (*status.Snapshot, error) {
			d, _ := ctx.Deadline()
			asked = append(asked, d.Sub(time.Now()).Round(time.Second))
			return fresh, nil
		},
		Last: func() *status.Snapshot { return old },
		Now:  func() time.Time { return now },
	})
	h := s.Handler()
	if got := services(get(t, h, "GET", "/").Body.String()); len(got) != 1 || len(asked) != 1 || asked[0] > time.Second {
		t.Errorf("young last: %d services, status asked %v", len(got), asked)
	}
	now = t0.Add(MaxStale + time.Second)
	asked = nil
	if got := services(get(t, h, "GET", "/").Body.String()); len(got) != 2 || len(asked) != 1 {
		t.Errorf("old last: %d services, status asked %v", len(got), asked)
	}
	var d dataReply
	now = t0.Add(time.Second)
	json.Unmarshal(get(t, h, "GET", "/status.json").Body.Bytes(), &d)
	if len(services(d.Main)) != 2 {
		t.Error("the data did not wait for a fresh snapshot")
	}
}
