package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/control"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source/kubernetes/apitest"
)

// TestKubernetesProgramMissing: a [kubernetes] section whose provider
// program is not there fails the start, naming the key.
func TestKubernetesProgramMissing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	cfg := fmt.Sprintf(`[daemon]
control_socket = %q
state_dir = %q
metrics_listen = ""

[kubernetes]
kubeconfig = "/nonexistent/kubeconfig"
default_class = true
program = "/nonexistent/vipd-kubernetes"

[[kubernetes.pool]]
name = "test"
addresses = ["192.0.2.200/29"]
`, filepath.Join(dir, "vipd.sock"), filepath.Join(dir, "state")) + twoServices
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	in := launch(t, "vipd", lbtest.New(), launchOptions{path: path})
	in.mustFail("kubernetes: the provider program /nonexistent/vipd-kubernetes ([kubernetes] program)", "no such file or directory")
}

// providerPids returns the pids of the vipd-kubernetes children of this
// process.
func providerPids(t *testing.T) []int {
	t.Helper()
	files, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(s)
			if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && filepath.Base(exe) == kubernetesProgram {
				out = append(out, pid)
			}
		}
	}
	return out
}

// TestDaemonKubernetesProviderCrash runs the daemon with [kubernetes]
// against a real API server: the provider runs without capabilities;
// killed, the daemon keeps its Service in the kernel, says in vipd
// status that the source is out of step, and starts it again, which
// brings the source back in step; the daemon's stop stops it.
func TestDaemonKubernetesProviderCrash(t *testing.T) {
	api := apitest.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.5"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, t.TempDir(), lbtest.New())
	h.write(h.header("") + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
leader_election = false

[kubernetes.node_health]
enabled = false

[[kubernetes.pool]]
name = "test"
addresses = ["192.0.2.200/29"]
`, api.Kubeconfig) + twoServices)
	h.run()
	inKernel := func() bool { return strings.Contains(h.k.Dump(), "service tcp 192.0.2.200:80") }
	h.eventually("the Service in the kernel", inKernel)
	source := func() (string, bool) {
		rep, err := control.Call(h.socket, "GET", "/v1/status")
		if err != nil || rep.Status == nil || len(rep.Status.Sources) != 1 {
			t.Fatalf("status: %v %+v", err, rep)
		}
		return rep.Status.Sources[0].Error, rep.Status.Sources[0].Services == 1
	}
	if e, one := source(); e != "" || !one {
		t.Fatalf("source error %q, one service %v", e, one)
	}

	pids := providerPids(t)
	if len(pids) != 1 {
		t.Fatalf("provider processes %v, want one", pids)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("the provider's status has no %q:\n%s", want, status)
		}
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.eventually("the source out of step", func() bool {
		e, _ := source()
		return strings.Contains(e, "signal: killed") && strings.Contains(e, "restarting in 1s")
	})
	if !inKernel() {
		t.Errorf("the Service left the kernel with the provider:\n%s", h.k.Dump())
	}
	h.eventually("the source in step again", func() bool {
		e, one := source()
		return e == "" && one
	})
	again := providerPids(t)
	if len(again) != 1 || again[0] == pids[0] {
		t.Errorf("provider processes after the restart %v (before %v)", again, pids)
	}
	if !inKernel() {
		t.Errorf("the Service left the kernel:\n%s", h.k.Dump())
	}
	// The daemon's stop waits for the provider.
	h.cancel()
	select {
	case <-h.done:
		h.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not stop")
	}
	if err := syscall.Kill(again[0], 0); err != syscall.ESRCH {
		t.Errorf("the provider %d outlived the daemon: kill 0 = %v", again[0], err)
	}
}
