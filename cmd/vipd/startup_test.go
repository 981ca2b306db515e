package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/systemd"
)

// instance is one runDaemon of a start-up test. Several may share a
// configuration, a state directory, a fake kernel and a kernel lock, as
// two vipd processes on one host do.
type instance struct {
	t      *testing.T
	name   string
	log    *syncBuffer
	notes  chan string
	done   chan error
	cancel context.CancelFunc
	// opened counts the calls of OpenKernel.
	opened atomic.Int32
	err    error
	ended  bool
}

// launchOptions say how an instance starts.
type launchOptions struct {
	path       string // configuration file
	kernelLock string
	// kernel wraps the fake's adapters, to inject failures.
	kernel func(lb.Kernel) lb.Kernel
}

// launch starts runDaemon on the fake kernel k.
func launch(t *testing.T, name string, k *lbtest.Kernel, o launchOptions) *instance {
	t.Helper()
	in := &instance{t: t, name: name, log: &syncBuffer{}, notes: make(chan string, 1024), done: make(chan error, 1)}
	// A short directory: a unix socket's path is limited to 108 bytes.
	dir, err := os.MkdirTemp("", "vipd-notify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ns, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "n"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ns.Read(buf)
			if err != nil {
				return
			}
			in.notes <- string(buf[:n])
		}
	}()
	t.Setenv("NOTIFY_SOCKET", filepath.Join(dir, "n"))
	notifier := systemd.FromEnv()
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() {
		in.done <- runDaemon(ctx, daemonOptions{
			Path:     o.path,
			Logger:   slog.New(slog.NewTextHandler(in.log, nil)),
			Notifier: notifier,
			OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
				in.opened.Add(1)
				kk := k.Interface()
				if o.kernel != nil {
					kk = o.kernel(kk)
				}
				return kk, func() {}, nil
			},
			KernelRelease: "6.1.0-27-cloud-amd64",
			KernelLock:    o.kernelLock,
			StartRetry:    10 * time.Millisecond,
		})
	}()
	t.Cleanup(func() {
		in.stop()
		ns.Close()
	})
	return in
}

// wait waits for the instance to be ready (nil) or to end (its error).
func (in *instance) wait() (ready bool, err error) {
	in.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case msg := <-in.notes:
			if strings.HasPrefix(msg, "READY=1") {
				return true, nil
			}
		case err := <-in.done:
			in.ended, in.err = true, err
			// A READY sent just before the end still counts.
			for {
				select {
				case msg := <-in.notes:
					if strings.HasPrefix(msg, "READY=1") {
						in.t.Errorf("%s reported READY and then ended with %v", in.name, err)
					}
				default:
					return false, err
				}
			}
		case <-timeout:
			in.t.Fatalf("%s neither got ready nor ended\nlog:\n%s", in.name, in.log)
		}
	}
}

// mustFail expects the instance to end, without READY, with an error
// containing every want.
func (in *instance) mustFail(wants ...string) error {
	in.t.Helper()
	ready, err := in.wait()
	if ready || err == nil {
		in.t.Fatalf("%s: ready=%v err=%v, want a failed start\nlog:\n%s", in.name, ready, err, in.log)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			in.t.Errorf("%s's error lacks %q:\n%v", in.name, w, err)
		}
	}
	if n := in.opened.Load(); n != 0 {
		in.t.Errorf("%s opened the kernel %d times before failing", in.name, n)
	}
	return err
}

// mustRun expects the instance to report READY.
func (in *instance) mustRun() {
	in.t.Helper()
	if ready, err := in.wait(); !ready {
		in.t.Fatalf("%s did not get ready: %v\nlog:\n%s", in.name, err, in.log)
	}
}

// stop ends a running instance and waits for it.
func (in *instance) stop() {
	in.cancel()
	if in.ended {
		return
	}
	select {
	case in.err = <-in.done:
		in.ended = true
	case <-time.After(5 * time.Second):
		in.t.Errorf("%s did not stop\nlog:\n%s", in.name, in.log)
	}
}

