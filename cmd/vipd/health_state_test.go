package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
)

// checkServer is a loopback HTTP server that one backend's health check
// probes. It answers 200 (or 503 while fail is set) to every request and
// counts requests by path.
type checkServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	paths map[string]int
	// fail makes it answer 503.
	fail atomic.Bool
}

func newCheckServer(t *testing.T) *checkServer {
	t.Helper()
	s := &checkServer{paths: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.paths[r.URL.Path]++
		s.mu.Unlock()
		if s.fail.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *checkServer) port() string {
	_, p, _ := net.SplitHostPort(s.srv.Listener.Addr().String())
	return p
}

// count returns the number of requests for path so far.
func (s *checkServer) count(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paths[path]
}

// baseCheck are the check settings the tests start from. The timeout is
// generous so that a loaded machine does not fail probes.
const baseCheck = `interval = "100ms"
timeout = "2s"
rise = 2
fall = 3
jitter = 0
path = "/health"
status = "200"
`

var (
	web1 = netip.MustParseAddrPort("10.0.0.1:80")
	web2 = netip.MustParseAddrPort("10.0.0.2:80")
)

// checkedServices is the "web" service, whose backends web1 and web2 are
// each checked over HTTP by their own server with the check settings
// given (TOML lines), then the "api" service without checks. skip2 leaves
// web2 out.
func checkedServices(srv [2]*checkServer, settings string, skip2 bool) string {
	var b strings.Builder
	b.WriteString("[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\n")
	for i, addr := range []string{"10.0.0.1", "10.0.0.2"} {
		if i == 1 && skip2 {
			continue
		}
		fmt.Fprintf(&b, "[[service.backend]]\naddress = %q\n[service.backend.check]\ntype = \"http\"\naddress = \"127.0.0.1\"\nport = %s\n%s",
			addr, srv[i].port(), settings)
	}
	b.WriteString("\n[[service]]\nname = \"api\"\nvip = \"192.0.2.11\"\nport = 443\nbackend = [{ address = \"10.0.0.3\" }]\n")
	return b.String()
}

// health returns the health of service's backends as the control socket
// reports it.
func (h *harness) health(service string) map[netip.AddrPort]status.Health {
	h.t.Helper()
	rep, err := control.Call(h.socket, "GET", "/v1/status")
	if err != nil || rep.Status == nil {
		h.t.Fatalf("status: %+v %v", rep, err)
	}
	out := map[netip.AddrPort]status.Health{}
	for _, s := range rep.Status.Services {
		if s.Name != service {
			continue
		}
		for _, b := range s.Backends {
			if b.Health != nil {
				out[b.Address] = *b.Health
			}
		}
	}
	return out
}

// startChecked starts a daemon on checkedServices with the fake kernel k
// (and ipvs, if not nil, as its IPVS adapter) and waits until both
// checked backends are up and programmed with weight 1. It returns the
// harness and the backends' health.
func startChecked(t *testing.T, srv [2]*checkServer, k *lbtest.Kernel, ipvs lb.IPVS) (*harness, map[netip.AddrPort]status.Health) {
	t.Helper()
	h := newHarness(t, t.TempDir(), k)
	h.ipvs = ipvs
	h.write(h.header("reload_guard = 1.0") + checkedServices(srv, baseCheck, false))
	h.run()
	h.eventually("both checked backends up", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "10.0.0.1:80 masq weight=1") && strings.Contains(d, "10.0.0.2:80 masq weight=1")
	})
	before := h.health("web")
	for _, a := range []netip.AddrPort{web1, web2} {
		if before[a].State != "up" {
			t.Fatalf("%s is %+v after its weight went to 1", a, before[a])
		}
	}
	return h, before
}

// expectHealthKept checks that the backends of web are up since the same
// time as in before.
func (h *harness) expectHealthKept(what string, before map[netip.AddrPort]status.Health) {
	h.t.Helper()
	after := h.health("web")
	for a, b := range before {
		if got := after[a]; got.State != "up" || !got.Since.Equal(b.Since) {
			h.t.Errorf("%s: %s is %s since %v; want up since %v as before\nlog:\n%s", what, a, got.State, got.Since, b.Since, h.log)
		}
	}
}

// expectNoWeightChange checks that no weight of web was written since the
// last call of h.k.Calls.
func (h *harness) expectNoWeightChange(what string) {
	h.t.Helper()
	for _, c := range h.k.Calls() {
		if strings.Contains(c, "192.0.2.10:80") {
			h.t.Errorf("%s: the kernel was changed: %s\nlog:\n%s", what, c, h.log)
		}
	}
	if d := h.k.Dump(); !strings.Contains(d, "10.0.0.1:80 masq weight=1") || !strings.Contains(d, "10.0.0.2:80 masq weight=1") {
		h.t.Errorf("%s: the checked backends lost their weight:\n%s", what, d)
	}
}

