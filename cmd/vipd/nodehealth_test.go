package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source/kubernetes/apitest"
)

// nodeHealthServer is a node's kube-proxy health endpoint on loopback:
// 200 at /healthz, or 503 while down; hits counts the probes.
type nodeHealthServer struct {
	down atomic.Bool
	hits atomic.Int64
}

func (s *nodeHealthServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.hits.Add(1)
	if r.URL.Path != "/healthz" || s.down.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ok"))
}

// listenNodes listens on the same port of every address, and serves
// each with its own nodeHealthServer.
func listenNodes(t *testing.T, addrs ...string) (port int, servers []*nodeHealthServer) {
	t.Helper()
	for try := 0; try < 20; try++ {
		var ls []net.Listener
		for _, a := range addrs {
			l, err := net.Listen("tcp", net.JoinHostPort(a, fmt.Sprint(port)))
			if err != nil {
				break
			}
			ls = append(ls, l)
			port = l.Addr().(*net.TCPAddr).Port
		}
		if len(ls) < len(addrs) {
			for _, l := range ls {
				l.Close()
			}
			port = 0
			continue
		}
		for _, l := range ls {
			s := &nodeHealthServer{}
			srv := &http.Server{Handler: s}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			servers = append(servers, s)
		}
		return port, servers
	}
	t.Fatalf("no port free on all of %v", addrs)
	return 0, nil
}

// TestDaemonKubernetesNodeHealth runs the daemon against a real API
// server, on the fake kernel, with two Nodes on loopback whose health
// endpoints answer as kube-proxy's: a Node whose endpoint fails leaves the
// Service's backends within fall probes and comes back when it passes;
// when every Node fails they all stay (quorum 1).
func TestDaemonKubernetesNodeHealth(t *testing.T) {
	api := apitest.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	addrs := []string{"127.0.0.3", "127.0.0.4"}
	hport, nodes := listenNodes(t, addrs...)
	for i, a := range addrs {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i+1)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	h := newHarness(t, t.TempDir(), lbtest.New())
	h.write(h.header("") + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
leader_election = false

[kubernetes.node_health]
port = %d
interval = "200ms"
timeout = "100ms"
rise = 1
fall = 2

[[kubernetes.pool]]
name = "test"
addresses = ["192.0.2.216/30"]
`, api.Kubeconfig, hport) + twoServices)
	h.run()

	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np := svc.Spec.Ports[0].NodePort
	has := func(addr string) bool {
		return strings.Contains(h.k.Dump(), fmt.Sprintf("-> %s:%d masq weight=1", addr, np))
	}
	h.eventually("both Nodes in the kernel", func() bool { return has("127.0.0.3") && has("127.0.0.4") })
	h.eventually("both Nodes probed", func() bool { return nodes[0].hits.Load() > 0 && nodes[1].hits.Load() > 0 })

	nodes[0].down.Store(true)
	start := time.Now()
	h.eventually("n1 out", func() bool { return !has("127.0.0.3") && has("127.0.0.4") })
	t.Logf("n1 left %v after its health endpoint failed (fall 2 × 200 ms)", time.Since(start).Round(time.Millisecond))
	nodes[0].down.Store(false)
	h.eventually("n1 back", func() bool { return has("127.0.0.3") && has("127.0.0.4") })

	// Every Node fails: the probe is more likely wrong than every Node,
	// and both stay. Wait for each to be probed fall times and more.
	nodes[0].down.Store(true)
	nodes[1].down.Store(true)
	from := []int64{nodes[0].hits.Load(), nodes[1].hits.Load()}
	h.eventually("both Nodes probed down 4 times", func() bool {
		return nodes[0].hits.Load() >= from[0]+4 && nodes[1].hits.Load() >= from[1]+4
	})
	if !has("127.0.0.3") || !has("127.0.0.4") {
		t.Fatalf("every Node failed and some left:\n%s", h.k.Dump())
	}
	// One comes back: the other leaves.
	nodes[1].down.Store(false)
	h.eventually("n1 out, n2 serving", func() bool { return !has("127.0.0.3") && has("127.0.0.4") })
}
