package kubernetes_test

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// runWatched runs a source against cs until the test ends, and returns
// once its informers watch EndpointSlices: the fake clientset's watches
// miss what changes between an informer's list and its watch.
func runWatched(t *testing.T, cs *fake.Clientset, sink *fakeSink) *kubernetes.Source {
	t.Helper()
	return runWatchedAs(t, cs, cs, kubernetes.Options{Pools: pools("192.0.2.0/28")}, sink)
}

// runWatchedAs is runWatched with options, and with client: cs, or a
// client that wraps it.
func runWatchedAs(t *testing.T, cs *fake.Clientset, client clientset.Interface, opts kubernetes.Options, sink *fakeSink) *kubernetes.Source {
	t.Helper()
	watching := make(chan struct{}, 1)
	cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		select {
		case watching <- struct{}{}:
		default:
		}
		return false, nil, nil
	})
	src := runSource(t, opts, client, sink)
	select {
	case <-watching:
		time.Sleep(50 * time.Millisecond) // the reactor runs just before the watch starts
	case <-time.After(timeout):
		t.Fatal("the source does not watch EndpointSlices")
	}
	return src
}

// lastSnap returns the sink's last snapshot and how many there were.
func (f *fakeSink) lastSnap() (source.Snapshot, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.snaps) == 0 {
		return source.Snapshot{}, 0
	}
	return f.snaps[len(f.snaps)-1], len(f.snaps)
}

// TestSliceChangesIncremental: a change of EndpointSlices alone is
// published as a change of its Service's virtual services alone
// (Snapshot.Changed names them, nothing else moves), a change that
// changes no backend publishes nothing, and after a run of such changes
// the snapshot is the one a full sync of the same objects makes (a
// source started afresh).
func TestSliceChangesIncremental(t *testing.T) {
	node := func(name, addr string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}}}
	}
	endpoints := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	http := port("http", corev1.ProtocolTCP, 80)
	np := func(p int32) corev1.ServicePort {
		sp := http
		sp.NodePort = p
		return sp
	}
	// The statuses hold the addresses already: no write changes a
	// Service, which would ask for a full sync.
	at := func(svc *corev1.Service, ip string) *corev1.Service {
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		return svc
	}
	local := at(stamped(fakeService("local", nil, np(30080)), 2), "192.0.2.1")
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	httpPort := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	onNode := func(es *discoveryv1.EndpointSlice, nodes ...string) *discoveryv1.EndpointSlice {
		for i := range es.Endpoints {
			es.Endpoints[i].NodeName = ptr.To(nodes[i])
		}
		return es
	}
	cs := fake.NewClientset([]runtime.Object{
		node("n1", "10.0.0.1"), node("n2", "10.0.0.2"),
		at(stamped(fakeService("ep", endpoints, http), 1), "192.0.2.0"),
		fakeSlice("ep", "ep-1", httpPort, "10.244.0.1", "10.244.0.2"),
		local,
		onNode(fakeSlice("local", "local-1", httpPort, "10.244.1.1"), "n1"),
		at(stamped(fakeService("cluster", nil, np(30081)), 3), "192.0.2.2"),
		onNode(fakeSlice("cluster", "cluster-1", httpPort, "10.244.2.1"), "n1"),
		at(stamped(fakeService("other", endpoints, http), 4), "192.0.2.3"),
		fakeSlice("other", "other-1", httpPort, "10.244.3.1"),
	}...)
	sink := &fakeSink{}
	runWatched(t, cs, sink)
	waitSnap(t, sink, `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.1:8080/1 10.244.0.2:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.1:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1`)
	if snap, _ := sink.lastSnap(); snap.Changed != nil {
		t.Errorf("the first snapshot names changed services: %v", snap.Changed)
	}

	api := cs.DiscoveryV1().EndpointSlices("ns")
	ctx := context.Background()
	// step makes a change and waits for the snapshot, which must name
	// the one service changed.
	step := func(what, changed, want string, change func() error) {
		t.Helper()
		_, before := sink.lastSnap()
		if err := change(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		waitSnap(t, sink, want)
		snap, n := sink.lastSnap()
		if n != before+1 {
			t.Errorf("%s: %d snapshots, want one", what, n-before)
		}
		if !slices.Equal(snap.Changed, []string{changed}) {
			t.Errorf("%s: changed %q, want %q", what, snap.Changed, changed)
		}
	}
	step("endpoints replaced, one terminating", "k8s/ns/ep/http/tcp", `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.2:8080/0 10.244.0.3:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.1:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1`, func() error {
		es := fakeSlice("ep", "ep-1", httpPort, "10.244.0.2", "10.244.0.3")
		es.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		_, err := api.Update(ctx, es, metav1.UpdateOptions{})
		return err
	})
	step("the local endpoint moves to n2", "k8s/ns/local/http/tcp", `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.2:8080/0 10.244.0.3:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.2:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1`, func() error {
		_, err := api.Update(ctx, onNode(fakeSlice("local", "local-1", httpPort, "10.244.1.2"), "n2"), metav1.UpdateOptions{})
		return err
	})
	step("a second slice", "k8s/ns/ep/http/tcp", `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.2:8080/0 10.244.0.3:8080/1 10.244.0.9:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.2:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1`, func() error {
		_, err := api.Create(ctx, fakeSlice("ep", "ep-2", httpPort, "10.244.0.9"), metav1.CreateOptions{})
		return err
	})
	step("the first slice deleted", "k8s/ns/ep/http/tcp", `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.9:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.2:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.1:8080/1`, func() error {
		return api.Delete(ctx, "ep-1", metav1.DeleteOptions{})
	})
	// The endpoints of an externalTrafficPolicy Cluster Service do not
	// choose its backends: its change publishes nothing, and the next
	// snapshot is other's change alone.
	step("a change that changes no backend, then another", "k8s/ns/other/http/tcp", `
k8s/ns/cluster/http/tcp tcp 192.0.2.2:80 -> 10.0.0.1:30081/1 10.0.0.2:30081/1
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.9:8080/1
k8s/ns/local/http/tcp tcp 192.0.2.1:80 -> 10.0.0.2:30080/1
k8s/ns/other/http/tcp tcp 192.0.2.3:80 -> 10.244.3.2:8080/1`, func() error {
		if _, err := api.Update(ctx, onNode(fakeSlice("cluster", "cluster-1", httpPort, "10.244.2.2"), "n2"), metav1.UpdateOptions{}); err != nil {
			return err
		}
		_, err := api.Update(ctx, fakeSlice("other", "other-1", httpPort, "10.244.3.2"), metav1.UpdateOptions{})
		return err
	})

	// A full sync of the same objects makes the same snapshot.
	got, _ := sink.lastSnap()
	fresh := &fakeSink{}
	runWatched(t, cs, fresh)
	waitSnap(t, fresh, dump(got))
	want, _ := fresh.lastSnap()
	got.Changed = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the incremental snapshot differs from a full sync's:\n%+v\nwant\n%+v", got, want)
	}
}

