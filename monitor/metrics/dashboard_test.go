package metrics

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
)

// TestDashboardMetricsExist checks that every vipd_ metric the example
// Grafana dashboard queries is one vipd exports.
func TestDashboardMetricsExist(t *testing.T) {
	data, err := os.ReadFile("../../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{
		Version:   "test",
		Status:    fixed(fakeStatus()),
		Announcer: func() AnnouncerStats { return AnnouncerStats{} },
		Health:    func() health.Stats { return health.Stats{} },
		Logger:    discard(),
		Now:       func() time.Time { return time.Unix(0, 0) },
		NoRuntime: true,
	})
	m.HealthTransition(health.Transition{Service: "web", Backend: ap("10.0.0.1:80"), State: health.Down})
	m.Watch(true)
	// Drift: vipd sets a sysctl back to what it set before.
	set := lb.Op{Kind: lb.OpSetSysctl, Host: &lb.HostChange{Sysctl: lb.SysctlVSConntrack, Value: "1"}}
	m.Pass("start", &lb.Result{Applied: []lb.Op{set}}, time.Millisecond)
	m.Pass("resync", &lb.Result{Applied: []lb.Op{set}}, time.Millisecond)
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
	}
	used := regexp.MustCompile(`vipd_[a-z_]+`).FindAllString(string(data), -1)
	if len(used) < 10 {
		t.Fatalf("the dashboard queries only %d vipd metrics", len(used))
	}
	for _, name := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if !exported[base] {
			t.Errorf("the dashboard queries %s, which vipd does not export", name)
		}
	}
}