// daemonDir writes a configuration with its own state directory and
// control socket into a new directory under root and returns its path.
func daemonDir(t *testing.T, root, name, services string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vipd.toml")
	body := fmt.Sprintf("[daemon]\ncontrol_socket = %q\nstate_dir = %q\nmetrics_listen = \"\"\n%s",
		filepath.Join(dir, "vipd.sock"), filepath.Join(dir, "state"), services)
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const otherService = `
[[service]]
name = "other"
vip = "192.0.2.20"
port = 80
backend = [{ address = "10.0.1.1" }]
`

// TestSecondDaemonRefused: while a vipd runs, a second one on the same
// state directory, or on the same kernel with another state directory,
// fails before it touches anything: the kernel sees no call, the first
// one's control socket still answers, and its error names the lock file
// and the first one's pid. Each pair is started in both orders. Once the
// first one ends, the second starts.
func TestSecondDaemonRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other string // the second one's directory; "" shares the first's
		lock  string // the lock the second is refused
	}{
		{"same state_dir", "", "state/vipd.lock"},
		{"same kernel", "b", "kernel.lock"},
	} {
		for _, order := range []string{"a first", "b first"} {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				root := t.TempDir()
				paths := map[string]string{"a": daemonDir(t, root, "a", twoServices)}
				paths["b"] = paths["a"]
				if tc.other != "" {
					paths["b"] = daemonDir(t, root, "b", otherService)
				}
				first, second := "a", "b"
				if order == "b first" {
					first, second = "b", "a"
				}
				k := lbtest.New()
				lock := filepath.Join(root, "kernel.lock")
				one := launch(t, first, k, launchOptions{path: paths[first], kernelLock: lock})
				one.mustRun()
				before := k.Dump()
				k.Calls()
				sock := filepath.Join(filepath.Dir(paths[first]), "vipd.sock")

				two := launch(t, second, k, launchOptions{path: paths[second], kernelLock: lock})
				held := lock
				if tc.other == "" {
					held = filepath.Join(root, "a", tc.lock)
				}
				two.mustFail(fmt.Sprintf("another vipd (pid %d) holds %s", os.Getpid(), held), "changed nothing")
				if calls := k.Calls(); len(calls) != 0 {
					t.Errorf("the refused vipd made kernel calls %v", calls)
				}
				if after := k.Dump(); after != before {
					t.Errorf("kernel changed:\n%s\nwant\n%s", after, before)
				}
				if rep, err := control.Call(sock, "GET", "/v1/status"); err != nil || rep.Status == nil {
					t.Errorf("the first vipd's control socket: %+v, %v", rep, err)
				}
				if strings.Contains(two.log.String(), "msg=starting") {
					t.Errorf("the refused vipd started:\n%s", two.log)
				}

				one.stop()
				if one.err != nil {
					t.Fatalf("the first vipd ended with %v", one.err)
				}
				again := launch(t, second, k, launchOptions{path: paths[second], kernelLock: lock})
				again.mustRun()
			})
		}
	}
}

// TestSimultaneousStart: two vipds started at the same moment on one
// state directory and kernel: exactly one runs, the other fails having
// opened nothing, and the kernel holds the configuration once.
func TestSimultaneousStart(t *testing.T) {
	for i := range 20 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			root := t.TempDir()
			path := daemonDir(t, root, "a", twoServices)
			k := lbtest.New()
			lock := filepath.Join(root, "kernel.lock")
			var (
				ins   [2]*instance
				wg    sync.WaitGroup
				ready [2]bool
				errs  [2]error
			)
			for j := range ins {
				ins[j] = launch(t, fmt.Sprintf("vipd %d", j), k, launchOptions{path: path, kernelLock: lock})
			}
			for j := range ins {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ready[j], errs[j] = ins[j].wait()
				}()
			}
			wg.Wait()
			if ready[0] == ready[1] {
				t.Fatalf("ready: %v, errors: %v; want exactly one running", ready, errs)
			}
			loser := 0
			if ready[0] {
				loser = 1
			}
			if errs[loser] == nil || !strings.Contains(errs[loser].Error(), "holds "+filepath.Join(root, "a", "state", "vipd.lock")) {
				t.Errorf("the second vipd's error = %v", errs[loser])
			}
			if n := ins[loser].opened.Load(); n != 0 {
				t.Errorf("the refused vipd opened the kernel %d times", n)
			}
			adds := 0
			for _, c := range k.Calls() {
				if strings.HasPrefix(c, "add-service") {
					adds++
				}
			}
			if adds != 2 {
				t.Errorf("%d services added, want 2 (each once)", adds)
			}
		})
	}
}

