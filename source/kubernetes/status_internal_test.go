package kubernetes

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeCall is a status write the writer makes in a test: it waits for
// the test's answer.
type writeCall struct {
	svc    *corev1.Service
	addrs  []netip.Addr
	answer chan error
}

// testWriter returns a writer in a term whose writes come to the test on
// the channel returned.
func testWriter(t *testing.T) (*statusWriter, <-chan writeCall) {
	t.Helper()
	calls := make(chan writeCall)
	w := newStatusWriter(func(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error {
		c := writeCall{svc: svc, addrs: addrs, answer: make(chan error)}
		select {
		case calls <- c:
		case <-ctx.Done():
			return errNotLeading
		}
		select {
		case err := <-c.answer:
			return err
		case <-ctx.Done():
			return errNotLeading
		}
	})
	t.Cleanup(w.stop)
	w.begin(context.Background(), context.Background())
	return w, calls
}

func nextCall(t *testing.T, calls <-chan writeCall) writeCall {
	t.Helper()
	select {
	case c := <-calls:
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("no status write")
		return writeCall{}
	}
}

func svcAt(name string, addrs ...string) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	for _, a := range addrs {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a})
	}
	return svc
}

// queue returns the writer's queue as "key=addrs" in order.
func (w *statusWriter) queue() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, k := range w.order {
		out = append(out, fmt.Sprintf("%s=%s", k, joinAddrs(w.queued[k].addrs)))
	}
	return out
}

// TestStatusWriterQueue: a Service is written once however often its
// status is asked for, a newer status replaces the one queued, a second
// write of a Service waits for the first, and a write made is not made
// again from the object it was made from.
func TestStatusWriterQueue(t *testing.T) {
	w, calls := testWriter(t)
	a, b, c := []netip.Addr{netip.MustParseAddr("192.0.2.1")}, []netip.Addr{netip.MustParseAddr("192.0.2.2")}, []netip.Addr{netip.MustParseAddr("192.0.2.3")}
	svc := svcAt("web")

	w.want("ns/web", svc, a)
	first := nextCall(t, calls)
	if first.svc != svc || !slices.Equal(first.addrs, a) {
		t.Fatalf("wrote %v from %p, want %v from %p", first.addrs, first.svc, a, svc)
	}
	// In flight: asked again, from the same object or a newer one.
	w.want("ns/web", svc, a)
	w.want("ns/web", svcAt("web"), a)
	if q := w.queue(); len(q) != 0 {
		t.Errorf("queued %q while the same write is in flight", q)
	}
	// Another status waits for the write in flight; a newer one
	// replaces it.
	w.want("ns/web", svc, b)
	newer := svcAt("web")
	w.want("ns/web", newer, c)
	if q := w.queue(); !slices.Equal(q, []string{"ns/web=192.0.2.3"}) {
		t.Errorf("queue %q, want the newest status alone", q)
	}
	first.answer <- nil
	second := nextCall(t, calls)
	if second.svc != newer || !slices.Equal(second.addrs, c) {
		t.Errorf("wrote %v from %p, want %v from the newest object %p", second.addrs, second.svc, c, newer)
	}
	second.answer <- nil

	// Made, its echo not in the cache yet: not again from the same
	// object; from a newer one that does not say it, again.
	deadline := time.Now().Add(30 * time.Second)
	for w.unsettled("ns/web", svcAt("web")) {
		if time.Now().After(deadline) {
			t.Fatal("the write stays in flight")
		}
		time.Sleep(time.Millisecond)
	}
	w.want("ns/web", newer, c)
	if q := w.queue(); len(q) != 0 {
		t.Errorf("queued %q again before its echo", q)
	}
	if !w.unsettled("ns/web", newer) {
		t.Error("a write not echoed yet is settled")
	}
	other := svcAt("web")
	w.want("ns/web", other, c)
	third := nextCall(t, calls)
	if third.svc != other {
		t.Errorf("wrote from %p, want %p", third.svc, other)
	}
	third.answer <- fmt.Errorf("refused")

	// The echo: nothing to write, and a write queued is dropped.
	w.want("ns/web", svcAt("web", "192.0.2.3"), c)
	if q := w.queue(); len(q) != 0 {
		t.Errorf("queued %q for a status that says it", q)
	}

	var got []string
	deadline = time.Now().Add(30 * time.Second)
	for len(got) < 3 {
		for _, r := range w.take() {
			got = append(got, fmt.Sprintf("%s %s %v %t", r.key, joinAddrs(r.addrs), r.err, r.current))
		}
		if time.Now().After(deadline) {
			t.Fatalf("results %q, want 3", got)
		}
		time.Sleep(time.Millisecond)
	}
	want := []string{"ns/web 192.0.2.1 <nil> true", "ns/web 192.0.2.3 <nil> true", "ns/web 192.0.2.3 refused true"}
	if !slices.Equal(got, want) {
		t.Errorf("results %q, want %q", got, want)
	}
}

// TestStatusWriterTermEnd: the end of a term drops the queued writes and
// cancels those in flight, whose results say they belong to an ended
// term; a write queued outside a term is not made.
func TestStatusWriterTermEnd(t *testing.T) {
	w, calls := testWriter(t)
	a := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	for i := range statusWorkers + 2 {
		w.want(fmt.Sprintf("ns/s%d", i), svcAt(fmt.Sprintf("s%d", i)), a)
	}
	for range statusWorkers {
		nextCall(t, calls)
	}
	if q := w.queue(); len(q) != 2 {
		t.Fatalf("queue %q, want 2 writes", q)
	}
	w.end()
	if q := w.queue(); len(q) != 0 {
		t.Errorf("queue %q after the term", q)
	}
	w.want("ns/late", svcAt("late"), a)
	if q := w.queue(); len(q) != 0 {
		t.Errorf("queued %q outside a term", q)
	}
	var n int
	deadline := time.Now().Add(30 * time.Second)
	for n < statusWorkers {
		for _, r := range w.take() {
			n++
			if r.current || r.err != errNotLeading {
				t.Errorf("%s: result %v, current %t; want errNotLeading of an ended term", r.key, r.err, r.current)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d results, want %d", n, statusWorkers)
		}
		time.Sleep(time.Millisecond)
	}
	// Once the workers are stopped, no other write was tried.
	w.stop()
	if rest := w.take(); len(rest) != 0 {
		t.Errorf("%d more writes tried after the term", len(rest))
	}
}

// TestStatusWriterStops: stop returns once the workers have, a write in
// flight cancelled, and leaves no goroutine behind.
func TestStatusWriterStops(t *testing.T) {
	before := runtime.NumGoroutine()
	inFlight := make(chan struct{})
	w := newStatusWriter(func(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error {
		close(inFlight)
		<-ctx.Done()
		return errNotLeading
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.begin(ctx, context.Background())
	w.want("ns/web", svcAt("web"), []netip.Addr{netip.MustParseAddr("192.0.2.1")})
	<-inFlight
	w.stop()
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after stop, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
