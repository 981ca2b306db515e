package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/kubernetes/apitest"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// instance is one vipd instance of an HA pair in a test.
type instance struct {
	id   string
	sink *fakeSink
	stop func()

	mu sync.Mutex
	// writes counts the status writes the instance sent to the API
	// server, and logs holds the messages it logged.
	writes int
	logs   []string
}

func (in *instance) statusWrites() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.writes
}

// waitLog waits until the instance has logged msg n times.
func (in *instance) waitLog(t *testing.T, msg string, n int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		in.mu.Lock()
		got := 0
		for _, m := range in.logs {
			if m == msg {
				got++
			}
		}
		in.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s logged %q %d times, want %d", in.id, msg, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// countWrites counts the status writes of Services that pass through it.
type countWrites struct {
	in   *instance
	next http.RoundTripper
}

func (c countWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/services/") && strings.HasSuffix(r.URL.Path, "/status") {
		c.in.mu.Lock()
		c.in.writes++
		c.in.mu.Unlock()
	}
	return c.next.RoundTrip(r)
}

// logRecorder keeps the messages logged, and passes them on.
type logRecorder struct {
	in   *instance
	next slog.Handler
}

func (h logRecorder) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (h logRecorder) Handle(ctx context.Context, r slog.Record) error {
	h.in.mu.Lock()
	h.in.logs = append(h.in.logs, r.Message)
	h.in.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}
func (h logRecorder) WithAttrs(a []slog.Attr) slog.Handler {
	return logRecorder{in: h.in, next: h.next.WithAttrs(a)}
}
func (h logRecorder) WithGroup(g string) slog.Handler {
	return logRecorder{in: h.in, next: h.next.WithGroup(g)}
}

// Short terms, so that a takeover takes seconds.
const (
	testLease  = 4 * time.Second
	testRenew  = 3 * time.Second
	testRetry  = 500 * time.Millisecond
	leaseName  = "vipd"
	msgLeading = "kubernetes: leading: allocating addresses and writing status"
	msgLost    = "kubernetes: lost the lease: following, from the statuses"
)

// start runs an instance with identity id and the Lease in ns; set
// changes its options.
func (e *env) start(t *testing.T, ns, id string, set ...func(*kubernetes.Options)) *instance {
	t.Helper()
	in := &instance{id: id, sink: &fakeSink{}}
	var next slog.Handler = slog.DiscardHandler
	if testing.Verbose() {
		next = slog.NewTextHandler(os.Stderr, nil)
	}
	opts := kubernetes.Options{
		Kubeconfig: e.srv.Kubeconfig, DefaultClass: true, Namespaces: []string{ns}, Pools: pools("192.0.2.104/29"),
		LeaseNamespace: ns, LeaseName: leaseName, Identity: id,
		LeaseDuration: testLease, RenewDeadline: testRenew, RetryPeriod: testRetry,
		Logger: slog.New(logRecorder{in: in, next: next}).With("identity", id),
	}
	for _, f := range set {
		f(&opts)
	}
	src, err := kubernetes.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	kubernetes.WrapTransport(src, func(rt http.RoundTripper) http.RoundTripper { return countWrites{in: in, next: rt} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, in.sink) }()
	var once sync.Once
	in.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: Run: %v", id, err)
			}
		})
	}
	t.Cleanup(in.stop)
	return in
}

