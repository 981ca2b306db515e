package k8s

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	vipd := Result{System: "vipd", Services: 1000, Samples: 20, ColdSync: 42.5, FirstUpdate: 3.8, P50: 100, P99: 200, Max: 200, CPU: 25, RSS: 74, HWM: 87, Converged: true, InIPVS: 1000}
	kp := Result{System: "kube-proxy", Services: 1000, Samples: 20, ColdSync: 21, FirstUpdate: 363, P50: 10000, P99: 16000, Max: 16000, CPU: 50, RSS: 74, HWM: 85, Converged: true, InIPVS: 1000}
	for _, c := range []struct {
		name string
		in   []Result
		want []string
	}{
		{"both", []Result{vipd, kp}, []string{"kube-proxy/vipd p50 100.0x, p99 80.0x, cpu 2.0x, rss 1.0x, cold sync 0.5x"}},
		{"no first update", []Result{vipd, {System: "kube-proxy", Services: 1000, ColdSync: 536, FirstUpdateMin: 1800, Converged: true, InIPVS: 1000, RSS: 300, HWM: 310,
			Note: "converged in 536.0 s, but the first update did not reach IPVS within 1800 s after that: not measured"}},
			[]string{">1800", "   Converged in 536.0 s, but", "later than 1800 s after it converged, vipd's 3.8 s (ratio > 474x), vipd's updates p50 100.0 ms"}},
		{"partial samples", []Result{vipd, func() Result {
			k := kp
			k.Samples, k.Note = 3, "the update of Service 7 did not reach IPVS by the deadline (VIPD_BENCH_K8S_DEADLINE_S); 3 updates measured before it"
			return k
		}()}, []string{"kube-proxy     1000       3", "   The update of Service 7", "kube-proxy/vipd p50 100.0x"}},
		{"not converged", []Result{vipd, {System: "kube-proxy", Services: 1000, InIPVS: 10, Limit: 3600}},
			[]string{"DID NOT CONVERGE: 10 of 1000", "no ratio: vipd converged true with 20 samples, kube-proxy converged false with 0 samples"}},
	} {
		got := Table(c.in)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: no %q in\n%s", c.name, w, got)
			}
		}
	}
}
