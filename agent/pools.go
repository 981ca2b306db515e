package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipd/vipd/config"
)

// poolSource is a source whose address pools a reload changes while it
// runs: the Kubernetes source.
type poolSource interface {
	Name() string
	// ReloadPools hands the source the [[kubernetes.pool]] tables of k.
	ReloadPools(k config.Kubernetes) error
}

// poolCounter is a source that counts its pools' addresses, for the
// metrics.
type poolCounter interface {
	EachPool(f func(pool, family string, total, inUse, free float64))
}

// poolSources returns the running sources whose pools a reload changes.
func (a *Agent) poolSources() []poolSource {
	var out []poolSource
	for _, src := range a.opts.Sources {
		if ps, ok := src.(poolSource); ok {
			out = append(out, ps)
		}
	}
	return out
}

// poolsChanged reports whether cfg's [[kubernetes.pool]] tables differ
// from old's while both enable the source.
func poolsChanged(old, cfg *config.Config) bool {
	return old.Kubernetes.Enabled && cfg.Kubernetes.Enabled &&
		!(config.Kubernetes{Pools: old.Kubernetes.Pools}).Equal(config.Kubernetes{Pools: cfg.Kubernetes.Pools})
}

// maxPoolRefusals bounds the addresses a refusal names, and the Services
// it names per address.
const maxPoolRefusals = 10

// poolGuard refuses new pools that take addresses Services hold out of
// the pool they were given from: the running pool sources' published
// Services show which. "vipd reload --force" takes them out anyway, and
// the source allocates those Services again.
func (a *Agent) poolGuard(cfg *config.Config) error {
	old, cur := &a.cfg.Kubernetes, &cfg.Kubernetes
	// held holds, by pool and address, the Services ("NAMESPACE/NAME")
	// that hold it.
	held := map[string]map[netip.Addr]map[string]bool{}
	for _, src := range a.poolSources() {
		st := a.sources.by[src.Name()]
		if st == nil {
			continue
		}
		for i := range st.snap.Services {
			vs := &st.snap.Services[i]
			vip := vs.VIP
			if !vip.IsValid() {
				vip = vs.Service.Key.Addr
			}
			p, ok := old.PoolOf(vip)
			if !ok {
				continue
			}
			if q, ok := cur.PoolOf(vip); ok && q == p {
				continue
			}
			if held[p] == nil {
				held[p] = map[netip.Addr]map[string]bool{}
			}
			if held[p][vip] == nil {
				held[p][vip] = map[string]bool{}
			}
			held[p][vip][serviceOf(vs.Name)] = true
		}
	}
	if len(held) == 0 {
		return nil
	}
	var parts []string
	n, more := 0, 0
	for _, p := range slices.Sorted(maps.Keys(held)) {
		var addrs []string
		for _, addr := range slices.SortedFunc(maps.Keys(held[p]), netip.Addr.Compare) {
			if n == maxPoolRefusals {
				more++
				continue
			}
			n++
			holders := slices.Sorted(maps.Keys(held[p][addr]))
			if len(holders) > maxPoolRefusals {
				holders = append(holders[:maxPoolRefusals], fmt.Sprintf("%d more", len(holders)-maxPoolRefusals))
			}
			addrs = append(addrs, fmt.Sprintf("%s (held by %s)", addr, strings.Join(holders, ", ")))
		}
		if len(addrs) > 0 {
			parts = append(parts, fmt.Sprintf("pool %q: %s", p, strings.Join(addrs, ", ")))
		}
	}
	if more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more addresses", more))
	}
	return fmt.Errorf("%w: the new [[kubernetes.pool]] tables take addresses that Services hold out of their pool: %s; run \"vipd reload --force\" to allocate those Services again",
		ErrReloadRejected, strings.Join(parts, "; "))
}

// serviceOf returns the Kubernetes Service ("NAMESPACE/NAME") of a
// virtual service named "k8s/NAMESPACE/NAME/PORT/PROTO", or the name.
func serviceOf(name string) string {
	f := strings.SplitN(name, "/", 4)
	if len(f) < 4 || f[0] != "k8s" {
		return name
	}
	return f[1] + "/" + f[2]
}

// applyPools hands the running pool sources cfg's pools when they
// changed from those of old.
func (a *Agent) applyPools(old, cfg *config.Config) {
	if !poolsChanged(old, cfg) {
		return
	}
	for _, src := range a.poolSources() {
		if err := src.ReloadPools(cfg.Kubernetes); err != nil {
			a.log.Error("kubernetes: the new pools are not applied", "source", src.Name(), "err", err)
			continue
		}
		a.log.Info("kubernetes: pools applied", "source", src.Name(), "pools", len(cfg.Kubernetes.Pools))
	}
}
