//go:build e2e

// Package e2e holds vipd's real-kernel end-to-end tests. They run only inside
// the qemu test guest booted by test/vm/e2e.sh (root, real IPVS, network
// namespaces); on any other machine the test binary refuses to run.
//
// This file is the harness: running commands, building topologies with
// test/vm/topo.sh (copied to /payload/topo.sh), and counting which backend
// answered each of N requests sent from the client namespace.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// InGuest reports whether this process runs in the vipd test guest.
func InGuest() bool { return os.Getenv("VIPD_VM") == "1" }

// ExpectFail reports whether the rig's failure-path self-test asked for a
// deliberately wrong expectation (VIPD_E2E_EXPECT_FAIL=1, see
// test/vm/selftest.sh): the run must then fail.
func ExpectFail() bool { return os.Getenv("VIPD_E2E_EXPECT_FAIL") == "1" }

// TopoScript is the path of topo.sh in the guest.
func TopoScript() string {
	if p := os.Getenv("VIPD_TOPO"); p != "" {
		return p
	}
	return "/payload/topo.sh"
}

// Payload is the directory the host's payload is unpacked to in the guest.
func Payload() string { return "/payload" }

// CmdTimeout bounds every command the harness runs.
var CmdTimeout = 60 * time.Second

// Result is what a command did.
type Result struct {
	Cmd    string
	Stdout string
	Stderr string
	Err    error
}

func (r Result) String() string {
	return fmt.Sprintf("$ %s\n(err: %v)\nstdout:\n%s\nstderr:\n%s", r.Cmd, r.Err, r.Stdout, r.Stderr)
}

// Exec runs name with args and returns what happened; it never fails the test.
func Exec(name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(context.Background(), CmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v: %w", CmdTimeout, err)
	}
	return Result{Cmd: strings.Join(append([]string{name}, args...), " "), Stdout: out.String(), Stderr: errb.String(), Err: err}
}

// Run runs a command and fails the test if it fails. It returns stdout.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	r := Exec(name, args...)
	if r.Err != nil {
		t.Fatalf("command failed:\n%s", r)
	}
	return r.Stdout
}

// Sh runs a bash script with topo.sh sourced (so topo_* functions and the
// current topology's TOPO_* variables are available) and fails the test if it
// fails. It returns stdout.
func Sh(t testing.TB, script string) string {
	t.Helper()
	return Run(t, "bash", "-c", "source "+TopoScript()+" || exit 1\nset -e\n"+script)
}

// ShExec is Sh without failing the test.
func ShExec(script string) Result {
	return Exec("bash", "-c", "source "+TopoScript()+" || exit 1\n"+script)
}

// Topo is a topology built by topo.sh. Fields mirror its TOPO_* variables.
type Topo struct {
	Kind       string
	VIP, VIP6  string // service addresses (vipd or the test puts them on the LB)
	LBIP       string // LB address facing the client
	LBIP6      string
	LBIf       string // LB interface facing the client
	ClientNS   string
	ClientIP   string
	ClientIP6  string
	Backends   []string // namespace names = the names the servers answer with
	BackendIPs []string
	BackendIP6 []string
}

// NewTopo builds a topology with topo.sh ("nat 2", "nat 3 onearm", "dr 2",
// "tun 2 gue", "k8s 3 0 onearm", ...) and tears it down (IPVS, iptables,
// nft, ipsets too) when the test ends.
func NewTopo(t testing.TB, spec string) *Topo {
	t.Helper()
	// A previous test that crashed may have left one behind.
	ShExec("topo_down")
	out := Sh(t, "topo_"+spec+" >&2\ntopo_env")
	t.Cleanup(func() {
		if r := ShExec("topo_down"); r.Err != nil {
			t.Errorf("topo_down failed:\n%s", r)
		}
	})
	env := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	tp := &Topo{
		Kind:       env["TOPO_KIND"],
		VIP:        env["TOPO_VIP"],
		VIP6:       env["TOPO_VIP6"],
		LBIP:       env["TOPO_LB_IP"],
		LBIP6:      env["TOPO_LB_IP6"],
		LBIf:       env["TOPO_LB_IF"],
		ClientNS:   env["TOPO_CLIENT_NS"],
		ClientIP:   env["TOPO_CLIENT_IP"],
		ClientIP6:  env["TOPO_CLIENT_IP6"],
		Backends:   strings.Fields(env["TOPO_BACKENDS"]),
		BackendIPs: strings.Fields(env["TOPO_BACKEND_IPS"]),
		BackendIP6: strings.Fields(env["TOPO_BACKEND_IP6S"]),
	}
	if tp.VIP == "" || len(tp.Backends) == 0 {
		t.Fatalf("topo_%s printed no usable environment:\n%s", spec, out)
	}
	return tp
}

// AddVIP puts the VIPs on a dummy interface in the LB, standing in for vipd
// in tests that program IPVS directly.
func (tp *Topo) AddVIP(t testing.TB) {
	t.Helper()
	Sh(t, "topo_vip_add")
}

// InClient runs a command in the client namespace and fails the test if it
// fails. It returns stdout.
func (tp *Topo) InClient(t testing.TB, name string, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"netns", "exec", tp.ClientNS, name}, args...)...)
}