// probed waits until both servers have answered n more requests for path
// than they had in before, so that the checks probed with what a reload
// set.
func probed(h *harness, srv [2]*checkServer, path string, before [2]int, n int) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("%d probes of %s", n, path), func() bool {
		return srv[0].count(path) >= before[0]+n && srv[1].count(path) >= before[1]+n
	})
}

// TestDaemonHealthSurvivesSettingsEdits edits one setting of the checks of
// up backends at a time, through the real reload path: no edit takes a
// backend out of rotation, even for the moment before its next probe, and
// the backends' health stays up since the same time, while the checks
// probe with the new settings.
func TestDaemonHealthSurvivesSettingsEdits(t *testing.T) {
	srv := [2]*checkServer{newCheckServer(t), newCheckServer(t)}
	h, before := startChecked(t, srv, lbtest.New(), nil)
	settings := baseCheck
	for _, edit := range []struct{ name, from, to, path string }{
		{"timeout", `timeout = "2s"`, `timeout = "3s"`, "/health"},
		{"interval", `interval = "100ms"`, `interval = "80ms"`, "/health"},
		{"rise and fall", "rise = 2\nfall = 3", "rise = 4\nfall = 5", "/health"},
		{"jitter", "jitter = 0", "jitter = 0.2", "/health"},
		{"initial", "jitter = 0.2", "jitter = 0.2\ninitial = \"up\"", "/health"},
		{"http path", `path = "/health"`, `path = "/ready"`, "/ready"},
		{"expected status", `status = "200"`, `status = "200-299"`, "/ready"},
	} {
		if !strings.Contains(settings, edit.from) {
			t.Fatalf("%s: settings lack %q:\n%s", edit.name, edit.from, settings)
		}
		settings = strings.Replace(settings, edit.from, edit.to, 1)
		h.k.Calls()
		seen := [2]int{srv[0].count(edit.path), srv[1].count(edit.path)}
		h.write(h.header("reload_guard = 1.0") + checkedServices(srv, settings, false))
		h.expectNotify("RELOADING=1")
		h.expectNotify("READY=1")
		h.expectNoWeightChange(edit.name + " edited")
		h.expectHealthKept(edit.name+" edited", before)
		probed(h, srv, edit.path, seen, 3)
		h.expectNoWeightChange(edit.name + " edited, after 3 probes")
		h.expectHealthKept(edit.name+" edited, after 3 probes", before)
	}
	if strings.Contains(h.log.String(), "backend down") {
		t.Errorf("a backend went down:\n%s", h.log)
	}
}

// TestDaemonHealthSurvivesRollback runs a reload that edits a check's
// timeout, removes a checked backend and adds a service whose kernel
// operation fails, so it is rolled back: the rollback restores the removed
// backend at its weight, and both backends' health is what it was.
func TestDaemonHealthSurvivesRollback(t *testing.T) {
	srv := [2]*checkServer{newCheckServer(t), newCheckServer(t)}
	h, before := startChecked(t, srv, lbtest.New(), nil)
	good := h.k.Dump()
	h.k.Calls()
	h.k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "add-dest tcp 192.0.2.12:80") {
			return errors.New("boom")
		}
		return nil
	})
	h.write(h.header("reload_guard = 1.0") + checkedServices(srv, strings.Replace(baseCheck, `timeout = "2s"`, `timeout = "3s"`, 1), true) +
		"\n[[service]]\nname = \"new\"\nvip = \"192.0.2.12\"\nport = 80\nbackend = [{ address = \"10.0.0.9\" }]\n")
	h.expectNotify("RELOADING=1")
	h.expectNotify("READY=1")
	if !strings.Contains(h.log.String(), "rolling back") {
		t.Fatalf("the reload was not rolled back:\n%s", h.log)
	}
	if got := h.k.Dump(); got != good {
		t.Errorf("the rollback left\n%s\nwant\n%s", got, good)
	}
	// The removed backend left rotation (weight 0) and the rollback put
	// it back; no other weight changed.
	var removed []string
	for _, c := range h.k.Calls() {
		switch {
		case strings.HasPrefix(c, "update-dest tcp 192.0.2.10:80 10.0.0.2:80"):
			removed = append(removed, c)
		case strings.HasPrefix(c, "update-dest tcp 192.0.2.10:80"):
			t.Errorf("the reload or its rollback changed a weight: %s", c)
		}
	}
	if want := []string{"update-dest tcp 192.0.2.10:80 10.0.0.2:80 weight=0", "update-dest tcp 192.0.2.10:80 10.0.0.2:80 weight=1"}; !slices.Equal(removed, want) {
		t.Errorf("the removed backend's calls %q, want %q", removed, want)
	}
	h.expectHealthKept("after the rollback", before)
	seen := [2]int{srv[0].count("/health"), srv[1].count("/health")}
	probed(h, srv, "/health", seen, 3)
	h.expectNoWeightChange("after the rollback, after 3 probes")
	h.expectHealthKept("after the rollback, after 3 probes", before)
}

