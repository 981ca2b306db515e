package kubernetes_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// gated is client-go's fake clientset whose Service status writes wait at
// a gate, as they would behind a slow API server or the client's rate
// limit: until the gate opens, or their context ends. (A reactor of the
// fake cannot wait: the fake holds its lock while a reactor runs, which
// would hold up every other request, watches included.)
type gated struct {
	*fake.Clientset
	gate chan struct{}
	open sync.Once

	mu sync.Mutex
	// entered counts the writes that reached the gate, and left those
	// that went on or gave up.
	entered, left int
}

func newGated(objs ...runtime.Object) *gated {
	return &gated{Clientset: fake.NewClientset(objs...), gate: make(chan struct{})}
}

// release opens the gate for good.
func (g *gated) release() { g.open.Do(func() { close(g.gate) }) }

func (g *gated) counts() (entered, left int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered, g.left
}

// waitCounts waits until ok holds of the counts.
func (g *gated) waitCounts(t *testing.T, what string, ok func(entered, left int) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		e, l := g.counts()
		if ok(e, l) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d status writes reached the gate, %d left it", what, e, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (g *gated) CoreV1() typedcorev1.CoreV1Interface {
	return gatedCore{CoreV1Interface: g.Clientset.CoreV1(), g: g}
}

type gatedCore struct {
	typedcorev1.CoreV1Interface
	g *gated
}

func (c gatedCore) Services(ns string) typedcorev1.ServiceInterface {
	return gatedServices{ServiceInterface: c.CoreV1Interface.Services(ns), g: c.g}
}

type gatedServices struct {
	typedcorev1.ServiceInterface
	g *gated
}

