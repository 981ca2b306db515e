package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/source"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	clientset "k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// waitSynced waits until the caches are in sync, reporting why not while
// the API server cannot be reached. It returns false when ctx ends.
func (c *controller) waitSynced(ctx context.Context, synced []cache.InformerSynced) bool {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	probe := time.NewTicker(probeLostEvery)
	defer probe.Stop()
	var lost error
	for {
		if !slices.ContainsFunc(synced, func(f cache.InformerSynced) bool { return !f() }) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		case err := <-c.watchErr:
			c.lose(fmt.Errorf("kubernetes: watch: %w", err), &lost)
		case now := <-probe.C:
			if !c.probeDue(now, lost) {
				continue
			}
			if err := c.probe(ctx); err != nil && ctx.Err() == nil {
				c.lose(err, &lost)
			}
		}
	}
}

// probeDue reports whether a probe is due at now: every probeEvery, and
// every tick while the server is out of reach.
func (c *controller) probeDue(now time.Time, lost error) bool {
	return lost != nil || now.Sub(c.probed) >= probeEvery
}

// probe asks the API server whether it is ready, past the gate (whose
// requests go again once the server answers). A client without a REST
// client (client-go's fake) cannot be asked.
func (c *controller) probe(ctx context.Context) error {
	c.probed = time.Now()
	rc := c.cs.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(passGate(ctx), probeEvery)
	defer cancel()
	if err := rc.Get().AbsPath("/readyz").Do(pctx).Error(); err != nil {
		return fmt.Errorf("kubernetes: API server %s: %w", c.host, err)
	}
	return nil
}

// controller is the running source.
type controller struct {
	s  *Source
	cs clientset.Interface
	// probed is when the last probe began.
	probed   time.Time
	host     string
	sink     source.Sink
	alloc    *Allocator
	recorder record.EventRecorder
	services interface {
		List(labels.Selector) ([]*corev1.Service, error)
	}
	slices interface {
		List(labels.Selector) ([]*discoveryv1.EndpointSlice, error)
	}
	nodes interface {
		List(labels.Selector) ([]*corev1.Node, error)
	}

	// dirty says that something changed since the last sync.
	dirty chan struct{}
	// mu guards touched and all, which the informers' handlers set:
	// touched holds the Services whose EndpointSlices changed, and all
	// says that something else changed (a Service, a Node), which needs
	// a full sync.
	mu      sync.Mutex
	touched map[string]bool
	all     bool
	// statuses holds the Services whose status alone changed.
	statuses map[string]bool
	// sliceIndex holds the EndpointSlices by Service (byService), and
	// serviceGet the Services, for a sync of a few Services.
	sliceIndex cache.Indexer
	serviceGet interface {
		Services(string) listerscorev1.ServiceNamespaceLister
	}
	// watchErr carries watch failures to the loop.
	watchErr chan error

	// lead is the context of this instance's term as leader, which ends
	// when the term does; nil while it follows. Status writes use it, so
	// that none is made after the Lease is lost.
	lead context.Context
	// restored says that the leader took the addresses back from the
	// statuses in this term.
	restored bool
	// status writes the statuses of the leader's term in the background.
	status *statusWriter
	// events holds the message of the last warning Event of each Service
	// (by "KEY address" and "KEY settings"), so that a lasting problem
	// makes one Event, not one per sync.
	events map[string]string
	// written holds the Services whose status vipd wrote.
	written map[string]bool
	// lastGood holds each Service's last valid settings.
	lastGood map[string]settings
	// published is the last snapshot the sink took, and conflicts the
	// refusals it answered.
	published *source.Snapshot
	conflicts map[string]string
	// spare is the Services of the snapshot before the published one,
	// which the sink no longer holds: syncSlices fills it in place of
	// allocating the next snapshot's (at 10,000 Services, collecting a
	// copy per update costs more than making it).
	spare []lb.VirtualService
}

func (c *controller) poke() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// pokeAll asks for a full sync: a Service or a Node changed.
func (c *controller) pokeAll() {
	c.mu.Lock()
	c.all = true
	c.mu.Unlock()
	c.poke()
}

// pokeService asks for a full sync when a Service changed, unless only its
// status did: then for a check of that status (see statusesHeld).
func (c *controller) pokeService(old, obj any) {
	o, ok := old.(*corev1.Service)
	n, ok2 := obj.(*corev1.Service)
	if !ok || !ok2 || !statusOnly(o, n) {
		c.pokeAll()
		return
	}
	c.mu.Lock()
	if c.statuses == nil {
		c.statuses = map[string]bool{}
	}
	c.statuses[n.Namespace+"/"+n.Name] = true
	c.mu.Unlock()
	c.poke()
}

// statusOnly reports whether a Service changed from o to n in its status
// alone: what vipd reads of a Service besides its status is its spec, its
// labels and annotations, and whether it is being deleted.
func statusOnly(o, n *corev1.Service) bool {
	return o.Generation == n.Generation && o.DeletionTimestamp.Equal(n.DeletionTimestamp) &&
		maps.Equal(o.Labels, n.Labels) && maps.Equal(o.Annotations, n.Annotations) &&
		slices.Equal(o.Finalizers, n.Finalizers) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
}

// statusesHeld reports whether the statuses of the Services of keys say
// what this instance holds, so that their change needs no sync: only when
// it leads, and has taken the addresses back from the statuses in this
// term (a follower takes its addresses from the statuses, on a full sync).
func (c *controller) statusesHeld(keys []string) bool {
	if !c.leading() || !c.restored {
		return len(keys) == 0
	}
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		svc, err := c.serviceGet.Services(ns).Get(name)
		if err != nil || !sameAddrs(statusAddrs(svc), c.alloc.Held(key)) {
			return false
		}
	}
	return true
}

