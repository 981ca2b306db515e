package statuspage

import (
	"net/http/httptest"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the process's CPU time so far (user and system): on a
// loaded machine it measures the work better than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The render of the page at 10,000 services x 10 backends, with ten
// minutes of history: the server's part of the time to first paint.
func benchPage(b *testing.B, target string) {
	snap := synthetic(10_000, 10, t0)
	h := NewHistory()
	for i := range Buckets {
		s := *snap
		s.Time = t0.Add(time.Duration(i-Buckets+1) * Step)
		h.Observe(&s)
	}
	srv := server(snap, h).Handler()
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
	if w.Code/100 != 2 {
		b.Fatal(w.Code)
	}
	size := w.Body.Len()
	b.ResetTimer()
	start := cpuTime()
	for range b.N {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(size), "bytes")
}

func BenchmarkPage10k(b *testing.B)       { benchPage(b, "/") }
func BenchmarkPage10kLast(b *testing.B)   { benchPage(b, "/?page=200") }
func BenchmarkPage10kFilter(b *testing.B) { benchPage(b, "/?q=app99") }
func BenchmarkData10k(b *testing.B)       { benchPage(b, "/status.json") }
func BenchmarkData10kUnchanged(b *testing.B) {
	benchPage(b, "/status.json?v="+version(synthetic(1, 1, t0)))
}

// The history's cost for each snapshot taken at 10,000 x 10.
func BenchmarkObserve10k(b *testing.B) {
	snap := synthetic(10_000, 10, t0)
	h := NewHistory()
	b.ResetTimer()
	start := cpuTime()
	for i := range b.N {
		snap.Time = t0.Add(time.Duration(i) * 5 * time.Second)
		h.Observe(snap)
	}
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}
