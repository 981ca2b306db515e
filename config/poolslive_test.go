package config

import (
	"net/netip"
	"strings"
	"testing"
)

// TestEqualBesidesPools: a change of [[kubernetes.pool]] tables alone is
// one a reload applies; any other change of [kubernetes] is not.
func TestEqualBesidesPools(t *testing.T) {
	const base = "[kubernetes]\ndefault_class = true\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\"]\n"
	parse := func(s string) Kubernetes {
		t.Helper()
		cfg, err := Parse("t.toml", []byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Kubernetes
	}
	k := parse(base)
	pools := parse(strings.Replace(base, `"192.0.2.32/28"`, `"192.0.2.32/27"`, 1) + "auto_assign = false\n[[kubernetes.pool]]\nname = \"q\"\naddresses = [\"198.51.100.0/24\"]\n")
	if k.Equal(pools) || !k.EqualBesidesPools(pools) {
		t.Errorf("pools changed: Equal %t, EqualBesidesPools %t; want false, true", k.Equal(pools), k.EqualBesidesPools(pools))
	}
	other := parse(strings.Replace(base, "default_class = true", "default_class = true\napi_qps = 7", 1))
	if k.EqualBesidesPools(other) {
		t.Error("api_qps changed: EqualBesidesPools")
	}
	for addr, want := range map[string]string{"192.0.2.40": "p", "192.0.2.63": "p", "192.0.2.64": "", "198.51.100.9": "q", "203.0.113.1": ""} {
		if got, ok := pools.PoolOf(netip.MustParseAddr(addr)); got != want || ok != (want != "") {
			t.Errorf("PoolOf(%s) = %q, %t; want %q", addr, got, ok, want)
		}
	}
}
