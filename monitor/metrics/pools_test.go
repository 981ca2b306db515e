package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPools: the pool metrics appear with the first Pools, read the
// counts at each scrape, and a later Pools replaces them.
func TestPools(t *testing.T) {
	m := newTest()
	names := []string{"vipd_kubernetes_pool_addresses", "vipd_kubernetes_pool_addresses_in_use", "vipd_kubernetes_pool_addresses_free"}
	if n, err := testutil.GatherAndCount(m.Registry(), names...); err != nil || n != 0 {
		t.Fatalf("pool metrics before Pools: %d series, %v; want none", n, err)
	}
	inUse := 3.0
	m.Pools(func(f func(pool, family string, total, inUse, free float64)) {
		f("default", "ipv4", 14, inUse, 14-inUse)
		f("default", "ipv6", 256, 0, 256)
	})
	inUse = 14
	want := `
# HELP vipd_kubernetes_pool_addresses Addresses of a [[kubernetes.pool]] that may be handed to Services, by family.
# TYPE vipd_kubernetes_pool_addresses gauge
vipd_kubernetes_pool_addresses{family="ipv4",pool="default"} 14
vipd_kubernetes_pool_addresses{family="ipv6",pool="default"} 256
# HELP vipd_kubernetes_pool_addresses_free Addresses of a [[kubernetes.pool]] left to hand out, by family: at 0, a new Service waits (PoolExhausted).
# TYPE vipd_kubernetes_pool_addresses_free gauge
vipd_kubernetes_pool_addresses_free{family="ipv4",pool="default"} 0
vipd_kubernetes_pool_addresses_free{family="ipv6",pool="default"} 256
# HELP vipd_kubernetes_pool_addresses_in_use Addresses of a [[kubernetes.pool]] that Services hold, by family.
# TYPE vipd_kubernetes_pool_addresses_in_use gauge
vipd_kubernetes_pool_addresses_in_use{family="ipv4",pool="default"} 14
vipd_kubernetes_pool_addresses_in_use{family="ipv6",pool="default"} 0
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	m.Pools(func(f func(pool, family string, total, inUse, free float64)) { f("edge", "ipv4", 2, 1, 1) })
	if n, err := testutil.GatherAndCount(m.Registry(), names...); err != nil || n != 3 {
		t.Fatalf("pool metrics after a second Pools: %d series, %v; want 3", n, err)
	}
}
