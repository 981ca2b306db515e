//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// The daemon's end-to-end tests: vipd itself programs the real kernel and
// real traffic goes through its VIPs. Each test builds a topology with
// topo.sh, writes a config, runs /payload/vipd and checks the result with
// traffic and with the kernel's own tools (ipvsadm, iptables-save, ip).

// vipdBin is the daemon binary in the guest.
func vipdBin() string { return filepath.Join(Payload(), "vipd") }

// lockedBuffer collects a process's output safely.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// daemon is one vipd process under test.
type daemon struct {
	t    *testing.T
	dir  string
	path string
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
	// starts counts the processes started, to tell their logs apart.
	starts int
	// ns, when set, is the network namespace vipd runs in.
	ns string
}

// header is the [daemon] table every test config starts with.
func (d *daemon) header(uplink, extra string) string {
	if !strings.Contains(extra, "resync_interval") {
		extra += "\nresync_interval = \"2s\""
	}
	if !strings.Contains(extra, "metrics_listen") {
		extra += "\nmetrics_listen = \"\""
	}
	return fmt.Sprintf(`[daemon]
uplinks = [%q]
state_dir = %q
control_socket = %q
%s
`, uplink, filepath.Join(d.dir, "state"), filepath.Join(d.dir, "vipd.sock"), extra)
}

// newDaemon prepares a daemon whose files live in a fresh directory.
func newDaemon(t *testing.T) *daemon {
	dir, err := os.MkdirTemp("", "vipd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dir: dir, path: filepath.Join(dir, "vipd.toml"), log: &lockedBuffer{}}
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("vipd log:\n%s", d.log)
		}
		os.RemoveAll(dir)
	})
	return d
}

// write replaces the config file atomically, as an editor does.
func (d *daemon) write(cfg string) {
	d.t.Helper()
	tmp := d.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, d.path); err != nil {
		d.t.Fatal(err)
	}
}

// start runs vipd and waits for its first pass.
func (d *daemon) start() {
	d.t.Helper()
	d.starts++
	fmt.Fprintf(d.log, "---- start %d\n", d.starts)
	d.cmd = exec.Command(vipdBin(), "run", "-c", d.path)
	if d.ns != "" {
		// ip netns exec execs vipd: the process is vipd's.
		d.cmd = exec.Command("ip", "netns", "exec", d.ns, vipdBin(), "run", "-c", d.path)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(d.cmd, d.done)
	marker := fmt.Sprintf("---- start %d\n", d.starts)
	Eventually(d.t, 60*time.Second, 50*time.Millisecond, func() bool {
		select {
		case <-d.done:
			d.t.Fatalf("vipd exited:\n%s", d.log)
		default:
		}
		_, after, _ := strings.Cut(d.log.String(), marker)
		return strings.Contains(after, "msg=ready")
	}, "vipd did not get ready:\n%s", d.log)
}

// logSince returns what the current process logged.
func (d *daemon) logSince() string {
	_, after, _ := strings.Cut(d.log.String(), fmt.Sprintf("---- start %d\n", d.starts))
	return after
}

// stop sends SIGTERM and waits.
func (d *daemon) stop() {
	d.t.Helper()
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.t.Fatalf("vipd did not stop:\n%s", d.log)
	}
	d.cmd = nil
}

// kill sends SIGKILL, as a crash or `kill -9` does.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Kill()
	<-d.done
	d.cmd = nil
}

// reload asks the daemon to reload through its control socket.
func (d *daemon) reload(force bool) Result {
	args := []string{"reload", "--socket", filepath.Join(d.dir, "vipd.sock")}
	if force {
		args = append(args, "--force")
	}
	return Exec(vipdBin(), args...)
}

// waitLog waits until the current process logged s.
func (d *daemon) waitLog(s string) {
	d.t.Helper()
	Eventually(d.t, 60*time.Second, 50*time.Millisecond, func() bool {
		return strings.Contains(d.logSince(), s)
	}, "vipd did not log %q:\n%s", s, d.log)
}