// InNS runs a command in namespace ns (a backend's name, or the client's)
// and fails the test if it fails. It returns stdout.
func (tp *Topo) InNS(t testing.TB, ns, name string, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// BackendDown makes backend's /healthz answer 503 (it keeps serving /);
// BackendUp undoes it.
func (tp *Topo) BackendDown(t testing.TB, backend string) {
	t.Helper()
	Sh(t, "topo_backend_down "+backend)
}
func (tp *Topo) BackendUp(t testing.TB, backend string) {
	t.Helper()
	Sh(t, "topo_backend_up "+backend)
}

// BackendStop kills backend's server (connections are refused);
// BackendStart starts it again and waits until it listens.
func (tp *Topo) BackendStop(t testing.TB, backend string) {
	t.Helper()
	Sh(t, "topo_backend_stop "+backend)
}
func (tp *Topo) BackendStart(t testing.TB, backend string) {
	t.Helper()
	Sh(t, "topo_backend_start "+backend)
}

// TopoState is topo.sh's state directory in the guest (TOPO_STATE).
const TopoState = "/run/vipd-rig"

// NodeHealthDown makes node's kube-proxy health stand-in (topo_k8s, port
// 10256) answer 503 on /healthz, or with a port the one topo_node_healthz
// started there (a Service's healthCheckNodePort); NodeHealthUp undoes it.
// Both act at once, as topo_node_health_down/up do, without a shell: a
// test that times what follows measures from the change itself.
func (tp *Topo) NodeHealthDown(t testing.TB, node string, port ...int) {
	t.Helper()
	if err := os.WriteFile(nodeHealthFile(node, port), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}
func (tp *Topo) NodeHealthUp(t testing.TB, node string, port ...int) {
	t.Helper()
	if err := os.Remove(nodeHealthFile(node, port)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
}

// nodeHealthFile is the file whose existence makes a health stand-in
// answer 503 (see topo_node_health_down).
func nodeHealthFile(node string, port []int) string {
	if len(port) > 0 {
		return fmt.Sprintf("%s/%s-health-%d.down", TopoState, node, port[0])
	}
	return fmt.Sprintf("%s/%s-health.down", TopoState, node)
}

// NodeHealthz starts a health server in node's namespace on port, as
// kube-proxy serves a Service's healthCheckNodePort (stopped by topo_down).
func (tp *Topo) NodeHealthz(t testing.TB, node string, port int) {
	t.Helper()
	Sh(t, fmt.Sprintf("topo_node_healthz %s %d", node, port))
}

// LinkDown cuts the link of namespace name (its bridge port vNAME goes
// down, its eth0 loses carrier); LinkUp restores it. As topo_link_down/up,
// with one ip command.
func (tp *Topo) LinkDown(t testing.TB, name string) {
	t.Helper()
	Run(t, "ip", "link", "set", "v"+name, "down")
}
func (tp *Topo) LinkUp(t testing.TB, name string) {
	t.Helper()
	Run(t, "ip", "link", "set", "v"+name, "up")
}

// Hits is what N requests from the client namespace got.
type Hits struct {
	OK           int            `json:"ok"`
	Errors       int            `json:"errors"`
	Counts       map[string]int `json:"counts"`   // backend name -> answers
	Sequence     []string       `json:"sequence"` // answer order; "!error" for failures
	ErrorSamples []string       `json:"error_samples"`
}

// Hit sends n requests from the client namespace, each on a new connection,
// to an HTTP URL, or with udp=true to HOST:PORT as UDP datagrams.
func (tp *Topo) Hit(t testing.TB, target string, n int, udp bool, extra ...string) Hits {
	t.Helper()
	args := []string{"netns", "exec", tp.ClientNS, Payload() + "/bin/rignode", "hit", "-n", fmt.Sprint(n)}
	if udp {
		args = append(args, "-udp")
	}
	args = append(args, extra...)
	args = append(args, target)
	out := Run(t, "ip", args...)
	var h Hits
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("rignode hit printed %q: %v", out, err)
	}
	return h
}

// HTTPURL is http://ADDR:PORT/PATH with IPv6 addresses bracketed.
func HTTPURL(addr string, port int, path string) string {
	return fmt.Sprintf("http://%s/%s", HostPort(addr, port), strings.TrimPrefix(path, "/"))
}

// HostPort joins an address and a port, bracketing IPv6 addresses.
func HostPort(addr string, port int) string {
	if strings.Contains(addr, ":") {
		return fmt.Sprintf("[%s]:%d", addr, port)
	}
	return fmt.Sprintf("%s:%d", addr, port)
}

// Eventually retries cond every interval until it returns true or timeout
// passes, then fails the test with msg.
func Eventually(t testing.TB, timeout, interval time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(interval)
	}
}

// GuestMain is the TestMain body for guest-only packages: it refuses to run
// anywhere but in the test guest, where the tests reconfigure the network.
func GuestMain(m interface{ Run() int }) int {
	if !InGuest() {
		fmt.Fprintln(os.Stderr, "e2e: these tests change kernel network state and run only inside the vipd test guest: use test/vm/e2e.sh (make e2e)")
		return 2
	}
	return m.Run()
}
