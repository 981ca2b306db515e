package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/source"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// sync brings allocation, status and the published snapshot in line with
// the caches, and queues the status writes of the leader (statusWriter).
// It returns true when something should be tried again later: a publish
// that failed, a refused service. A status write that fails asks for
// its retry when its result comes back (statusResults).
func (c *controller) sync(ctx context.Context) (bool, error) {
	c.s.fullSyncs.Add(1)
	all, err := c.services.List(labels.Everything())
	if err != nil {
		return false, err
	}
	// Oldest first, so that on a restart an address two statuses claim
	// stays with the older Service.
	slices.SortFunc(all, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(keyOf(a), keyOf(b))
	})
	var served []*corev1.Service
	present := map[string]*corev1.Service{}
	for _, svc := range all {
		present[keyOf(svc)] = svc
		if c.served(svc) {
			served = append(served, svc)
		}
	}
	leading := c.leading()
	repooled := c.s.takePools()
	if !leading || !c.restored {
		if err := c.restore(served, leading); err != nil {
			return false, err
		}
		c.restored = leading
	} else if repooled {
		if err := c.reallocate(served); err != nil {
			return false, err
		}
	}

	// Services no longer served: release their addresses, clear the
	// status vipd wrote.
	servedKeys := map[string]bool{}
	for _, svc := range served {
		servedKeys[keyOf(svc)] = true
	}
	for _, key := range slices.Sorted(maps.Keys(c.written)) {
		if servedKeys[key] {
			continue
		}
		c.alloc.Release(key)
		delete(c.lastGood, key)
		for _, what := range warnings {
			delete(c.events, key+" "+what)
		}
		svc := present[key]
		if !leading {
			// The leader clears the status; should this instance lead
			// before it has, it will.
			if svc == nil || len(svc.Status.LoadBalancer.Ingress) == 0 {
				delete(c.written, key)
			}
			continue
		}
		if svc == nil {
			// Deleted, or out of the selector: get it to be sure.
			got, err := c.cs.CoreV1().Services(strings.SplitN(key, "/", 2)[0]).Get(ctx, strings.SplitN(key, "/", 2)[1], metav1.GetOptions{})
			if err != nil {
				c.status.forget(key)
				delete(c.written, key)
				continue
			}
			svc = got
		}
		// The status is cleared through the status writer, as it is
		// written: one writer per Service keeps its writes in order, and
		// releasing thousands of Services (a change of class) does not
		// hold the loop up either. The Service stays written until the
		// clear lands (statusResults), or until no write of it, in
		// flight or not yet echoed, can still put an address there.
		if len(svc.Status.LoadBalancer.Ingress) > 0 || c.status.unsettled(key, svc) {
			c.status.want(key, svc, nil)
			continue
		}
		c.status.forget(key)
		delete(c.written, key)
	}
	// Addresses in the status of Services vipd does not serve (another
	// load balancer's, or its own from before a restart that vipd could
	// not clear) are never handed out.
	foreign := map[netip.Addr]string{}
	for _, svc := range all {
		if !servedKeys[keyOf(svc)] && !c.written[keyOf(svc)] {
			for _, a := range statusAddrs(svc) {
				foreign[a] = keyOf(svc)
			}
		}
	}
	c.alloc.SetForeign(foreign)
	// Services that vanished before vipd wrote their status.
	for _, key := range c.alloc.keys() {
		if !servedKeys[key] {
			c.alloc.Release(key)
		}
	}

	snap := source.Snapshot{}
	idx := c.indexSlices()
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return false, err
	}
	if leading {
		c.assign(served)
	}
	counts := c.alloc.counts()
	c.s.poolsMu.Lock()
	c.s.counts = counts
	c.s.poolsMu.Unlock()
	for _, svc := range served {
		key := keyOf(svc)
		held := c.alloc.Held(key)
		if len(held) == 0 {
			// Served but given nothing (refused, or what its status
			// shows no longer fits): the status must not show an
			// address vipd does not serve to it.
			if leading && c.written[key] && (len(svc.Status.LoadBalancer.Ingress) > 0 || c.status.unsettled(key, svc)) {
				c.status.want(key, svc, nil)
			}
			continue
		}
		if leading {
			// Queued unless the status, or a write queued or made,
			// says so already.
			c.status.want(key, svc, held)
		}
		c.written[key] = true
		st, serr := c.settingsOf(svc)
		c.warn(svc, "settings", serr)
		c.warn(svc, "nodeports", noNodePorts(svc, st))
		vss, hs := c.servicesOf(svc, held, st, nodes, idx[key])
		for _, vs := range vss {
			if h, ok := hs[vs.Name]; ok {
				if snap.Health == nil {
					snap.Health = map[string]config.ServiceHealth{}
				}
				snap.Health[vs.Name] = h
			}
		}
		snap.Services = append(snap.Services, vss...)
	}
	slices.SortFunc(snap.Services, func(a, b lb.VirtualService) int { return strings.Compare(a.Name, b.Name) })
	// The statuses are written in the background (statusWriter): the
	// data plane need not wait for the API server to take thousands of
	// status writes at a start, nor an EndpointSlice change after it.
	var conflicts []source.Conflict
	if c.published == nil || !reflect.DeepEqual(*c.published, snap) || len(c.conflicts) > 0 {
		conflicts, err = c.sink.Publish(ctx, snap)
		c.spare = nil
		if err != nil {
			return true, fmt.Errorf("publish: %w", err)
		}
		c.published = &snap
		c.noteConflicts(present, conflicts)
	}
	// The sink takes a refused service at a later Publish, once its owner
	// lets go of it: ask again.
	return len(conflicts) > 0, nil
}