// service renders one [[service]] table.
func service(name, vip string, port int, extra string, backends ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n[[service]]\nname = %q\nvip = %q\nport = %d\n%s\n", name, vip, port, extra)
	for _, be := range backends {
		if strings.HasPrefix(be, "{") {
			fmt.Fprintf(&b, "[[service.backend]]\n%s\n", strings.TrimSuffix(strings.TrimPrefix(be, "{"), "}"))
			continue
		}
		fmt.Fprintf(&b, "[[service.backend]]\naddress = %q\n", be)
	}
	return b.String()
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

func mustNotContain(t *testing.T, what, out string, bad ...string) {
	t.Helper()
	for _, w := range bad {
		if strings.Contains(out, w) {
			t.Errorf("%s has %q:\n%s", what, w, out)
		}
	}
}

func url(tp *Topo, port int) string { return HTTPURL(tp.VIP, port, "/") }

// TestVipdNAT: NAT forwarding with rr, then wrr, sh and persistence, each
// checked with real traffic, ipvsadm, iptables-save, ipset and ip.
func TestVipdNAT(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	be := tp.BackendIPs
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, `scheduler = "rr"`, be[0], be[1]))
	d.start()

	h := tp.Hit(t, url(tp, 80), 20, false)
	checkCounts(t, h, tp.Backends, 10)
	for i := 1; i < len(h.Sequence); i++ {
		if h.Sequence[i] == h.Sequence[i-1] {
			t.Fatalf("rr did not alternate: %v", h.Sequence)
		}
	}

	ipvs := Run(t, "ipvsadm", "-Ln")
	mustContain(t, "ipvsadm -Ln", ipvs,
		fmt.Sprintf("TCP  %s:80 rr", tp.VIP),
		fmt.Sprintf("-> %s:80", be[0]), fmt.Sprintf("-> %s:80", be[1]), "Masq    1")
	mustContain(t, "ip addr show vipd0", Run(t, "ip", "-o", "addr", "show", "dev", "vipd0"), tp.VIP+"/32")
	mustContain(t, "iptables-save", Run(t, "iptables-save"), "-A INPUT -m comment --comment \"vipd filter traffic to vips\" -j VIPD-FILTER",
		":VIPD-POSTROUTING", "-j VIPD-MARK-SNAT", "-m ipvs --ipvs", "MASQUERADE")
	mustContain(t, "ipset", Run(t, "ipset", "list", "vipd-served-4"), tp.VIP+",tcp:80")
	mustContain(t, "sysctls", Run(t, "cat", "/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv4/conf/all/arp_ignore", "/proc/sys/net/ipv4/vs/expire_nodest_conn"), "1\n1\n1")

	// wrr: the ratio follows the weights.
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, `scheduler = "wrr"`,
		fmt.Sprintf("{address = %q\nweight = 3}", be[0]), fmt.Sprintf("{address = %q\nweight = 1}", be[1])))
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), "wrr")
	}, "wrr not programmed")
	h = tp.Hit(t, url(tp, 80), 40, false)
	if h.Errors != 0 || h.Counts[tp.Backends[0]] != 30 || h.Counts[tp.Backends[1]] != 10 {
		t.Errorf("wrr 3:1 over 40 requests: %+v", h)
	}

	// sh: one client sticks to one backend.
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, `scheduler = "sh"`, be[0], be[1]))
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), " sh")
	}, "sh not programmed")
	h = tp.Hit(t, url(tp, 80), 10, false)
	if h.Errors != 0 || len(h.Counts) != 1 {
		t.Errorf("sh spread one client over %d backends: %+v", len(h.Counts), h)
	}

	// rr with persistence: one client sticks too.
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\npersistence = \"5m\"", be[0], be[1]))
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), "persistent 300")
	}, "persistence not programmed")
	h = tp.Hit(t, url(tp, 80), 10, false)
	if h.Errors != 0 || len(h.Counts) != 1 {
		t.Errorf("persistence spread one client over %d backends: %+v", len(h.Counts), h)
	}

	// The filter drops an unserved port of the VIP; ping still passes.
	if r := Exec("ip", "netns", "exec", tp.ClientNS, Payload()+"/bin/rignode", "hit", "-n", "1", "-timeout", "1s", url(tp, 81)); !strings.Contains(r.Stdout, `"errors":1`) {
		t.Errorf("unserved port answered: %s", r)
	}
	tp.InClient(t, "ping", "-c", "1", "-W", "2", tp.VIP)

	// Stop with on_stop = "clean" removes everything vipd owns.
	d.write(d.header(tp.LBIf, `on_stop = "clean"`) + service("web", tp.VIP, 80, "scheduler = \"rr\"\npersistence = \"5m\"", be[0], be[1]))
	d.waitLog(`why="file changed" applied=0 failed=0`) // daemon settings alone: no kernel change
	d.stop()
	mustNotContain(t, "ipvsadm -Ln after stop", Run(t, "ipvsadm", "-Ln"), tp.VIP)
	mustNotContain(t, "iptables-save after stop", Run(t, "iptables-save"), "VIPD")
	mustNotContain(t, "ip addr after stop", Run(t, "ip", "-o", "addr", "show", "dev", "vipd0"), tp.VIP)
}

