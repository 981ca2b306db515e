package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/kubernetes/apitest"
	"github.com/vipd/vipd/source/process"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// fakeSink records what the source publishes and reports. It refuses the
// services that refuse names. Every snapshot crosses the wire to the
// daemon (source/process) first, and must come out the same.
type fakeSink struct {
	mu      sync.Mutex
	snaps   []source.Snapshot
	reports []error
	refuse  map[string]bool
	// wire is the daemon's side of the wire: the last snapshot taken,
	// the base of the next delta.
	wire struct {
		base  *source.Snapshot
		index map[string]int
	}
}

// crossWire sends snap over the wire as vipd-kubernetes does (a delta
// after a snapshot taken), and returns what the daemon makes of it.
func (f *fakeSink) crossWire(snap source.Snapshot) (source.Snapshot, error) {
	p, err := process.PublishOf(1, snap, nil, f.wire.base != nil)
	if err != nil {
		return source.Snapshot{}, err
	}
	var buf bytes.Buffer
	c := process.NewConn(&buf, &buf, 0)
	if err := c.Write(&process.Message{Type: process.TypePublish, Publish: p}); err != nil {
		return source.Snapshot{}, err
	}
	m, err := c.Read()
	if err != nil {
		return source.Snapshot{}, err
	}
	got, err := m.Publish.Snapshot(f.wire.base, f.wire.index)
	if err != nil {
		return source.Snapshot{}, err
	}
	if !p.Delta {
		f.wire.index = map[string]int{}
		for i := range got.Services {
			f.wire.index[got.Services[i].Name] = i
		}
	}
	f.wire.base = &got
	return got, nil
}

func (f *fakeSink) Publish(ctx context.Context, snap source.Snapshot) ([]source.Conflict, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	got, err := f.crossWire(snap)
	if err != nil {
		panic(fmt.Sprintf("the snapshot does not cross the wire: %v", err))
	}
	if !reflect.DeepEqual(got, snap) {
		panic(fmt.Sprintf("the snapshot changed on the wire:\n got %+v\nwant %+v", got, snap))
	}
	// The source may reuse the Services of a snapshot once it has
	// published the next: keep a copy.
	snap.Services = slices.Clone(snap.Services)
	f.snaps = append(f.snaps, snap)
	var out []source.Conflict
	for _, vs := range snap.Services {
		if f.refuse[vs.Name] {
			out = append(out, source.Conflict{Service: vs.Name, Key: vs.Service.Key, Owner: "file", OwnerService: "web"})
		}
	}
	return out, nil
}

func (f *fakeSink) Report(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, err)
}

// last returns the dump of the last snapshot and how many there were.
func (f *fakeSink) last() (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.snaps) == 0 {
		return "(nothing published)", 0
	}
	return dump(f.snaps[len(f.snaps)-1]), len(f.snaps)
}

