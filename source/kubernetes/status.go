package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// statusWrite is a status the leader writes: svc's addresses become
// addrs; none clears the status of a Service vipd no longer serves.
type statusWrite struct {
	svc   *corev1.Service
	addrs []netip.Addr
}

// statusResult is how a status write ended, for the loop.
type statusResult struct {
	key string
	statusWrite
	err error
	// current says that the write belongs to the term still running:
	// the failures of an ended term are nobody's to retry.
	current bool
}

// statusWriter writes the leader's Service statuses in the background, so
// that the loop keeps programming EndpointSlice and Service changes while
// the API server takes them: 10,000 writes at a start take at least
// 200 s at 50 per second (658 s in the emulated guest), and an endpoint
// change waited for all of them when sync wrote them itself.
//
// It holds one desired status per Service, by key: a newer one replaces
// the one still queued, so that a Service is written once however often
// sync asks (it asks at every full sync until the echo of the write is
// in the informer's cache). statusWorkers goroutines drain the queue in
// the order the keys came, never two writes of one Service at once (the
// second would fail on the resourceVersion the first changed). Each write
// is made in the leader's term: when the term ends, the queue is dropped
// and the writes in flight are cancelled with the term's context, for
// the next leader takes its addresses from the statuses afresh.
//
// The workers never call the loop: they put what they did in results and
// poke ready, and the loop logs it, records the Event and retries a
// failure by a full sync, which reads the Service again from the
// informer's cache (a write is never retried with the object it failed
// with: a conflict says that object is stale).
type statusWriter struct {
	write func(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error
	// ready has a value when results has some.
	ready chan struct{}

	mu   sync.Mutex
	cond *sync.Cond
	// term is the context of the leader's term, and cancel ends it
	// (also when the loop ends); nil while this instance follows. gen
	// counts the terms.
	term   context.Context
	cancel context.CancelFunc
	gen    int
	// order holds the keys of queued in the order they came.
	order  []string
	queued map[string]statusWrite
	// busy holds the writes in flight, by key, with their term.
	busy map[string]statusWrite
	// landed holds the writes made whose echo the informer's cache may
	// not hold yet: the object they were made from is the cache's as
	// long as no change of the Service reached it (the cache replaces
	// the object at each change), and while it is, sync must not write
	// the same addresses again from the stale object.
	landed  map[string]statusWrite
	results []statusResult
	stopped bool
	wg      sync.WaitGroup
}

// newStatusWriter starts the workers of a writer that writes with write.
// They stop at stop.
func newStatusWriter(write func(context.Context, *corev1.Service, []netip.Addr) error) *statusWriter {
	w := &statusWriter{
		write:  write,
		ready:  make(chan struct{}, 1),
		queued: map[string]statusWrite{},
		busy:   map[string]statusWrite{},
		landed: map[string]statusWrite{},
	}
	w.cond = sync.NewCond(&w.mu)
	for range statusWorkers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.work()
		}()
	}
	return w
}

// begin starts a term: writes are made in ctx until end, or until ctx
// or parent (the loop's) ends.
func (w *statusWriter) begin(parent, term context.Context) {
	w.end()
	ctx, cancel := context.WithCancel(term)
	stop := context.AfterFunc(parent, cancel)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.term = ctx
	w.cancel = func() { stop(); cancel() }
	w.gen++
}

// end ends the term: the queued writes are dropped and those in flight
// cancelled. Their failures are not retried.
func (w *statusWriter) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
	}
	w.term, w.cancel = nil, nil
	w.order = nil
	clear(w.queued)
	clear(w.landed)
}

// stop ends the term and waits for the workers to return.
func (w *statusWriter) stop() {
	w.end()
	w.mu.Lock()
	w.stopped = true
	w.cond.Broadcast()
	w.mu.Unlock()
	w.wg.Wait()
}

// statusSays reports whether svc's status holds addrs, and nothing when
// addrs is empty.
func statusSays(svc *corev1.Service, addrs []netip.Addr) bool {
	if len(addrs) == 0 {
		return len(svc.Status.LoadBalancer.Ingress) == 0
	}
	return sameAddrs(statusAddrs(svc), addrs)
}

// want says that the status of the Service of key, svc in the informer's
// cache, must hold addrs (none: be cleared). It queues a write unless the
// status says so already, or a write of addrs is queued (whose object svc
// then replaces: the newest is the least likely to conflict), in flight,
// or made from this very object (its echo is on the way). It does nothing
// outside a term.
func (w *statusWriter) want(key string, svc *corev1.Service, addrs []netip.Addr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.term == nil {
		return
	}
	if l, ok := w.landed[key]; ok && l.svc != svc {
		// The cache holds a newer object: the echo, or a change since.
		delete(w.landed, key)
	}
	if statusSays(svc, addrs) {
		// A write still queued would undo what the status says.
		w.dropLocked(key)
		return
	}
	if _, ok := w.queued[key]; ok {
		w.queued[key] = statusWrite{svc: svc, addrs: addrs}
		return
	}
	if b, ok := w.busy[key]; ok && sameAddrs(b.addrs, addrs) {
		return
	}
	if l, ok := w.landed[key]; ok && sameAddrs(l.addrs, addrs) {
		return
	}
	w.queued[key] = statusWrite{svc: svc, addrs: addrs}
	w.order = append(w.order, key)
	w.cond.Signal()
}