// TestVipdDirectRouting: DR with the VIP on the backends' loopback. The VIP
// is on-link for the client, so traffic also proves that vipd answers ARP
// for it (strict ARP keeps the kernel from doing so).
func TestVipdDirectRouting(t *testing.T) {
	tp := NewTopo(t, "dr 2")
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") + service("dr", tp.VIP, 80, "scheduler = \"rr\"\nforward = \"droute\"", tp.BackendIPs...))
	d.start()
	h := tp.Hit(t, url(tp, 80), 10, false)
	checkCounts(t, h, tp.Backends, 5)
	mustContain(t, "ipvsadm -Ln", Run(t, "ipvsadm", "-Ln"), "Route   1")
	mustContain(t, "client neighbours", tp.InClient(t, "ip", "neigh", "show", tp.VIP), "lladdr")
}

// TestVipdOneArmSNAT: backends without a route back need SNAT; without it
// connections fail, with it (after a hot reload) they work.
func TestVipdOneArmSNAT(t *testing.T) {
	tp := NewTopo(t, "nat 2 onearm")
	d := newDaemon(t)
	be := tp.BackendIPs
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, `scheduler = "rr"`, be...))
	d.start()
	if h := tp.Hit(t, url(tp, 80), 2, false, "-timeout", "1s"); h.OK != 0 {
		t.Fatalf("one-arm traffic worked without SNAT: %+v", h)
	}
	d.write(d.header(tp.LBIf, "") + service("web", tp.VIP, 80, "scheduler = \"rr\"\nsnat = true", be...))
	d.waitLog("why=\"file changed\"")
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipset", "list", "vipd-snat-4"), tp.VIP+",tcp:80")
	}, "snat entry missing")
	h := tp.Hit(t, url(tp, 80), 10, false)
	checkCounts(t, h, tp.Backends, 5)
	mustContain(t, "conntrack sysctl", Run(t, "cat", "/proc/sys/net/ipv4/vs/conntrack"), "1")
	mustContain(t, "iptables-save -t nat", Run(t, "iptables-save", "-t", "nat"), "MASQUERADE")
}

// noKernelChanges fails the test if the daemon's current process applied
// any operation but announcements: a restarted vipd must adopt the kernel
// as it is. (Announcing is not a kernel change: the new process starts
// answering ARP for its VIPs.)
func noKernelChanges(t *testing.T, d *daemon) {
	t.Helper()
	for _, line := range strings.Split(d.logSince(), "\n") {
		if strings.Contains(line, "msg=applied") && !strings.Contains(line, "op=announce") {
			t.Errorf("restart changed the kernel: %s", line)
		}
	}
	mustContain(t, "restart log", d.logSince(), "why=start")
}

