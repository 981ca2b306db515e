package health

import (
	"errors"
	"testing"
	"time"
)

func TestMachine(t *testing.T) {
	errFail := errors.New("fail")
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	// Each case feeds results (true = pass) to a machine with rise 2 and
	// fall 3 and lists the state after each.
	tests := []struct {
		name    string
		initial State
		results []bool
		want    []State
	}{
		{"cold start passes at once", Down, []bool{true}, []State{Up}},
		{"cold start failing needs rise", Down, []bool{false, true, true}, []State{Down, Down, Up}},
		{"cold start never passing", Down, []bool{false, false, false, false}, []State{Down, Down, Down, Down}},
		{"up needs fall failures", Down, []bool{true, false, false, false}, []State{Up, Up, Up, Down}},
		{"a success resets the fall count", Down, []bool{true, false, false, true, false, false, false}, []State{Up, Up, Up, Up, Up, Up, Down}},
		{"a failure resets the rise count", Down, []bool{false, true, false, true, true}, []State{Down, Down, Down, Down, Up}},
		{"initially up and passing", Up, []bool{true, false, false, false}, []State{Up, Up, Up, Down}},
		{"initially up failing at once", Up, []bool{false, true, true}, []State{Down, Down, Up}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMachine(tt.initial, t0)
			changes := uint64(0)
			prev := tt.initial
			for i, pass := range tt.results {
				now := t0.Add(time.Duration(i+1) * time.Second)
				var err error
				if !pass {
					err = errFail
				}
				changed := m.observe(err, now, 2, 3)
				if m.state != tt.want[i] {
					t.Fatalf("after result %d (%v): %s, want %s", i, pass, m.state, tt.want[i])
				}
				if changed != (m.state != prev) {
					t.Fatalf("after result %d: changed=%v but state %s -> %s", i, changed, prev, m.state)
				}
				if changed {
					changes++
					if !m.since.Equal(now) {
						t.Fatalf("since %v, want %v", m.since, now)
					}
				}
				prev = m.state
			}
			if m.transitions != changes || m.probes != uint64(len(tt.results)) {
				t.Fatalf("counted %d transitions and %d probes", m.transitions, m.probes)
			}
		})
	}
}