// dump formats a snapshot one line per service, sorted.
func dump(snap source.Snapshot) string {
	var lines []string
	for _, vs := range snap.Services {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s", vs.Name, vs.Service.Key)
		if vs.Service.Persistent != 0 {
			fmt.Fprintf(&b, " persistent=%d/%d", vs.Service.Persistent, vs.Service.Netmask)
		}
		if vs.VIP != vs.Service.Key.Addr || !vs.Announce {
			fmt.Fprintf(&b, " vip=%s announce=%t", vs.VIP, vs.Announce)
		}
		b.WriteString(" ->")
		for _, d := range vs.Backends {
			fmt.Fprintf(&b, " %s/%d", d.Addr, d.Weight)
			if d.Forward != lb.Masq {
				fmt.Fprintf(&b, "/%s", d.Forward)
			}
		}
		lines = append(lines, b.String())
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// env is one API server shared by the subtests of TestKubernetes; each
// subtest works in its own namespace with its own pools.
type env struct {
	srv *apitest.Server
	cs  *clientset.Clientset
}

func TestKubernetes(t *testing.T) {
	srv := apitest.Start(t)
	e := &env{srv: srv, cs: clientset.NewForConfigOrDie(srv.Config)}
	t.Run("NodePort", e.testNodePort)
	t.Run("Endpoints", e.testEndpoints)
	t.Run("Lifecycle", e.testLifecycle)
	t.Run("Exhausted", e.testExhausted)
	t.Run("Sharing", e.testSharing)
	t.Run("BadAnnotation", e.testBadAnnotation)
	t.Run("Conflict", e.testConflict)
	t.Run("DualStack", e.testDualStack)
	t.Run("Families", e.testFamilies)
	t.Run("Terminating", e.testTerminating)
	t.Run("Restart", e.testRestart)
	t.Run("Class", e.testClass)
	t.Run("Selector", e.testSelector)
	t.Run("Tenants", e.testTenants)
	t.Run("PoolsLive", e.testPoolsLive)
	t.Run("NodeHealth", e.testNodeHealth)
	// Last: it stops the API server.
	t.Run("APILoss", e.testAPILoss)
}

const timeout = 30 * time.Second

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// namespace creates a namespace named after the test.
func (e *env) namespace(t *testing.T) string {
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if _, err := e.cs.CoreV1().Namespaces().Create(ctxOf(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// run runs a source until the test ends; stop stops it early.
func (e *env) run(t *testing.T, opts kubernetes.Options, sink *fakeSink) (stop func()) {
	t.Helper()
	return e.runWith(t, opts, sink, nil)
}

// runWith is run with set, when not nil, changing the source before it
// runs.
func (e *env) runWith(t *testing.T, opts kubernetes.Options, sink *fakeSink, set func(*kubernetes.Source)) (stop func()) {
	t.Helper()
	opts.Kubeconfig = e.srv.Kubeconfig
	if opts.LoadBalancerClass == "" {
		opts.DefaultClass = true
	}
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	src, err := kubernetes.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(src)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitSnap waits until the sink's last snapshot dumps as want.
func waitSnap(t *testing.T, sink *fakeSink, want string) {
	t.Helper()
	waitSnapWithin(t, sink, want, timeout)
}

// waitSnapWithin waits up to d until the sink's last snapshot is want.
func waitSnapWithin(t *testing.T, sink *fakeSink, want string, d time.Duration) {
	t.Helper()
	want = strings.TrimSpace(want)
	deadline := time.Now().Add(d)
	for {
		got, _ := sink.last()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot:\n%s\nwant:\n%s", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitStatus waits until the Service's status shows want (IPs,
// comma-separated; "" for none), each with ipMode VIP, and returns it.
func (e *env) waitStatus(t *testing.T, ns, name, want string) *corev1.Service {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		svc, err := e.cs.CoreV1().Services(ns).Get(ctxOf(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var ips []string
		modes := true
		for _, in := range svc.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
			modes = modes && in.IPMode != nil && *in.IPMode == corev1.LoadBalancerIPModeVIP
		}
		got := strings.Join(ips, ",")
		if got == want && modes {
			return svc
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s status %q (ipMode VIP on all: %t), want %q", ns, name, got, modes, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEvent waits for a warning Event with reason on the Service whose
// message contains text.
func (e *env) waitEvent(t *testing.T, ns, name, reason, text string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		evs, err := e.cs.CoreV1().Events(ns).List(ctxOf(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, text) && ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.Kind == "Service" {
				return
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event containing %q on %s/%s; events: %q", reason, text, ns, name, seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lbService(ns, name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: ports},
	}
}

func port(name string, proto corev1.Protocol, p int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: p}
}

func (e *env) create(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	got, err := e.cs.CoreV1().Services(svc.Namespace).Create(ctxOf(t), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// update gets the Service, applies f and updates it.
func (e *env) update(t *testing.T, ns, name string, f func(*corev1.Service)) *corev1.Service {
	t.Helper()
	svc, err := e.cs.CoreV1().Services(ns).Get(ctxOf(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f(svc)
	got, err := e.cs.CoreV1().Services(ns).Update(ctxOf(t), svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// node creates a Node with internal addresses, Ready or not, deleted when
// the test ends.
func (e *env) node(t *testing.T, name string, ready bool, addrs ...string) {
	t.Helper()
	n, err := e.cs.CoreV1().Nodes().Create(ctxOf(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	if _, err := e.cs.CoreV1().Nodes().UpdateStatus(ctxOf(t), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ep is an endpoint of a test EndpointSlice.
type ep struct {
	addr, node                  string
	ready, serving, terminating bool
}

// slice creates or replaces an EndpointSlice of the Service.
func (e *env) slice(t *testing.T, ns, svc, name string, family discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...ep) {
	t.Helper()
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: family,
		Ports:       ports,
	}
	for _, p := range eps {
		x := discoveryv1.Endpoint{
			Addresses:  []string{p.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(p.ready), Serving: ptr.To(p.serving), Terminating: ptr.To(p.terminating)},
		}
		if p.node != "" {
			x.NodeName = ptr.To(p.node)
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	c := e.cs.DiscoveryV1().EndpointSlices(ns)
	old, err := c.Get(ctxOf(t), name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = c.Update(ctxOf(t), es, metav1.UpdateOptions{})
	} else {
		_, err = c.Create(ctxOf(t), es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func epPort(name string, proto corev1.Protocol, p int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr.To(name), Protocol: ptr.To(proto), Port: ptr.To(p)}
}

func pools(addrs ...string) []kubernetes.Pool {
	return []kubernetes.Pool{{Name: "default", Addresses: addrs}}
}

func (e *env) testNodePort(t *testing.T) {
	ns := e.namespace(t)
	e.node(t, "np-a", true, "10.0.0.1")
	e.node(t, "np-b", true, "10.0.0.2")
	e.node(t, "np-c", false, "10.0.0.3")
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.8/30")}, sink)
	svc := e.create(t, lbService(ns, "web", port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	np, np2 := svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort
	e.waitStatus(t, ns, "web", "192.0.2.8")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/web/dns/udp udp 192.0.2.8:53 -> 10.0.0.1:%[3]d/1 10.0.0.2:%[3]d/1
k8s/%[1]s/web/http/tcp tcp 192.0.2.8:80 -> 10.0.0.1:%[2]d/1 10.0.0.2:%[2]d/1`, ns, np, np2))

	// externalTrafficPolicy Local: only the nodes with a ready endpoint.
	e.update(t, ns, "web", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/web/dns/udp udp 192.0.2.8:53 ->
k8s/%[1]s/web/http/tcp tcp 192.0.2.8:80 ->`, ns))
	e.slice(t, ns, "web", "web-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
		ep{addr: "10.244.1.5", node: "np-b", ready: true, serving: true},
		ep{addr: "10.244.0.5", node: "np-a", ready: false, serving: true, terminating: true},
		ep{addr: "10.244.2.5", node: "np-c", ready: true, serving: true})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/web/dns/udp udp 192.0.2.8:53 -> 10.0.0.2:%[3]d/1
k8s/%[1]s/web/http/tcp tcp 192.0.2.8:80 -> 10.0.0.2:%[2]d/1`, ns, np, np2))

	// Session affinity: persistence with its timeout.
	e.update(t, ns, "web", func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
	})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/web/dns/udp udp 192.0.2.8:53 persistent=600/32 -> 10.0.0.2:%[3]d/1
k8s/%[1]s/web/http/tcp tcp 192.0.2.8:80 persistent=600/32 -> 10.0.0.2:%[2]d/1`, ns, np, np2))
}

func (e *env) testEndpoints(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.16/30"), Backends: kubernetes.BackendsEndpoints}, sink)
	e.create(t, lbService(ns, "app", port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	e.waitStatus(t, ns, "app", "192.0.2.16")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/app/dns/udp udp 192.0.2.16:53 ->
k8s/%[1]s/app/http/tcp tcp 192.0.2.16:80 ->`, ns))

	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("dns", corev1.ProtocolUDP, 5353)}
	e.slice(t, ns, "app", "app-1", discoveryv1.AddressTypeIPv4, ports,
		ep{addr: "10.244.0.1", ready: true, serving: true},
		ep{addr: "10.244.0.2", serving: true, terminating: true},
		ep{addr: "10.244.0.3"})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/app/dns/udp udp 192.0.2.16:53 -> 10.244.0.1:5353/1 10.244.0.2:5353/0
k8s/%[1]s/app/http/tcp tcp 192.0.2.16:80 -> 10.244.0.1:8080/1 10.244.0.2:8080/0`, ns))

	// A second slice adds an endpoint; the terminating one goes, the
	// unready one becomes ready.
	e.slice(t, ns, "app", "app-2", discoveryv1.AddressTypeIPv4, ports[:1], ep{addr: "10.244.1.1", ready: true, serving: true})
	e.slice(t, ns, "app", "app-1", discoveryv1.AddressTypeIPv4, ports,
		ep{addr: "10.244.0.1", ready: true, serving: true},
		ep{addr: "10.244.0.3", ready: true, serving: true})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/app/dns/udp udp 192.0.2.16:53 -> 10.244.0.1:5353/1 10.244.0.3:5353/1
k8s/%[1]s/app/http/tcp tcp 192.0.2.16:80 -> 10.244.0.1:8080/1 10.244.0.3:8080/1 10.244.1.1:8080/1`, ns))

	// Per-Service mode by annotation.
	e.update(t, ns, "app", func(s *corev1.Service) {
		s.Annotations = map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsNodePort}
	})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/app/dns/udp udp 192.0.2.16:53 ->
k8s/%[1]s/app/http/tcp tcp 192.0.2.16:80 ->`, ns))
}

func (e *env) testLifecycle(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.24")}, sink)
	e.create(t, lbService(ns, "a", port("http", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "a", "192.0.2.24")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%s/a/http/tcp tcp 192.0.2.24:80 ->`, ns))
	e.create(t, lbService(ns, "b", port("http", corev1.ProtocolTCP, 80)))
	e.waitEvent(t, ns, "b", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")

	// A type change away from LoadBalancer clears a's status and gives
	// its address to b.
	e.update(t, ns, "a", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	})
	e.waitStatus(t, ns, "a", "")
	e.waitStatus(t, ns, "b", "192.0.2.24")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%s/b/http/tcp tcp 192.0.2.24:80 ->`, ns))

	// Back to LoadBalancer: no address is free.
	e.update(t, ns, "a", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
	e.waitEvent(t, ns, "a", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")
	// Deleting b releases the address to a.
	if err := e.cs.CoreV1().Services(ns).Delete(ctxOf(t), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, ns, "a", "192.0.2.24")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%s/a/http/tcp tcp 192.0.2.24:80 ->`, ns))
}

func (e *env) testExhausted(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: []kubernetes.Pool{
		{Name: "small", Addresses: []string{"192.0.2.32/31"}},
		{Name: "manual", Addresses: []string{"198.51.100.0/24"}, AutoAssign: ptr.To(false)},
	}}, sink)
	for _, name := range []string{"s1", "s2", "s3"} {
		e.create(t, lbService(ns, name, port("", corev1.ProtocolTCP, 80)))
	}
	e.waitStatus(t, ns, "s1", "192.0.2.32")
	e.waitStatus(t, ns, "s2", "192.0.2.33")
	e.waitEvent(t, ns, "s3", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv4 address")
	e.waitStatus(t, ns, "s3", "")
	// A pool by annotation, and a specific address by spec.loadBalancerIP.
	e.update(t, ns, "s3", func(s *corev1.Service) { s.Annotations = map[string]string{kubernetes.AnnotationPool: "manual"} })
	e.waitStatus(t, ns, "s3", "198.51.100.0")
	e.update(t, ns, "s3", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "198.51.100.77" })
	e.waitStatus(t, ns, "s3", "198.51.100.77")
	svc := lbService(ns, "s4", port("", corev1.ProtocolTCP, 80))
	svc.Annotations = map[string]string{kubernetes.AnnotationAddresses: "198.51.100.77"}
	e.create(t, svc)
	e.waitEvent(t, ns, "s4", kubernetes.ReasonAddressTaken, "198.51.100.77 is used by Service "+ns+"/s3")
	svc = lbService(ns, "s5", port("", corev1.ProtocolTCP, 80))
	svc.Annotations = map[string]string{kubernetes.AnnotationAddresses: "203.0.113.1"}
	e.create(t, svc)
	e.waitEvent(t, ns, "s5", kubernetes.ReasonAddressNotInPool, "203.0.113.1 is not in any pool")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/s1/80/tcp tcp 192.0.2.32:80 ->
k8s/%[1]s/s2/80/tcp tcp 192.0.2.33:80 ->
k8s/%[1]s/s3/80/tcp tcp 198.51.100.77:80 ->`, ns))
}

func (e *env) testSharing(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.40/30")}, sink)
	shared := func(name string, p int32) *corev1.Service {
		svc := lbService(ns, name, port("", corev1.ProtocolTCP, p))
		svc.Annotations = map[string]string{kubernetes.AnnotationSharingKey: "front"}
		return svc
	}
	e.create(t, shared("http", 80))
	e.waitStatus(t, ns, "http", "192.0.2.40")
	e.create(t, shared("https", 443))
	e.waitStatus(t, ns, "https", "192.0.2.40")
	// Same key, a port in use: its own address.
	e.create(t, shared("http2", 80))
	e.waitStatus(t, ns, "http2", "192.0.2.41")
	// No key: never a shared address, even asked for by name.
	svc := lbService(ns, "other", port("", corev1.ProtocolTCP, 8080))
	svc.Annotations = map[string]string{kubernetes.AnnotationAddresses: "192.0.2.40"}
	e.create(t, svc)
	e.waitEvent(t, ns, "other", kubernetes.ReasonAddressTaken, "192.0.2.40 is used by Service "+ns+"/http")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/http/80/tcp tcp 192.0.2.40:80 ->
k8s/%[1]s/http2/80/tcp tcp 192.0.2.41:80 ->
k8s/%[1]s/https/443/tcp tcp 192.0.2.40:443 ->`, ns))
}

func (e *env) testBadAnnotation(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	stop := e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.48/30")}, sink)
	e.create(t, lbService(ns, "a", port("", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "a", "192.0.2.48")
	// A bad request keeps what the Service has, and says why.
	e.update(t, ns, "a", func(s *corev1.Service) {
		s.Annotations = map[string]string{kubernetes.AnnotationAddresses: "192.0.2.300", kubernetes.AnnotationBackends: "pods"}
	})
	e.waitEvent(t, ns, "a", kubernetes.ReasonBadAnnotation, `vipd.io/addresses: "192.0.2.300" is not an IP address`)
	e.waitEvent(t, ns, "a", kubernetes.ReasonBadAnnotation, `vipd.io/backends "pods" must be "nodeport" or "endpoints"`)
	e.waitStatus(t, ns, "a", "192.0.2.48")
	want := fmt.Sprintf(`k8s/%s/a/80/tcp tcp 192.0.2.48:80 ->`, ns)
	waitSnap(t, sink, want)
	// A lasting problem is one Event, not one per sync.
	for i := range 3 {
		e.update(t, ns, "a", func(s *corev1.Service) { s.Labels = map[string]string{"sync": fmt.Sprint(i)} })
	}
	e.create(t, lbService(ns, "b", port("", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "b", "192.0.2.49")
	evs, err := e.cs.CoreV1().Events(ns).List(ctxOf(t), metav1.ListOptions{FieldSelector: "involvedObject.name=a,reason=" + kubernetes.ReasonBadAnnotation})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Count != 1 {
			t.Errorf("event %q was recorded %d times", ev.Message, ev.Count)
		}
	}
	// A restart keeps the Service with a bad request as it was.
	stop()
	sink2 := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.48/30")}, sink2)
	waitSnap(t, sink2, want+fmt.Sprintf("\nk8s/%s/b/80/tcp tcp 192.0.2.49:80 ->", ns))
	e.waitStatus(t, ns, "a", "192.0.2.48")
	e.update(t, ns, "a", func(s *corev1.Service) { s.Annotations = map[string]string{kubernetes.AnnotationPool: "nope"} })
	e.waitEvent(t, ns, "a", kubernetes.ReasonBadAnnotation, `vipd.io/pool: no pool is named "nope"`)
}

func (e *env) testConflict(t *testing.T) {
	ns := e.namespace(t)
	name := fmt.Sprintf("k8s/%s/a/http/tcp", ns)
	sink := &fakeSink{refuse: map[string]bool{name: true}}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.56/30")}, sink)
	e.create(t, lbService(ns, "a", port("http", corev1.ProtocolTCP, 80)))
	e.waitEvent(t, ns, "a", kubernetes.ReasonConflict, fmt.Sprintf(`service %q: tcp 192.0.2.56:80 is taken by file's service "web"`, name))
	// The source asks again until the owner lets go.
	_, n := sink.last()
	sink.mu.Lock()
	sink.refuse = nil
	sink.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		if _, m := sink.last(); m > n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Publish after a refusal")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) testDualStack(t *testing.T) {
	ns := e.namespace(t)
	e.node(t, "ds-a", true, "10.0.1.1", "fd00::1")
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.64/30", "2001:db8::/126")}, sink)
	svc := lbService(ns, "ds", port("http", corev1.ProtocolTCP, 80))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}
	svc = e.create(t, svc)
	np := svc.Spec.Ports[0].NodePort
	e.waitStatus(t, ns, "ds", "2001:db8::,192.0.2.64")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/ds/http/tcp tcp 192.0.2.64:80 -> 10.0.1.1:%[2]d/1
k8s/%[1]s/ds/http/tcp/ipv6 tcp [2001:db8::]:80 -> [fd00::1]:%[2]d/1`, ns, np))
	e.update(t, ns, "ds", func(s *corev1.Service) {
		s.Annotations = map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	})
	e.slice(t, ns, "ds", "ds-6", discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
		ep{addr: "fd00:244::1", ready: true, serving: true})
	e.slice(t, ns, "ds", "ds-4", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
		ep{addr: "10.244.9.1", ready: true, serving: true})
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/ds/http/tcp tcp 192.0.2.64:80 -> 10.244.9.1:8080/1
k8s/%[1]s/ds/http/tcp/ipv6 tcp [2001:db8::]:80 -> [fd00:244::1]:8080/1`, ns))
}

// testTerminating: a rollout of one replica (KEP-1669). While the new pod
// is not ready, the old one, terminating but serving, carries the traffic
// (endpoints mode), and its node stays in (nodeport mode with
// externalTrafficPolicy Local); once the new one is ready, the old one
// drains and its node leaves.
func (e *env) testTerminating(t *testing.T) {
	ns := e.namespace(t)
	e.node(t, "term-a", true, "10.0.2.1")
	e.node(t, "term-b", true, "10.0.2.2")
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.128/30")}, sink)
	svc := lbService(ns, "one", port("http", corev1.ProtocolTCP, 80))
	svc.Annotations = map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	e.create(t, svc)
	e.waitStatus(t, ns, "one", "192.0.2.128")
	svc = lbService(ns, "local", port("http", corev1.ProtocolTCP, 80))
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	np := e.create(t, svc).Spec.Ports[0].NodePort
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}
	rollout := []ep{
		{addr: "10.244.2.1", node: "term-a", serving: true, terminating: true},
		{addr: "10.244.2.2", node: "term-b"},
	}
	e.slice(t, ns, "one", "one-1", discoveryv1.AddressTypeIPv4, ports, rollout...)
	e.slice(t, ns, "local", "local-1", discoveryv1.AddressTypeIPv4, ports, rollout...)
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/local/http/tcp tcp 192.0.2.129:80 -> 10.0.2.1:%[2]d/1
k8s/%[1]s/one/http/tcp tcp 192.0.2.128:80 -> 10.244.2.1:8080/1`, ns, np))
	rollout[1].ready, rollout[1].serving = true, true
	e.slice(t, ns, "one", "one-1", discoveryv1.AddressTypeIPv4, ports, rollout...)
	e.slice(t, ns, "local", "local-1", discoveryv1.AddressTypeIPv4, ports, rollout...)
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/local/http/tcp tcp 192.0.2.129:80 -> 10.0.2.2:%[2]d/1
k8s/%[1]s/one/http/tcp tcp 192.0.2.128:80 -> 10.244.2.1:8080/0 10.244.2.2:8080/1`, ns, np))
}

// testFamilies: ipFamilyPolicy and the order of ipFamilies, with an
// IPv6 pool of one address.
func (e *env) testFamilies(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.112/29", "2001:db8:35::5")}, sink)
	withPolicy := func(name string, policy corev1.IPFamilyPolicy, families ...corev1.IPFamily) *corev1.Service {
		svc := lbService(ns, name, port("http", corev1.ProtocolTCP, 80))
		svc.Spec.IPFamilyPolicy = ptr.To(policy)
		svc.Spec.IPFamilies = families
		return e.create(t, svc)
	}
	// SingleStack: one address, of the cluster's first family.
	if svc := withPolicy("single", corev1.IPFamilyPolicySingleStack); !slices.Equal(svc.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol}) {
		t.Fatalf("the API server gave SingleStack ipFamilies %v", svc.Spec.IPFamilies)
	}
	e.waitStatus(t, ns, "single", "192.0.2.112")
	// PreferDualStack: both families, in the order of ipFamilies.
	withPolicy("prefer", corev1.IPFamilyPolicyPreferDualStack, corev1.IPv6Protocol, corev1.IPv4Protocol)
	e.waitStatus(t, ns, "prefer", "2001:db8:35::5,192.0.2.113")
	// The IPv6 pool is exhausted: PreferDualStack gets IPv4 alone, with
	// an Event; RequireDualStack gets nothing.
	withPolicy("prefer4", corev1.IPFamilyPolicyPreferDualStack, corev1.IPv6Protocol, corev1.IPv4Protocol)
	e.waitStatus(t, ns, "prefer4", "192.0.2.114")
	e.waitEvent(t, ns, "prefer4", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv6 address (ipFamilyPolicy PreferDualStack: served by ipv4 alone)")
	withPolicy("require", corev1.IPFamilyPolicyRequireDualStack)
	e.waitEvent(t, ns, "require", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv6 address")
	e.waitStatus(t, ns, "require", "")
	// Requested addresses must agree with the policy.
	svc := lbService(ns, "require-one", port("http", corev1.ProtocolTCP, 80))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyRequireDualStack)
	svc.Spec.LoadBalancerIP = "192.0.2.119"
	e.create(t, svc)
	e.waitEvent(t, ns, "require-one", kubernetes.ReasonBadAnnotation, "ipFamilyPolicy RequireDualStack needs an address of each family, and spec.loadBalancerIP asks for 192.0.2.119 alone")
	svc = lbService(ns, "single-six", port("http", corev1.ProtocolTCP, 80))
	svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	svc.Annotations = map[string]string{kubernetes.AnnotationAddresses: "2001:db8:35::5"}
	e.create(t, svc)
	e.waitEvent(t, ns, "single-six", kubernetes.ReasonBadAnnotation, "2001:db8:35::5 is ipv6, which is not among the Service's ipFamilies")
	e.waitStatus(t, ns, "require-one", "")
	e.waitStatus(t, ns, "single-six", "")
	if err := e.cs.CoreV1().Services(ns).Delete(ctxOf(t), "prefer4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Dual-stack to SingleStack keeps the first family and releases the
	// other.
	e.update(t, ns, "prefer", func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack) })
	e.waitStatus(t, ns, "prefer", "2001:db8:35::5")
	// The IPv6 address freed goes to the waiting RequireDualStack Service.
	if err := e.cs.CoreV1().Services(ns).Delete(ctxOf(t), "prefer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, ns, "require", "192.0.2.115,2001:db8:35::5")
	// SingleStack to PreferDualStack adds the second family once there is
	// one to be had: here when RequireDualStack to SingleStack releases
	// it.
	svc = e.update(t, ns, "single", func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack) })
	if !slices.Equal(svc.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}) {
		t.Fatalf("the API server gave PreferDualStack ipFamilies %v", svc.Spec.IPFamilies)
	}
	e.waitEvent(t, ns, "single", kubernetes.ReasonPoolExhausted, "no pool with auto_assign has a free ipv6 address (ipFamilyPolicy PreferDualStack: served by ipv4 alone)")
	e.waitStatus(t, ns, "single", "192.0.2.112")
	e.update(t, ns, "require", func(s *corev1.Service) { s.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack) })
	e.waitStatus(t, ns, "require", "192.0.2.115")
	e.waitStatus(t, ns, "single", "192.0.2.112,2001:db8:35::5")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/require/http/tcp tcp 192.0.2.115:80 ->
k8s/%[1]s/single/http/tcp tcp 192.0.2.112:80 ->
k8s/%[1]s/single/http/tcp/ipv6 tcp [2001:db8:35::5]:80 ->`, ns))
}

func (e *env) testRestart(t *testing.T) {
	ns := e.namespace(t)
	opts := kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.72/29")}
	sink := &fakeSink{}
	stop := e.run(t, opts, sink)
	for _, name := range []string{"a", "b", "c"} {
		e.create(t, lbService(ns, name, port("", corev1.ProtocolTCP, 80)))
	}
	before := map[string]string{}
	for i, name := range []string{"a", "b", "c"} {
		svc := e.waitStatus(t, ns, name, fmt.Sprintf("192.0.2.%d", 72+i))
		before[name] = svc.ResourceVersion
	}
	want := fmt.Sprintf(`
k8s/%[1]s/a/80/tcp tcp 192.0.2.72:80 ->
k8s/%[1]s/b/80/tcp tcp 192.0.2.73:80 ->
k8s/%[1]s/c/80/tcp tcp 192.0.2.74:80 ->`, ns)
	waitSnap(t, sink, want)
	stop()

	// While vipd is down: b goes, d comes.
	if err := e.cs.CoreV1().Services(ns).Delete(ctxOf(t), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(t, lbService(ns, "d", port("", corev1.ProtocolTCP, 80)))

	sink2 := &fakeSink{}
	stop = e.run(t, opts, sink2)
	// d gets an address nobody holds; a and c keep theirs, unwritten.
	e.waitStatus(t, ns, "d", "192.0.2.73")
	waitSnap(t, sink2, fmt.Sprintf(`
k8s/%[1]s/a/80/tcp tcp 192.0.2.72:80 ->
k8s/%[1]s/c/80/tcp tcp 192.0.2.74:80 ->
k8s/%[1]s/d/80/tcp tcp 192.0.2.73:80 ->`, ns))
	for _, name := range []string{"a", "c"} {
		svc, err := e.cs.CoreV1().Services(ns).Get(ctxOf(t), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc.ResourceVersion != before[name] {
			t.Errorf("%s was written on restart (resourceVersion %s, was %s)", name, svc.ResourceVersion, before[name])
		}
	}
	// The first snapshot after the restart was already complete: a
	// restart never withdraws services.
	sink2.mu.Lock()
	first := dump(sink2.snaps[0])
	sink2.mu.Unlock()
	for _, name := range []string{"a", "c"} {
		if !strings.Contains(first, fmt.Sprintf("k8s/%s/%s/80/tcp", ns, name)) {
			t.Errorf("the first snapshot after the restart lacks %s:\n%s", name, first)
		}
	}
	// Once d's status and Event are written (the Event is sent on its
	// own), a restart with nothing changed writes nothing: no status,
	// no Event, no Service; the Lease is the election's.
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		evs, err := e.cs.CoreV1().Events(ns).List(ctxOf(t), metav1.ListOptions{FieldSelector: "involvedObject.name=d"})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return ev.Reason == "AddressAssigned" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no AddressAssigned Event on d")
		}
	}
	stop()
	writes := &requests{used: map[permission]int{}, refused: map[permission]int{}}
	sink3 := &fakeSink{}
	e.runWith(t, opts, sink3, func(src *kubernetes.Source) { kubernetes.WrapTransport(src, writes.via) })
	want = fmt.Sprintf(`
k8s/%[1]s/a/80/tcp tcp 192.0.2.72:80 ->
k8s/%[1]s/c/80/tcp tcp 192.0.2.74:80 ->
k8s/%[1]s/d/80/tcp tcp 192.0.2.73:80 ->`, ns)
	waitSnap(t, sink3, want)
	// Let the source run a while: statuses are written before the
	// snapshot, Events a moment after.
	time.Sleep(2 * time.Second)
	used, refused := writes.snapshot()
	for p, n := range used {
		if p.verb != "get" && p.verb != "list" && p.verb != "watch" && p.resource != "leases" {
			t.Errorf("a restart with nothing changed made %d %s requests", n, p)
		}
	}
	if len(refused) > 0 {
		t.Errorf("refused: %v", refused)
	}
	if _, n := sink3.last(); n != 1 {
		t.Errorf("%d snapshots after a restart with nothing changed, want 1", n)
	}
}

func (e *env) testClass(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, LoadBalancerClass: "vipd.io/lb", Pools: pools("192.0.2.80/30")}, sink)
	mine := lbService(ns, "mine", port("", corev1.ProtocolTCP, 80))
	mine.Spec.LoadBalancerClass = ptr.To("vipd.io/lb")
	e.create(t, mine)
	other := lbService(ns, "other", port("", corev1.ProtocolTCP, 80))
	other.Spec.LoadBalancerClass = ptr.To("example.com/lb")
	e.create(t, other)
	e.create(t, lbService(ns, "none", port("", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "mine", "192.0.2.80")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%s/mine/80/tcp tcp 192.0.2.80:80 ->`, ns))
	for _, name := range []string{"other", "none"} {
		e.waitStatus(t, ns, name, "")
	}
	// Another load balancer gives other an address of vipd's pool:
	// vipd never hands it out.
	o, err := e.cs.CoreV1().Services(ns).Get(ctxOf(t), "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.81", IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
	if _, err := e.cs.CoreV1().Services(ns).UpdateStatus(ctxOf(t), o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, ns, "other", "192.0.2.81")
	mine2 := lbService(ns, "mine2", port("", corev1.ProtocolTCP, 80))
	mine2.Spec.LoadBalancerClass = ptr.To("vipd.io/lb")
	e.create(t, mine2)
	e.waitStatus(t, ns, "mine2", "192.0.2.82")
	// Its status stays as the other load balancer wrote it.
	e.waitStatus(t, ns, "other", "192.0.2.81")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/mine/80/tcp tcp 192.0.2.80:80 ->
k8s/%[1]s/mine2/80/tcp tcp 192.0.2.82:80 ->`, ns))
}

func (e *env) testSelector(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, ServiceSelector: "lb=vipd", Pools: pools("192.0.2.96/30")}, sink)
	svc := lbService(ns, "web", port("", corev1.ProtocolTCP, 80))
	svc.Labels = map[string]string{"lb": "vipd"}
	e.create(t, svc)
	e.create(t, lbService(ns, "unlabelled", port("", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "web", "192.0.2.96")
	waitSnap(t, sink, fmt.Sprintf(`k8s/%s/web/80/tcp tcp 192.0.2.96:80 ->`, ns))
	e.waitStatus(t, ns, "unlabelled", "")
	// Out of the selector, the Service vanishes from vipd's cache: its
	// status is still cleared, and its address goes back to the pool.
	e.update(t, ns, "web", func(s *corev1.Service) { s.Labels = nil })
	e.waitStatus(t, ns, "web", "")
	waitSnap(t, sink, "")
	e.update(t, ns, "unlabelled", func(s *corev1.Service) { s.Labels = map[string]string{"lb": "vipd"} })
	e.waitStatus(t, ns, "unlabelled", "192.0.2.96")
}

func (e *env) testAPILoss(t *testing.T) {
	ns := e.namespace(t)
	sink := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.88/30")}, sink)
	e.create(t, lbService(ns, "a", port("", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns, "a", "192.0.2.88")
	want := fmt.Sprintf(`k8s/%s/a/80/tcp tcp 192.0.2.88:80 ->`, ns)
	waitSnap(t, sink, want)
	_, n := sink.last()

	e.srv.StopAPIServer()
	waitReport(t, sink, func(err error) bool { return err != nil })
	if err := e.srv.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	waitReport(t, sink, func(err error) bool { return err == nil })
	// Back in step with nothing changed: nothing published again.
	e.waitStatus(t, ns, "a", "192.0.2.88")
	if got, m := sink.last(); m != n || got != strings.TrimSpace(want) {
		t.Fatalf("after the API came back: %d snapshots (was %d), last:\n%s", m, n, got)
	}
	// A change made as soon as the server is back reaches the sink at
	// once: the informers' requests waited at the gate during the outage
	// instead of backing off.
	back := time.Now()
	e.create(t, lbService(ns, "b", port("", corev1.ProtocolTCP, 80)))
	want += "\n" + fmt.Sprintf(`k8s/%s/b/80/tcp tcp 192.0.2.89:80 ->`, ns)
	waitSnapWithin(t, sink, want, backWithin)
	t.Logf("a Service created after the API server's return was published in %v", time.Since(back).Round(time.Millisecond))
	e.waitStatus(t, ns, "b", "192.0.2.89")

	// A source that starts while the API server is gone says so, and
	// publishes nothing until its caches are in sync.
	e.srv.StopAPIServer()
	sink2 := &fakeSink{}
	e.run(t, kubernetes.Options{Namespaces: []string{ns}, Pools: pools("192.0.2.88/30")}, sink2)
	waitReport(t, sink2, func(err error) bool { return err != nil })
	if got, m := sink2.last(); m != 0 {
		t.Fatalf("published before the caches were in sync:\n%s", got)
	}
	// Long enough for client-go's back-off to grow past backWithin: without
	// the gate the source published 3-6.4 s after the server's return.
	time.Sleep(12 * time.Second)
	if err := e.srv.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	back = time.Now()
	waitSnapWithin(t, sink2, want, backWithin)
	t.Logf("a source started without the API server published in %v after its return", time.Since(back).Round(time.Millisecond))
	waitReport(t, sink2, func(err error) bool { return err == nil })
}

// backWithin bounds the time from the API server's return (ready) to the
// source's being in step again.
const backWithin = 3 * time.Second

// waitReport waits until the sink's last report satisfies ok.
func waitReport(t *testing.T, sink *fakeSink, ok func(error) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sink.mu.Lock()
		var last error = errors.New("no report")
		if n := len(sink.reports); n > 0 {
			last = sink.reports[n-1]
		}
		done := len(sink.reports) > 0 && ok(last)
		sink.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports: last %v", last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
