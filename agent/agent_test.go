package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source"
)

// The agent's policies, driven through its typed methods on the fake
// kernel, the path production takes without the control socket.

// logBuffer is a log a test reads while the agent writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// readyNotifier closes ready when the agent reports ready.
type readyNotifier struct {
	quiet
	once  sync.Once
	ready chan struct{}
}

func (n *readyNotifier) Ready(string) error {
	n.once.Do(func() { close(n.ready) })
	return nil
}

// rig runs an agent on a fake kernel with a configuration file in a
// temporary directory.
type rig struct {
	t    *testing.T
	dir  string
	path string
	k    *lbtest.Kernel
	a    *Agent
	log  *logBuffer
	done chan error
	stop context.CancelFunc
	// options, when set, changes the agent's options.
	options func(*Options)
}

const header = `[daemon]
watch = false
resync_interval = "1h"
metrics_listen = ""
`

// newRig writes services as the configuration and starts an agent with
// srcs; it returns once the agent is ready.
func newRig(t *testing.T, services string, srcs ...source.Source) *rig {
	t.Helper()
	return newRigWith(t, services, nil, srcs...)
}

// newRigWith is newRig with options changing the agent's options.
func newRigWith(t *testing.T, services string, options func(*Options), srcs ...source.Source) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{t: t, dir: dir, path: filepath.Join(dir, "vipd.toml"), k: lbtest.New(), log: &logBuffer{}, done: make(chan error, 1),
		options: options}
	r.write(services)
	r.start(srcs...)
	return r
}

// restart starts another agent on r's kernel and files, as a restart of
// vipd does, once r's has stopped.
func (r *rig) restart(t *testing.T) *rig {
	t.Helper()
	n := &rig{t: t, dir: r.dir, path: r.path, k: r.k, log: &logBuffer{}, done: make(chan error, 1), options: r.options}
	n.start()
	return n
}

func (r *rig) start(srcs ...source.Source) {
	t := r.t
	t.Helper()
	n := &readyNotifier{ready: make(chan struct{})}
	opts := Options{
		Path:     r.path,
		Logger:   slog.New(slog.NewTextHandler(r.log, nil)),
		Notifier: n,
		OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
			return r.k.Interface(), func() {}, nil
		},
		KernelRelease: "6.1.0",
		Sources:       srcs,
	}
	if r.options != nil {
		r.options(&opts)
	}
	r.a = New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { r.done <- r.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
			t.Error("the agent did not stop")
		}
	})
	select {
	case <-n.ready:
	case err := <-r.done:
		t.Fatalf("the agent ended before ready: %v\n%s", err, r.log)
	case <-time.After(10 * time.Second):
		t.Fatalf("the agent is not ready\n%s", r.log)
	}
}

func (r *rig) write(services string) {
	r.t.Helper()
	text := header + fmt.Sprintf("state_dir = %q\ncontrol_socket = %q\n", filepath.Join(r.dir, "state"), filepath.Join(r.dir, "vipd.sock")) + services
	if err := os.WriteFile(r.path, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// services returns the text of n services named s0.. on 192.0.2.(10+i):80,
// each with two backends of the given weight.
func services(n, weight int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "[[service]]\nname = \"s%d\"\nvip = \"192.0.2.%d\"\nport = 80\n", i, 10+i)
		fmt.Fprintf(&b, "backend = [{ address = \"10.0.%d.1\", weight = %d }, { address = \"10.0.%d.2\", weight = %d }]\n", i, weight, i, weight)
	}
	return b.String()
}

func (r *rig) has(t *testing.T, want ...string) {
	t.Helper()
	dump := r.k.Dump()
	for _, w := range want {
		if !strings.Contains(dump, w) {
			t.Errorf("the kernel has no %q:\n%s", w, dump)
		}
	}
}

func (r *rig) hasNot(t *testing.T, unwanted ...string) {
	t.Helper()
	dump := r.k.Dump()
	for _, w := range unwanted {
		if strings.Contains(dump, w) {
			t.Errorf("the kernel has %q:\n%s", w, dump)
		}
	}
}