// TestVipdOwnership: a foreign IPVS service and foreign iptables rules
// survive vipd's start, reloads and a cleaning stop; a restart with the
// same config changes nothing; drift is repaired within resync_interval.
func TestVipdOwnership(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	foreign := tp.LBIP + ":8080"
	Run(t, "ipvsadm", "-A", "-t", foreign, "-s", "lc")
	Run(t, "ipvsadm", "-a", "-t", foreign, "-r", tp.BackendIPs[0]+":8080", "-m")
	Run(t, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-m", "comment", "--comment", "foreign", "-j", "ACCEPT")
	foreignIPVS := func() string { return Run(t, "ipvsadm", "-Ln", "-t", foreign) }
	before := foreignIPVS()

	d := newDaemon(t)
	be := tp.BackendIPs
	cfg := d.header(tp.LBIf, `on_stop = "clean"`) + service("web", tp.VIP, 80, `scheduler = "rr"`, be...)
	d.write(cfg)
	d.start()
	tp.Hit(t, url(tp, 80), 4, false)

	// Restart with the same config: zero operations.
	d.kill()
	d.start()
	noKernelChanges(t, d)

	// Drift: a service deleted by hand comes back.
	Run(t, "ipvsadm", "-D", "-t", tp.VIP+":80")
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), tp.VIP+":80")
	}, "deleted service was not repaired")

	// Reloads: add a service, then remove it.
	d.write(cfg + service("extra", tp.VIP, 8080, "", be...))
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), tp.VIP+":8080")
	}, "extra service not added")
	d.write(cfg)
	Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return !strings.Contains(Run(t, "ipvsadm", "-Ln"), tp.VIP+":8080")
	}, "extra service not removed")

	d.stop()
	if after := foreignIPVS(); after != before {
		t.Errorf("foreign service changed:\nbefore\n%s\nafter\n%s", before, after)
	}
	mustContain(t, "iptables-save", Run(t, "iptables-save"), `--comment foreign -j ACCEPT`)
}

// TestVipdMissingScheduler: a scheduler the kernel lacks (twos on 6.1)
// fails that one service with a clear error; the others serve.
func TestVipdMissingScheduler(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") +
		service("new", tp.VIP, 8080, `scheduler = "twos"`, tp.BackendIPs...) +
		service("web", tp.VIP, 80, `scheduler = "rr"`, tp.BackendIPs...))
	d.start()
	mustContain(t, "vipd log", d.logSince(), `scheduler \"twos\" is not supported by this kernel`)
	checkCounts(t, tp.Hit(t, url(tp, 80), 4, false), tp.Backends, 2)
}

