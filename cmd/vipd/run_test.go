package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
	"github.com/vipd/vipd/systemd"
)

// syncBuffer is a log sink safe for the daemon's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t      testing.TB
	dir    string
	path   string
	socket string
	k      *lbtest.Kernel
	log    *syncBuffer
	notify *net.UnixConn
	notes  chan string
	done   chan error
	cancel context.CancelFunc
	// ipvs, if set, is the IPVS adapter the daemon opens instead of k.
	ipvs lb.IPVS
	// options, if set, changes the daemon's options.
	options func(*daemonOptions)
}

func (h *harness) header(extra string) string {
	return "[daemon]\ncontrol_socket = \"" + h.socket + "\"\nstate_dir = \"" + h.dir + "/state\"\nmetrics_listen = \"\"\n" + extra + "\n"
}

const twoServices = `
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]

[[service]]
name = "api"
vip = "192.0.2.11"
port = 443
backend = [{ address = "10.0.0.3" }, { address = "10.0.0.4" }]
`

func (h *harness) write(body string) {
	h.t.Helper()
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

func startDaemon(t testing.TB, daemonExtra, services string) *harness {
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	h.write(h.header(daemonExtra) + services)
	h.run()
	return h
}

// startDaemonAt starts a daemon on an existing directory (and config) and
// kernel, as a restart does.
func startDaemonAt(t *testing.T, dir string, k *lbtest.Kernel) *harness {
	h := newHarness(t, dir, k)
	h.run()
	return h
}

func newHarness(t testing.TB, dir string, k *lbtest.Kernel) *harness {
	return &harness{t: t, dir: dir, path: filepath.Join(dir, "vipd.toml"), socket: filepath.Join(dir, "vipd.sock"),
		k: k, log: &syncBuffer{}, done: make(chan error, 1)}
}

func (h *harness) run() {
	t := h.t
	if b, err := os.ReadFile(h.path); err == nil && strings.Contains(string(b), "[kubernetes]") {
		needProvider(t)
	}
	os.Remove(filepath.Join(h.dir, "notify.sock"))
	ns, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(h.dir, "notify.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	h.notify = ns
	// Read every notification as it comes, as systemd does: the
	// daemon's sends would otherwise fill the socket's queue.
	h.notes = make(chan string, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ns.Read(buf)
			if err != nil {
				return
			}
			h.notes <- string(buf[:n])
		}
	}()
	t.Setenv("NOTIFY_SOCKET", filepath.Join(h.dir, "notify.sock"))
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	opts := daemonOptions{
		Path:     h.path,
		Logger:   slog.New(slog.NewTextHandler(h.log, nil)),
		Notifier: systemd.FromEnv(),
		OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
			k := h.k.Interface()
			if h.ipvs != nil {
				k.IPVS = h.ipvs
			}
			return k, func() {}, nil
		},
		KernelRelease: "6.1.0-27-cloud-amd64",
	}
	if h.options != nil {
		h.options(&opts)
	}
	go func() {
		h.done <- runDaemon(ctx, opts)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(5 * time.Second):
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("daemon did not stop; goroutines:\n%s", b.String())
		}
		ns.Close()
	})
	h.expectNotify("READY=1")
}

// expectNotify waits for a notification that starts with prefix.
func (h *harness) expectNotify(prefix string) string {
	h.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case msg := <-h.notes:
			if strings.HasPrefix(msg, prefix) {
				return msg
			}
		case <-timeout:
			h.t.Fatalf("no %q notification\nlog:\n%s", prefix, h.log)
		}
	}
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s\nkernel:\n%s\nlog:\n%s", what, h.k.Dump(), h.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectOneWeight checks that a weight change of the api service took
// one kernel call and read that service alone.
func (h *harness) expectOneWeight() {
	h.t.Helper()
	if calls := h.k.Calls(); len(calls) != 1 || !strings.HasPrefix(calls[0], "update-dest") {
		h.t.Errorf("calls for one weight = %v", calls)
	}
	// A weight is planned from what the last pass left: nothing is read.
	if reads := h.k.Reads(); len(reads) != 0 {
		h.t.Errorf("reads for one weight = %v; want none", reads)
	}
}