// syncSlices brings the published snapshot in line with the
// EndpointSlices of the Services of keys, when nothing but EndpointSlices
// changed since the last sync: it maps those Services alone, and
// publishes the last snapshot with their virtual services replaced,
// naming the ones that changed (source.Snapshot.Changed), so that the
// work of an update does not grow with the number of Services. synced is
// false when it cannot, having published nothing: before the first full
// sync, while refusals wait, or when a Service is health checked or its
// virtual services are not the ones published; the caller then runs a
// full sync (sync), which is always right.
func (c *controller) syncSlices(ctx context.Context, keys []string) (again, synced bool, err error) {
	if c.published == nil || len(c.conflicts) > 0 {
		return false, false, nil
	}
	if len(keys) == 0 {
		return false, true, nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return false, false, err
	}
	services := c.published.Services
	var out []lb.VirtualService
	var changed []string
	present := map[string]*corev1.Service{}
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		svc, err := c.serviceGet.Services(ns).Get(name)
		if err != nil || !c.served(svc) {
			// Gone or not served: the change of the Service asks for a
			// full sync of its own.
			continue
		}
		lo, hi := nameRange(services, key)
		held := c.alloc.Held(key)
		st, _ := c.settingsOf(svc)
		var vss []lb.VirtualService
		var hs map[string]config.ServiceHealth
		if len(held) > 0 {
			vss, hs = c.servicesOf(svc, held, st, nodes, c.slicesOf(key))
		}
		if hi-lo != len(vss) {
			return false, false, nil
		}
		for k := range vss {
			if services[lo+k].Name != vss[k].Name {
				return false, false, nil
			}
			// A change of a checked service's checks (a Node that comes
			// or goes) takes a full sync, which hands the checker its
			// targets.
			h, ok := hs[vss[k].Name]
			was, wasOK := c.published.Health[vss[k].Name]
			if ok != wasOK || ok && !reflect.DeepEqual(h, was) {
				return false, false, nil
			}
			if reflect.DeepEqual(services[lo+k], vss[k]) {
				continue
			}
			if out == nil {
				out = append(c.spare[:0], services...)
			}
			out[lo+k] = vss[k]
			changed = append(changed, vss[k].Name)
		}
		present[key] = svc
	}
	if len(changed) == 0 {
		return false, true, nil
	}
	snap := source.Snapshot{Services: out, Health: c.published.Health, Changed: changed}
	conflicts, err := c.sink.Publish(ctx, snap)
	c.spare = nil
	if err != nil {
		return true, true, fmt.Errorf("publish: %w", err)
	}
	c.spare = services
	c.published = &snap
	c.noteConflicts(present, conflicts)
	return len(conflicts) > 0, true, nil
}

// nameRange returns where the virtual services of the Service of key are
// in services, sorted by name: [lo, hi).
func nameRange(services []lb.VirtualService, key string) (lo, hi int) {
	prefix := "k8s/" + key + "/"
	lo, _ = slices.BinarySearchFunc(services, prefix, func(vs lb.VirtualService, p string) int { return strings.Compare(vs.Name, p) })
	hi = lo
	for hi < len(services) && strings.HasPrefix(services[hi].Name, prefix) {
		hi++
	}
	return lo, hi
}

// slicesOf returns the EndpointSlices of the Service of key.
func (c *controller) slicesOf(key string) []*discoveryv1.EndpointSlice {
	objs, _ := c.sliceIndex.ByIndex(byService, key)
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, es)
		}
	}
	return out
}

// sliceIndex holds the EndpointSlices of each Service, by key.
type sliceIndex map[string][]*discoveryv1.EndpointSlice

func (c *controller) indexSlices() sliceIndex {
	all, _ := c.slices.List(labels.Everything())
	idx := sliceIndex{}
	for _, es := range all {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		k := es.Namespace + "/" + name
		idx[k] = append(idx[k], es)
	}
	return idx
}