// dialIn returns a dialer whose sockets live in network namespace ns.
func dialIn(t *testing.T, ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			// The thread is left in ns and dies with this goroutine
			// (no UnlockOSThread), so no other goroutine runs there.
			runtime.LockOSThread()
			if err := netns.Set(h); err != nil {
				ch <- res{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- res{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// load is client traffic through a VIP: long-lived keep-alive connections
// that each send a request every interval, and a stream of short requests
// on new connections.
type load struct {
	mu       sync.Mutex
	longOK   int
	longErrs []string
	shortOK  int
	shortErr []string
	// shortFailed holds when each failed short request was sent.
	shortFailed []time.Time
	shortPorts  []int
	last        map[int]string // backend of each long-lived client's last answer
	opts        loadOptions
	start       time.Time
	took        time.Duration // from start to finish
	stop        chan struct{}
	wg          sync.WaitGroup
}

func startLoad(t *testing.T, tp *Topo, port, long int, every time.Duration) *load {
	return startLoadWith(t, tp, loadOptions{Port: port, Long: long, LongEvery: every, Short: 1, ShortEvery: every / 4})
}

// loadOptions shape a load.
type loadOptions struct {
	Port int
	// Long clients each send a request every LongEvery.
	Long      int
	LongEvery time.Duration
	// Short workers each send a request on a new connection every
	// ShortEvery.
	Short      int
	ShortEvery time.Duration
	// OnShortFail, when set, is called (on the failing worker's
	// goroutine) with the local port of each short request that failed,
	// 0 when the socket got none: to look for the connection in the
	// kernels' tables while they still hold it.
	OnShortFail func(port int, err error)
	// OnShortSlow, when set, is called with the local port, the send
	// time and the duration of each short request that succeeded after
	// SlowAfter or more (a lost SYN costs the client 1 s).
	OnShortSlow func(port int, sent time.Time, took time.Duration)
	SlowAfter   time.Duration
}

func startLoadWith(t *testing.T, tp *Topo, o loadOptions) *load {
	l := &load{opts: o, stop: make(chan struct{}), last: map[int]string{}, start: time.Now()}
	dial := dialIn(t, tp.ClientNS)
	addr := HostPort(tp.VIP, o.Port)
	for i := 0; i < o.Long; i++ {
		// A long-lived client speaks HTTP/1.1 on one TCP connection it
		// dials once: any error on it is a broken connection.
		c, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatalf("long-lived client %d: %v", i, err)
		}
		l.wg.Add(1)
		go func(i int, c net.Conn) {
			defer l.wg.Done()
			defer c.Close()
			br := bufio.NewReader(c)
			get := func() (string, error) {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: vip\r\n\r\n"); err != nil {
					return "", err
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return "", err
				}
				defer resp.Body.Close()
				if _, err := io.Copy(io.Discard, resp.Body); err != nil {
					return "", err
				}
				if resp.StatusCode != 200 {
					return "", fmt.Errorf("status %d", resp.StatusCode)
				}
				return resp.Header.Get("X-Backend"), nil
			}
			l.loop(o.LongEvery, func() bool {
				backend, err := get()
				l.mu.Lock()
				defer l.mu.Unlock()
				if err != nil {
					// The connection is broken: this client stops.
					l.longErrs = append(l.longErrs, fmt.Sprintf("%s long client %d (on %s): %v", time.Now().Format("15:04:05.000"), i, l.last[i], err))
					return false
				}
				if prev := l.last[i]; prev != "" && prev != backend {
					l.longErrs = append(l.longErrs, fmt.Sprintf("long client %d moved from %s to %s", i, prev, backend))
				}
				l.last[i] = backend
				l.longOK++
				return true
			})
		}(i, c)
	}
	ns, err := netns.GetFromName(tp.ClientNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	for range o.Short {
		l.wg.Add(1)
		go l.shortLoop(ns, addr, o.ShortEvery)
	}
	return l
}

// shortLoop sends a request on a new connection every interval, from a
// thread that it moves into network namespace ns once (a thread per
// connection would cost more than the request in the emulated guest).
func (l *load) shortLoop(ns netns.NsHandle, addr string, every time.Duration) {
	defer l.wg.Done()
	// The thread is left in ns and dies with this goroutine (no
	// UnlockOSThread), so no other goroutine runs there.
	runtime.LockOSThread()
	if err := netns.Set(ns); err != nil {
		l.mu.Lock()
		// Counted as a failed request, its records in step with the
		// others'.
		l.shortErr = append(l.shortErr, "enter the client namespace: "+err.Error())
		l.shortFailed = append(l.shortFailed, time.Now())
		l.shortPorts = append(l.shortPorts, 0)
		l.mu.Unlock()
		return
	}
	var port int
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(network, _ string, rc syscall.RawConn) error {
		// Bind to a port of the kernel's choosing before connecting,
		// so that a request whose handshake fails names its port.
		port = 0
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			var sa syscall.Sockaddr = &syscall.SockaddrInet4{}
			if strings.HasSuffix(network, "6") {
				sa = &syscall.SockaddrInet6{}
			}
			if err = syscall.Bind(int(fd), sa); err != nil {
				return
			}
			switch got, gerr := syscall.Getsockname(int(fd)); a := got.(type) {
			case *syscall.SockaddrInet4:
				port = a.Port
			case *syscall.SockaddrInet6:
				port = a.Port
			default:
				err = gerr
			}
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	get := func() error {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	l.loop(every, func() bool {
		sent := time.Now()
		err := get()
		if err != nil && l.opts.OnShortFail != nil {
			l.opts.OnShortFail(port, err)
		}
		if took := time.Since(sent); err == nil && l.opts.OnShortSlow != nil && took >= l.opts.SlowAfter {
			l.opts.OnShortSlow(port, sent, took)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.shortErr = append(l.shortErr, fmt.Sprintf("%s port %d: %v", time.Now().Format("15:04:05.000"), port, err))
			l.shortFailed = append(l.shortFailed, sent)
			l.shortPorts = append(l.shortPorts, port)
			return true
		}
		l.shortOK++
		return true
	})
}

// loop calls f every interval until the load stops or f returns false.
func (l *load) loop(every time.Duration, f func() bool) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			if !f() {
				return
			}
		}
	}
}

// end stops the load and waits for its clients.
func (l *load) end() {
	close(l.stop)
	l.wg.Wait()
	l.took = time.Since(l.start)
}

// finish stops the load and fails the test on any failed request.
func (l *load) finish(t *testing.T, what string) {
	t.Helper()
	l.end()
	t.Logf("%s: %d long-lived and %d short requests", what, l.longOK, l.shortOK)
	if len(l.longErrs)+len(l.shortErr) > 0 {
		t.Errorf("%s: %d long-lived failures %q, %d short failures %q", what, len(l.longErrs), first(l.longErrs), len(l.shortErr), first(l.shortErr))
	}
	if l.opts.Long > 0 && l.longOK == 0 || l.opts.Short > 0 && l.shortOK == 0 {
		t.Errorf("%s: no traffic went through (%d long, %d short)", what, l.longOK, l.shortOK)
	}
}

func first(s []string) []string {
	if len(s) > 3 {
		return s[:3]
	}
	return s
}

// TestVipdReloadUnderLoad: long-lived connections and a steady stream of
// short requests go through the VIP while the config is reloaded 50 times
// with changing backends, then vipd is killed with SIGKILL and restarted,
// then a truncated and a broken file are written. No request may fail.
func TestVipdReloadUnderLoad(t *testing.T) {
	tp := NewTopo(t, "nat 3")
	d := newDaemon(t)
	be := tp.BackendIPs
	cfg := func(i int) string {
		// Weights change every step; every third step the third backend
		// leaves (it drains: its long-lived connections stay) or returns.
		backends := []string{
			fmt.Sprintf("{address = %q\nweight = %d}", be[0], 1+i%3),
			fmt.Sprintf("{address = %q\nweight = %d}", be[1], 1+(i+1)%3),
		}
		if (i/3)%2 == 0 {
			backends = append(backends, be[2])
		}
		return d.header(tp.LBIf, "") + service("web", tp.VIP, 80, `scheduler = "wrr"`, backends...)
	}
	d.write(cfg(0))
	d.start()
	l := startLoad(t, tp, 80, 6, 100*time.Millisecond)
	time.Sleep(time.Second)
	// Each new file is applied before the next is written: by the
	// watcher, or at the latest by the synchronous `vipd reload` (which
	// answers "unchanged" when the watcher was first).
	start := time.Now()
	for i := 1; i <= 50; i++ {
		d.write(cfg(i))
		if r := d.reload(false); r.Err != nil {
			t.Fatalf("reload %d: %s", i, r)
		}
	}
	t.Logf("50 reloads in %v", time.Since(start).Round(time.Millisecond))
	if re := regexp.MustCompile(fmt.Sprintf(`-> %s:80\s+Masq\s+%d\s`, regexp.QuoteMeta(be[0]), 1+50%3)); !re.MatchString(Run(t, "ipvsadm", "-Ln")) {
		t.Errorf("ipvsadm -Ln does not show the last file's weight (%s):\n%s", re, Run(t, "ipvsadm", "-Ln"))
	}
	if n := strings.Count(d.logSince(), "msg=reconciled why=\"file changed\"") + strings.Count(d.logSince(), "msg=reconciled why=\"control socket\""); n < 50 {
		t.Errorf("%d reloads applied, want 50", n)
	}
	// Changes confined to the service go the incremental way: its block
	// parsed alone, a pass over it alone (see lb.Reconciler.ReconcileDelta).
	if n := strings.Count(d.logSince(), "services_parsed=1 full=false"); n < 40 {
		t.Errorf("%d of 50 reloads parsed one block incrementally, want most:\n%s", n, d.logSince())
	}

	// kill -9 and restart under load.
	d.kill()
	time.Sleep(500 * time.Millisecond)
	d.start()
	noKernelChanges(t, d)

	// A truncated file: the guard refuses; a broken one: rejected with
	// file and line.
	d.write("")
	d.waitLog("reload_guard")
	d.write(cfg(50) + "\n[[service]]\nname = \"broken\"\nvip = \"10.0.0.99\"\nport = 80\nbackend = [{ address = \"10.0.2.11\", weight = -1 }]\n")
	d.waitLog("weight -1 is negative")
	mustContain(t, "vipd log", d.logSince(), "vipd.toml:")
	time.Sleep(time.Second)
	l.finish(t, "reloads, restart, bad files")
}

// TestVipdInclude: services kept in included files, under load. A change
// of one file is read, parsed and applied alone (its own file named in
// the reload's log, one block parsed); a new file adds its service and a
// removed one takes it away; a broken file is rejected naming itself,
// and vipd check counts the files. The long-lived connections on the
// other file's service never break.
func TestVipdInclude(t *testing.T) {
	tp := NewTopo(t, "nat 3")
	d := newDaemon(t)
	be := tp.BackendIPs
	dir := filepath.Join(d.dir, "services.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(name, text string) {
		t.Helper()
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	api := func(i int) string {
		// Port 81 forwards to the backends' port 80.
		return service("api", tp.VIP, 81, `scheduler = "wrr"`,
			fmt.Sprintf("{address = \"%s:80\"\nweight = %d}", be[0], 1+i%5), fmt.Sprintf("{address = \"%s:80\"\nweight = %d}", be[1], 1+(i+2)%5))
	}
	put("web.toml", service("web", tp.VIP, 80, `scheduler = "rr"`, be...))
	put("api.toml", api(0))
	d.write("include = [\"services.d/*.toml\"]\n" + d.header(tp.LBIf, ""))
	mustContain(t, "vipd check", Run(t, vipdBin(), "check", d.path), "ok, 2 services in 3 files")
	d.start()
	// wrr 1:3 over two whole rounds.
	if h := tp.Hit(t, url(tp, 81), 8, false); h.Errors != 0 || h.Counts[tp.Backends[0]] != 2 || h.Counts[tp.Backends[1]] != 6 {
		t.Fatalf("wrr 1:3 over 8 requests on the included file's service: %+v", h)
	}
	l := startLoad(t, tp, 80, 6, 100*time.Millisecond)
	time.Sleep(time.Second)

	apiFile := filepath.Join(dir, "api.toml")
	for i := 1; i <= 20; i++ {
		put("api.toml", api(i))
		want := regexp.MustCompile(fmt.Sprintf(`-> %s:80\s+Masq\s+%d\s`, regexp.QuoteMeta(be[0]), 1+i%5))
		Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool {
			return want.MatchString(Run(t, "ipvsadm", "-Ln", "-t", tp.VIP+":81"))
		}, "change %d not in the kernel: %s", i, want)
	}
	if n := strings.Count(d.logSince(), "file="+apiFile); n < 20 {
		t.Errorf("%d reloads named %s, want 20:\n%s", n, apiFile, d.logSince())
	}
	if n := strings.Count(d.logSince(), "services_parsed=1 full=false"); n < 20 {
		t.Errorf("%d of 20 reloads parsed one block incrementally:\n%s", n, d.logSince())
	}

	// A new file, then its removal.
	put("extra.toml", service("extra", tp.VIP, 82, "", be[2]))
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		return strings.Contains(Run(t, "ipvsadm", "-Ln"), tp.VIP+":82")
	}, "the new file's service is not in the kernel")
	if err := os.Remove(filepath.Join(dir, "extra.toml")); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 30*time.Second, 50*time.Millisecond, func() bool {
		return !strings.Contains(Run(t, "ipvsadm", "-Ln"), tp.VIP+":82")
	}, "the removed file's service is still in the kernel")

	// A broken file: rejected, naming itself; the kernel keeps the last
	// good configuration.
	put("api.toml", api(21)+"colour = 1\n")
	d.waitLog(apiFile + ":")
	mustContain(t, "vipd log", d.logSince(), "reload rejected", `unknown key \"service.backend.colour\"`)
	mustContain(t, "ipvsadm -Ln", Run(t, "ipvsadm", "-Ln"), tp.VIP+":81", tp.VIP+":80")
	time.Sleep(time.Second)
	l.finish(t, "included files changed, added, removed, broken")
}