// forget drops the queued write of key, and what it knows of the last:
// the Service is gone.
func (w *statusWriter) forget(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropLocked(key)
	delete(w.landed, key)
}

func (w *statusWriter) dropLocked(key string) {
	if _, ok := w.queued[key]; !ok {
		return
	}
	delete(w.queued, key)
	w.order = slices.DeleteFunc(w.order, func(k string) bool { return k == key })
}

// unsettled reports whether a write of key is being made, or was made
// and its echo has not replaced svc in the informer's cache yet: the
// status may still change to what the write says.
func (w *statusWriter) unsettled(key string, svc *corev1.Service) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, busy := w.busy[key]
	l, landed := w.landed[key]
	return busy || landed && l.svc == svc
}

// take returns, and forgets, the results since the last call.
func (w *statusWriter) take() []statusResult {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.results
	w.results = nil
	return out
}

// work makes the queued writes until stop.
func (w *statusWriter) work() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		if w.stopped {
			return
		}
		i := slices.IndexFunc(w.order, func(k string) bool { _, busy := w.busy[k]; return !busy })
		if i < 0 {
			w.cond.Wait()
			continue
		}
		key := w.order[i]
		if i == 0 {
			// The usual case, in constant time: at a start order
			// holds thousands of keys.
			w.order = w.order[1:]
		} else {
			w.order = slices.Delete(w.order, i, i+1)
		}
		sw := w.queued[key]
		delete(w.queued, key)
		w.busy[key] = sw
		ctx, gen := w.term, w.gen
		w.mu.Unlock()
		err := w.write(ctx, sw.svc, sw.addrs)
		w.mu.Lock()
		delete(w.busy, key)
		current := gen == w.gen && w.term != nil
		if err == nil && current {
			w.landed[key] = sw
		}
		w.results = append(w.results, statusResult{key: key, statusWrite: sw, err: err, current: current})
		select {
		case w.ready <- struct{}{}:
		default:
		}
		// A write of key may wait for this one.
		w.cond.Broadcast()
	}
}

// writeStatus sets svc's status.loadBalancer.ingress to addrs (none to
// clear it) through the status subresource, in the leader's term ctx: it
// returns errNotLeading when the term has ended. The write carries the
// resourceVersion vipd saw, so that it fails should another instance have
// written since. The status writer's workers call it.
func (c *controller) writeStatus(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error {
	if ctx == nil || ctx.Err() != nil {
		return errNotLeading
	}
	up := svc.DeepCopy()
	up.Status.LoadBalancer.Ingress = nil
	for _, a := range addrs {
		mode := corev1.LoadBalancerIPModeVIP
		up.Status.LoadBalancer.Ingress = append(up.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &mode})
	}
	_, err := c.cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, up, metav1.UpdateOptions{FieldManager: "vipd"})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errNotLeading, err)
	}
	return err
}

// statusResults handles the writes the status writer made since the last
// call: it logs each, records the Event of an address assigned, and
// forgets a Service whose status it cleared. It reports whether a full
// sync must come to retry a failure: the full sync reads the Service
// again from the informer's cache, so that a write that failed on a
// conflict (another writer changed the Service) is made again from the
// newer object once the cache holds it, never from the stale one.
func (c *controller) statusResults() (again bool) {
	for _, r := range c.status.take() {
		switch {
		case r.err == nil && len(r.addrs) == 0:
			c.s.log.Info("kubernetes: released", "service", r.key)
			if len(c.alloc.Held(r.key)) == 0 {
				delete(c.written, r.key)
			}
		case r.err == nil:
			c.s.log.Info("kubernetes: assigned", "service", r.key, "addresses", joinAddrs(r.addrs))
			c.event(r.svc, corev1.EventTypeNormal, "AddressAssigned", "assigned "+joinAddrs(r.addrs))
			if r.current && !sameAddrs(c.alloc.Held(r.key), r.addrs) {
				// The Service changed while its write was in flight:
				// write what is held now.
				c.pokeAll()
			}
		case !r.current || errors.Is(r.err, errNotLeading):
			// The term ended: the next leader takes the statuses as they
			// are.
		case apierrors.IsNotFound(r.err):
			// Deleted: its deletion makes a full sync of its own.
		case len(r.addrs) == 0:
			c.s.log.Warn("kubernetes: clearing status failed", "service", r.key, "err", r.err)
			again = true
		default:
			c.s.log.Warn("kubernetes: writing status failed", "service", r.key, "err", r.err)
			again = true
		}
	}
	return again
}