// TestStatusEchoNoFullSync: a change of a Service's status alone that
// says what the leader holds (the echo of its own write) makes no full
// sync, while one that says something else does, and the leader writes
// its address back.
func TestStatusEchoNoFullSync(t *testing.T) {
	endpoints := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	httpPort := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	svc := stamped(fakeService("ep", endpoints, port("http", corev1.ProtocolTCP, 80)), 1)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.0", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
	cs := fake.NewClientset(svc, fakeSlice("ep", "ep-1", httpPort, "10.244.0.1"))
	sink := &fakeSink{}
	src := runWatched(t, cs, sink)
	waitSnap(t, sink, `
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.1:8080/1`)
	ctx := context.Background()
	services := cs.CoreV1().Services("ns")
	setStatus := func(ip string) {
		t.Helper()
		cur, err := services.Get(ctx, "ep", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
		if ip == "192.0.2.0" {
			// An echo changes something vipd does not read.
			cur.Status.Conditions = append(cur.Status.Conditions, metav1.Condition{Type: "Echo", Status: metav1.ConditionTrue, Reason: "Test"})
		}
		if _, err := services.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := kubernetes.FullSyncs(src)
	setStatus("192.0.2.0")
	// Then a change of EndpointSlices, synced after the status: its
	// snapshot says the status was taken.
	time.Sleep(100 * time.Millisecond)
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(ctx, fakeSlice("ep", "ep-1", httpPort, "10.244.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, sink, `
k8s/ns/ep/http/tcp tcp 192.0.2.0:80 -> 10.244.0.2:8080/1`)
	if n := kubernetes.FullSyncs(src) - before; n != 0 {
		t.Errorf("the echo of the status made %d full syncs", n)
	}
	// Someone else's address in the status: a full sync, which writes
	// the held address back.
	setStatus("192.0.2.9")
	deadline := time.Now().Add(timeout)
	for {
		cur, err := services.Get(ctx, "ep", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ing := cur.Status.LoadBalancer.Ingress; len(ing) == 1 && ing[0].IP == "192.0.2.0" && kubernetes.FullSyncs(src) > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the status says %v after %d full syncs, want 192.0.2.0 back", cur.Status.LoadBalancer.Ingress, kubernetes.FullSyncs(src)-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