func TestReloadGuard(t *testing.T) {
	r := newRig(t, services(4, 1))
	before := r.k.Dump()
	r.write(services(1, 1))
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	if !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), "reload_guard") {
		t.Fatalf("reload deleting 3 of 4 services: %v, want the guard's refusal", err)
	}
	if after := r.k.Dump(); after != before {
		t.Errorf("a refused reload changed the kernel:\n%s\nwant\n%s", after, before)
	}
	out, err := r.a.Reload(context.Background(), ReloadOptions{Force: true})
	if err != nil {
		t.Fatalf("forced reload: %v", err)
	}
	if len(out.Applied) == 0 {
		t.Error("a forced reload applied nothing")
	}
	r.hasNot(t, "192.0.2.11:80", "192.0.2.13:80")
	r.has(t, "192.0.2.10:80")
}

func TestReloadInvalidKeepsServing(t *testing.T) {
	r := newRig(t, services(2, 1))
	before := r.k.Dump()
	r.write(services(2, 1) + "[[service]]\nname = \"bad\"\nvip = \"192.0.2.99\"\nport = 70000\n")
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	if !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), "vipd.toml:") {
		t.Fatalf("invalid file: %v, want a rejection naming the file", err)
	}
	if after := r.k.Dump(); after != before {
		t.Errorf("a rejected reload changed the kernel")
	}
}

func TestReloadRollback(t *testing.T) {
	r := newRig(t, services(2, 1))
	before := r.k.Dump()
	r.k.FailWith(func(call string) error {
		if call == "add-service tcp 192.0.2.12:80" {
			return errors.New("injected")
		}
		return nil
	})
	r.write(services(3, 2))
	out, err := r.a.Reload(context.Background(), ReloadOptions{})
	if err == nil || !strings.Contains(err.Error(), "rolled back to the last good configuration") {
		t.Fatalf("reload with a failing operation: %v, want a rollback", err)
	}
	if len(out.Failed) == 0 {
		t.Error("the outcome lists no failed operation")
	}
	if after := r.k.Dump(); after != before {
		t.Errorf("after the rollback the kernel is\n%s\nwant\n%s", after, before)
	}
	// The running configuration is still the old one: a failure it
	// does not have is not blamed on the next reload of the same file.
	r.k.FailWith(nil)
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatalf("the same reload without the failure: %v", err)
	}
	r.has(t, "192.0.2.12:80")
}

func TestReloadContinue(t *testing.T) {
	r := newRig(t, "")
	r.write(services(2, 1))
	// on_apply_error = "continue" keeps the new configuration.
	text, _ := os.ReadFile(r.path)
	text = bytes.Replace(text, []byte("[daemon]\n"), []byte("[daemon]\non_apply_error = \"continue\"\n"), 1)
	os.WriteFile(r.path, text, 0o644)
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	r.k.FailWith(func(call string) error {
		if call == "add-service tcp 192.0.2.12:80" {
			return errors.New("injected")
		}
		return nil
	})
	os.WriteFile(r.path, append(text, services(3, 1)[len(services(2, 1)):]...), 0o644)
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	if err == nil || !strings.Contains(err.Error(), "kept the new configuration") {
		t.Fatalf("reload: %v, want the new configuration kept", err)
	}
	// The failure belongs to the running configuration now: reloading
	// the same file again is not a new failure.
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatalf("reload of the same file: %v", err)
	}
}

