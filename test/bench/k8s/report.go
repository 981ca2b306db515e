package k8s

import (
	"fmt"
	"strings"
)

// Result is one system at one size.
type Result struct {
	System   string  `json:"system"`
	Services int     `json:"services"`
	Samples  int     `json:"samples"`
	ColdSync float64 `json:"cold_sync_s"` // from start to every Service in IPVS
	// FirstUpdate is the first update's time, after the cold sync, not
	// counted in the percentiles.
	FirstUpdate float64 `json:"first_update_s"`
	// FirstUpdateMin, set when the first update did not reach IPVS in
	// the time allowed, is that time: a lower bound of FirstUpdate.
	FirstUpdateMin float64 `json:"first_update_min_s,omitempty"`
	P50            float64 `json:"p50_ms"`
	P99            float64 `json:"p99_ms"`
	Max            float64 `json:"max_ms"`
	CPU            float64 `json:"cpu_percent"` // of one core, over the updates
	RSS            float64 `json:"rss_mb"`      // at the end
	HWM            float64 `json:"rss_peak_mb"`
	// Converged is false when the system did not have every Service in
	// IPVS within the time allowed (VIPD_BENCH_K8S_CONVERGE_S); InIPVS
	// says how many it had then, and nothing else was measured.
	Converged bool    `json:"converged"`
	InIPVS    int     `json:"in_ipvs"`
	Limit     float64 `json:"limit_s,omitempty"`
	// Note, when set, says what was not measured and why; the figures
	// measured before it (Samples of them) stand.
	Note string `json:"note,omitempty"`
}

// Table is the benchmark's report: a row per system and size, then the
// ratios of kube-proxy to vipd per size (results come in pairs, vipd
// first). A ratio is printed only from figures both systems have; when
// kube-proxy's first update never came, the ratio of first updates is a
// lower bound, and says so.
func Table(results []Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-10s %8s %7s %10s %9s %10s %10s %10s %8s %8s %9s\n", "system", "services", "samples", "cold s", "first s", "p50 ms", "p99 ms", "max ms", "cpu %", "rss MB", "peak MB")
	for _, r := range results {
		switch {
		case !r.Converged && r.Note == "":
			fmt.Fprintf(&b, "%-10s %8d DID NOT CONVERGE: %d of %d Services in IPVS after %.0f s (the limit); nothing else measured; rss %.1f MB (peak %.1f)\n",
				r.System, r.Services, r.InIPVS, r.Services, r.Limit, r.RSS, r.HWM)
			continue
		case r.Samples > 0:
			fmt.Fprintf(&b, "%-10s %8d %7d %10.1f %9.1f %10.1f %10.1f %10.1f %8.1f %8.1f %9.1f\n", r.System, r.Services, r.Samples, r.ColdSync, r.FirstUpdate, r.P50, r.P99, r.Max, r.CPU, r.RSS, r.HWM)
		case r.Converged:
			first := "-"
			if r.FirstUpdateMin > 0 {
				first = fmt.Sprintf(">%.0f", r.FirstUpdateMin)
			}
			fmt.Fprintf(&b, "%-10s %8d %7d %10.1f %9s %10s %10s %10s %8s %8.1f %9.1f\n", r.System, r.Services, 0, r.ColdSync, first, "-", "-", "-", "-", r.RSS, r.HWM)
		}
		if r.Note != "" {
			fmt.Fprintf(&b, "%-10s %8d   %s\n", "", r.Services, strings.ToUpper(r.Note[:1])+r.Note[1:])
		}
	}
	for i := 0; i+1 < len(results); i += 2 {
		v, k := results[i], results[i+1]
		switch {
		case v.Samples > 0 && k.Samples > 0:
			fmt.Fprintf(&b, "%d services: kube-proxy/vipd p50 %.1fx, p99 %.1fx, cpu %.1fx, rss %.1fx, cold sync %.1fx\n", v.Services,
				k.P50/v.P50, k.P99/v.P99, k.CPU/v.CPU, k.RSS/v.RSS, k.ColdSync/v.ColdSync)
		case v.Samples > 0 && v.FirstUpdate > 0 && k.FirstUpdateMin > 0:
			fmt.Fprintf(&b, "%d services: kube-proxy applied no update: its first came later than %.0f s after it converged, vipd's %.1f s (ratio > %.0fx), vipd's updates p50 %.1f ms; cold sync %.1fx, rss %.1fx\n",
				v.Services, k.FirstUpdateMin, v.FirstUpdate, k.FirstUpdateMin/v.FirstUpdate, v.P50, k.ColdSync/v.ColdSync, k.RSS/v.RSS)
		default:
			fmt.Fprintf(&b, "%d services: no ratio: vipd converged %v with %d samples, kube-proxy converged %v with %d samples\n",
				v.Services, v.Converged, v.Samples, k.Converged, k.Samples)
		}
	}
	return b.String()
}