// failingReads is the fake kernel with reads of IPVS that fail while
// fail is set.
type failingReads struct {
	*lbtest.Kernel
	fail atomic.Bool
}

var errUnreadable = errors.New("netlink: no buffer space available")

func (k *failingReads) Services() (map[lb.ServiceKey]*lb.ServiceState, error) {
	if k.fail.Load() {
		return nil, errUnreadable
	}
	return k.Kernel.Services()
}

func (k *failingReads) Service(key lb.ServiceKey) (*lb.ServiceState, error) {
	if k.fail.Load() {
		return nil, errUnreadable
	}
	return k.Kernel.Service(key)
}

// TestDaemonHealthSurvivesUnreadableKernel runs a reload that edits a
// check's timeout while the kernel cannot be read: nothing is applied,
// and once the kernel can be read again no backend's health or weight
// has changed.
func TestDaemonHealthSurvivesUnreadableKernel(t *testing.T) {
	srv := [2]*checkServer{newCheckServer(t), newCheckServer(t)}
	k := &failingReads{Kernel: lbtest.New()}
	h, before := startChecked(t, srv, k.Kernel, k)
	h.k.Calls()
	k.fail.Store(true)
	h.write(h.header("reload_guard = 1.0") + checkedServices(srv, strings.Replace(baseCheck, `timeout = "2s"`, `timeout = "3s"`, 1), false))
	h.expectNotify("RELOADING=1")
	h.expectNotify("READY=1")
	if !strings.Contains(h.log.String(), "netlink: no buffer space available") {
		t.Fatalf("the reload's pass did not fail:\n%s", h.log)
	}
	// Status reads the kernel too: look once it can be read again.
	seen := [2]int{srv[0].count("/health"), srv[1].count("/health")}
	probed(h, srv, "/health", seen, 3)
	k.fail.Store(false)
	h.expectHealthKept("after the failed reload", before)

	// The kernel is back: reloading the file applies it, changing no
	// weight.
	rep, err := control.Call(h.socket, "POST", "/v1/reload")
	if err != nil || rep.Error != "" {
		t.Fatalf("reload: %+v %v", rep, err)
	}
	h.expectNoWeightChange("after the kernel came back")
	h.expectHealthKept("after the kernel came back", before)
}

// TestDaemonRollbackKeepsQuorumState runs a reload that raises a
// service's quorum above its healthy backends, so that it would fail open,
// and fails, so that it is rolled back: the running configuration's
// quorum decision, which its hysteresis depends on, is what it was, and
// the failed backends stay out of rotation.
func TestDaemonRollbackKeepsQuorumState(t *testing.T) {
	var srv [4]*checkServer
	for i := range srv {
		srv[i] = newCheckServer(t)
	}
	srv[3].fail.Store(true)
	services := func(quorum int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nquorum = %d\nquorum_hysteresis = 2\n", quorum)
		for i, s := range srv {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"10.0.0.%d\"\n[service.backend.check]\ntype = \"http\"\naddress = \"127.0.0.1\"\nport = %s\n%s", i+1, s.port(), baseCheck)
		}
		return b.String()
	}
	h := newHarness(t, t.TempDir(), lbtest.New())
	h.write(h.header("") + services(1))
	h.run()
	// Three of four up: quorum 1 plus hysteresis 2 is met.
	h.eventually("three backends up and one out", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "10.0.0.3:80 masq weight=1") && strings.Contains(d, "10.0.0.4:80 masq weight=0")
	})
	// One more fails: two are up, above the quorum.
	srv[2].fail.Store(true)
	h.eventually("two backends up and two out", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "10.0.0.1:80 masq weight=1") && strings.Contains(d, "10.0.0.2:80 masq weight=1") &&
			strings.Contains(d, "10.0.0.3:80 masq weight=0") && strings.Contains(d, "10.0.0.4:80 masq weight=0")
	})
	good := h.k.Dump()
	h.k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "add-dest tcp 192.0.2.12:80") {
			return errors.New("boom")
		}
		return nil
	})
	h.write(h.header("") + services(4) + "\n[[service]]\nname = \"new\"\nvip = \"192.0.2.12\"\nport = 80\nbackend = [{ address = \"10.0.0.9\" }]\n")
	h.expectNotify("RELOADING=1")
	h.expectNotify("READY=1")
	if !strings.Contains(h.log.String(), "rolling back") {
		t.Fatalf("the reload was not rolled back:\n%s", h.log)
	}
	if got := h.k.Dump(); got != good {
		t.Errorf("the rollback left\n%s\nwant\n%s", got, good)
	}
}
