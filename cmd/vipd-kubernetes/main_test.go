package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/process"
)

// unprivileged checks the Cap* and NoNewPrivs lines of status (one or
// more /proc/PID/status texts), which must be there.
func unprivileged(t *testing.T, status string) {
	t.Helper()
	seen := map[string]int{}
	for line := range strings.Lines(status) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		v = strings.TrimSpace(v)
		switch k {
		case "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb":
			seen[k]++
			if v != "0000000000000000" {
				t.Errorf("%s is %s", k, v)
			}
		case "NoNewPrivs":
			seen[k]++
			if v != "1" {
				t.Errorf("NoNewPrivs is %s", v)
			}
		}
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs"} {
		if seen[k] == 0 {
			t.Errorf("no %s in:\n%s", k, status)
		}
	}
}

// TestProgramUnprivileged builds vipd-kubernetes as make does (without
// cgo), starts it as the daemon does, with its socket, and reads its
// threads' status once it has said hello: no capability, no_new_privs,
// still uid 0.
func TestProgramUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool builds the program: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "vipd-kubernetes")
	build := exec.Command(goTool, "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "parent"), os.NewFile(uintptr(fds[1]), "child")
	defer parent.Close()
	cmd := exec.Command(bin)
	cmd.ExtraFiles = []*os.File{child}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	defer cmd.Wait()
	defer cmd.Process.Kill()
	conn, err := net.FileConn(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	m, err := process.NewConn(conn, conn, 0).Read()
	if err != nil || m.Type != process.TypeHello {
		t.Fatalf("no hello: %+v, %v; stderr: %s", m, err, stderr.String())
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "task", "*", "status"))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("tasks: %v, %v", tasks, err)
	}
	var all strings.Builder
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
		if !strings.Contains(string(b), "\nUid:\t0\t0\t0\t0\n") {
			t.Errorf("%s: not uid 0:\n%s", f, b)
		}
	}
	unprivileged(t, all.String())
	// The socket's end stops it.
	conn.Close()
	parent.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(stderr.String(), "read the parent's hello") {
			t.Errorf("exit %v, stderr %q", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Error("the program did not exit at the end of its socket")
	}
}

// TestRefusesWithoutSocket: started by hand, without the daemon's
// socket, the program says what it is for.
func TestRefusesWithoutSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool builds the program: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "vipd-kubernetes")
	build := exec.Command(goTool, "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is started by vipd run") {
		t.Errorf("by hand: %v, %s", err, out)
	}
}

// TestOptionsOf: the wire's options and the source's have the same
// fields, but the source's logger and the wire's log level, and every
// field crosses with its value.
func TestOptionsOf(t *testing.T) {
	wire, src := reflect.TypeFor[process.Options](), reflect.TypeFor[kubernetes.Options]()
	names := func(t reflect.Type, but string) []string {
		var out []string
		for f := range t.Fields() {
			if f.Name != but {
				out = append(out, f.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	if w, s := names(wire, "LogLevel"), names(src, "Logger"); !slices.Equal(w, s) {
		t.Errorf("the wire's options have fields %v, the source's %v", w, s)
	}
	le := false
	in := process.Options{Kubeconfig: "/k", LoadBalancerClass: "c", DefaultClass: true, Namespaces: []string{"a", "b"},
		ServiceSelector: "app=web", Backends: "endpoints", MetalLBAnnotations: true, NoPacketFilter: true, LeaderElection: &le,
		LeaseNamespace: "ns", LeaseName: "ln", Identity: "id", LeaseDuration: 20 * time.Second, RenewDeadline: 9 * time.Second,
		RetryPeriod: 3 * time.Second, APIQPS: 7.5, APIBurst: 9, LogLevel: 4,
		NodeHealth: &process.NodeHealth{Port: 10256, Path: "/healthz", Local: true, Interval: time.Second, Timeout: time.Second / 2, Rise: 2, Fall: 3},
		Pools:      []process.Pool{{Name: "p", Addresses: []string{"192.0.2.0/29"}, AutoAssign: &le, AvoidNetworkBroadcast: true, Namespaces: []string{"x"}, ServiceSelector: "s", ShareAcrossNamespaces: true, SNAT: true}}}
	out, err := optionsOf(in)
	if err != nil {
		t.Fatal(err)
	}
	iv, ov := reflect.ValueOf(in), reflect.ValueOf(out)
	for f := range wire.Fields() {
		if f.Name == "LogLevel" {
			continue
		}
		a, _ := json.Marshal(iv.FieldByName(f.Name).Interface())
		b, _ := json.Marshal(ov.FieldByName(f.Name).Interface())
		if string(a) != string(b) || iv.FieldByName(f.Name).IsZero() {
			t.Errorf("%s: %s became %s", f.Name, a, b)
		}
	}
}

// TestPoolsOf: the pools and Node probes of a configuration reach the
// source in the provider program as the configuration gives them, with
// the defaults the configuration filled in.
func TestPoolsOf(t *testing.T) {
	cfg, err := config.Parse("t.toml", []byte(`[kubernetes]
default_class = true
[kubernetes.node_health]
port = 10256
local = true
[[kubernetes.pool]]
name = "a"
addresses = ["192.0.2.0/29"]
auto_assign = false
snat = true
[[kubernetes.pool]]
name = "b"
addresses = ["2001:db8::/120"]
namespaces = ["web"]
`))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := optionsOf(process.OptionsOf(cfg))
	if err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	wantPools := []kubernetes.Pool{
		{Name: "a", Addresses: []string{"192.0.2.0/29"}, AutoAssign: &no, SNAT: true},
		{Name: "b", Addresses: []string{"2001:db8::/120"}, AutoAssign: &yes, Namespaces: []string{"web"}},
	}
	if !reflect.DeepEqual(opts.Pools, wantPools) {
		t.Errorf("pools %+v, want %+v", opts.Pools, wantPools)
	}
	nh := cfg.Kubernetes.NodeHealth
	wantHealth := &kubernetes.NodeHealth{Port: 10256, Path: nh.Path, Local: true, Interval: nh.Interval,
		Timeout: nh.Timeout, Rise: nh.Rise, Fall: nh.Fall}
	if !reflect.DeepEqual(opts.NodeHealth, wantHealth) || nh.Interval == 0 || nh.Path == "" {
		t.Errorf("node health %+v, want %+v", opts.NodeHealth, wantHealth)
	}
	if opts.LeaderElection == nil || *opts.LeaderElection != cfg.Kubernetes.LeaderElection || opts.NoPacketFilter == cfg.Daemon.ManageIPTables {
		t.Errorf("leader election %v, no packet filter %v", opts.LeaderElection, opts.NoPacketFilter)
	}
}