func TestReloadDeltaPass(t *testing.T) {
	r := newRig(t, services(20, 1))
	r.k.Reads()
	r.write(services(20, 1) + "")
	text, _ := os.ReadFile(r.path)
	text = bytes.Replace(text, []byte(`"10.0.7.1", weight = 1`), []byte(`"10.0.7.1", weight = 3`), 1)
	os.WriteFile(r.path, text, 0o644)
	out, err := r.a.Reload(context.Background(), ReloadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Applied) != 1 || !strings.Contains(out.Applied[0].String(), "10.0.7.1:80") {
		t.Errorf("applied %v, want the one weight", out.Applied)
	}
	// A weight is planned from the running configuration's state of the
	// service: nothing is read.
	if reads := r.k.Reads(); len(reads) != 0 {
		t.Errorf("a weight change read %v, want nothing", reads)
	}
	// A backend added is planned from the kernel's state of its service.
	text = bytes.Replace(text, []byte(`"10.0.7.1", weight = 3 }`), []byte(`"10.0.7.1", weight = 3 }, { address = "10.0.7.3" }`), 1)
	os.WriteFile(r.path, text, 0o644)
	if out, err = r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(out.Applied) != 1 || !strings.Contains(out.Applied[0].String(), "10.0.7.3:80") {
		t.Errorf("applied %v, want the new backend", out.Applied)
	}
	reads := r.k.Reads()
	if len(reads) != 1 || reads[0] != "service tcp 192.0.2.17:80" {
		t.Errorf("a one-service change read %v, want that service alone", reads)
	}
	// A forced reload reads the whole table.
	if _, err := r.a.Reload(context.Background(), ReloadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if reads := r.k.Reads(); !strings.Contains(strings.Join(reads, ","), "services") {
		t.Errorf("a forced reload read %v, want the whole table", reads)
	}
}

func TestDrainUndrain(t *testing.T) {
	r := newRig(t, services(2, 1))
	ctx := context.Background()
	b := netip.MustParseAddrPort("10.0.1.2:80")
	if _, err := r.a.Drain(ctx, DrainOptions{Service: "nope", Backend: b}); err == nil || !strings.Contains(err.Error(), `no service "nope"`) {
		t.Errorf("drain of an unknown service: %v", err)
	}
	if _, err := r.a.Drain(ctx, DrainOptions{Service: "s1", Backend: netip.MustParseAddrPort("10.9.9.9:80")}); err == nil || !strings.Contains(err.Error(), "no backend") {
		t.Errorf("drain of an unknown backend: %v", err)
	}
	out, err := r.a.Drain(ctx, DrainOptions{Service: "s1", Backend: b})
	if err != nil || len(out.Applied) != 1 {
		t.Fatalf("drain: %v %v", out.Applied, err)
	}
	r.has(t, "10.0.1.2:80 masq weight=0")
	// A reload keeps the drain.
	if _, err := r.a.Reload(ctx, ReloadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "10.0.1.2:80 masq weight=0")
	data, err := os.ReadFile(filepath.Join(r.dir, "state", "drained.json"))
	if err != nil || !strings.Contains(string(data), `"10.0.1.2:80"`) {
		t.Errorf("stored drains: %s %v", data, err)
	}
	if _, err := r.a.Undrain(ctx, DrainOptions{Service: "s1", Backend: b}); err != nil {
		t.Fatal(err)
	}
	r.has(t, "10.0.1.2:80 masq weight=1")
	if _, err := r.a.Undrain(ctx, DrainOptions{Service: "s1", Backend: b}); err == nil || !strings.Contains(err.Error(), "is not drained") {
		t.Errorf("undrain twice: %v", err)
	}
}

func TestPlanChangesNothing(t *testing.T) {
	r := newRig(t, services(2, 1))
	r.write(services(3, 1))
	before := r.k.Dump()
	ops, err := r.a.Plan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, op := range ops {
		got = append(got, op.String())
	}
	if !strings.Contains(strings.Join(got, "\n"), "192.0.2.12") {
		t.Errorf("plan %v has nothing for the new service", got)
	}
	if r.k.Dump() != before {
		t.Error("plan changed the kernel")
	}
}

func TestRequestsAfterStop(t *testing.T) {
	r := newRig(t, services(1, 1))
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatalf("run: %v", err)
	}
	r.done <- nil // for the cleanup
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); !errors.Is(err, ErrStopped) {
		t.Errorf("reload after stop: %v, want ErrStopped", err)
	}
}

func TestRestartAdoptsHealth(t *testing.T) {
	port := acceptor(t)
	checked := fmt.Sprintf(`[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
check = { type = "tcp", address = "127.0.0.1", port = %d, interval = "1h", rise = 1, fall = 1 }
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2" }]
`, port)
	r := newRig(t, checked)
	r.waitFor(t, []string{"10.0.0.1:80 masq weight=1", "10.0.0.2:80 masq weight=1"}, nil)
	r.stop()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	r.done <- nil
	r.k.Calls()
	// The restarted agent has not probed yet: the backends it finds
	// serving count as up, and nothing changes.
	r2 := r.restart(t)
	for _, c := range r.k.Calls() {
		if strings.HasPrefix(c, "update-dest") || strings.HasPrefix(c, "delete-dest") {
			t.Errorf("the restart changed a backend: %s\n%s", c, r2.log)
		}
	}
	r2.has(t, "10.0.0.1:80 masq weight=1", "10.0.0.2:80 masq weight=1")
}

