package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/vipd/vipd/control"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source/kubernetes/apitest"
)

// TestDaemonKubernetesPoolsReload runs the daemon against a real API
// server, on the fake kernel: a reload that adds addresses to a pool
// serves the waiting Service at once, without a restart; one that takes
// out an address a Service holds is refused, naming them, until forced,
// and the Service then moves; the pool metrics follow.
func TestDaemonKubernetesPoolsReload(t *testing.T) {
	api := apitest.Start(t)
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	k := lbtest.New()
	h := newHarness(t, dir, k)
	addr := freeAddr(t)
	config := func(addrs string) string {
		return strings.Replace(h.header(""), `metrics_listen = ""`, `metrics_listen = "`+addr+`"`, 1) + fmt.Sprintf(`
[kubernetes]
kubeconfig = %q
default_class = true
leader_election = false

[[kubernetes.pool]]
name = "test"
addresses = [%s]
`, api.Kubeconfig, addrs) + twoServices
	}
	h.write(config(`"192.0.2.216/31"`))
	h.run()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	metric := func(want string) func() bool {
		return func() bool {
			_, body, err := scrape(ctx, http.DefaultClient, addr)
			return err == nil && strings.Contains(body, want+"\n")
		}
	}
	h.eventually("a and b in the kernel", func() bool {
		d := k.Dump()
		return strings.Contains(d, "service tcp 192.0.2.216:80") && strings.Contains(d, "service tcp 192.0.2.217:80")
	})
	h.eventually("the pool exhausted", metric(`vipd_kubernetes_pool_addresses_free{family="ipv4",pool="test"} 0`))

	reload := func(force bool) string {
		t.Helper()
		path := "/v1/reload"
		if force {
			path += "?force=1"
		}
		rep, err := control.Call(h.socket, "POST", path)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Error
	}
	h.write(config(`"192.0.2.216/31", "192.0.2.220"`))
	if e := reload(false); e != "" {
		t.Fatalf("reload adding an address: %s", e)
	}
	h.eventually("c served from the new address", func() bool { return strings.Contains(k.Dump(), "service tcp 192.0.2.220:80") })
	h.eventually("the pool metrics", metric(`vipd_kubernetes_pool_addresses{family="ipv4",pool="test"} 3`))
	if strings.Contains(h.log.String(), "take effect on restart") {
		t.Errorf("a change of pools asks for a restart:\n%s", h.log)
	}

	h.write(config(`"192.0.2.216", "192.0.2.220", "192.0.2.222"`))
	want := `the new [[kubernetes.pool]] tables take addresses that Services hold out of their pool: pool "test": 192.0.2.217 (held by default/b)`
	if e := reload(false); !strings.Contains(e, want) {
		t.Fatalf("reload removing b's address: %q, want %q", e, want)
	}
	if !strings.Contains(k.Dump(), "service tcp 192.0.2.217:80") {
		t.Fatalf("a refused reload moved b:\n%s", k.Dump())
	}
	if e := reload(true); e != "" {
		t.Fatalf("forced reload: %s", e)
	}
	h.eventually("b moved", func() bool {
		d := k.Dump()
		return strings.Contains(d, "service tcp 192.0.2.222:80") && !strings.Contains(d, "192.0.2.217")
	})
	h.eventually("b's status", func() bool {
		svc, err := cs.CoreV1().Services("default").Get(ctx, "b", metav1.GetOptions{})
		return err == nil && len(svc.Status.LoadBalancer.Ingress) == 1 && svc.Status.LoadBalancer.Ingress[0].IP == "192.0.2.222"
	})
}
