package process

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/source"
)

// The fake child: the test binary, started with fakeEnv set to a mode.
const (
	fakeEnv    = "VIPD_PROCESS_FAKE"
	fakeDirEnv = "VIPD_PROCESS_FAKE_DIR"
)

// daemonEnv makes the test binary a daemon that runs a Source of the
// fake child "hang", with the fake's directory.
const daemonEnv = "VIPD_PROCESS_DAEMON"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeChild(mode, os.Getenv(fakeDirEnv)))
	}
	if dir := os.Getenv(daemonEnv); dir != "" {
		exe, _ := os.Executable()
		s, err := New(SourceOptions{Program: exe, Env: []string{fakeEnv + "=hang", fakeDirEnv + "=" + dir, daemonEnv + "="}})
		if err != nil {
			os.Exit(2)
		}
		s.Run(context.Background(), newFakeSink())
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// fakeService is what the fake provider publishes.
var fakeService = lb.VirtualService{Name: "k8s/default/web/80/tcp", VIP: netip.MustParseAddr("192.0.2.200"),
	Service:  lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.200"), Port: 80}, Scheduler: "wrr"},
	Backends: []lb.Destination{{Addr: netip.MustParseAddrPort("10.1.0.5:31000"), Weight: 1, Forward: lb.Masq}}}

// fakeProvider publishes fakeService, reports the conflicts it gets
// back, and reports the pools it is handed.
type fakeProvider struct {
	mode, dir string
	start     int
	log       *slog.Logger
	sink      chan source.Sink
}

func (p *fakeProvider) Run(ctx context.Context, sink source.Sink) error {
	p.sink <- sink
	vs := fakeService
	if p.mode == "badname" {
		vs.Name = "web"
	}
	conflicts, err := sink.Publish(ctx, source.Snapshot{Services: []lb.VirtualService{vs}})
	if err != nil {
		return nil
	}
	var names []string
	for _, c := range conflicts {
		names = append(names, c.Service+" owned by "+c.Owner)
	}
	sink.Report(fmt.Errorf("conflicts: %s", strings.Join(names, ", ")))
	if p.mode == "crash" {
		os.Exit(3)
	}
	<-ctx.Done()
	return nil
}

func (p *fakeProvider) SetPools(pools []Pool) error {
	if p.mode == "diepools" && p.start == 1 {
		os.Exit(4)
	}
	if pools[0].Name == "refused" {
		return errors.New("pool \"refused\": no")
	}
	sink := <-p.sink
	p.sink <- sink
	sink.Report(fmt.Errorf("pools %s", pools[0].Name))
	return nil
}

func (p *fakeProvider) Counts() []PoolCount {
	return []PoolCount{{Pool: "p", Family: "ipv4", Total: 8, InUse: 1, Free: 7}}
}

// fakeChild runs as the child in mode, with dir for its traces.
func fakeChild(mode, dir string) int {
	n := 1
	if b, err := os.ReadFile(filepath.Join(dir, "starts")); err == nil {
		n, _ = strconv.Atoi(string(b))
		n++
	}
	os.WriteFile(filepath.Join(dir, "starts"), []byte(strconv.Itoa(n)), 0o600)
	os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	conn := os.NewFile(3, "parent")
	raw := func(data []byte) int {
		c := NewConn(conn, conn, 0)
		c.Write(hello())
		c.Read()
		c.Read()
		conn.Write(data)
		time.Sleep(time.Minute)
		return 0
	}
	switch mode {
	case "oversized":
		return raw(binaryLen(DefaultMaxFrame + 1))
	case "garbage":
		return raw(rawFrame("{nonsense"))
	case "unknown":
		return raw(rawFrame(`{"type":"bogus"}`))
	case "fromparent":
		return raw(rawFrame(`{"type":"options","options":{}}`))
	case "badpong":
		return raw(rawFrame(`{"type":"pong","pong":{"seq":99}}`))
	case "badhello":
		NewConn(conn, conn, 0).Write(&Message{Type: TypeHello, Hello: &Hello{Version: 99, Schema: Schema()}})
		time.Sleep(time.Minute)
		return 0
	case "hang":
		signal.Ignore(syscall.SIGTERM)
		c := NewConn(conn, conn, 0)
		c.Write(hello())
		c.Read()
		c.Read()
		time.Sleep(time.Minute)
		return 0
	}
	if v, ok := os.LookupEnv("NOTIFY_SOCKET"); ok {
		fmt.Fprintln(os.Stderr, "NOTIFY_SOCKET="+v)
	}
	fmt.Fprintln(os.Stderr, "a line that is not JSON")
	fmt.Fprintln(os.Stderr, strings.Repeat("y", 10000))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := Serve(ctx, ServeOptions{Conn: conn, Log: os.Stderr, Open: func(o Options, log *slog.Logger) (Provider, error) {
		if mode == "fatal" {
			return nil, errors.New("kubeconfig /nonexistent: no such file")
		}
		log.Info("fake provider started", "pools", o.Pools[0].Name, "start", n)
		return &fakeProvider{mode: mode, dir: dir, start: n, log: log, sink: make(chan source.Sink, 1)}, nil
	}})
	os.WriteFile(filepath.Join(dir, "stopped"), []byte(fmt.Sprint(err)), 0o600)
	if err != nil {
		return 1
	}
	return 0
}

// binaryLen returns a frame header of n bytes.
func binaryLen(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// fakeSink records what the source hands the agent.
type fakeSink struct {
	conflicts []source.Conflict
	pubs      chan source.Snapshot
	reports   chan error
}

func newFakeSink() *fakeSink {
	return &fakeSink{pubs: make(chan source.Snapshot, 100), reports: make(chan error, 100),
		conflicts: []source.Conflict{{Service: fakeService.Name, Owner: "file", OwnerService: "web"}}}
}

func (s *fakeSink) Publish(ctx context.Context, snap source.Snapshot) ([]source.Conflict, error) {
	s.pubs <- snap
	return s.conflicts, nil
}

func (s *fakeSink) Report(err error) { s.reports <- err }

// syncBuffer is a log's buffer, safe for the child's logger goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// running is a Source running a fake child.
type running struct {
	t      *testing.T
	s      *Source
	sink   *fakeSink
	log    *syncBuffer
	dir    string
	cancel context.CancelFunc
	done   chan error
}

// start runs a source whose child is the fake in mode.
func start(t *testing.T, mode string, tweak func(*SourceOptions)) *running {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log := &syncBuffer{}
	opts := SourceOptions{Program: exe, Env: []string{fakeEnv + "=" + mode, fakeDirEnv + "=" + dir},
		Options:    Options{Pools: []Pool{{Name: "first", Addresses: []string{"192.0.2.200/29"}}}, LogLevel: int(slog.LevelDebug)},
		Logger:     slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		NamePrefix: "k8s/", Backoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, StopGrace: 200 * time.Millisecond, MaxLine: 300}
	if tweak != nil {
		tweak(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, s: s, sink: newFakeSink(), log: log, dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx, r.sink) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return r
}

// publish waits for a snapshot.
func (r *running) publish() source.Snapshot {
	r.t.Helper()
	select {
	case snap := <-r.sink.pubs:
		return snap
	case <-time.After(10 * time.Second):
		r.t.Fatalf("no publish; log:\n%s", r.log.String())
	}
	return source.Snapshot{}
}

// logged waits for the log to hold want: the child's log comes on its
// standard error, apart from its messages, and the daemon logs a
// failure after it reports it.
func (r *running) logged(want string) bool {
	r.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(r.log.String(), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// report waits for a report that contains want ("" for nil).
func (r *running) report(want string) error {
	r.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-r.sink.reports:
			if want == "" && err == nil || want != "" && err != nil && strings.Contains(err.Error(), want) {
				return err
			}
		case <-deadline:
			r.t.Fatalf("no report with %q; log:\n%s", want, r.log.String())
		}
	}
}

// starts returns how many times the fake child started.
func (r *running) starts() int {
	b, _ := os.ReadFile(filepath.Join(r.dir, "starts"))
	n, _ := strconv.Atoi(string(b))
	return n
}

// stop ends the source's context and returns Run's error.
func (r *running) stop() error {
	r.t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(10 * time.Second):
		r.t.Fatal("Run did not return after its context ended")
	}
	return nil
}

// TestPublishConflictsReport: the child's snapshot reaches the sink
// whole, the sink's conflicts reach the child (which reports them), the
// pools' counts come with the snapshot, and the child's log records are
// logged at their level with their attributes; other output is logged
// as warnings, bounded.
func TestPublishConflictsReport(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	r := start(t, "serve", nil)
	snap := r.publish()
	if len(snap.Services) != 1 || snap.Services[0].Name != fakeService.Name || snap.Services[0].Backends[0] != fakeService.Backends[0] {
		t.Errorf("published %+v", snap)
	}
	r.report("conflicts: k8s/default/web/80/tcp owned by file")
	var counts []string
	r.s.EachPool(func(pool, family string, total, inUse, free float64) {
		counts = append(counts, fmt.Sprintf("%s %s %v %v %v", pool, family, total, inUse, free))
	})
	if strings.Join(counts, ";") != "p ipv4 8 1 7" {
		t.Errorf("EachPool: %q", counts)
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run = %v after its context ended", err)
	}
	log := r.log.String()
	for _, want := range []string{`level=INFO msg="fake provider started" pools=first start=1`,
		`level=WARN msg="provider output" line="a line that is not JSON"`,
		`level=WARN msg="provider output" line=` + strings.Repeat("y", 300) + ` truncated=true`,
		`msg="the provider process started"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log has no %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "NOTIFY_SOCKET") {
		t.Errorf("the child got the daemon's NOTIFY_SOCKET:\n%s", log)
	}
	if strings.Contains(log, strings.Repeat("y", 301)) {
		t.Errorf("a line longer than MaxLine was logged whole")
	}
	// The child stopped in order: its Serve returned nil on the
	// socket's end, not killed.
	if b, err := os.ReadFile(filepath.Join(r.dir, "stopped")); err != nil || string(b) != "<nil>" {
		t.Errorf("the child did not stop in order: %q, %v", b, err)
	}
}

// TestReloadPools: pools reach the running child, a refusal is logged,
// and a child started again gets the last pools a child took.
func TestReloadPools(t *testing.T) {
	r := start(t, "serve", nil)
	r.publish()
	r.report("conflicts")
	pools := func(name string) config.Kubernetes {
		return config.Kubernetes{Pools: []config.KubernetesPool{{Name: name, Addresses: []string{"192.0.2.0/29"}, AutoAssign: true}}}
	}
	if err := r.s.ReloadPools(config.Kubernetes{}); err == nil {
		t.Error("ReloadPools took no pools")
	}
	if err := r.s.ReloadPools(pools("second")); err != nil {
		t.Fatal(err)
	}
	r.report("pools second")
	if err := r.s.ReloadPools(pools("refused")); err != nil {
		t.Fatal(err)
	}
	if !r.logged(`msg="the new pools are not applied" err="pool \"refused\": no"`) {
		t.Fatalf("the refusal is not logged:\n%s", r.log.String())
	}
	// A new child gets "second": kill this one.
	pid, err := os.ReadFile(filepath.Join(r.dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(string(pid))
	syscall.Kill(n, syscall.SIGKILL)
	r.report("signal: killed")
	r.publish()
	if !r.logged(`msg="fake provider started" pools=second start=2`) {
		t.Errorf("the second child did not start with the pools the first took:\n%s", r.log.String())
	}
}

// TestReloadPoolsLost: pools sent to a child that dies before it
// answers go to the next child.
func TestReloadPoolsLost(t *testing.T) {
	r := start(t, "diepools", nil)
	r.publish()
	r.report("conflicts")
	k := config.Kubernetes{Pools: []config.KubernetesPool{{Name: "second", Addresses: []string{"192.0.2.0/29"}, AutoAssign: true}}}
	if err := r.s.ReloadPools(k); err != nil {
		t.Fatal(err)
	}
	r.report("exit status 4")
	r.report("pools second")
	if n := r.starts(); n != 2 {
		t.Errorf("started %d times", n)
	}
}

// TestCrashRestarts: a child that dies is reported, with its exit
// status, and started again after the backoff; the agent keeps the
// last snapshot (the source publishes nothing empty in between).
func TestCrashRestarts(t *testing.T) {
	r := start(t, "crash", nil)
	for range 3 {
		if snap := r.publish(); len(snap.Services) != 1 {
			t.Errorf("published %+v", snap)
		}
		r.report("exit status 3")
	}
	if n := r.starts(); n < 3 {
		t.Errorf("started %d times", n)
	}
	if !r.logged("restarting in 50ms") {
		t.Errorf("the backoff did not grow to its bound:\n%s", r.log.String())
	}
}

// TestRefusedChild: what a child sends wrong ends it, with a report
// that says what, and it starts again.
func TestRefusedChild(t *testing.T) {
	for _, tt := range []struct{ mode, want string }{
		{"oversized", "frame too big"},
		{"garbage", "decode a frame"},
		{"unknown", `unknown message type "bogus"`},
		{"fromparent", "it sent a options message"},
		{"badpong", "it answered ping 99, which was not sent"},
		{"badhello", "wire version 99, want 1"},
		{"badname", `refused its publish: service "web": the name does not begin with "k8s/"`},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			r := start(t, tt.mode, nil)
			r.report(tt.want)
			r.report(tt.want)
			if n := r.starts(); n < 2 {
				t.Errorf("started %d times", n)
			}
		})
	}
}

// TestFatal: a child whose source cannot start stops Run with its
// error.
func TestFatal(t *testing.T) {
	r := start(t, "fatal", nil)
	select {
	case err := <-r.done:
		r.done <- err
		if err == nil || err.Error() != "kubernetes: kubeconfig /nonexistent: no such file" {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

// TestStopKills: a child that ignores the end of its socket and SIGTERM
// is killed after the grace, and waited for, when the context ends.
func TestStopKills(t *testing.T) {
	r := start(t, "hang", nil)
	if !r.logged("the provider process started") {
		t.Fatalf("the child did not start:\n%s", r.log.String())
	}
	b, err := os.ReadFile(filepath.Join(r.dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	begin := time.Now()
	if err := r.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	if took := time.Since(begin); took < 200*time.Millisecond {
		t.Errorf("Run returned in %s, before the grace", took)
	}
	// Waited for: no process, not even a zombie, has its pid.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child %d is still there: kill 0 = %v", pid, err)
	}
}

// TestMissingProgram: New refuses a program that is not there, or not
// executable.
func TestMissingProgram(t *testing.T) {
	if _, err := New(SourceOptions{Program: "/nonexistent/vipd-kubernetes"}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing program: %v", err)
	}
	f := filepath.Join(t.TempDir(), "vipd-kubernetes")
	os.WriteFile(f, nil, 0o644)
	if _, err := New(SourceOptions{Program: f}); err == nil || !strings.Contains(err.Error(), "is not an executable file") {
		t.Errorf("a file that is not executable: %v", err)
	}
}

// TestParentDeath: the child dies with the daemon, even one that
// ignores SIGTERM and the end of its socket (PR_SET_PDEATHSIG).
func TestParentDeath(t *testing.T) {
	dir := t.TempDir()
	daemon := exec.Command(os.Args[0])
	daemon.Env = append(os.Environ(), daemonEnv+"="+dir)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer daemon.Process.Kill()
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the daemon's child did not start")
		}
		time.Sleep(10 * time.Millisecond)
		b, _ := os.ReadFile(filepath.Join(dir, "pid"))
		pid, _ = strconv.Atoi(string(b))
	}
	if !alive(pid) {
		t.Fatalf("the child %d is not running", pid)
	}
	daemon.Process.Kill()
	daemon.Wait()
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the child %d outlived its daemon", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid is a process that has not exited (neither
// gone nor a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// TestHungChildRestarts: a child that answers no ping (it neither reads
// nor writes its socket) is reported, killed and started again; one that
// answers runs on.
func TestHungChildRestarts(t *testing.T) {
	fast := func(o *SourceOptions) { o.PingInterval = 20 * time.Millisecond }
	r := start(t, "hang", fast)
	r.report("answered no ping for 3 intervals of 20ms: taken for hung")
	r.report("answered no ping")
	if n := r.starts(); n < 2 {
		t.Errorf("started %d times", n)
	}

	// Pings every 100 ms: an answer would have to come 300 ms late, on
	// a loaded machine, to be missed three times in a row.
	r = start(t, "serve", func(o *SourceOptions) { o.PingInterval = 100 * time.Millisecond })
	r.publish()
	r.report("conflicts: ")
	time.Sleep(5 * 100 * time.Millisecond)
	select {
	case err := <-r.sink.reports:
		t.Errorf("reported %v", err)
	default:
	}
	if n := r.starts(); n != 1 {
		t.Errorf("an answering child started %d times:\n%s", n, r.log.String())
	}
}