func (h *harness) logHas(s string) func() bool {
	return func() bool { return strings.Contains(h.log.String(), s) }
}

// TestDaemonReloadPath runs the reload path against the fake kernel: good,
// broken, truncated (guarded), forced, and failing (rolled back) files in
// turn, checking the kernel after each.
func TestDaemonReloadPath(t *testing.T) {
	h := startDaemon(t, "", twoServices)
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	h.k.Calls()

	// A new backend: exactly one kernel call.
	h.write(h.header("") + strings.Replace(twoServices, `{ address = "10.0.0.2" }]`, `{ address = "10.0.0.2" }, { address = "10.0.0.5" }]`, 1))
	h.expectNotify("RELOADING=1\nMONOTONIC_USEC=")
	h.eventually("the new backend", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.5:80") })
	h.expectNotify("READY=1")
	if calls := h.k.Calls(); len(calls) != 1 || !strings.HasPrefix(calls[0], "add-dest") {
		t.Fatalf("calls for one new backend = %v", calls)
	}
	good := h.k.Dump()

	// A broken file: rejected with file and line, nothing touched.
	h.write(h.header("") + "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\", weight = -1 }]\n")
	h.eventually("the rejection", h.logHas(`vipd.toml:10: service \"web\": backend \"10.0.0.1:80\": weight -1 is negative`))
	if !strings.Contains(h.log.String(), "reload rejected") {
		t.Errorf("log does not say the reload was rejected:\n%s", h.log)
	}

	// A truncated file: the guard refuses, over the control socket too.
	h.write("")
	h.eventually("the guard", h.logHas("reload_guard"))
	rep, err := control.Call(h.socket, "POST", "/v1/reload")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Error, "removes 2 of 2 services") {
		t.Errorf("reload reply = %+v, want the guard's refusal", rep)
	}
	if got := h.k.Dump(); got != good {
		t.Fatalf("kernel changed after rejected reloads:\n%s\nwant\n%s", got, good)
	}
	if calls := h.k.Calls(); len(calls) != 0 {
		t.Fatalf("rejected reloads made calls %v", calls)
	}

	// Forced: the deletion goes through.
	h.write(h.header("") + twoServices[:strings.Index(twoServices, "[[service]]\nname = \"api\"")])
	h.eventually("the guard again", func() bool { return strings.Count(h.log.String(), "reload_guard") >= 2 })
	rep, err = control.Call(h.socket, "POST", "/v1/reload?force=1")
	if err != nil || rep.Error != "" {
		t.Fatalf("forced reload: %+v %v", rep, err)
	}
	if strings.Contains(h.k.Dump(), "192.0.2.11") {
		t.Fatalf("forced reload left the api service:\n%s", h.k.Dump())
	}
	// The removed backend left rotation in that pass; a drain pass a
	// second later deletes it, idle.
	if !strings.Contains(h.k.Dump(), "10.0.0.5:80 masq weight=0") {
		t.Fatalf("forced reload did not take 10.0.0.5 out of rotation first:\n%s", h.k.Dump())
	}
	h.eventually("the removed backend's deletion", func() bool { return !strings.Contains(h.k.Dump(), "10.0.0.5:80") })
	good = h.k.Dump()

	// A reload whose kernel operations fail is rolled back.
	boom := errors.New("boom")
	h.k.FailWith(func(call string) error {
		if strings.HasPrefix(call, "add-dest tcp 192.0.2.12:80") {
			return boom
		}
		return nil
	})
	h.write(h.header("") + twoServices[:strings.Index(twoServices, "[[service]]\nname = \"api\"")] +
		"[[service]]\nname = \"new\"\nvip = \"192.0.2.12\"\nport = 80\nbackend = [{ address = \"10.0.0.9\" }]\n")
	h.eventually("the rollback", h.logHas("rolling back"))
	h.eventually("the rollback's end", func() bool { return h.k.Dump() == good })

	// The control socket's plan shows what the file would do.
	h.k.FailWith(nil)
	rep, err = control.Call(h.socket, "GET", "/v1/plan")
	if err != nil || len(rep.Planned) == 0 || !strings.Contains(strings.Join(rep.Planned, "\n"), "add service tcp 192.0.2.12:80") {
		t.Fatalf("plan = %+v %v", rep, err)
	}
}

