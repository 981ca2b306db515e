package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// poolFakeSource is a fakeSource whose pools a reload changes: it
// records the pools it is handed.
type poolFakeSource struct {
	*fakeSource
	mu     sync.Mutex
	reload [][]string
}

func (f *poolFakeSource) ReloadPools(k config.Kubernetes) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var addrs []string
	for _, p := range k.Pools {
		addrs = append(addrs, p.Name+"="+strings.Join(p.Addresses, ","))
	}
	f.reload = append(f.reload, addrs)
	return nil
}

func (f *poolFakeSource) reloads() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.reload)
}

// withPools returns services followed by a [kubernetes] section with one
// pool per entry of pools ("NAME=ADDR,ADDR").
func withPools(services string, pools ...string) string {
	var b strings.Builder
	b.WriteString(services)
	b.WriteString("[kubernetes]\ndefault_class = true\n")
	for _, p := range pools {
		name, addrs, _ := strings.Cut(p, "=")
		fmt.Fprintf(&b, "[[kubernetes.pool]]\nname = %q\naddresses = [\"%s\"]\n", name, strings.Join(strings.Split(addrs, ","), `", "`))
	}
	return b.String()
}

// TestReloadPools: a reload hands changed [[kubernetes.pool]] tables to
// the running source at once, without asking for a restart; one that
// takes an address a Service holds out of its pool is refused, naming
// the pool, the address and the Service, unless forced.
func TestReloadPools(t *testing.T) {
	src := &poolFakeSource{fakeSource: newFakeSource("kubernetes")}
	r := newRig(t, withPools(services(1, 1), "default=192.0.2.64/31"), src)
	publish(t, src.sink(t), vs("k8s/ns/b/http/tcp", "192.0.2.65", "10.1.0.1"), vs("k8s/ns/b/dns/tcp", "192.0.2.65", "10.1.0.1"))
	r.has(t, "192.0.2.65:80")

	// New addresses and a new pool: handed over, no restart asked for.
	r.write(withPools(services(1, 1), "default=192.0.2.64/31,192.0.2.70", "more=198.51.100.0/30"))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, want := src.reloads(), "[[default=192.0.2.64/31,192.0.2.70 more=198.51.100.0/30]]"; got != want {
		t.Fatalf("pools handed over: %s, want %s", got, want)
	}
	if strings.Contains(r.log.String(), "take effect on restart") {
		t.Errorf("a change of pools asks for a restart:\n%s", r.log)
	}

	// An address no Service holds may go.
	r.write(withPools(services(1, 1), "default=192.0.2.64/31", "more=198.51.100.0/30"))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); err != nil {
		t.Fatal(err)
	}

	// One a Service holds may not, unless forced.
	held := withPools(services(1, 1), "default=192.0.2.64", "more=198.51.100.0/30")
	r.write(held)
	before := src.reloads()
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	want := `reload rejected: the new [[kubernetes.pool]] tables take addresses that Services hold out of their pool: pool "default": 192.0.2.65 (held by ns/b); run "vipd reload --force" to allocate those Services again`
	if !errors.Is(err, ErrReloadRejected) || err.Error() != want {
		t.Fatalf("removing a held address: %v, want %s", err, want)
	}
	if got := src.reloads(); got != before {
		t.Fatalf("a refused reload handed the pools over: %s", got)
	}
	// Moving it to another pool takes it out of its pool too.
	r.write(withPools(services(1, 1), "default=192.0.2.64", "more=198.51.100.0/30,192.0.2.65"))
	if _, err := r.a.Reload(context.Background(), ReloadOptions{}); !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), `pool "default": 192.0.2.65 (held by ns/b)`) {
		t.Fatalf("moving a held address: %v", err)
	}
	r.write(held)
	if _, err := r.a.Reload(context.Background(), ReloadOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if got, want := src.reloads(), before[:len(before)-1]+" [default=192.0.2.64 more=198.51.100.0/30]]"; got != want {
		t.Fatalf("pools handed over: %s, want %s", got, want)
	}
}

// TestReloadPoolsBounded: a refusal names at most maxPoolRefusals
// addresses, and counts the others.
func TestReloadPoolsBounded(t *testing.T) {
	src := &poolFakeSource{fakeSource: newFakeSource("kubernetes")}
	r := newRig(t, withPools(services(1, 1), "default=192.0.2.64/27"), src)
	var svcs []lb.VirtualService
	for i := range 12 {
		svcs = append(svcs, vs(fmt.Sprintf("k8s/ns/s%d/http/tcp", i), fmt.Sprintf("192.0.2.%d", 64+i), "10.1.0.1"))
	}
	// Twelve Services sharing one address, on other ports.
	for i := range 12 {
		v := vs(fmt.Sprintf("k8s/ns/shared%02d/http/tcp", i), "192.0.2.80", "10.1.0.1")
		v.Service.Key.Port = uint16(1000 + i)
		svcs = append(svcs, v)
	}
	publish(t, src.sink(t), svcs...)
	r.write(withPools(services(1, 1), "default=192.0.2.90"))
	_, err := r.a.Reload(context.Background(), ReloadOptions{})
	if !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), "192.0.2.73 (held by ns/s9); and 3 more addresses;") || strings.Contains(err.Error(), "192.0.2.74") {
		t.Fatalf("removing 13 held addresses: %v", err)
	}
	r.write(withPools(services(1, 1), "default=192.0.2.64/28"))
	_, err = r.a.Reload(context.Background(), ReloadOptions{})
	if !errors.Is(err, ErrReloadRejected) || !strings.Contains(err.Error(), `pool "default": 192.0.2.80 (held by ns/shared00, ns/shared01, ns/shared02, ns/shared03, ns/shared04, ns/shared05, ns/shared06, ns/shared07, ns/shared08, ns/shared09, 2 more);`) {
		t.Fatalf("removing an address 12 Services share: %v", err)
	}
}

func (f *poolFakeSource) EachPool(fn func(pool, family string, total, inUse, free float64)) {
	fn("default", "ipv4", 2, 1, 1)
}

// TestPoolMetrics: the metrics endpoint exports the pools a source
// counts.
func TestPoolMetrics(t *testing.T) {
	src := &poolFakeSource{fakeSource: newFakeSource("kubernetes")}
	r := newRig(t, withPools(services(1, 1), "default=192.0.2.64/31"), src)
	src.sink(t)
	rec := httptest.NewRecorder()
	r.a.Metrics().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`vipd_kubernetes_pool_addresses{family="ipv4",pool="default"} 2`,
		`vipd_kubernetes_pool_addresses_in_use{family="ipv4",pool="default"} 1`,
		`vipd_kubernetes_pool_addresses_free{family="ipv4",pool="default"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), want+"\n") {
			t.Errorf("metrics have no %q:\n%s", want, grepLines(rec.Body.String(), "vipd_kubernetes"))
		}
	}
}