// waitHolder waits until the Lease in ns names holder.
func (e *env) waitHolder(t *testing.T, ns, holder string) *coordinationv1.Lease {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l, err := e.cs.CoordinationV1().Leases(ns).Get(ctxOf(t), leaseName, metav1.GetOptions{})
		got := "(no lease)"
		if err == nil && l.Spec.HolderIdentity != nil {
			got = *l.Spec.HolderIdentity
			if got == holder {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease holder %q (err %v), want %q", got, err, holder)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestLeaderElection(t *testing.T) {
	srv := apitest.Start(t)
	e := &env{srv: srv, cs: clientset.NewForConfigOrDie(srv.Config)}
	ns := e.namespace(t)
	e.node(t, "le-a", true, "10.0.2.1")

	// a starts first and leads; b follows.
	a := e.start(t, ns, "a")
	a.waitLog(t, msgLeading, 1)
	e.waitHolder(t, ns, "a")
	b := e.start(t, ns, "b")
	web := e.create(t, lbService(ns, "web", port("http", corev1.ProtocolTCP, 80)))
	web = e.waitStatus(t, ns, "web", "192.0.2.104")
	want := fmt.Sprintf(`k8s/%s/web/http/tcp tcp 192.0.2.104:80 -> 10.0.2.1:%d/1`, ns, web.Spec.Ports[0].NodePort)
	// Both serve it, the follower from the status.
	waitSnap(t, a.sink, want)
	waitSnap(t, b.sink, want)
	// A change the leader answers with a status write: web's address
	// becomes another.
	e.update(t, ns, "web", func(s *corev1.Service) {
		s.Annotations = map[string]string{kubernetes.AnnotationAddresses: "192.0.2.110"}
	})
	web = e.waitStatus(t, ns, "web", "192.0.2.110")
	want = fmt.Sprintf(`k8s/%s/web/http/tcp tcp 192.0.2.110:80 -> 10.0.2.1:%d/1`, ns, web.Spec.Ports[0].NodePort)
	waitSnap(t, a.sink, want)
	waitSnap(t, b.sink, want)
	if n := a.statusWrites(); n < 2 {
		t.Errorf("the leader wrote status %d times, want 2 or more", n)
	}
	if n := b.statusWrites(); n != 0 {
		t.Errorf("the follower wrote status %d times", n)
	}

	// The leader stops: it gives the Lease up, and b takes over without
	// writing web again, and allocates what is new.
	_, published := b.sink.last()
	a.stop()
	e.waitHolder(t, ns, "b")
	b.waitLog(t, msgLeading, 1)
	e.create(t, lbService(ns, "api", port("http", corev1.ProtocolTCP, 80)))
	api := e.waitStatus(t, ns, "api", "192.0.2.104")
	waitSnap(t, b.sink, fmt.Sprintf("k8s/%s/api/http/tcp tcp 192.0.2.104:80 -> 10.0.2.1:%d/1\n", ns, api.Spec.Ports[0].NodePort)+want)
	// The takeover changed nothing that b serves: what it published
	// since has api.
	b.sink.mu.Lock()
	for _, snap := range b.sink.snaps[published:] {
		if !strings.Contains(dump(snap), "/api/") {
			t.Errorf("b published at the takeover:\n%s", dump(snap))
		}
	}
	b.sink.mu.Unlock()
	got, err := e.cs.CoreV1().Services(ns).Get(ctxOf(t), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != web.ResourceVersion {
		t.Errorf("web was written at the takeover (resourceVersion %s, was %s)", got.ResourceVersion, web.ResourceVersion)
	}
	if n := b.statusWrites(); n == 0 {
		t.Error("the new leader wrote no status")
	}

	// Another holder takes the Lease: b stops writing once it sees it
	// lost, follows the statuses, and leads again when the Lease is free.
	// (b renews as the test writes: get and try again on a conflict.)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease := e.waitHolder(t, ns, "b")
		lease.Spec.HolderIdentity = ptr.To("intruder")
		lease.Spec.LeaseDurationSeconds = ptr.To[int32](3600)
		lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		_, err := e.cs.CoordinationV1().Leases(ns).Update(ctxOf(t), lease, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	b.waitLog(t, msgLost, 1)
	writes := b.statusWrites()
	e.create(t, lbService(ns, "late", port("http", corev1.ProtocolTCP, 80)))
	// Several retry periods: time for a write, were there one.
	time.Sleep(4 * testRetry)
	e.waitStatus(t, ns, "late", "")
	if n := b.statusWrites(); n != writes {
		t.Errorf("the instance that lost the lease wrote status %d times", n-writes)
	}
	if err := e.cs.CoordinationV1().Leases(ns).Delete(ctxOf(t), leaseName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	b.waitLog(t, msgLeading, 2)
	e.waitHolder(t, ns, "b")
	e.waitStatus(t, ns, "late", "192.0.2.105")
	e.waitStatus(t, ns, "web", "192.0.2.110")
	e.waitStatus(t, ns, "api", "192.0.2.104")

	// Without leader election, a single instance allocates and writes
	// whoever holds the Lease.
	ns2 := ns + "-solo"
	if _, err := e.cs.CoreV1().Namespaces().Create(ctxOf(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns2}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: leaseName}, Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("intruder"), LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: ptr.To(metav1.NewMicroTime(time.Now())),
	}}
	if _, err := e.cs.CoordinationV1().Leases(ns2).Create(ctxOf(t), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	solo := e.start(t, ns2, "solo", func(o *kubernetes.Options) { o.LeaderElection = ptr.To(false) })
	solo2 := e.create(t, lbService(ns2, "web", port("http", corev1.ProtocolTCP, 80)))
	e.waitStatus(t, ns2, "web", "192.0.2.104")
	waitSnap(t, solo.sink, fmt.Sprintf(`k8s/%s/web/http/tcp tcp 192.0.2.104:80 -> 10.0.2.1:%d/1`, ns2, solo2.Spec.Ports[0].NodePort))
	if l, err := e.cs.CoordinationV1().Leases(ns2).Get(ctxOf(t), leaseName, metav1.GetOptions{}); err != nil || *l.Spec.HolderIdentity != "intruder" {
		t.Errorf("the Lease without leader election: %v, %v", l, err)
	}
}

func TestLeaseOptions(t *testing.T) {
	base := func() kubernetes.Options {
		return kubernetes.Options{DefaultClass: true, Pools: pools("192.0.2.0/28")}
	}
	for _, tc := range []struct {
		name string
		set  func(*kubernetes.Options)
		err  string
	}{
		{"defaults", func(*kubernetes.Options) {}, ""},
		{"off ignores the rest", func(o *kubernetes.Options) {
			o.LeaderElection = ptr.To(false)
			o.LeaseDuration = time.Millisecond
		}, ""},
		{"short terms", func(o *kubernetes.Options) {
			o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 2*time.Second, time.Second, 100*time.Millisecond
		}, ""},
		{"fraction of a second", func(o *kubernetes.Options) { o.LeaseDuration = 2500 * time.Millisecond },
			"kubernetes: lease_duration 2.5s must be a whole number of seconds, at least 1s"},
		{"negative", func(o *kubernetes.Options) { o.LeaseDuration = -time.Second },
			"kubernetes: lease_duration -1s must be a whole number of seconds, at least 1s"},
		{"renew not shorter", func(o *kubernetes.Options) { o.RenewDeadline = 15 * time.Second },
			"kubernetes: renew_deadline 15s must be shorter than lease_duration 15s"},
		{"retry too long", func(o *kubernetes.Options) { o.RetryPeriod = 9 * time.Second },
			"kubernetes: renew_deadline 10s must be longer than 1.2 × retry_period 9s"},
		{"retry negative", func(o *kubernetes.Options) { o.RetryPeriod = -time.Second },
			"kubernetes: retry_period -1s must be positive"},
		{"namespace", func(o *kubernetes.Options) { o.LeaseNamespace = "Kube_System" },
			`kubernetes: lease_namespace "Kube_System": a lowercase RFC 1123 label`},
		{"name", func(o *kubernetes.Options) { o.LeaseName = "vipd/lease" },
			`kubernetes: lease_name "vipd/lease": a lowercase RFC 1123 subdomain`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base()
			tc.set(&o)
			_, err := kubernetes.New(o)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)):
				t.Fatalf("New: %v, want %q", err, tc.err)
			}
		})
	}
}