// TestDaemonStop checks on_stop: keep leaves everything, clean removes
// what vipd owns and nothing else.
func TestDaemonStop(t *testing.T) {
	for _, mode := range []string{"keep", "clean"} {
		t.Run(mode, func(t *testing.T) {
			h := startDaemon(t, "on_stop = \""+mode+"\"", twoServices)
			h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
			foreignKey := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("198.51.100.1"), Port: 22}
			h.k.Edit(func(s *lb.State) {
				s.Services[foreignKey] = &lb.ServiceState{Service: lb.Service{Key: foreignKey, Scheduler: "rr"}}
			})
			h.cancel()
			if err := <-h.done; err != nil {
				t.Fatal(err)
			}
			h.done <- nil // for the cleanup
			dump := h.k.Dump()
			if mode == "keep" && !strings.Contains(dump, "192.0.2.10") {
				t.Errorf("keep removed services:\n%s", dump)
			}
			if mode == "clean" && (strings.Contains(dump, "192.0.2.1") || strings.Contains(dump, "chains")) {
				t.Errorf("clean left vipd's state:\n%s", dump)
			}
			if !strings.Contains(dump, "service tcp 198.51.100.1:22 scheduler=rr\n") {
				t.Errorf("stop touched a foreign service:\n%s", dump)
			}
		})
	}
}

// TestDaemonHealth takes a backend whose check fails out of rotation
// (weight 0) and puts it back when the check passes, with real TCP checks
// on loopback.
func TestDaemonHealth(t *testing.T) {
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	// A port that was open and is closed now.
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	downAddr := l2.Addr().String()
	l2.Close()
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	svc := `
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
[service.check]
type = "tcp"
address = "127.0.0.1"
interval = "50ms"
timeout = "200ms"
rise = 1
fall = 1
jitter = 0
[[service.backend]]
address = "10.0.0.1"
check = { type = "tcp", address = "127.0.0.1", port = ` + port(up.Addr().String()) + `, interval = "50ms", rise = 1, fall = 1 }
[[service.backend]]
address = "10.0.0.2"
check = { type = "tcp", address = "127.0.0.1", port = ` + port(downAddr) + `, interval = "50ms", rise = 1, fall = 1 }
`
	h := startDaemon(t, "", svc)
	h.eventually("the failing backend quiesced", func() bool {
		d := h.k.Dump()
		return strings.Contains(d, "10.0.0.1:80 masq weight=1") && strings.Contains(d, "10.0.0.2:80 masq weight=0")
	})
	l, err := net.Listen("tcp", downAddr)
	if err != nil {
		t.Fatalf("cannot reopen %s: %v", downAddr, err)
	}
	defer l.Close()
	h.eventually("the recovered backend restored", func() bool {
		return strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=1")
	})
}

// TestDaemonObservability checks status, admin drains (which survive a
// reload) and the metrics endpoint against the fake kernel.
func TestDaemonObservability(t *testing.T) {
	h := startDaemon(t, "", twoServices)
	h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })

	rep, err := control.Call(h.socket, "GET", "/v1/status")
	if err != nil || rep.Status == nil {
		t.Fatalf("status: %+v %v", rep, err)
	}
	if len(rep.Status.Services) != 2 {
		t.Errorf("status has %d services, want 2", len(rep.Status.Services))
	}
	var table bytes.Buffer
	if err := status.RenderTable(&table, rep.Status); err != nil || !strings.Contains(table.String(), "web") {
		t.Errorf("table: %v\n%s", err, table.String())
	}

	rep, err = control.Call(h.socket, "POST", "/v1/drain?service=web&backend=10.0.0.2:80")
	if err != nil || rep.Error != "" {
		t.Fatalf("drain: %+v %v", rep, err)
	}
	if !strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=0") {
		t.Fatalf("drain did not quiesce the backend:\n%s", h.k.Dump())
	}
	if rep, _ := control.Call(h.socket, "POST", "/v1/drain?service=web&backend=10.9.9.9:80"); !strings.Contains(rep.Error, "no backend") {
		t.Errorf("draining an unknown backend: %+v", rep)
	}
	// A reload keeps the drain.
	h.write(h.header("") + strings.Replace(twoServices, `{ address = "10.0.0.4" }]`, `{ address = "10.0.0.4" }, { address = "10.0.0.5" }]`, 1))
	h.eventually("the reload", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.5:443") })
	if !strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=0") {
		t.Fatalf("reload undid the drain:\n%s", h.k.Dump())
	}
	data, err := os.ReadFile(filepath.Join(h.dir, "state", "drained.json"))
	if err != nil || !strings.Contains(string(data), "10.0.0.2:80") {
		t.Fatalf("drains not stored: %q %v", data, err)
	}
	rep, err = control.Call(h.socket, "POST", "/v1/undrain?service=web&backend=10.0.0.2:80")
	if err != nil || rep.Error != "" || !strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=1") {
		t.Fatalf("undrain: %+v %v\n%s", rep, err, h.k.Dump())
	}
}

