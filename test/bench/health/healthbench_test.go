package healthbench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
)

var small = DefaultWorkload.Scaled(25, 12)

func TestWorkloadPlan(t *testing.T) {
	bs := small.Backends()
	if len(bs) != 37 || bs[0] != (Backend{TCP, netip.MustParseAddrPort("10.77.0.1:8080")}) || bs[25] != (Backend{HTTP, netip.MustParseAddrPort("10.77.0.26:80")}) {
		t.Fatalf("backends: %d, first %v, first http %v", len(bs), bs[0], bs[25])
	}
	big := DefaultWorkload.Backends()
	if last := big[len(big)-1]; last.Addr != netip.MustParseAddrPort("10.77.47.250:80") {
		t.Errorf("last of 12,000 backends: %v", last)
	}
	seen := map[netip.AddrPort]bool{}
	prefix := netip.MustParsePrefix(BackendPrefix)
	for _, b := range big {
		if seen[b.Addr] || !prefix.Contains(b.Addr.Addr()) {
			t.Fatalf("backend %v repeated or outside %s", b.Addr, prefix)
		}
		seen[b.Addr] = true
	}
	// 25 tcp in 10+10+5, 12 http in 10+2: a service holds one kind.
	var sizes []int
	for _, s := range small.Services() {
		sizes = append(sizes, len(s.Backends))
		for _, b := range s.Backends {
			if b.Kind != s.Kind {
				t.Errorf("service %s (%s) has a %s backend", s.Name, s.Kind, b.Kind)
			}
		}
	}
	if got := fmt.Sprint(sizes); got != "[10 10 5 10 2]" {
		t.Errorf("service sizes %s, want [10 10 5 10 2]", got)
	}
	if got := DefaultWorkload.ChecksPerSecond(); got != 11000 {
		t.Errorf("checks/s %v, want 11000", got)
	}
	if w := small.Scaled(0, 0); w.Validate() != nil || !w.Idle() {
		t.Errorf("0/0 does not validate as idle: %v", w.Validate())
	}
	for _, w := range []Workload{small.Scaled(-1, 0), small.Scaled(70000, 0), {TCP: 1, TCPInterval: 1500 * time.Millisecond, HTTPInterval: time.Second, Timeout: time.Second, Fall: 1, PerService: 1}} {
		if w.Validate() == nil {
			t.Errorf("%+v validates", w)
		}
	}
	if err := DefaultWorkload.Validate(); err != nil {
		t.Error(err)
	}
}

