//go:build healthbench

package healthbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// The benchmark's knobs (environment):
//
//	VIPD_HEALTHBENCH_SIZES    workloads, TCP/HTTP backends, comma-separated
//	                          (host: 10000/0,10000/2000; guest: 1000/0,400/0,200/40);
//	                          0/0 measures vipd's agent idle (keepalived is
//	                          skipped there)
//	VIPD_HEALTHBENCH_PEERS    checkers (host: vipd,vipd-halfopen; guest:
//	                          vipd,vipd-halfopen,keepalived); vipd-halfopen
//	                          is vipd with half_open TCP checks
//	VIPD_HEALTHBENCH_SIDES    apart (default) or one: see sides_test.go
//	VIPD_HEALTHBENCH_WINDOW   CPU window in seconds (default 20)
//	VIPD_HEALTHBENCH_SAMPLES  detection samples of TCP backends (default 20;
//	                          HTTP: half as many)
//	VIPD_HEALTHBENCH_OUT      file the tables also go to
//	VIPD_HEALTHBENCH_GOGC     GOGC for vipd in the guest (default: the
//	                          runtime's)
//	VIPD_HEALTHBENCH_NETNS=1  says the host run is in a private network
//	                          namespace (bench-health.sh runs it under
//	                          unshare -n), where it may route 10.77.0.0/16
//	                          to lo
//	VIPD_HEALTHBENCH_CPUPROFILE  file the host's vipd writes a CPU profile
//	                          of its whole run to (go tool pprof)
//	VIPD_HEALTHBENCH_MEMPROFILE  file the host's vipd writes a heap profile
//	                          to as it stops (go tool pprof -sample_index=inuse_space)
//
// Roles of the test binary's child processes.
const (
	roleEnv     = "VIPD_HEALTHBENCH_ROLE"
	workloadEnv = "VIPD_HEALTHBENCH_WORKLOAD"
	configEnv   = "VIPD_HEALTHBENCH_CONFIG"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "listen":
		os.Exit(runListener())
	case "daemon":
		os.Exit(runDaemon())
	}
	os.Exit(m.Run())
}

