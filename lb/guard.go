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

// Removed counts the services and backends of old that cur no longer has.
// Services are matched by name, backends by service name and address.
func Removed(old, cur *Spec) Removal {
	type backendKey struct {
		svc  string
		addr netip.AddrPort
	}
	curSvc := make(map[string]struct{}, len(cur.Services))
	curBackends := map[backendKey]struct{}{}
	for i := range cur.Services {
		vs := &cur.Services[i]
		curSvc[vs.Name] = struct{}{}
		for _, b := range vs.Backends {
			curBackends[backendKey{vs.Name, b.Addr}] = struct{}{}
		}
	}
	var r Removal
	for i := range old.Services {
		vs := &old.Services[i]
		r.OfServices++
		if _, ok := curSvc[vs.Name]; !ok {
			r.Services++
		}
		for _, b := range vs.Backends {
			r.OfBackends++
			if _, ok := curBackends[backendKey{vs.Name, b.Addr}]; !ok {
				r.Backends++
			}
		}
	}
	return r
}

// Exceeds reports whether the removal deletes more than share of the
// services or of the backends, and describes it.
func (r Removal) Exceeds(share float64) (bool, string) {
	over := func(n, of int) bool { return of > 0 && float64(n) > share*float64(of) }
	desc := fmt.Sprintf("removes %d of %d services and %d of %d backends", r.Services, r.OfServices, r.Backends, r.OfBackends)
	return over(r.Services, r.OfServices) || over(r.Backends, r.OfBackends), desc
}
