package lb

import (
	"fmt"
	"net/netip"
)

// Removal counts what a change of Spec removes.
type Removal struct {
	Services, OfServices int
	Backends, OfBackends int
}

// Removed counts the services and backends of old that cur no longer has
// (see Remaining.Removed).
func Removed(old, cur *Spec) Removal {
	return Remain(cur.Services).Removed(old.Services)
}

// Remaining indexes the services a change keeps, to count what it
// removes.
type Remaining struct {
	byName map[string]*VirtualService
	byKey  map[ServiceKey]*VirtualService
}

// Remain indexes services, the services a change keeps. It keeps
// pointers into services.
func Remain(services []VirtualService) *Remaining {
	r := &Remaining{
		byName: make(map[string]*VirtualService, len(services)),
		byKey:  make(map[ServiceKey]*VirtualService, len(services)),
	}
	for i := range services {
		vs := &services[i]
		r.byName[vs.Name] = vs
		r.byKey[vs.Service.Key] = vs
	}
	return r
}

// Removed counts the services of old, and their backends, that the
// remaining services do not have, with OfServices and OfBackends the
// counts of old's. A service stays when a remaining service has its name
// or, renamed, its address (its IPVS service key); a backend stays when
// that service has a backend of its address.
func (r *Remaining) Removed(old []VirtualService) Removal {
	var out Removal
	for i := range old {
		vs := &old[i]
		out.OfServices++
		out.OfBackends += len(vs.Backends)
		cur, ok := r.byName[vs.Name]
		if !ok {
			cur, ok = r.byKey[vs.Service.Key]
		}
		if !ok {
			out.Services++
			out.Backends += len(vs.Backends)
			continue
		}
		if len(cur.Backends) == 0 {
			out.Backends += len(vs.Backends)
			continue
		}
		kept := make(map[netip.AddrPort]struct{}, len(cur.Backends))
		for _, b := range cur.Backends {
			kept[b.Addr] = struct{}{}
		}
		for _, b := range vs.Backends {
			if _, ok := kept[b.Addr]; !ok {
				out.Backends++
			}
		}
	}
	return out
}

// Exceeds reports whether the removal deletes more than share of the
// services or of the backends, and describes it.
func (r Removal) Exceeds(share float64) (bool, string) {
	over := func(n, of int) bool { return of > 0 && float64(n) > share*float64(of) }
	desc := fmt.Sprintf("removes %d of %d services and %d of %d backends", r.Services, r.OfServices, r.Backends, r.OfBackends)
	return over(r.Services, r.OfServices) || over(r.Backends, r.OfBackends), desc
}