// runListener is the listener process: it opens the workload's
// listeners, says "ready", and serves the command protocol on its
// standard input and output.
func runListener() int {
	w, err := parseSize(os.Getenv(workloadEnv))
	if err == nil {
		err = raiseNofile(w.TCP + w.HTTP + 4096)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := Listen(w.Backends())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	if err := l.ServeCommands(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runDaemon is vipd on the host: the agent, as `vipd run` runs it, on a
// fake kernel (the host has no IPVS) that prints each weight it is given
// ("weight ADDR W UNIXNANO"), with its metrics served.
func runDaemon() int {
	k := lbtest.New()
	ki := k.Interface()
	ki.IPVS = &reportingIPVS{IPVS: ki.IPVS, out: bufio.NewWriter(os.Stdout)}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a := agent.New(agent.Options{
		Path:          os.Getenv(configEnv),
		Logger:        log,
		KernelRelease: "6.1.0",
		OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
			return ki, func() {}, nil
		},
		Serve: func(ctx context.Context, a *agent.Agent, d config.Daemon) (func(), error) {
			ln, err := net.Listen("tcp", d.MetricsListen)
			if err != nil {
				return nil, err
			}
			srv := &http.Server{Handler: a.Metrics()}
			go srv.Serve(ln)
			return func() { srv.Close() }, nil
		},
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if path := os.Getenv("VIPD_HEALTHBENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv("VIPD_HEALTHBENCH_MEMPROFILE"); path != "" {
		runtime.MemProfileRate = 4096
		// What the checks hold at the end of the run, as the window
		// left it: written once the agent stops, its state still
		// referenced by a.
		defer func() {
			f, err := os.Create(path)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return
			}
			defer f.Close()
			runtime.GC()
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			runtime.KeepAlive(a)
		}()
	}
	if err := a.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// reportingIPVS prints the weight of every destination an Apply updates.
type reportingIPVS struct {
	lb.IPVS
	mu  sync.Mutex
	out *bufio.Writer
}

func (r *reportingIPVS) Apply(ops []lb.Op) []error {
	errs := r.IPVS.Apply(ops)
	now := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, op := range ops {
		if errs[i] == nil && (op.Kind == lb.OpUpdateDest || op.Kind == lb.OpDrainDest) {
			fmt.Fprintf(r.out, "weight %s %d %d\n", op.Dest.Addr, op.Dest.Weight, now)
		}
	}
	r.out.Flush()
	return errs
}

// parseSize reads "TCP/HTTP" as DefaultWorkload with that many backends.
func parseSize(s string) (Workload, error) {
	a, b, ok := strings.Cut(s, "/")
	n, err1 := strconv.Atoi(a)
	m, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		return Workload{}, fmt.Errorf("size %q: want TCP/HTTP backends, as 10000/2000", s)
	}
	w := DefaultWorkload.Scaled(n, m)
	return w, w.Validate()
}

// raiseNofile lets the process (and the checkers it starts) hold a file
// per listener and the connections in flight: it raises the open files
// limit to 2^18 where it may, else to its hard limit, which must leave
// room for need files.
func raiseNofile(need int) error {
	lim := syscall.Rlimit{Cur: 1 << 18, Max: 1 << 18}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		return nil
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("raise the open files limit: %w", err)
	}
	if lim.Max < uint64(need) {
		return fmt.Errorf("the open files limit is %d, want at least %d", lim.Max, need)
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(t *testing.T, name string, def int) int {
	v := env(name, strconv.Itoa(def))
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q is not a positive number", name, v)
	}
	return n
}

// inGuest reports whether the test runs in the test guest.
func inGuest() bool { return os.Getenv("VIPD_VM") == "1" }

// TestHealthBench measures vipd's checker (and keepalived's, in the
// guest) under each workload, and prints and writes the tables.
func TestHealthBench(t *testing.T) {
	sizes, peers := "10000/0,10000/2000", "vipd,vipd-halfopen"
	if inGuest() {
		sizes, peers = "1000/0,400/0,200/40", "vipd,vipd-halfopen,keepalived"
	} else if os.Getenv("VIPD_HEALTHBENCH_NETNS") != "1" {
		t.Fatal("on the host, run in a private network namespace (test/vm/bench-health.sh runs it under unshare -n) with VIPD_HEALTHBENCH_NETNS=1")
	}
	sizes, peers = env("VIPD_HEALTHBENCH_SIZES", sizes), env("VIPD_HEALTHBENCH_PEERS", peers)
	window := envInt(t, "VIPD_HEALTHBENCH_WINDOW", 20)
	samples := envInt(t, "VIPD_HEALTHBENCH_SAMPLES", 20)
	if err := raiseNofile(8192); err != nil {
		t.Fatal(err)
	}
	sd := setupSides(t, env("VIPD_HEALTHBENCH_SIDES", sidesApart))
	var tables strings.Builder
	for _, size := range strings.Split(sizes, ",") {
		w, err := parseSize(size)
		if err != nil {
			t.Fatal(err)
		}
		r := &Result{Workload: w, Window: float64(window), Sides: sd.describe(), HugePages: hugePages()}
		if inGuest() {
			r.Where, r.Detection = "guest", "weight 0 in the kernel's IPVS table (polled every 5 ms)"
		} else {
			r.Where, r.Detection = "host (vipd's agent on a fake kernel)", "vipd applying weight 0 (the fake kernel's Apply)"
		}
		b := &bench{t: t, w: w, dir: t.TempDir(), window: window, samples: samples, sides: sd}
		b.listeners = startListeners(t, w, sd)
		measured := strings.Split(peers, ",")
		if w.Idle() {
			// keepalived's checker has nothing to run without a
			// virtual server.
			measured = slices.DeleteFunc(measured, func(p string) bool { return p == "keepalived" })
		}
		for _, peer := range measured {
			t.Logf("%s: %s", peer, w)
			switch peer {
			case "vipd":
				r.Peers = append(r.Peers, b.vipd(false))
			case "vipd-halfopen":
				r.Peers = append(r.Peers, b.vipd(true))
			case "keepalived":
				r.Peers = append(r.Peers, b.keepalived())
			default:
				t.Fatalf("unknown peer %q", peer)
			}
		}
		b.listeners.stop()
		if err := r.Check(measured...); err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		if err := r.WriteTable(&tables); err != nil {
			t.Fatal(err)
		}
		tables.WriteString("\n")
	}
	fmt.Printf("HEALTH-BENCH-TABLE-BEGIN\n%sHEALTH-BENCH-TABLE-END\n", tables.String())
	if out := os.Getenv("VIPD_HEALTHBENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(tables.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// listeners is the listener process.
type listeners struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	mu   sync.Mutex
	done chan struct{}
}

func startListeners(t *testing.T, w Workload, sd *sides) *listeners {
	t.Helper()
	argv := sd.backends(os.Args[0])
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), roleEnv+"=listen", fmt.Sprintf("%s=%d/%d", workloadEnv, w.TCP, w.HTTP))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &listeners{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out), done: make(chan struct{})}
	t.Cleanup(l.stop)
	if !l.out.Scan() || l.out.Text() != "ready" {
		t.Fatalf("listener process: %q, %v", l.out.Text(), l.out.Err())
	}
	return l
}

// ask sends one command and returns its answer's fields.
func (l *listeners) ask(cmd string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := fmt.Fprintln(l.in, cmd); err != nil {
		l.t.Fatalf("listener process: %v", err)
	}
	if !l.out.Scan() {
		l.t.Fatalf("listener process: no answer to %q: %v", cmd, l.out.Err())
	}
	f := strings.Fields(l.out.Text())
	if len(f) == 0 || f[0] == "error" {
		l.t.Fatalf("listener process: %q answered %q", cmd, l.out.Text())
	}
	return f
}

// kill closes addr's listener and returns when it did.
func (l *listeners) kill(addr netip.AddrPort) time.Time {
	f := l.ask("close " + addr.String())
	ns, err := strconv.ParseInt(f[len(f)-1], 10, 64)
	if err != nil {
		l.t.Fatalf("listener process: close answered %q", f)
	}
	return time.Unix(0, ns)
}

func (l *listeners) revive(addr netip.AddrPort) { l.ask("open " + addr.String()) }

func (l *listeners) stop() {
	select {
	case <-l.done:
		return
	default:
	}
	close(l.done)
	l.in.Close()
	go func() { time.Sleep(10 * time.Second); l.cmd.Process.Kill() }()
	_ = l.cmd.Wait()
}

// bench measures the peers under one workload.
type bench struct {
	t         *testing.T
	w         Workload
	dir       string
	window    int
	samples   int
	listeners *listeners
	sides     *sides
}

// metricsAddr is where vipd serves its metrics in the runs.
const metricsAddr = "127.0.0.1:9728"

// scrape reads vipd's metrics.
func scrape() (*Scrape, error) {
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	return ParseScrape(resp.Body)
}

// vipd runs vipd (the binary in the guest, the agent on a fake kernel on
// the host) under b's workload, its TCP checks half-open if halfOpen, and
// measures it.
func (b *bench) vipd(halfOpen bool) Peer {
	t := b.t
	path := filepath.Join(b.dir, "vipd.toml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.w.WriteVipd(f, Daemon{MetricsListen: metricsAddr, StateDir: filepath.Join(b.dir, "state"), ControlSocket: filepath.Join(b.dir, "vipd.sock"), HalfOpen: halfOpen}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	name := "vipd"
	if halfOpen {
		name = "vipd-halfopen"
	}
	logf, err := os.Create(filepath.Join(b.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var cmd *exec.Cmd
	var weights *weightWatch
	if inGuest() {
		argv := b.sides.checker(env("VIPD_HEALTHBENCH_VIPD", "/payload/vipd"), "run", "-c", path, "--log-level", "warn")
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = logf, logf
		if v := os.Getenv("VIPD_HEALTHBENCH_GOGC"); v != "" {
			// The Go runtime's GOGC for the daemon: what a lower
			// one saves of its memory, and costs of its CPU.
			cmd.Env = append(os.Environ(), "GOGC="+v)
		}
	} else {
		argv := b.sides.checker(os.Args[0])
		cmd = exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), roleEnv+"=daemon", configEnv+"="+path)
		cmd.Stderr = logf
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		weights = newWeightWatch(out)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if inGuest() {
			flushIPVS(t)
		}
	}
	defer stop()

	// Ready when every backend was probed once.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		s, err := scrape()
		if err == nil && s.Values["vipd_health_probes_total"] >= float64(b.w.TCP+b.w.HTTP) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not every backend probed after 5 minutes (last scrape: %v); log in %s", name, err, logf.Name())
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)

	p := Peer{Name: name}
	s0, err := scrape()
	if err != nil {
		t.Fatal(err)
	}
	at0 := time.Now()
	b.measure(&p, []int{cmd.Process.Pid})
	s1, err := scrape()
	if err != nil {
		t.Fatal(err)
	}
	const lat = "vipd_health_check_lateness_seconds"
	if p.Lateness, err = Diff(s1.Buckets[lat], s0.Buckets[lat]); b.w.Idle() {
		p.Lateness = nil // no checks
	} else if err != nil || len(p.Lateness) == 0 {
		t.Fatalf("%s: lateness histogram: %v (%d buckets)", name, err, len(s1.Buckets[lat]))
	}
	p.Probes = (s1.Values["vipd_health_probes_total"] - s0.Values["vipd_health_probes_total"]) / time.Since(at0).Seconds()
	p.Failures = s1.Values["vipd_health_probe_failures_total"] - s0.Values["vipd_health_probe_failures_total"]
	p.InFlight = s1.Values["vipd_health_probes_in_flight"]
	p.GoMem = GoMemOf(s1)

	if b.w.Idle() {
		return p // nothing to detect
	}
	var seen func([]netip.AddrPort, time.Duration) map[netip.AddrPort]time.Time
	if weights != nil {
		seen = weights.waitZero
	} else {
		seen = b.pollZero
	}
	p.DetectTCP, p.DetectHTTP = b.detect(seen, func(addr netip.AddrPort) string {
		var out []string
		if inGuest() {
			out = append(out, b.kernelWeight(addr))
		}
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for line := range strings.Lines(string(data)) {
				if strings.Contains(line, `"`+addr.String()+`"`) && (strings.HasPrefix(line, "vipd_backend_up") || strings.HasPrefix(line, "vipd_backend_weight")) {
					out = append(out, strings.TrimSpace(line))
				}
			}
		}
		return strings.Join(out, "; ") + "; log: " + tail(logf.Name(), 5)
	})
	stop()
	return p
}

