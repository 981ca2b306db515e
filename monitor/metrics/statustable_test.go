package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestStatusMetricsTable: the table both writers come from is sorted by
// name, names each family once, and gives every per-object family a
// filter and either one value or the values in and out, never both.
func TestStatusMetricsTable(t *testing.T) {
	if !slices.IsSortedFunc(statusMetrics, func(a, b statusMetric) int { return strings.Compare(a.name, b.name) }) {
		t.Error("statusMetrics is not sorted by name")
	}
	seen := map[string]bool{}
	for _, m := range statusMetrics {
		if seen[m.name] {
			t.Errorf("%s is in the table twice", m.name)
		}
		seen[m.name] = true
		if !strings.HasPrefix(m.name, "vipd_") || m.help == "" {
			t.Errorf("%s: a name without vipd_ or no help", m.name)
		}
		if strings.HasSuffix(m.name, "_total") != (m.typ == prometheus.CounterValue) {
			t.Errorf("%s: counters, and only they, end in _total", m.name)
		}
		switch m.scope {
		case perService:
			if m.service == nil || (m.serviceValue == nil) == (m.serviceIn == nil || m.serviceOut == nil) {
				t.Errorf("%s: a per-service family needs a filter and one value or both directions", m.name)
			}
		case perBackend:
			if m.backend == nil || (m.backendValue == nil) == (m.backendIn == nil || m.backendOut == nil) {
				t.Errorf("%s: a per-backend family needs a filter and one value or both directions", m.name)
			}
		}
	}
}