// TestVipdTunnel: tunnel forwarding with each encapsulation the kernel
// offers; the backends decapsulate and answer the client directly.
func TestVipdTunnel(t *testing.T) {
	for _, enc := range []string{"ipip", "gue", "gre"} {
		t.Run(enc, func(t *testing.T) {
			tp := NewTopo(t, "tun 2 "+enc)
			d := newDaemon(t)
			extra := "scheduler = \"rr\"\nforward = \"tunnel\"\ntunnel = \"" + enc + "\""
			if enc == "gue" {
				extra += "\ntunnel_port = 6080"
			}
			d.write(d.header(tp.LBIf, "") + service("tun", tp.VIP, 80, extra, tp.BackendIPs...))
			d.start()
			checkCounts(t, tp.Hit(t, url(tp, 80), 6, false), tp.Backends, 3)
			mustContain(t, "ipvsadm -Ln", Run(t, "ipvsadm", "-Ln"), "Tunnel  1")
			d.stop()
		})
	}
}

// TestVipdIPv6: an IPv6 VIP with IPv6 backends, NAT and rr.
func TestVipdIPv6(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") + service("web6", tp.VIP6, 80, `scheduler = "rr"`, tp.BackendIP6...))
	d.start()
	checkCounts(t, tp.Hit(t, HTTPURL(tp.VIP6, 80, "/"), 10, false), tp.Backends, 5)
	mustContain(t, "ipvsadm -Ln", Run(t, "ipvsadm", "-Ln"), "TCP  ["+tp.VIP6+"]:80 rr")
	mustContain(t, "ip -6 addr show vipd0", Run(t, "ip", "-o", "-6", "addr", "show", "dev", "vipd0"), tp.VIP6+"/128")
	mustContain(t, "forwarding sysctl", Run(t, "cat", "/proc/sys/net/ipv6/conf/all/forwarding"), "1")
}

