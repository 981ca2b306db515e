package statuspage

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/monitor/status"
)

func TestHistory(t *testing.T) {
	h := NewHistory()
	snap := synthetic(3, 2, t0)
	// Five minutes of snapshots every 5 s: svc-00000's rate climbs, its
	// second backend stops serving after two minutes.
	for i := range 60 {
		at := t0.Add(time.Duration(i) * 5 * time.Second)
		s := synthetic(3, 2, at)
		s.Services[0].Stats.ConnRate = uint64(i)
		if i >= 24 {
			s.Services[0].Backends[1].Weight = 0
		}
		h.Observe(s)
		h.Observe(s) // twice: ignored
	}
	rates, backends := h.series(&snap.Services[0])
	// 300 s in 10 s buckets: the last 30 buckets hold the highest value
	// of each (odd i), the first 30 nothing.
	for i, p := range rates {
		if want := i >= 30; p.Ok != want {
			t.Fatalf("bucket %d: ok %v", i, p.Ok)
		}
		if p.Ok && p.Value != uint64(2*(i-30)+1) {
			t.Errorf("bucket %d: %d, want %d", i, p.Value, 2*(i-30)+1)
		}
	}
	st := backends[snap.Services[0].Backends[1].Address]
	if st[29] != unknown || st[30] != serving || st[41] != serving || st[42] != notServing || st[59] != notServing {
		t.Errorf("backend strip %v", st)
	}
	runs := strip(st)
	if len(runs) != 2 || runs[0].Class != "up" || runs[0].X != 60 || runs[0].W != 24 || runs[1].Class != "down" || runs[1].W != 36 {
		t.Errorf("runs %+v", runs)
	}
	sp := sparkline(rates)
	if sp.Max != 59 || sp.Last != "59" || !strings.HasPrefix(sp.Path, "M60 ") || strings.Count(sp.Path, "L") != 29 {
		t.Errorf("sparkline %+v", sp)
	}
	// Within a bucket, the highest rate and any failure stay.
	at := t0.Add(600 * time.Second)
	for i, serving := range []bool{true, false, true} {
		s := synthetic(3, 2, at.Add(time.Duration(i)*time.Second))
		s.Services[2].Stats.ConnRate = uint64(100 - 10*i)
		if !serving {
			s.Services[2].Backends[0].Weight = 0
		}
		h.Observe(s)
	}
	r, bs := h.series(&snap.Services[2])
	if r[Buckets-1] != (Point{Ok: true, Value: 100}) || bs[snap.Services[2].Backends[0].Address][Buckets-1] != notServing ||
		bs[snap.Services[2].Backends[1].Address][Buckets-1] != serving {
		t.Errorf("bucket of three snapshots: rate %+v, states %v", r[Buckets-1], bs)
	}
	h = NewHistory()
	for i := range 60 {
		s := synthetic(3, 2, t0.Add(time.Duration(i)*5*time.Second))
		s.Services[0].Stats.ConnRate = uint64(i)
		h.Observe(s)
	}

	// An older snapshot changes nothing.
	h.Observe(synthetic(3, 2, t0))
	if r2, _ := h.series(&snap.Services[0]); r2 != rates {
		t.Error("an older snapshot was recorded")
	}
	// A service that leaves is forgotten once no bucket holds it; a
	// backend that leaves too.
	later := t0.Add(300 * time.Second)
	for i := range 130 {
		s := synthetic(3, 2, later.Add(time.Duration(i)*5*time.Second))
		s.Services = s.Services[1:]
		s.Services[0].Backends = s.Services[0].Backends[:1]
		h.Observe(s)
		if i == 60 && h.Len() != 3 {
			t.Errorf("after 5 min: %d services, want 3", h.Len())
		}
	}
	if h.Len() != 2 {
		t.Errorf("after 10 min: %d services, want 2", h.Len())
	}
	if _, b := h.series(&snap.Services[1]); len(b) != 1 {
		t.Errorf("a removed backend is still held: %d", len(b))
	}
	// A gap longer than the history empties it.
	h.Observe(synthetic(3, 2, later.Add(time.Hour)))
	r, _ = h.series(&snap.Services[1])
	for i, p := range r[:Buckets-1] {
		if p.Ok {
			t.Fatalf("bucket %d survived an hour's gap", i)
		}
	}
}

// TestHistoryMemory measures the history of 10,000 services x 10 backends
// after ten minutes of snapshots, and holds it to a bound.
func TestHistoryMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	snaps := make([]*status.Snapshot, 2)
	for i := range snaps {
		snaps[i] = synthetic(10_000, 10, t0)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h := NewHistory()
	for i := range Buckets + 5 {
		s := snaps[i%2]
		s.Time = t0.Add(time.Duration(i) * Step)
		h.Observe(s)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	used := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("history of 10,000 services x 10 backends: %.1f MiB (%d bytes a service)", float64(used)/(1<<20), used/10_000)
	if used > 12<<20 {
		t.Errorf("history takes %d bytes, more than 12 MiB", used)
	}
	runtime.KeepAlive(snaps)
	runtime.KeepAlive(h)
}
