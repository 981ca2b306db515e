package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolCounts calls f once per address pool and family with the pool's
// addresses: total (those it may hand out), in use (held by Services)
// and free (neither held nor shown by another load balancer's Service).
type PoolCounts func(f func(pool, family string, total, inUse, free float64))

// poolCollector exports the address pools of the Kubernetes source as
// they are at each scrape.
type poolCollector struct {
	mu     sync.Mutex
	counts PoolCounts
}

var (
	poolTotalDesc = prometheus.NewDesc("vipd_kubernetes_pool_addresses",
		"Addresses of a [[kubernetes.pool]] that may be handed to Services, by family.", []string{"pool", "family"}, nil)
	poolInUseDesc = prometheus.NewDesc("vipd_kubernetes_pool_addresses_in_use",
		"Addresses of a [[kubernetes.pool]] that Services hold, by family.", []string{"pool", "family"}, nil)
	poolFreeDesc = prometheus.NewDesc("vipd_kubernetes_pool_addresses_free",
		"Addresses of a [[kubernetes.pool]] left to hand out, by family: at 0, a new Service waits (PoolExhausted).", []string{"pool", "family"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolTotalDesc
	ch <- poolInUseDesc
	ch <- poolFreeDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	counts := c.counts
	c.mu.Unlock()
	if counts == nil {
		return
	}
	counts(func(pool, family string, total, inUse, free float64) {
		ch <- prometheus.MustNewConstMetric(poolTotalDesc, prometheus.GaugeValue, total, pool, family)
		ch <- prometheus.MustNewConstMetric(poolInUseDesc, prometheus.GaugeValue, inUse, pool, family)
		ch <- prometheus.MustNewConstMetric(poolFreeDesc, prometheus.GaugeValue, free, pool, family)
	})
}

// Pools exports the address pools that counts reports, read at each
// scrape: vipd_kubernetes_pool_addresses, ..._in_use and ..._free, by pool
// and family. The first call registers them; a later one replaces
// counts.
func (m *Metrics) Pools(counts PoolCounts) {
	m.poolsOnce.Do(func() { m.register(&m.pools) })
	m.pools.mu.Lock()
	m.pools.counts = counts
	m.pools.mu.Unlock()
}
