package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
)

func spareText(n int, weights map[int]int) []byte {
	var b strings.Builder
	b.WriteString("[daemon]\nwatch = false\n")
	for i := range n {
		w := 1
		if x, ok := weights[i]; ok {
			w = x
		}
		fmt.Fprintf(&b, "\n[[service]]\nname = \"s%d\"\nvip = \"192.0.2.%d\"\nport = 80\nbackend = [{ address = \"10.0.%d.1\", weight = %d }]\n", i, 1+i, i, w)
	}
	return []byte(b.String())
}

func cloneServices(svcs []lb.VirtualService) []lb.VirtualService {
	out := slices.Clone(svcs)
	for i := range out {
		out[i].Backends = slices.Clone(out[i].Backends)
	}
	return out
}

// TestParseFromReusing: a reload that hands over the configuration
// before the running one builds the next in its memory, with the same
// result as ParseFrom, and leaves the running one alone.
func TestParseFromReusing(t *testing.T) {
	v0, err := Parse("t.toml", spareText(20, nil))
	if err != nil {
		t.Fatal(err)
	}
	v1, d1, err := ParseFrom(v0, "t.toml", spareText(20, map[int]int{3: 5}))
	if err != nil || d1.Full || d1.From != 3 || d1.NewTo != 4 {
		t.Fatalf("edit 1: %+v %v", d1, err)
	}
	running := cloneServices(v1.Spec.Services)
	next := spareText(20, map[int]int{3: 5, 11: 7})
	want, wd, err := ParseFrom(v1, "t.toml", next)
	if err != nil {
		t.Fatal(err)
	}
	spareMem := &v0.Spec.Services[0]
	got, gd, err := ParseFromReusing(v1, "t.toml", next, Spare{Config: v0, Delta: d1})
	if err != nil {
		t.Fatal(err)
	}
	if gd != wd || !reflect.DeepEqual(got.Spec.Services, want.Spec.Services) {
		t.Errorf("reusing gave %+v\n%+v\nwant %+v\n%+v", gd, got.Spec.Services, wd, want.Spec.Services)
	}
	if &got.Spec.Services[0] != spareMem {
		t.Error("the spare's memory was not reused")
	}
	if !reflect.DeepEqual(v1.Spec.Services, running) {
		t.Error("reusing changed the running configuration")
	}
	// The next round hands over v1, which differs from got by gd.
	third := spareText(20, map[int]int{3: 5, 11: 7, 19: 2})
	want3, _, _ := ParseFrom(got, "t.toml", third)
	got3, _, err := ParseFromReusing(got, "t.toml", third, Spare{Config: v1, Delta: gd})
	if err != nil || !reflect.DeepEqual(got3.Spec.Services, want3.Spec.Services) || &got3.Spec.Services[0] != &v1.Spec.Services[0] {
		t.Errorf("second round: %v", err)
	}
}

func TestParseFromReusingIgnoresMisfits(t *testing.T) {
	v0, _ := Parse("t.toml", spareText(10, nil))
	v1, d1, _ := ParseFrom(v0, "t.toml", spareText(10, map[int]int{2: 3}))
	for name, sp := range map[string]Spare{
		"full delta":     {Config: v0, Delta: Delta{Full: true, OldTo: 10, NewTo: 10}},
		"count changed":  {Config: v0, Delta: Delta{From: 2, OldTo: 3, NewTo: 4}},
		"base itself":    {Config: v1, Delta: Delta{From: 2, OldTo: 2, NewTo: 2}},
		"none":           {},
		"other services": {Config: mustParse(t, spareText(9, nil)), Delta: d1},
	} {
		t.Run(name, func(t *testing.T) {
			before := cloneServices(v1.Spec.Services)
			got, _, err := ParseFromReusing(v1, "t.toml", spareText(10, map[int]int{2: 3, 5: 9}), sp)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(v1.Spec.Services, before) {
				t.Error("the running configuration changed")
			}
			if got.Spec.Services[5].Backends[0].Weight != 9 {
				t.Error("the edit is missing")
			}
		})
	}
	// An edit that adds a service cannot take a spare.
	got, _, err := ParseFromReusing(v1, "t.toml", spareText(11, map[int]int{2: 3}), Spare{Config: v0, Delta: d1})
	if err != nil || len(got.Spec.Services) != 11 || &got.Spec.Services[0] == &v0.Spec.Services[0] {
		t.Errorf("an edit adding a service: %v", err)
	}
}

func mustParse(t *testing.T, data []byte) *Config {
	t.Helper()
	cfg, err := Parse("t.toml", data)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