// pokeSlice asks for a sync of the Service of the EndpointSlice obj.
func (c *controller) pokeSlice(obj any) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		// A tombstone: the slice was deleted while the watch was down.
		c.pokeAll()
		return
	}
	key, _ := sliceService(es)
	c.mu.Lock()
	if len(key) > 0 {
		if c.touched == nil {
			c.touched = map[string]bool{}
		}
		c.touched[key[0]] = true
	}
	c.mu.Unlock()
	c.poke()
}

// takeTouched returns, and forgets, the Services whose EndpointSlices
// changed since the last call, those whose status alone changed, and
// whether anything else changed.
func (c *controller) takeTouched() (keys, statuses []string, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, statuses, all = slices.Sorted(maps.Keys(c.touched)), slices.Sorted(maps.Keys(c.statuses)), c.all
	c.touched, c.statuses, c.all = nil, nil, false
	return keys, statuses, all
}

// byService names the index of the EndpointSlices by their Service's key.
const byService = "service"

// sliceService is the index function of byService.
func sliceService(obj any) ([]string, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := es.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{es.Namespace + "/" + name}, nil
}

// probeEvery is how often the source asks the API server whether it is
// ready: client-go's watches retry a refused connection silently, so a
// stopped API server shows only here. While the server is out of reach,
// it asks every probeLostEvery, so that the source says soon that it is
// back.
const (
	probeEvery     = 3 * time.Second
	probeLostEvery = 500 * time.Millisecond
)

// leading reports whether this instance holds the Lease (or elects no
// leader).
func (c *controller) leading() bool { return c.lead != nil && c.lead.Err() == nil }

// loop syncs after every change until ctx ends, and reports whether the
// source is in step with the API server. Each term of leadership comes
// from elected.
func (c *controller) loop(ctx context.Context, elected <-chan context.Context) error {
	const retry = 2 * time.Second
	timer := time.NewTimer(0)
	defer timer.Stop()
	probe := time.NewTicker(probeLostEvery)
	defer probe.Stop()
	c.sink.Report(nil)
	c.status = newStatusWriter(c.writeStatus)
	defer c.status.stop()
	if c.lead != nil {
		c.status.begin(ctx, c.lead)
	}
	var lost error
	for {
		// full says that this round syncs everything: only a change of
		// EndpointSlices alone lets it sync the Services they touch.
		full := true
		var termEnd <-chan struct{}
		if c.lead != nil {
			termEnd = c.lead.Done()
		}
		select {
		case <-ctx.Done():
			return nil
		case term := <-elected:
			c.s.log.Info("kubernetes: leading: allocating addresses and writing status", "identity", c.s.opts.Identity)
			c.lead = term
			c.status.begin(ctx, term)
			// Take the addresses back from the statuses, as at a start,
			// and say again what is wrong.
			c.restored = false
			clear(c.events)
			c.conflicts = nil
		case <-termEnd:
			if ctx.Err() != nil {
				return nil
			}
			c.s.log.Warn("kubernetes: lost the lease: following, from the statuses", "identity", c.s.opts.Identity)
			c.lead = nil
			// The writes of the term are dropped: the next leader takes
			// its addresses from the statuses, and so does this
			// instance should it lead again.
			c.status.end()
		case <-c.dirty:
			full = false
		case <-c.s.repool:
			// New pools: a full sync applies them.
		case <-c.status.ready:
			if c.statusResults() {
				timer.Reset(retry)
			}
			continue
		case <-timer.C:
		case err := <-c.watchErr:
			c.lose(fmt.Errorf("kubernetes: watch: %w", err), &lost)
			continue
		case now := <-probe.C:
			if !c.probeDue(now, lost) {
				continue
			}
			err := c.probe(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				c.lose(err, &lost)
				continue
			}
			if lost == nil {
				continue
			}
			// The informers relist on their own once the server is
			// back; sync in case they missed nothing.
			c.s.log.Info("kubernetes: API server back", "after", lost)
			lost = nil
			c.sink.Report(nil)
		}
		keys, statuses, all := c.takeTouched()
		all = all || !c.statusesHeld(statuses)
		again, synced, err := false, false, error(nil)
		if !full && !all {
			again, synced, err = c.syncSlices(ctx, keys)
		}
		if !synced && err == nil {
			again, err = c.sync(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.s.log.Warn("kubernetes: sync failed; retrying", "err", err)
			again = true
		}
		if again {
			timer.Reset(retry)
		}
	}
}

// lose reports that the source is out of step, once per error.
func (c *controller) lose(err error, lost *error) {
	if *lost != nil && (*lost).Error() == err.Error() {
		return
	}
	*lost = err
	c.s.log.Warn("kubernetes: out of step with the API server; the last state stays programmed", "err", err)
	c.sink.Report(err)
}

// served reports whether vipd serves svc.
func (c *controller) served(svc *corev1.Service) bool {
	o := &c.s.opts
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if len(o.Namespaces) > 1 && !slices.Contains(o.Namespaces, svc.Namespace) {
		return false
	}
	if !c.s.selector.Matches(labels.Set(svc.Labels)) {
		return false
	}
	if svc.Spec.LoadBalancerClass == nil {
		return o.DefaultClass
	}
	return o.LoadBalancerClass != "" && *svc.Spec.LoadBalancerClass == o.LoadBalancerClass
}

func keyOf(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }
