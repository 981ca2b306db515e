package main

import (
	"strings"
	"testing"
)

// TestRenderLayouts: part 2 has a row per size and layout, judges the
// targets for each layout, and shows a layout that failed as FAILED.
func TestRenderLayouts(t *testing.T) {
	ms := func(v float64) []float64 { return []float64{v, v, v} }
	res := &Results{Layouts: []string{"single", "split"}, PerFile: 100, ChangeMethod: "probe", ReloadMethod: "polled"}
	for _, s := range []struct {
		n              int
		single, reload float64
		split          *Change
	}{
		{100, 13, 150, &Change{Layout: "split", File: "services.d/0000.toml", FileBytes: 51000, MS: ms(5), StartOps: new(int)}},
		{10000, 90, 13000, &Change{Layout: "split", File: "services.d/0050.toml", FileBytes: 53000, Err: "vipd exited"}},
	} {
		res.Sizes = append(res.Sizes, &SizeResult{N: s.n, M: 10, Reload: &Change{MS: ms(s.reload)}, Changes: map[string]*Change{
			"single": {Layout: "single", File: "vipd.toml", FileBytes: 5300000, MS: ms(s.single), Ops: []int{1, 1, 1}},
			"split":  s.split,
		}})
	}
	var b strings.Builder
	renderChanges(&b, res)
	out := b.String()
	expectAll(t, out,
		"vipd: probe\n",
		"100x10  single",
		"services.d/0000.toml (51.0 KB)",
		"flat, single layout (the largest size's p99 at most 1.5x the smallest's): p99 13.0 ms at 100x10 -> 90.0 ms at 10000x10 (6.9x; p50 6.9x): MISSED",
		"vipd restarted on the table the single layout left, which it adopted with 0 operations",
	)
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 1 && f[0] == "100x10" && f[1] == "split":
			// 5 ms p99 < 20 ms; 150 / 5 = 30x < 100x.
			if f[len(f)-2] != "met" || f[len(f)-1] != "MISSED" {
				t.Errorf("100x10 split row: %q", l)
			}
		case len(f) > 1 && f[0] == "10000x10" && f[1] == "split":
			if !strings.Contains(l, "FAILED") {
				t.Errorf("10000x10 split row: %q", l)
			}
		case len(f) > 1 && f[0] == "10000x10" && f[1] == "single":
			// 13000 / 90 = 144x.
			if f[len(f)-2] != "MISSED" || f[len(f)-1] != "met" {
				t.Errorf("10000x10 single row: %q", l)
			}
		}
	}
	if strings.Contains(out, "flat, split layout") {
		t.Errorf("flat judged for the split layout with one size measured:\n%s", out)
	}
}

// TestRenderFloor: the floor's line gives its percentiles, judges it
// against the p99 target and divides vipd's by it, layout by layout.
func TestRenderFloor(t *testing.T) {
	res := &Results{Layouts: []string{"single", "split"}, PerFile: 100}
	res.Sizes = append(res.Sizes, &SizeResult{N: 100, M: 10, Changes: map[string]*Change{
		"single": {Layout: "single", MS: []float64{10, 10, 30}},
		"split":  {Layout: "split", MS: []float64{8, 8, 24}},
	}, Floor: &Change{Layout: "floor", MS: []float64{2, 2, 6}}})
	res.Sizes = append(res.Sizes, &SizeResult{N: 10000, M: 10, Floor: &Change{Err: "the floor daemon did not start"}})
	var b strings.Builder
	renderChanges(&b, res)
	out := b.String()
	expectAll(t, out,
		"n=3: p50 2.0 / p99 6.0 ms, p99 < 20 ms: met; vipd single / floor: p50 5.0x, p99 5.0x; vipd split / floor: p50 4.0x, p99 4.0x; p99/p50: floor 3.0x, vipd single 3.0x, vipd split 3.0x\n",
		"floor at 10000x10: FAILED: the floor daemon did not start\n",
	)
}

// expectAll fails t for each of wants that out does not contain.
func expectAll(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
