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
// against the p99 target and divides vipd's by it, layout by layout,
// judging the ratios at the largest size whose changes were timed
// (single: p50 at most 5x; split: p50 and p99 at most 2x).
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
		"n=3: p50 2.0 / p99 6.0 ms, p99 < 20 ms: met; vipd single / floor: p50 5.0x, p99 5.0x (target p50 <= 5x: met); vipd split / floor: p50 4.0x, p99 4.0x (target p50 and p99 <= 2x: MISSED); p99/p50: floor 3.0x, vipd single 3.0x, vipd split 3.0x\n",
		"floor at 10000x10: FAILED: the floor daemon did not start\n",
	)
}

// TestRenderColdAndMemory: the cold start is judged against keepalived
// at the largest size and against ipvsadm -R at the smallest; sizes run
// for memory alone have no row in part 1 and one in part 3, where the
// soak's growth is judged.
func TestRenderColdAndMemory(t *testing.T) {
	res := &Results{Layouts: []string{"single"}, PerFile: 100}
	cold := func(v, i, k float64) map[string]*Cold {
		return map[string]*Cold{"vipd": {Seconds: v}, "ipvsadm": {Seconds: i}, "keepalived": {Seconds: k}}
	}
	res.Sizes = []*SizeResult{
		{N: 100, M: 10, Objects: 1100, Cold: cold(1.0, 1.25, 0.9), VipdPeakMiB: 20, VipdRSSMiB: 19},
		{N: 10000, M: 10, Objects: 110000, Cold: cold(8, 40, 25), VipdPeakMiB: 120, VipdRSSMiB: 110,
			Soak: &Soak{Layout: "split", Reloads: 1000, RSSBefore: 100, RSSTenth: 100, RSSAfter: 115, PeakMiB: 121}},
		{N: 50000, M: 2, Objects: 150000, MemOnly: true, Cold: map[string]*Cold{"vipd": {Seconds: 12}}, VipdPeakMiB: 160, VipdRSSMiB: 150},
	}
	out := render(res)
	expectAll(t, out,
		"<= ipvsadm -R: met",
		"<= 0.3x keepalived: MISSED",
		"1000 reloads at 10000x10 (split layout",
		"growth from reload 100 to 1000 +15.0% (target <= 10%: MISSED)",
	)
	part1 := out[:strings.Index(out, "\n2. ")]
	if strings.Contains(part1, "50000x2") {
		t.Errorf("a memory-only size in part 1:\n%s", part1)
	}
	part3 := out[strings.Index(out, "\n3. "):strings.Index(out, "\n4. ")]
	for _, l := range strings.Split(part3, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "50000x2":
			if f[len(f)-1] != "MISSED" || f[3] != "160.0" {
				t.Errorf("50000x2 memory row: %q", l)
			}
		case len(f) > 0 && f[0] == "100x10":
			if f[len(f)-1] != "-" {
				t.Errorf("100x10 memory row judged: %q", l)
			}
		}
	}
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