// keepalived runs keepalived's checker (keepalived -C) under b's
// workload, in the guest, and measures it.
func (b *bench) keepalived() Peer {
	t := b.t
	if !inGuest() {
		t.Fatal("keepalived runs in the guest only (it needs IPVS)")
	}
	kp, err := exec.LookPath("keepalived")
	if err != nil {
		t.Fatalf("keepalived: %v", err)
	}
	conf := filepath.Join(b.dir, "keepalived.conf")
	f, err := os.Create(conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.w.WriteKeepalived(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	logf, err := os.Create(filepath.Join(b.dir, "keepalived.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	checkers := filepath.Join(b.dir, "checkers.pid")
	argv := b.sides.checker(kp, "-n", "-C", "-l", "-f", conf, "-p", filepath.Join(b.dir, "keepalived.pid"), "-c", checkers)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		flushIPVS(t)
	}()

	// Ready when the table holds every backend and the checker process
	// runs.
	a := openIPVS(t)
	defer a.Close()
	deadline := time.Now().Add(5 * time.Minute)
	var pids []int
	for {
		svcs, err := a.Services()
		dests := 0
		for _, s := range svcs {
			dests += len(s.Dests)
		}
		if data, rerr := os.ReadFile(checkers); rerr == nil && err == nil && dests == b.w.TCP+b.w.HTTP {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(data))); perr == nil {
				pids = []int{cmd.Process.Pid, pid}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("keepalived: table not complete after 5 minutes (%d dests, %v); log in %s", dests, err, logf.Name())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Its first checks are spread over an interval.
	time.Sleep(2*b.w.HTTPInterval + 3*time.Second)
	p := Peer{Name: "keepalived"}
	b.measure(&p, pids)
	p.Failures = float64(zeroWeights(t, a))
	p.DetectTCP, p.DetectHTTP = b.detect(b.pollZero, func(addr netip.AddrPort) string {
		return b.kernelWeight(addr) + "; log: " + tail(logf.Name(), 5)
	})
	return p
}

// measure samples pids' CPU and RSS each second of the window, and the
// listener process's CPU over it.
func (b *bench) measure(p *Peer, pids []int) {
	t := b.t
	l0, err := ReadProc(b.listeners.cmd.Process.Pid)
	if err != nil {
		t.Fatalf("listener process: %v", err)
	}
	u0, err := ReadProcs(pids)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	t0 := time.Now()
	prev, prevT := u0, t0
	for i := 1; i <= b.window; i++ {
		time.Sleep(time.Until(t0.Add(time.Duration(i) * time.Second)))
		u, err := ReadProcs(pids)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		now := time.Now()
		p.CPU = append(p.CPU, 100*(u.CPU-prev.CPU).Seconds()/now.Sub(prevT).Seconds())
		p.Sys = append(p.Sys, 100*(u.Sys-prev.Sys).Seconds()/now.Sub(prevT).Seconds())
		p.RSS = append(p.RSS, float64(u.RSS)/(1<<20))
		p.Switches = append(p.Switches, float64(u.Switches-prev.Switches)/now.Sub(prevT).Seconds())
		prev, prevT = u, now
	}
	p.CPUMean = 100 * (prev.CPU - u0.CPU).Seconds() / prevT.Sub(t0).Seconds()
	p.SysMean = 100 * (prev.Sys - u0.Sys).Seconds() / prevT.Sub(t0).Seconds()
	p.SwitchesMean = float64(prev.Switches-u0.Switches) / prevT.Sub(t0).Seconds()
	for _, pid := range pids {
		anon, file, shmem, err := RSSParts(pid)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		p.RSSAnon += float64(anon) / (1 << 20)
		p.RSSFile += float64(file) / (1 << 20)
		p.RSSShmem += float64(shmem) / (1 << 20)
	}
	l1, err := ReadProc(b.listeners.cmd.Process.Pid)
	if err != nil {
		t.Fatalf("listener process: %v", err)
	}
	p.ListenersCPU = 100 * (l1.CPU - l0.CPU).Seconds() / prevT.Sub(t0).Seconds()
}

// detect kills the listeners of samples TCP backends and half as many
// HTTP ones, one every 200 ms, each of another service, and returns the
// time from each kill to its weight 0 (seen reports when each of a set of
// backends was seen at weight 0), in ms. The listeners come back after.
func (b *bench) detect(seen func([]netip.AddrPort, time.Duration) map[netip.AddrPort]time.Time, diagnose func(netip.AddrPort) string) (tcp, httpMs []float64) {
	t := b.t
	var victims []Backend
	all := b.w.Backends()
	pick := func(from, n, count int) {
		if n == 0 {
			return
		}
		count = min(count, n)
		stride := n / count
		for i := range count {
			victims = append(victims, all[from+i*stride])
		}
	}
	pick(0, b.w.TCP, b.samples)
	pick(b.w.TCP, b.w.HTTP, max(b.samples/2, 1))
	addrs := make([]netip.AddrPort, len(victims))
	for i, v := range victims {
		addrs[i] = v.Addr
	}
	bound := time.Duration(b.w.Fall)*max(b.w.TCPInterval, b.w.HTTPInterval)*3 + 200*time.Millisecond*time.Duration(len(victims))
	killed := make(map[netip.AddrPort]time.Time, len(victims))
	var mu sync.Mutex
	done := make(chan map[netip.AddrPort]time.Time)
	go func() { done <- seen(addrs, bound) }()
	for _, v := range victims {
		at := b.listeners.kill(v.Addr)
		mu.Lock()
		killed[v.Addr] = at
		mu.Unlock()
		time.Sleep(200 * time.Millisecond)
	}
	zero := <-done
	var missed []string
	for _, v := range victims {
		if _, ok := zero[v.Addr]; !ok {
			missed = append(missed, fmt.Sprintf("%s (%s, closed %s ago): %s", v.Addr, v.Kind, time.Since(killed[v.Addr]).Round(time.Millisecond), diagnose(v.Addr)))
		}
	}
	if len(missed) > 0 {
		t.Fatalf("%d of %d backends not at weight 0 within %s of their listeners' close:\n%s", len(missed), len(victims), bound, strings.Join(missed, "\n"))
	}
	for _, v := range victims {
		b.listeners.revive(v.Addr)
		z := zero[v.Addr]
		ms := float64(z.Sub(killed[v.Addr]).Microseconds()) / 1000
		if v.Kind == TCP {
			tcp = append(tcp, ms)
		} else {
			httpMs = append(httpMs, ms)
		}
	}
	// Let the backends come back up before what comes next.
	time.Sleep(2 * max(b.w.TCPInterval, b.w.HTTPInterval))
	return tcp, httpMs
}

// weightWatch reads the fake kernel's weight lines of the host's vipd.
type weightWatch struct {
	mu    sync.Mutex
	zero  map[netip.AddrPort]time.Time
	since time.Time
}

func newWeightWatch(r io.Reader) *weightWatch {
	w := &weightWatch{zero: map[netip.AddrPort]time.Time{}}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 || f[0] != "weight" || f[2] != "0" {
				continue
			}
			addr, err1 := netip.ParseAddrPort(f[1])
			ns, err2 := strconv.ParseInt(f[3], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			w.mu.Lock()
			if _, ok := w.zero[addr]; !ok {
				w.zero[addr] = time.Unix(0, ns)
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// waitZero returns when each of addrs was first given weight 0 since the
// call, waiting at most bound for all of them.
func (w *weightWatch) waitZero(addrs []netip.AddrPort, bound time.Duration) map[netip.AddrPort]time.Time {
	start := time.Now()
	w.mu.Lock()
	for _, a := range addrs {
		delete(w.zero, a)
	}
	w.mu.Unlock()
	for {
		w.mu.Lock()
		out := map[netip.AddrPort]time.Time{}
		for _, a := range addrs {
			if z, ok := w.zero[a]; ok && z.After(start) {
				out[a] = z
			}
		}
		w.mu.Unlock()
		if len(out) == len(addrs) || time.Since(start) > bound {
			return out
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pollZero polls the kernel's table every 5 ms for the services of addrs
// and returns when each was first seen at weight 0, waiting at most bound
// for all.
func (b *bench) pollZero(addrs []netip.AddrPort, bound time.Duration) map[netip.AddrPort]time.Time {
	t := b.t
	a := openIPVS(t)
	defer a.Close()
	keyOf := map[netip.AddrPort]lb.ServiceKey{}
	for _, s := range b.w.Services() {
		for _, be := range s.Backends {
			if slices.Contains(addrs, be.Addr) {
				keyOf[be.Addr] = lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: s.VIP.Addr(), Port: s.VIP.Port()}
			}
		}
	}
	out := map[netip.AddrPort]time.Time{}
	start := time.Now()
	for len(out) < len(addrs) && time.Since(start) < bound {
		for _, addr := range addrs {
			if _, ok := out[addr]; ok {
				continue
			}
			st, err := a.Service(keyOf[addr])
			if err != nil || st == nil {
				continue
			}
			if d, ok := st.Dests[addr]; ok && d.Weight == 0 {
				out[addr] = time.Now()
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return out
}

// kernelWeight describes addr's destination in the kernel's table.
func (b *bench) kernelWeight(addr netip.AddrPort) string {
	a, err := ipvs.New(ipvs.Options{})
	if err != nil {
		return err.Error()
	}
	defer a.Close()
	for _, s := range b.w.Services() {
		for _, be := range s.Backends {
			if be.Addr != addr {
				continue
			}
			st, err := a.Service(lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: s.VIP.Addr(), Port: s.VIP.Port()})
			switch {
			case err != nil:
				return fmt.Sprintf("kernel: service %s: %v", s.VIP, err)
			case st == nil:
				return fmt.Sprintf("kernel: no service %s", s.VIP)
			}
			d, ok := st.Dests[addr]
			return fmt.Sprintf("kernel: service %s, destination present %v, weight %d", s.VIP, ok, d.Weight)
		}
	}
	return "not a backend of the workload"
}

// tail returns the last n lines of a file, joined by " | ".
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], " | ")
}

func openIPVS(t *testing.T) *ipvs.IPVS {
	a, err := ipvs.New(ipvs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// zeroWeights counts the table's destinations at weight 0.
func zeroWeights(t *testing.T, a *ipvs.IPVS) int {
	svcs, err := a.Services()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range svcs {
		for _, d := range s.Dests {
			if d.Weight == 0 {
				n++
			}
		}
	}
	return n
}

// flushIPVS empties the table between peers.
func flushIPVS(t *testing.T) {
	if out, err := exec.Command("ipvsadm", "-C").CombinedOutput(); err != nil {
		t.Fatalf("ipvsadm -C: %v\n%s", err, out)
	}
}

// hugePages returns the kernel's transparent huge page mode, "" when it
// has none.
func hugePages() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
