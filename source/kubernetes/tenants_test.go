package kubernetes_test

import (
	"testing"
	"time"

	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// lastHealth returns the health checks of the last snapshot, by virtual
// service name.
func (f *fakeSink) lastHealth() map[string][]health.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]health.Spec{}
	if len(f.snaps) == 0 {
		return out
	}
	for name, h := range f.snaps[len(f.snaps)-1].Health {
		for _, s := range h.Checks {
			out[name] = append(out[name], s)
		}
	}
	return out
}

// TestCheckAnnotationConfined runs the source against the fake
// clientset: a vipd.io/check that would aim the load balancer away from
// the backend (another address, the load balancer's mark, its files) is
// refused with a BadAnnotation Event naming the key, and the Service is
// served unchecked; a check port is taken where the backends are the
// pods, and refused where they are the Nodes, whose other services it
// would reach.
func TestCheckAnnotationConfined(t *testing.T) {
	http := port("http", corev1.ProtocolTCP, 80)
	endpoints := func(check string) map[string]string {
		return map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints, kubernetes.AnnotationCheck: check}
	}
	slice := func(svc string) *discoveryv1.EndpointSlice {
		return fakeSlice(svc, svc+"-1", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}, "10.244.0.1")
	}
	sink := &fakeSink{}
	cs := runFake(t, kubernetes.Options{Pools: pools("192.0.2.0/29")}, sink,
		stamped(fakeService("meta", endpoints(`{ type = "http", address = "169.254.169.254", path = "/latest/meta-data/" }`), http), 1), slice("meta"),
		stamped(fakeService("mark", endpoints(`{ type = "tcp", mark = 4096 }`), http), 2), slice("mark"),
		stamped(fakeService("ca", endpoints(`{ type = "https", ca_file = "/dev/zero" }`), http), 3), slice("ca"),
		stamped(fakeService("np", map[string]string{kubernetes.AnnotationCheck: `{ type = "tcp", port = 10250 }`}, http), 4),
		stamped(fakeService("ok", endpoints(`{ type = "http", port = 8081, path = "/healthz" }`), http), 5), slice("ok"),
	)
	// A refused annotation leaves the Service its last valid settings:
	// here the defaults (nodeport mode, and no Nodes).
	waitSnap(t, sink, `
k8s/ns/ca/http/tcp tcp 192.0.2.2:80 ->
k8s/ns/mark/http/tcp tcp 192.0.2.1:80 ->
k8s/ns/meta/http/tcp tcp 192.0.2.0:80 ->
k8s/ns/np/http/tcp tcp 192.0.2.3:80 ->
k8s/ns/ok/http/tcp tcp 192.0.2.4:80 -> 10.244.0.1:8080/1`)
	const why = ": an annotation's check probes the backend's address and sets nothing of the load balancer's own"
	waitFakeEvent(t, cs, "meta", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "address" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "mark", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "mark" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "ca", kubernetes.ReasonBadAnnotation, `vipd.io/check: key "ca_file" is not allowed in an annotation`+why)
	waitFakeEvent(t, cs, "np", kubernetes.ReasonBadAnnotation,
		`vipd.io/check: port 10250: in nodeport mode the backends are the Nodes, and a check port would reach their other services (leave port out: the check probes the node port)`)
	deadline := time.Now().Add(timeout)
	for {
		h := sink.lastHealth()
		ok := h["k8s/ns/ok/http/tcp"]
		if len(h) == 1 && len(ok) == 1 && ok[0].Port == 8081 && !ok[0].Addr.IsValid() && ok[0].HTTP.Path == "/healthz" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health checks %+v, want only ok's, on port 8081", h)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