func (s gatedServices) UpdateStatus(ctx context.Context, svc *corev1.Service, opts metav1.UpdateOptions) (*corev1.Service, error) {
	s.g.mu.Lock()
	s.g.entered++
	s.g.mu.Unlock()
	defer func() {
		s.g.mu.Lock()
		s.g.left++
		s.g.mu.Unlock()
	}()
	select {
	case <-s.g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.ServiceInterface.UpdateStatus(ctx, svc, opts)
}

// recordLogs returns a logger that keeps its messages in in (see
// instance.waitLog), and the count of a message.
func recordLogs(in *instance) *slog.Logger {
	return slog.New(logRecorder{in: in, next: slog.DiscardHandler})
}

func (in *instance) logged(msg string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for _, m := range in.logs {
		if m == msg {
			n++
		}
	}
	return n
}

// waitStatusOf waits until the status of ns/name in cs holds ip alone and
// ok holds of the Service.
func waitStatusOf(t *testing.T, cs *fake.Clientset, name, ip string, ok func(*corev1.Service) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		svc, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("services"), "ns", name)
		if err != nil {
			t.Fatal(err)
		}
		s := svc.(*corev1.Service)
		if ing := s.Status.LoadBalancer.Ingress; len(ing) == 1 && ing[0].IP == ip && ok(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ns/%s: status %v, annotations %v; want %s", name, s.Status.LoadBalancer.Ingress, s.Annotations, ip)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStatusWritesDoNotHoldUpSlices: while the status writes of a start
// wait for the API server, a change of EndpointSlices of a Service
// already published reaches the data plane; the writes land once the
// server takes them.
func TestStatusWritesDoNotHoldUpSlices(t *testing.T) {
	endpoints := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	httpPort := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	g := newGated(
		stamped(fakeService("a", endpoints, port("http", corev1.ProtocolTCP, 80)), 1),
		fakeSlice("a", "a-1", httpPort, "10.244.0.1"),
		stamped(fakeService("b", endpoints, port("http", corev1.ProtocolTCP, 80)), 2),
		fakeSlice("b", "b-1", httpPort, "10.244.1.1"),
	)
	t.Cleanup(g.release) // before the source stops: Cleanup runs last first
	sink := &fakeSink{}
	runWatchedAs(t, g.Clientset, g, kubernetes.Options{Pools: pools("192.0.2.0/28")}, sink)
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 -> 10.244.0.1:8080/1
k8s/ns/b/http/tcp tcp 192.0.2.1:80 -> 10.244.1.1:8080/1`)
	g.waitCounts(t, "the writes of the start", func(e, l int) bool { return e == 2 && l == 0 })

	ctx := context.Background()
	if _, err := g.Clientset.DiscoveryV1().EndpointSlices("ns").Update(ctx, fakeSlice("a", "a-1", httpPort, "10.244.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, sink, `
k8s/ns/a/http/tcp tcp 192.0.2.0:80 -> 10.244.0.2:8080/1
k8s/ns/b/http/tcp tcp 192.0.2.1:80 -> 10.244.1.1:8080/1`)
	if e, l := g.counts(); e != 2 || l != 0 {
		t.Errorf("%d status writes reached the gate and %d left it before it opened; want 2 and 0", e, l)
	}

	g.release()
	anyStatus := func(*corev1.Service) bool { return true }
	waitStatusOf(t, g.Clientset, "a", "192.0.2.0", anyStatus)
	waitStatusOf(t, g.Clientset, "b", "192.0.2.1", anyStatus)
}

// TestStatusWriteRetried: a status write that fails on a conflict (the
// Service changed under it) is made again from the Service the informer
// holds after the change, not from the stale one, and the failure is
// logged once.
func TestStatusWriteRetried(t *testing.T) {
	endpoints := map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	httpPort := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	cs := fake.NewClientset(
		stamped(fakeService("ep", endpoints, port("http", corev1.ProtocolTCP, 80)), 1),
		fakeSlice("ep", "ep-1", httpPort, "10.244.0.1"),
	)
	services := corev1.SchemeGroupVersion.WithResource("services")
	var failed atomic.Bool
	cs.PrependReactor("update", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" || failed.Swap(true) {
			return false, nil, nil
		}
		// Someone changes the Service first: vipd's object is stale.
		obj, err := cs.Tracker().Get(services, "ns", "ep")
		if err != nil {
			return true, nil, err
		}
		svc := obj.(*corev1.Service).DeepCopy()
		svc.Annotations["example.com/changed"] = "yes"
		if err := cs.Tracker().Update(services, svc, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "services"}, "ep", errors.New("the object has been modified"))
	})
	in := &instance{id: "a"}
	sink := &fakeSink{}
	runWatchedAs(t, cs, cs, kubernetes.Options{Pools: pools("192.0.2.0/28"), Logger: recordLogs(in)}, sink)

	// A write from the stale object would drop the annotation.
	waitStatusOf(t, cs, "ep", "192.0.2.0", func(s *corev1.Service) bool { return s.Annotations["example.com/changed"] == "yes" })
	in.waitLog(t, "kubernetes: assigned", 1)
	if n := in.logged("kubernetes: writing status failed"); n != 1 {
		t.Errorf("the failed write logged %d warnings, want 1", n)
	}
	if n := in.logged("kubernetes: assigned"); n != 1 {
		t.Errorf("%d writes logged as assigned, want 1", n)
	}
}

// TestTermEndDropsWrites: when the leader's term ends while status writes
// are queued, those in flight are cancelled and the queued ones dropped:
// no write is sent after the term ended, and no failure is logged as one
// to retry.
func TestTermEndDropsWrites(t *testing.T) {
	var objs []runtime.Object
	for i := range 12 {
		objs = append(objs, stamped(fakeService("s"+string(rune('a'+i)), nil, port("http", corev1.ProtocolTCP, 80)), i+1))
	}
	g := newGated(objs...)
	t.Cleanup(g.release)
	var refuse atomic.Bool
	g.Clientset.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, errors.New("lease refused")
		}
		return false, nil, nil
	})
	in := &instance{id: "a"}
	_, stop := startSource(t, kubernetes.Options{
		Pools: pools("192.0.2.0/28"), Logger: recordLogs(in),
		LeaderElection: ptr.To(true), Identity: "a",
		LeaseDuration: testLease, RenewDeadline: testRenew, RetryPeriod: testRetry,
	}, g, &fakeSink{})
	t.Cleanup(stop)
	in.waitLog(t, msgLeading, 1)
	// Fewer writes than Services are in flight: the others wait in the
	// queue.
	g.waitCounts(t, "the writes of the term", func(e, l int) bool { return e > 0 })

	refuse.Store(true)
	in.waitLog(t, msgLost, 1)
	g.waitCounts(t, "the writes in flight", func(e, l int) bool { return e == l })
	sent, _ := g.counts()
	if sent >= len(objs) {
		t.Fatalf("%d writes in flight, want fewer than %d", sent, len(objs))
	}
	g.release()
	stop()

	if e, _ := g.counts(); e != sent {
		t.Errorf("%d status writes sent after the term ended", e-sent)
	}
	list, err := g.Clientset.CoreV1().Services("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range list.Items {
		if ing := svc.Status.LoadBalancer.Ingress; len(ing) > 0 {
			t.Errorf("%s: status %v written", svc.Name, ing)
		}
	}
	if n := in.logged("kubernetes: writing status failed"); n != 0 {
		t.Errorf("%d writes of the ended term logged as failures to retry", n)
	}
}