// TestWriteVipd parses the vipd configuration with vipd's own parser: the
// services, backends and checks are the workload's.
func TestWriteVipd(t *testing.T) {
	var b bytes.Buffer
	if err := small.WriteVipd(&b, Daemon{MetricsListen: "127.0.0.1:9999", StateDir: "/tmp/x", ControlSocket: "/tmp/x/s"}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vipd.toml")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	svcs := small.Services()
	if len(cfg.Spec.Services) != len(svcs) {
		t.Fatalf("%d services, want %d", len(cfg.Spec.Services), len(svcs))
	}
	targets := cfg.Targets()
	if len(targets) != 37 {
		t.Fatalf("%d check targets, want 37", len(targets))
	}
	for _, tg := range targets {
		s := tg.Spec
		want := small.interval(Kind(s.Kind.String()))
		if s.Interval != want || s.Timeout != time.Second || s.Fall != 3 || s.Rise != 1 {
			t.Errorf("%s %s: %+v", tg.Service, tg.Backend, s)
		}
		if (tg.Backend.Port() == httpPort) != (s.Kind.String() == "http") {
			t.Errorf("%s %s: a %s check", tg.Service, tg.Backend, s.Kind)
		}
		if s.Kind.String() == "http" && s.HTTP.Path != HealthPath {
			t.Errorf("%s %s: http path %q", tg.Service, tg.Backend, s.HTTP.Path)
		}
	}
	if cfg.Daemon.MetricsListen != "127.0.0.1:9999" {
		t.Errorf("metrics_listen %q", cfg.Daemon.MetricsListen)
	}
	for _, tg := range targets {
		if tg.Spec.TCP.HalfOpen {
			t.Errorf("%s %s: half-open without Daemon.HalfOpen", tg.Service, tg.Backend)
		}
	}

	// With HalfOpen, the TCP checks and only they are half-open.
	b.Reset()
	if err := small.WriteVipd(&b, Daemon{MetricsListen: "127.0.0.1:9999", HalfOpen: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg, err = config.Load(path); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	half := 0
	for _, tg := range cfg.Targets() {
		if tg.Spec.TCP.HalfOpen != (tg.Spec.Kind.String() == "tcp") {
			t.Errorf("%s %s: a %s check, half-open %v", tg.Service, tg.Backend, tg.Spec.Kind, tg.Spec.TCP.HalfOpen)
		}
		if tg.Spec.TCP.HalfOpen {
			half++
		}
	}
	if half != 25 {
		t.Errorf("%d half-open checks, want 25", half)
	}
}

// TestWriteKeepalived checks the keepalived.conf's shape and, where
// keepalived is installed, has keepalived check it.
func TestWriteKeepalived(t *testing.T) {
	var b bytes.Buffer
	if err := small.WriteKeepalived(&b); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for what, want := range map[string]int{
		"virtual_server ": 5, "real_server ": 37, "TCP_CHECK {": 25, "HTTP_GET {": 12,
		"inhibit_on_failure": 37, " retry 2\n": 37, "delay_loop 1\n": 3, "delay_loop 2\n": 2,
		"delay_before_retry 2\n": 12, "path /healthz\n": 12,
	} {
		if got := strings.Count(s, what); got != want {
			t.Errorf("%q %d times, want %d", what, got, want)
		}
	}
	if strings.Count(s, "{") != strings.Count(s, "}") {
		t.Error("unbalanced braces")
	}
	kp, err := exec.LookPath("keepalived")
	if err != nil {
		t.Log("keepalived is not installed: its own check of the file skipped")
		return
	}
	path := filepath.Join(t.TempDir(), "keepalived.conf")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(kp, "-t", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("keepalived -t: %v\n%s", err, out)
	}
}

// TestListeners answers a TCP and an HTTP check on loopback, and closes
// and reopens one through the command protocol.
func TestListeners(t *testing.T) {
	tcp := Backend{TCP, freeAddr(t)}
	httpb := Backend{HTTP, freeAddr(t)}
	l, err := Listen([]Backend{tcp, httpb})
	if err != nil {
		t.Fatal(err)
	}
	defer l.CloseAll()
	// The listeners are plain TCP, not Go's default MPTCP.
	for _, b := range []Backend{tcp, httpb} {
		rc, err := l.lns[b.Addr].(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var proto int
		var perr error
		if err := rc.Control(func(fd uintptr) {
			proto, perr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PROTOCOL)
		}); err != nil || perr != nil {
			t.Fatal(err, perr)
		}
		if proto != syscall.IPPROTO_TCP {
			t.Errorf("%s listens with protocol %d, want TCP (%d)", b.Addr, proto, syscall.IPPROTO_TCP)
		}
	}
	c, err := net.Dial("tcp", tcp.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c, err = net.Dial("tcp", httpb.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := io.ReadAll(c)
	c.Close()
	if err != nil || string(resp) != httpResponse {
		t.Fatalf("http answer %q, %v", resp, err)
	}

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go func() { _ = l.ServeCommands(inR, outW); outW.Close() }()
	out := bufio.NewScanner(outR)
	ask := func(cmd string) string {
		t.Helper()
		io.WriteString(inW, cmd+"\n")
		if !out.Scan() {
			t.Fatalf("no answer to %q", cmd)
		}
		return out.Text()
	}
	before := time.Now().UnixNano()
	f := strings.Fields(ask("close " + tcp.Addr.String()))
	if len(f) != 3 || f[0] != "closed" || f[1] != tcp.Addr.String() {
		t.Fatalf("close answered %q", f)
	}
	if at, err := strconv.ParseInt(f[2], 10, 64); err != nil || at < before || at > time.Now().UnixNano() {
		t.Fatalf("close answered %q", f)
	}
	if c, err := net.Dial("tcp", tcp.Addr.String()); err == nil {
		c.Close()
		t.Fatal("a closed listener accepted")
	}
	if got := ask("close " + tcp.Addr.String()); !strings.HasPrefix(got, "error ") {
		t.Errorf("second close answered %q", got)
	}
	if got := ask("open " + tcp.Addr.String()); got != "opened "+tcp.Addr.String() {
		t.Errorf("open answered %q", got)
	}
	if c, err := net.Dial("tcp", tcp.Addr.String()); err != nil {
		t.Fatalf("reopened listener: %v", err)
	} else {
		c.Close()
	}
	if got := ask("bogus 1.2.3.4:5"); !strings.HasPrefix(got, "error ") {
		t.Errorf("bogus command answered %q", got)
	}
	inW.Close()
}

// freeAddr returns a free loopback TCP address.
func freeAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return netip.MustParseAddrPort(ln.Addr().String())
}

func TestParseStat(t *testing.T) {
	line := "1234 (a (weird) name) S 1 1234 1234 0 -1 4194560 7070 0 0 0 250 37 0 0 20 0 12 0 3327 1290240000 9000 18446744073709551615\n"
	user, sys, err := parseStat(line)
	if err != nil || user != 2500*time.Millisecond || sys != 370*time.Millisecond {
		t.Fatalf("parseStat: %v, %v, %v; want 2.5s and 0.37s", user, sys, err)
	}
	if _, _, err := parseStat("1 (x) S 1 2"); err == nil {
		t.Error("a short line parsed")
	}
	rss, err := parseRSS("Name:\tvipd\nVmRSS:\t  123456 kB\nThreads: 9\n")
	if err != nil || rss != 123456<<10 {
		t.Fatalf("parseRSS: %v, %v", rss, err)
	}
	if _, err := parseRSS("Name: x\n"); err == nil {
		t.Error("no VmRSS parsed")
	}
	sw, err := parseSwitches("Name:\tvipd\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t7\n")
	if err != nil || sw != 127 {
		t.Fatalf("parseSwitches: %v, %v; want 127", sw, err)
	}
	if _, err := parseSwitches("Name:\tx\nvoluntary_ctxt_switches:\t1\n"); err == nil {
		t.Error("a status without nonvoluntary_ctxt_switches parsed")
	}
	anon, file, shmem, err := parseRSSParts("RssAnon:\t  2048 kB\nRssFile:\t 1024 kB\nRssShmem:\t 512 kB\n")
	if err != nil || anon != 2048<<10 || file != 1024<<10 || shmem != 512<<10 {
		t.Fatalf("parseRSSParts: %v, %v, %v, %v", anon, file, shmem, err)
	}
	if _, _, _, err := parseRSSParts("RssAnon:\t1 kB\nRssFile:\t1 kB\n"); err == nil {
		t.Error("a status without RssFile parsed")
	}
	u, err := ReadProc(os.Getpid())
	if err != nil || u.RSS == 0 || u.Sys > u.CPU || u.Switches == 0 {
		t.Fatalf("ReadProc(self): %+v, %v", u, err)
	}
}

const scrapeText = `# HELP vipd_health_probes_total Health probes completed.
# TYPE vipd_health_probes_total counter
vipd_health_probes_total 1000
vipd_backend_up{service="a",backend="1.2.3.4:80"} 1
# TYPE vipd_health_check_lateness_seconds histogram
vipd_health_check_lateness_seconds_bucket{le="0.001"} 500
vipd_health_check_lateness_seconds_bucket{le="0.01"} 900
vipd_health_check_lateness_seconds_bucket{le="0.1"} 1000
vipd_health_check_lateness_seconds_bucket{le="+Inf"} 1000
vipd_health_check_lateness_seconds_sum 12.5
vipd_health_check_lateness_seconds_count 1000
`

func TestScrapeQuantile(t *testing.T) {
	s, err := ParseScrape(strings.NewReader(scrapeText))
	if err != nil {
		t.Fatal(err)
	}
	if s.Values["vipd_health_probes_total"] != 1000 || s.Values["vipd_health_check_lateness_seconds_count"] != 1000 {
		t.Errorf("values %v", s.Values)
	}
	if _, ok := s.Values[`vipd_backend_up{service="a",backend="1.2.3.4:80"}`]; ok {
		t.Error("a labelled series was kept")
	}
	bs := s.Buckets["vipd_health_check_lateness_seconds"]
	if len(bs) != 4 || !math.IsInf(bs[3].LE, 1) {
		t.Fatalf("buckets %v", bs)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 0.001}, {0.25, 0.0005}, {0.7, 0.0055}, {0.99, 0.091}} {
		if got := Quantile(bs, c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", c.q, got, c.want)
		}
	}
	earlier := []Bucket{{0.001, 100}, {0.01, 100}, {0.1, 100}, {math.Inf(1), 100}}
	d, err := Diff(bs, earlier)
	if err != nil || d[0].Count != 400 || d[3].Count != 900 {
		t.Fatalf("diff %v, %v", d, err)
	}
	if _, err := Diff(bs, earlier[:2]); err == nil {
		t.Error("buckets of other bounds diffed")
	}
	// Every observation in +Inf: the last finite bound.
	if got := Quantile([]Bucket{{1, 0}, {math.Inf(1), 5}}, 0.5); got != 1 {
		t.Errorf("quantile in +Inf: %v", got)
	}
	if got := Quantile([]Bucket{{1, 0}, {math.Inf(1), 0}}, 0.5); !math.IsNaN(got) {
		t.Errorf("quantile of nothing: %v", got)
	}
	if _, err := ParseScrape(strings.NewReader("x{le=\"a\"} 1\n")); err != nil {
		t.Errorf("a non-bucket labelled series: %v", err)
	}
	if _, err := ParseScrape(strings.NewReader("x_bucket{le=\"a\"} 1\n")); err == nil {
		t.Error("a bucket with a bad bound parsed")
	}
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {100, 10}, {0, 1}, {10, 1}, {11, 2}} {
		if got := Percentile(xs, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is a number")
	}
}

func TestReport(t *testing.T) {
	w := DefaultWorkload.Scaled(1000, 200)
	lat := []Bucket{{0.001, 90}, {0.01, 100}, {math.Inf(1), 100}}
	r := &Result{Where: "guest", Workload: w, Window: 20, Detection: "weight 0 in the kernel's table", Peers: []Peer{
		{Name: "vipd", CPU: []float64{10, 12, 11}, CPUMean: 11, Sys: []float64{8, 9, 8.5}, SysMean: 8.8, Switches: []float64{300, 320, 310}, SwitchesMean: 310, RSS: []float64{30, 31}, RSSAnon: 20, RSSFile: 11, RSSShmem: 1, Lateness: lat, Probes: 1100, InFlight: 12, ListenersCPU: 30, DetectTCP: []float64{2100, 2500}, DetectHTTP: []float64{4000}},
		{Name: "keepalived", CPU: []float64{40, 44}, CPUMean: 42, RSS: []float64{20}, Failures: 2, DetectTCP: []float64{2300}, DetectHTTP: []float64{4100}},
		{Name: "vipd-halfopen", CPU: []float64{5, 5}, CPUMean: 5, RSS: []float64{30}, Lateness: lat, InFlight: 3, DetectTCP: []float64{2000}, DetectHTTP: []float64{4000}},
	}, Sides: "sides: apart"}
	scrape, err := ParseScrape(strings.NewReader("go_memstats_heap_alloc_bytes 3.145728e+06\ngo_memstats_next_gc_bytes 4194304\ngo_memstats_heap_inuse_bytes 4194304\n" +
		"go_memstats_heap_idle_bytes 3145728\ngo_memstats_heap_released_bytes 1048576\ngo_memstats_stack_inuse_bytes 524288\ngo_memstats_sys_bytes 12582912\n"))
	if err != nil {
		t.Fatal(err)
	}
	r.Peers[0].GoMem = GoMemOf(scrape)
	if GoMemOf(&Scrape{Values: map[string]float64{}}) != nil {
		t.Error("Go memory of a scrape without go_memstats")
	}
	if err := r.Check("vipd", "keepalived"); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	// Compared with runs of blanks as one: the columns' widths vary.
	got := strings.Join(strings.Fields(b.String()), " ")
	for _, want := range []string{
		"guest: 1000 tcp every 1s + 200 http every 2s",
		"1100 checks/s",
		"vipd        cpu % of one core (per s)  3     11.0  12.0  mean 11.0",
		"vipd        check lateness ms          100   0.56  9.10  1100 probes/s",
		"vipd        detection tcp ms           2     2100  2500  fall x interval 3000",
		"vipd        detection http ms          1     4000  4000  fall x interval 6000",
		"keepalived  check lateness ms          -     -     -     not exported",
		"keepalived  rss MiB (per s)            1     20.0  20.0  max 20.0",
		"cpu keepalived/vipd (means): 3.8x (target >= 3x: met)",
		"cpu keepalived/vipd-halfopen (means): 8.4x (target >= 3x: met)",
		"vipd-halfopen: 3 probes in flight at the window's end",
		"sides: apart",
		"vipd        of which in the kernel %       3     8.5   9.0   mean 8.8",
		"vipd        context switches per s         3     310   320   mean 310",
		"keepalived  context switches per s         0     -     -     mean 0",
		"vipd: 80% of its CPU in the kernel",
		"vipd: rss at the window's end 20.0 MiB anonymous, 11.0 MiB file-backed, 1.0 MiB shared (files on a RAM file system count here)",
		"keepalived: 0% of its CPU in the kernel",
		"detection: from the listener closed to weight 0 in the kernel's table",
		"vipd: 0 probes failed in the window (every backend listening); the listener process used 30.0% of one core in its window",
		"vipd: 12 probes in flight at the window's end",
		"vipd: Go memory at the window's end: heap 3.0 MiB allocated (GC goal 4.0), 4.0 MiB of spans in use, 2.0 MiB free and not returned to the kernel; stacks 0.5 MiB; all the runtime holds 11.0 MiB",
		"keepalived: 2 backends at weight 0 after the window (every backend listening); the listener process used 0.0% of one core in its window",
	} {
		if want = strings.Join(strings.Fields(want), " "); !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}

	// A peer without figures fails the run.
	r.Peers[1].DetectHTTP = nil
	r.Peers[0].Lateness = nil
	r.Peers[2].Lateness = nil
	err = r.Check("vipd", "keepalived", "vipd-halfopen", "other")
	for _, want := range []string{"keepalived: no http detection", "vipd: no lateness", "vipd-halfopen: no lateness", "other: not measured"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check: %v, want %q", err, want)
		}
	}

	idle := &Result{Where: "guest", Workload: DefaultWorkload.Scaled(0, 0), Window: 20, Detection: "-",
		Peers: []Peer{{Name: "vipd-halfopen", CPU: []float64{1}, CPUMean: 1, RSS: []float64{40}}}}
	if err := idle.Check("vipd-halfopen"); err != nil {
		t.Errorf("idle: %v", err)
	}
	b.Reset()
	if err := idle.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(b.String()), " "); !strings.Contains(got, "vipd-halfopen check lateness ms - - - no checks") {
		t.Errorf("idle table lacks the lateness row:\n%s", b.String())
	}

	host := &Result{Where: "host (fake kernel)", Workload: DefaultWorkload.Scaled(10000, 0), Window: 20, Detection: "vipd applying weight 0",
		Peers: []Peer{{Name: "vipd", CPU: []float64{12}, CPUMean: 12, RSS: []float64{50}, Lateness: lat, DetectTCP: []float64{2000}}}}
	b.Reset()
	if err := host.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "vipd cpu, mean: 12.0% of one core (target <= 10%: missed)") {
		t.Errorf("host table lacks the target:\n%s", b.String())
	}
}
