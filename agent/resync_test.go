package agent

import (
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

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// slowRules is the fake kernel's rules, whose reads block, once armed,
// until released: a resync's read of iptables-save that takes seconds,
// as in a loaded emulated guest.
type slowRules struct {
	lb.RuleTables
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *slowRules) Observe() (lb.Rules, error) {
	if s.armed.Load() {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		<-s.release
	}
	return s.RuleTables.Observe()
}

func (s *slowRules) unblock() { s.once.Do(func() { close(s.release) }) }

// TestVerdictDuringSlowResync shows that a health verdict lands while a
// resync reads the rules, however long that read takes: the loop goes on
// with verdicts meanwhile, and the resync's pass follows the read.
func TestVerdictDuringSlowResync(t *testing.T) {
	up := acceptor(t)
	// The second backend's check probes a listener the test closes.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	down := l.Addr().(*net.TCPAddr).Port

	dir := t.TempDir()
	k := lbtest.New()
	rules := &slowRules{RuleTables: k, entered: make(chan struct{}, 1), release: make(chan struct{})}
	r := &rig{t: t, dir: dir, path: filepath.Join(dir, "vipd.toml"), k: k, log: &logBuffer{}, done: make(chan error, 1)}
	r.options = func(o *Options) {
		// The resync's pass that changes nothing logs at debug.
		o.Logger = slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.OpenKernel = func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
			kk := k.Interface()
			kk.Rules = rules
			return kk, func() {}, nil
		}
	}
	text := fmt.Sprintf(`[daemon]
watch = false
resync_interval = "1s"
metrics_listen = ""
state_dir = %q
control_socket = %q

[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
backend = [
  { address = "10.0.0.1", check = { type = "tcp", address = "127.0.0.1", port = %d, interval = "50ms", rise = 1, fall = 1 } },
  { address = "10.0.0.2", check = { type = "tcp", address = "127.0.0.1", port = %d, interval = "50ms", rise = 1, fall = 1 } },
]
`, filepath.Join(dir, "state"), filepath.Join(dir, "vipd.sock"), up, down)
	if err := os.WriteFile(r.path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	r.start()
	// Registered after start's, so it runs first: the agent's end waits
	// for the read.
	t.Cleanup(rules.unblock)
	r.waitFor(t, []string{"10.0.0.1:80 masq weight=1", "10.0.0.2:80 masq weight=1"}, nil)

	rules.armed.Store(true)
	select {
	case <-rules.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no resync read the rules\n%s", r.log)
	}
	// The resync's read is blocked until released; the backend fails
	// its check meanwhile, and must leave at once.
	l.Close()
	r.waitFor(t, []string{"10.0.0.1:80 masq weight=1"}, []string{"10.0.0.2:80 masq weight=1"})
	select {
	case <-rules.release:
		t.Fatal("the read was released before the verdict landed")
	default:
	}

	// Released, the read is used, and the resync's pass runs: it finds
	// nothing to change.
	rules.armed.Store(false)
	rules.unblock()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.log.String(), "why=resync") {
		if time.Now().After(deadline) {
			t.Fatalf("no resync pass after the read\n%s", r.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.has(t, "10.0.0.1:80 masq weight=1")
	r.hasNot(t, "10.0.0.2:80 masq weight=1")
}