// TestVipdObservability: after traffic, the metrics' byte and connection
// counters moved; vipd status shows the services; an admin drain takes a
// backend out of rotation until undrained.
func TestVipdObservability(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	// The scrapes below are 5 s apart; stats_interval below that makes
	// each read the kernel's counters anew.
	d.write(d.header(tp.LBIf, "metrics_listen = \"127.0.0.1:9728\"\nstats_interval = \"1s\"") + service("web", tp.VIP, 80, `scheduler = "rr"`, tp.BackendIPs...))
	d.start()
	scrape := func() string {
		resp, err := http.Get("http://127.0.0.1:9728/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	// counter reads one backend's series. The kernel may reuse a
	// destination (with its counters) that an earlier test deleted, so
	// the test compares before and after.
	counter := func(body, metric, be, extra string) int {
		re := regexp.MustCompile(metric + `\{backend="` + regexp.QuoteMeta(be) + `:80",` + extra + `service="web",vip="[^"]*"\} (\d+)`)
		m := re.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no %s for %s in the metrics", metric, be)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	time.Sleep(2500 * time.Millisecond) // IPVS counters move on a 2 s tick
	before := scrape()
	checkCounts(t, tp.Hit(t, url(tp, 80), 10, false), tp.Backends, 5)
	time.Sleep(2500 * time.Millisecond)
	body := scrape()
	for _, be := range tp.BackendIPs {
		if n := counter(body, "vipd_backend_connections_total", be, "") - counter(before, "vipd_backend_connections_total", be, ""); n != 5 {
			t.Errorf("connections of %s moved by %d, want 5", be, n)
		}
		if n := counter(body, "vipd_backend_bytes_total", be, `direction="in",`) - counter(before, "vipd_backend_bytes_total", be, `direction="in",`); n <= 0 {
			t.Errorf("bytes in of %s moved by %d", be, n)
		}
	}
	mustContain(t, "metrics", body, `vipd_reconcile_passes_total{why="start"} 1`, "vipd_garp_sent_total")

	sock := filepath.Join(d.dir, "vipd.sock")
	mustContain(t, "vipd status", Run(t, vipdBin(), "status", "--socket", sock), "web", tp.BackendIPs[0]+":80", tp.BackendIPs[1]+":80")
	mustContain(t, "vipd status -o json", Run(t, vipdBin(), "status", "--socket", sock, "-o", "json"), `"services"`)

	Run(t, vipdBin(), "drain", "--socket", sock, "web", tp.BackendIPs[1]+":80")
	h := tp.Hit(t, url(tp, 80), 6, false)
	if h.Errors != 0 || h.Counts[tp.Backends[0]] != 6 {
		t.Errorf("after draining be2: %+v", h)
	}
	mustContain(t, "vipd status", Run(t, vipdBin(), "status", "--socket", sock), "admin")
	Run(t, vipdBin(), "undrain", "--socket", sock, "web", tp.BackendIPs[1]+":80")
	checkCounts(t, tp.Hit(t, url(tp, 80), 6, false), tp.Backends, 3)
}