// TestCorruptStateFile: an empty, truncated or garbage owned.json or
// drained.json ends the start before anything is touched, without READY,
// with an error that names the file, says what is wrong and gives the
// command that lets vipd start; the file is left as it was. Valid files,
// and the fix, start.
func TestCorruptStateFile(t *testing.T) {
	valid := map[string]string{
		"owned.json":   `{"version":1,"services":[{"family":4,"proto":"tcp","addr":"192.0.2.10","port":80}]}`,
		"drained.json": `[{"service":"web","backend":"10.0.0.2:80"}]`,
	}
	for _, file := range []string{"owned.json", "drained.json"} {
		for _, tc := range []struct{ name, text, why string }{
			{"empty", "", "the file is empty"},
			{"truncated", valid[file][:len(valid[file])/2], "unexpected end of JSON input"},
			{"garbage", "\x00\x13\x37garbage", "invalid character"},
			{"valid", valid[file], ""},
		} {
			t.Run(file+"/"+tc.name, func(t *testing.T) {
				root := t.TempDir()
				path := daemonDir(t, root, "a", twoServices)
				state := filepath.Join(root, "a", "state")
				if err := os.MkdirAll(state, 0o755); err != nil {
					t.Fatal(err)
				}
				bad := filepath.Join(state, file)
				if err := os.WriteFile(bad, []byte(tc.text), 0o600); err != nil {
					t.Fatal(err)
				}
				k := lbtest.New()
				in := launch(t, "vipd", k, launchOptions{path: path})
				if tc.why == "" {
					in.mustRun()
					if file == "drained.json" && !strings.Contains(k.Dump(), "10.0.0.2:80 masq weight=0") {
						t.Errorf("the stored drain was not applied:\n%s", k.Dump())
					}
					return
				}
				in.mustFail(bad+" is corrupt", tc.why, "vipd changed nothing", "mv "+bad+" "+bad+".corrupt")
				if calls := k.Calls(); len(calls) != 0 {
					t.Errorf("kernel calls %v", calls)
				}
				if data, _ := os.ReadFile(bad); string(data) != tc.text {
					t.Errorf("%s changed to %q", bad, data)
				}
				// The fix the error gives.
				if err := os.Rename(bad, bad+".corrupt"); err != nil {
					t.Fatal(err)
				}
				fixed := launch(t, "vipd after the fix", k, launchOptions{path: path})
				fixed.mustRun()
				if !strings.Contains(k.Dump(), "10.0.0.4:443") {
					t.Errorf("after the fix the kernel lacks the configuration:\n%s", k.Dump())
				}
			})
		}
	}
}

// failingLedger fails its first n loads, as a kernel that cannot be read
// does: the pass cannot observe and does nothing.
type failingLedger struct {
	lb.Ledger
	n atomic.Int32
}

func (f *failingLedger) Load() (map[lb.ServiceKey]struct{}, error) {
	if f.n.Add(-1) >= 0 {
		return nil, errors.New("netlink: dump interrupted")
	}
	return f.Ledger.Load()
}

// TestFirstPassCannotRead: a first pass that cannot read the kernel is
// tried again; if it never can, the start fails without READY.
func TestFirstPassCannotRead(t *testing.T) {
	for _, tc := range []struct {
		fails int32
		ready bool
	}{{2, true}, {3, false}} {
		t.Run(fmt.Sprint(tc.fails), func(t *testing.T) {
			path := daemonDir(t, t.TempDir(), "a", twoServices)
			k := lbtest.New()
			in := launch(t, "vipd", k, launchOptions{path: path, kernel: func(kk lb.Kernel) lb.Kernel {
				l := &failingLedger{Ledger: kk.Ledger}
				l.n.Store(tc.fails)
				kk.Ledger = l
				return kk
			}})
			if !tc.ready {
				ready, err := in.wait()
				if ready || err == nil || !strings.Contains(err.Error(), "cannot read the kernel (3 attempts)") || !strings.Contains(err.Error(), "dump interrupted") {
					t.Fatalf("ready=%v err=%v, want a failed start\nlog:\n%s", ready, err, in.log)
				}
				if len(k.Calls()) != 0 {
					t.Errorf("a start that could not read the kernel changed it:\n%s", k.Dump())
				}
				return
			}
			in.mustRun()
			if n := strings.Count(in.log.String(), "first pass cannot read the kernel; trying again"); n != 2 {
				t.Errorf("%d retries logged, want 2:\n%s", n, in.log)
			}
			if !strings.Contains(k.Dump(), "10.0.0.4:443") {
				t.Errorf("kernel lacks the configuration:\n%s", k.Dump())
			}
		})
	}
}