// acceptor listens on a port of 127.0.0.1 that accepts and closes every
// connection until the test ends, and returns the port.
func acceptor(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor waits until the kernel dump has every one of want, and none
// of unwanted.
func (r *rig) waitFor(t *testing.T, want, unwanted []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := r.k.Dump()
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(d, w)
		}
		for _, u := range unwanted {
			ok = ok && !strings.Contains(d, u)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kernel never had %q without %q:\n%s\n%s", want, unwanted, d, r.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReloadSequence runs reloads of one-service edits, some rolled
// back, and checks after each that the running configuration is what a
// fresh parse of the file it kept gives: reloads build the next
// configuration in the memory of one no longer used (config.Spare), and
// none may leak into another.
func TestReloadSequence(t *testing.T) {
	weights := map[int]int{}
	text := func(w map[int]int) string {
		var b strings.Builder
		for i := range 20 {
			fmt.Fprintf(&b, "[[service]]\nname = \"s%d\"\nvip = \"192.0.2.%d\"\nport = 80\nbackend = [{ address = \"10.0.%d.1\", weight = %d }]\n", i, 10+i, i, max(w[i], 1))
		}
		return b.String()
	}
	r := newRig(t, text(weights))
	rng := rand.New(rand.NewPCG(1, 2))
	kept := text(weights)
	for step := range 60 {
		next := maps.Clone(weights)
		next[rng.IntN(20)] = 1 + rng.IntN(9)
		fail := step%7 == 3
		r.k.FailWith(func(call string) error {
			if fail && strings.HasPrefix(call, "update-dest") {
				return errors.New("injected")
			}
			return nil
		})
		// As the watcher hands a changed file over.
		r.write(text(next))
		data, rerr := os.ReadFile(r.path)
		if rerr != nil {
			t.Fatal(rerr)
		}
		var err error
		if step%2 == 0 {
			r.a.do(context.Background(), func(ctx context.Context) {
				_, err = r.a.reload(ctx, fileRead{why: "file changed", file: r.path, data: data}, false)
			})
		} else {
			// vipd reload and SIGHUP read every file again, and build
			// in the spare too.
			var spare *lb.VirtualService
			r.a.do(context.Background(), func(context.Context) {
				if c := r.a.spare.Config; c != nil {
					spare = &c.Spec.Services[0]
				}
			})
			_, err = r.a.Reload(context.Background(), ReloadOptions{})
			var now *lb.VirtualService
			r.a.do(context.Background(), func(context.Context) { now = &r.a.cfg.Spec.Services[0] })
			if err == nil && spare != nil && !maps.Equal(next, weights) && now != spare {
				t.Errorf("step %d: vipd reload did not build in the spare", step)
			}
		}
		switch {
		case fail && maps.Equal(next, weights):
		case fail && (err == nil || !strings.Contains(err.Error(), "rolled back")):
			t.Fatalf("step %d: %v, want a rollback", step, err)
		case !fail && err != nil:
			t.Fatalf("step %d: %v", step, err)
		case !fail:
			weights, kept = next, text(next)
		}
		want, err := config.Parse(r.path, []byte(header+fmt.Sprintf("state_dir = %q\ncontrol_socket = %q\n", filepath.Join(r.dir, "state"), filepath.Join(r.dir, "vipd.sock"))+kept))
		if err != nil {
			t.Fatal(err)
		}
		var got []lb.VirtualService
		r.a.do(context.Background(), func(context.Context) { got = slices.Clone(r.a.cfg.Spec.Services) })
		if !reflect.DeepEqual(got, want.Spec.Services) {
			t.Fatalf("step %d: the running configuration's services are not the file's", step)
		}
	}
	r.k.FailWith(nil)
	if r.a.spare.Config == nil {
		t.Error("no spare after the last reload")
	}
}