func TestDaemonMetrics(t *testing.T) {
	h := startDaemon(t, "", twoServices)
	h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	// The harness disables metrics; start a second daemon config with a
	// listener on a free port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h.write(strings.Replace(h.header(""), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) + twoServices)
	h.eventually("the warning that metrics_listen needs a restart", h.logHas("take effect on restart"))
	h.cancel()
	<-h.done
	h.done <- nil

	h2 := startDaemonAt(t, h.dir, h.k)
	h2.eventually("metrics", h2.logHas("serving metrics"))
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`vipd_config_generation 1`,
		`vipd_reconcile_passes_total{why="start"} 1`,
		`vipd_backend_configured_weight{backend="10.0.0.1:80",service="web",vip="192.0.2.10:80/tcp"} 1`,
		`vipd_build_info{`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, grepLines(string(body), "vipd_"))
		}
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestDaemonReloadDelta: a reload that changes one backend's weight
// writes that backend alone and reads nothing; one that adds a VIP runs a
// full pass, which reads the whole table.
func TestDaemonReloadDelta(t *testing.T) {
	h := startDaemon(t, "", twoServices)
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	h.k.Calls()
	h.k.Reads()

	h.write(h.header("") + strings.Replace(twoServices, `{ address = "10.0.0.4" }`, `{ address = "10.0.0.4", weight = 3 }`, 1))
	h.eventually("the new weight", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443 masq weight=3") })
	h.expectNotify("READY=1")
	h.expectOneWeight()

	h.write(h.header("") + twoServices + "\n[[service]]\nname = \"new\"\nvip = \"192.0.2.12\"\nport = 80\nbackend = [{ address = \"10.0.0.9\" }]\n")
	h.eventually("the new service", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.12:80") })
	h.expectNotify("READY=1")
	if reads := h.k.Reads(); !slices.Contains(reads, "services") {
		t.Errorf("reads for a new VIP = %v; want a full pass", reads)
	}
	if strings.Contains(h.k.Dump(), "weight=3") {
		t.Errorf("the full pass left weight 3, which the file no longer has:\n%s", h.k.Dump())
	}
}

// TestDaemonDrainPass: a backend removed while it has connections drains;
// the passes that wait for its connections to end read its service alone,
// and delete it once they have.
func TestDaemonDrainPass(t *testing.T) {
	h := startDaemon(t, "drain = true", twoServices)
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	busy := netip.MustParseAddrPort("10.0.0.4:443")
	h.k.Edit(func(s *lb.State) {
		for _, st := range s.Services {
			if d, ok := st.Dests[busy]; ok {
				d.ActiveConns = 3
				st.Dests[busy] = d
			}
		}
	})
	h.write(h.header("drain = true") + strings.Replace(twoServices, `, { address = "10.0.0.4" }`, ``, 1))
	h.eventually("the drain", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443 masq weight=0") })
	h.k.Reads()
	time.Sleep(2500 * time.Millisecond) // drain passes run every second
	reads := h.k.Reads()
	if len(reads) == 0 {
		t.Error("no drain pass read the kernel")
	}
	for _, r := range reads {
		if r != "service tcp 192.0.2.11:443" {
			t.Errorf("a drain pass read %q; want the draining service alone", r)
		}
	}
	if !strings.Contains(h.k.Dump(), "10.0.0.4:443") {
		t.Fatalf("the busy backend went before its connections ended:\n%s", h.k.Dump())
	}
	h.k.Edit(func(s *lb.State) {
		for _, st := range s.Services {
			if d, ok := st.Dests[busy]; ok {
				d.ActiveConns = 0
				st.Dests[busy] = d
			}
		}
	})
	h.eventually("the deletion", func() bool { return !strings.Contains(h.k.Dump(), "10.0.0.4:443") })
}

// writeAt renames data into place at path, as operators are told to.
func writeAt(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), ".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestDaemonInclude runs a configuration whose services are in included
// files: a change of one file is read, parsed and applied alone (one
// kernel call, one service read); a new file adds its services; a broken
// file is rejected naming itself while everything keeps running; a
// removed file takes its services away; a change of the include patterns
// starts watching the new directory.
func TestDaemonInclude(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	web := filepath.Join(dir, "services.d", "web.toml")
	api := filepath.Join(dir, "services.d", "api.toml")
	parts := strings.SplitAfter(twoServices, "\n\n")
	writeAt(t, web, parts[0])
	writeAt(t, api, parts[1])
	main := "include = [\"services.d/*.toml\"]\n" + h.header("reload_guard = 1.0")
	h.write(main)
	h.run()
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	h.k.Calls()
	h.k.Reads()

	writeAt(t, api, strings.Replace(parts[1], `{ address = "10.0.0.4" }`, `{ address = "10.0.0.4", weight = 3 }`, 1))
	h.eventually("the new weight", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443 masq weight=3") })
	h.expectNotify("READY=1")
	h.expectOneWeight()
	h.eventually("the reload timing", h.logHas("file="+api))
	if !strings.Contains(h.log.String(), "services_parsed=1 full=false") {
		t.Errorf("the reload was not incremental:\n%s", h.log)
	}

	// A new file on an existing VIP.
	extra := filepath.Join(dir, "services.d", "extra.toml")
	writeAt(t, extra, "[[service]]\nname = \"alt\"\nvip = \"192.0.2.10\"\nport = 8080\nbackend = [{ address = \"10.0.0.7\" }]\n")
	h.eventually("the new file's service", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.10:8080") })

	// A broken file: rejected, naming it, nothing touched.
	good := h.k.Dump()
	writeAt(t, web, "[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\", weight = -1 }]\n")
	h.eventually("the rejection", h.logHas(web+`:5: service \"web\": backend \"10.0.0.1:80\": weight -1 is negative`))
	if got := h.k.Dump(); got != good {
		t.Errorf("a rejected file changed the kernel:\n%s\nwant\n%s", got, good)
	}
	// Another file still reloads, with the broken one's last good text.
	writeAt(t, extra, "[[service]]\nname = \"alt\"\nvip = \"192.0.2.10\"\nport = 8081\nbackend = [{ address = \"10.0.0.7\" }]\n")
	h.eventually("the other file", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.10:8081") })
	if !strings.Contains(h.k.Dump(), "10.0.0.1:80") {
		t.Errorf("the broken file's services went away:\n%s", h.k.Dump())
	}

	// A removed file takes its services with it.
	if err := os.Remove(extra); err != nil {
		t.Fatal(err)
	}
	h.eventually("the removal", func() bool { return !strings.Contains(h.k.Dump(), "192.0.2.10:8081") })

	// The broken file fixed.
	writeAt(t, web, parts[0])
	h.eventually("the fix", h.logHas("file="+web))

	// New patterns: the new directory is read and then watched.
	more := filepath.Join(dir, "more.d", "m.toml")
	writeAt(t, more, "[[service]]\nname = \"more\"\nvip = \"192.0.2.20\"\nport = 80\nbackend = [{ address = \"10.0.0.8\" }]\n")
	h.write("include = [\"services.d/*.toml\", \"more.d/*.toml\"]\n" + h.header("reload_guard = 1.0"))
	h.eventually("the new pattern's file", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.20:80") })
	writeAt(t, more, "[[service]]\nname = \"more\"\nvip = \"192.0.2.20\"\nport = 81\nbackend = [{ address = \"10.0.0.8\" }]\n")
	h.eventually("a change in the new directory", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.20:81") })

	// A pattern whose directory is missing: the reload is refused, naming
	// the line, and every file is still watched.
	good = h.k.Dump()
	h.write("include = [\"services.d/*.toml\", \"more.d/*.toml\", \"typo.d/*.toml\"]\n" + h.header("reload_guard = 1.0"))
	h.eventually("the refusal", h.logHas(`vipd.toml:1: include: \"`+filepath.Join(dir, "typo.d")+`/*.toml\": directory `+filepath.Join(dir, "typo.d")+` does not exist`))
	if got := h.k.Dump(); got != good {
		t.Errorf("a refused include changed the kernel:\n%s\nwant\n%s", got, good)
	}
	writeAt(t, more, "[[service]]\nname = \"more\"\nvip = \"192.0.2.20\"\nport = 82\nbackend = [{ address = \"10.0.0.8\" }]\n")
	h.eventually("a change after the refusal", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.20:82") })
}

// TestStatusCommand runs `vipd status` against a daemon: the daemon
// renders the table, which is the table of the snapshot -o json prints;
// and a daemon that answers the table's request with JSON (an older
// vipd) gets its snapshot rendered by the command.
func TestStatusCommand(t *testing.T) {
	h := startDaemon(t, `stats_interval = "10m"`, twoServices)
	h.eventually("programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	statusCmd := func(socket string, args ...string) string {
		t.Helper()
		var out, errOut strings.Builder
		root := newRoot(&out, &errOut)
		root.SetArgs(append([]string{"status", "--socket", socket}, args...))
		if err := root.Execute(); err != nil || errOut.Len() > 0 {
			t.Fatalf("vipd status %v: %v %s", args, err, errOut.String())
		}
		return out.String()
	}
	// The snapshot stays cached for stats_interval: both see the same.
	js := statusCmd(h.socket, "-o", "json")
	table := statusCmd(h.socket)
	var snap status.Snapshot
	if err := json.Unmarshal([]byte(js), &snap); err != nil {
		t.Fatalf("-o json: %v\n%s", err, js)
	}
	var want, wantJSON strings.Builder
	if err := status.RenderTable(&want, &snap); err != nil {
		t.Fatal(err)
	}
	if err := status.RenderJSON(&wantJSON, &snap); err != nil {
		t.Fatal(err)
	}
	if js != wantJSON.String() {
		t.Errorf("-o json prints:\n%s\nwant RenderJSON's:\n%s", js, wantJSON.String())
	}
	if table != want.String() || !strings.Contains(table, "web 192.0.2.10:80/tcp") {
		t.Errorf("the command's table:\n%s\nwant the table of -o json's snapshot:\n%s", table, want.String())
	}
	// The daemon rendered it.
	a, err := control.CallRaw(h.socket, "GET", "/v1/status?format=table")
	var served strings.Builder
	a.Copy(&served, 0, 0)
	if err != nil || a.ContentType != control.TableType || served.String() != want.String() {
		t.Errorf("GET /v1/status?format=table: %v, %q:\n%s", err, a.ContentType, served.String())
	}

	// An older daemon answers JSON to ?format=table.
	old := filepath.Join(t.TempDir(), "old.sock")
	l, err := net.Listen("unix", old)
	if err != nil {
		t.Fatal(err)
	}
	var asked atomic.Value
	var pretty atomic.Bool
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.URL.String())
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		if pretty.Load() {
			enc.SetIndent("", "\t")
		}
		enc.Encode(control.Reply{Status: &snap})
	})}
	go srv.Serve(l)
	defer srv.Close()
	if got := statusCmd(old); got != want.String() {
		t.Errorf("an older daemon's JSON, rendered by the command:\n%s\nwant:\n%s", got, want.String())
	}
	if got, _ := asked.Load().(string); got != "/v1/status?format=table" {
		t.Errorf("the command asked for %q, want /v1/status?format=table", got)
	}
	// -o json of an answer not in the daemon's compact shape: decoded
	// and encoded again, the same text.
	pretty.Store(true)
	if got := statusCmd(old, "-o", "json"); got != wantJSON.String() {
		t.Errorf("-o json of an indented answer:\n%s\nwant:\n%s", got, wantJSON.String())
	}
}
