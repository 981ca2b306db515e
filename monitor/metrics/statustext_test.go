package metrics

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/monitor/status"
)

// mixedStatus returns a snapshot with what orders and filters the status
// metrics: names shared by several services (NodePort entries), backends
// in several services, missing services, backends only configured or
// only in the kernel, failing health, names to escape, counters of every
// magnitude; in a shuffled order.
func mixedStatus(n int, seed uint64) *status.Snapshot {
	rng := rand.New(rand.NewPCG(seed, 1))
	snap := &status.Snapshot{Time: time.Unix(1764806400, 123456789), Foreign: 3}
	names := []string{"web", "api", "a\"quoted\\name", "np", "z-last", "line\nbreak"}
	states := []status.State{status.OK, status.Degraded, status.Down, status.Missing}
	for i := range n {
		s := status.Service{
			Name:  names[rng.IntN(len(names))] + fmt.Sprint(i%7),
			Key:   fmt.Sprintf("10.0.%d.%d:%d/tcp", i%3, rng.IntN(4), 80+i%5),
			State: states[rng.IntN(len(states))],
			Stats: status.Stats{Conns: rng.Uint64N(1 << 40), InPackets: uint64(i), OutPackets: 1, InBytes: rng.Uint64N(5e9), OutBytes: 0},
		}
		for j := range 1 + rng.IntN(6) {
			b := status.Backend{
				Address:          netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 16, byte(rng.IntN(3)), byte(j)}), uint16(8080+rng.IntN(2))),
				Configured:       rng.IntN(5) > 0,
				ConfiguredWeight: rng.IntN(3),
				InKernel:         rng.IntN(5) > 0,
				Weight:           rng.IntN(100) - 1,
				ActiveConns:      rng.Uint32N(1000),
				InactiveConns:    rng.Uint32N(2),
				Stats:            status.Stats{Conns: rng.Uint64N(1e12), InPackets: rng.Uint64N(10), OutPackets: rng.Uint64N(1 << 60), InBytes: 2_400_000_000, OutBytes: rng.Uint64N(1e7)},
			}
			switch rng.IntN(3) {
			case 0:
				b.Health = &status.Health{State: "down"}
			case 1:
				b.Health = &status.Health{State: "up"}
			}
			if slices.ContainsFunc(s.Backends, func(o status.Backend) bool { return o.Address == b.Address }) {
				continue
			}
			s.Backends = append(s.Backends, b)
		}
		if slices.ContainsFunc(snap.Services, func(o status.Service) bool { return o.Name == s.Name && o.Key == s.Key }) {
			continue
		}
		snap.Services = append(snap.Services, s)
	}
	// BGP peers, some with BFD, in no order, v4 and v6.
	snap.BGP = &status.BGP{}
	for i := range n / 10 {
		p := status.BGPPeer{Address: netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(3)), byte(i)}).String(), State: "established"}
		if i%2 == 1 {
			p.Address = fmt.Sprintf("fd00::%x", i)
		}
		if rng.IntN(3) > 0 {
			p.BFD = &status.BFD{State: []string{"up", "down", "init", "admindown"}[rng.IntN(4)], Downs: rng.Uint64N(5),
				Received: rng.Uint64N(1 << 40), Sent: rng.Uint64N(1e6), Dropped: status.BFDDropped{TTL: rng.Uint64N(3), Malformed: rng.Uint64N(3)}}
		}
		snap.BGP.Peers = append(snap.BGP.Peers, p)
	}
	return snap
}

// scrapeWith serves one request to h with the given Accept and
// Accept-Encoding headers and returns the (decompressed) body and the
// response.
func scrapeWith(t *testing.T, h http.Handler, accept, encoding string) (string, *http.Response) {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	if encoding != "" {
		r.Header.Set("Accept-Encoding", encoding)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	resp := w.Result()
	body := io.Reader(resp.Body)
	if resp.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = gz
	}
	data, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	return string(data), resp
}

// TestStatusTextMatchesRegistry checks that the handler's own writing of
// the status metrics is byte for byte what client_golang's registry and
// encoder write, in full scrapes with every other family around them.
func TestStatusTextMatchesRegistry(t *testing.T) {
	for name, snap := range map[string]*status.Snapshot{
		"fake":         fakeStatus(),
		"mixed 40":     mixedStatus(40, 1),
		"mixed 400":    mixedStatus(400, 2),
		"nil":          nil,
		"no services":  {Time: time.Unix(5, 0)},
		"only missing": {Services: []status.Service{{Name: "x", Key: "k", State: status.Missing}}},
	} {
		t.Run(name, func(t *testing.T) {
			m := New(Options{
				Version:   "1.2.3",
				Status:    fixed(snap),
				Announcer: func() AnnouncerStats { return AnnouncerStats{Announcements: 3} },
				Health:    func() health.Stats { return health.Stats{Checks: 1} },
				Now:       func() time.Time { return now },
				NoRuntime: true,
			})
			m.Pass("start", nil, time.Millisecond)
			m.HA(true, 100, "start")
			want, _ := scrapeWith(t, m.full, "", "")
			got, resp := scrapeWith(t, http.HandlerFunc(m.serve), "", "")
			if got != want {
				t.Errorf("the handler's text differs from the registry's:\n%s", firstDiff(got, want))
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
				t.Errorf("content type %q", ct)
			}
			gz, resp := scrapeWith(t, http.HandlerFunc(m.serve), "", "gzip, deflate")
			if resp.Header.Get("Content-Encoding") != "gzip" || gz != want {
				t.Errorf("gzip scrape: encoding %q, same text %v", resp.Header.Get("Content-Encoding"), gz == want)
			}
		})
	}
}

// firstDiff shows where two texts part.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d:\n got  %q\n want %q", i+1, g[i], w[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(g), len(w))
}

// TestScrapeFormats checks that a protobuf scrape still gets everything
// through the registry, and that a failed status read counts once per
// scrape and leaves the status metrics out.
func TestScrapeFormats(t *testing.T) {
	m := New(Options{Status: fixed(fakeStatus()), NoRuntime: true})
	body, resp := scrapeWith(t, m.Handler(), "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited", "")
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "protobuf") || !strings.Contains(body, "vipd_backend_weight") {
		t.Errorf("protobuf scrape: %q, backend weights %v", ct, strings.Contains(body, "vipd_backend_weight"))
	}

	failing := New(Options{Status: func() (*status.Snapshot, error) { return nil, errors.New("netlink: gone") }, NoRuntime: true, Logger: discard()})
	for i := 1; i <= 2; i++ {
		body, _ := scrapeWith(t, failing.Handler(), "text/plain", "")
		if !strings.Contains(body, fmt.Sprintf("\nvipd_status_errors_total %d\n", i)) || strings.Contains(body, "vipd_service_state") {
			t.Errorf("scrape %d of a failing status:\n%s", i, body)
		}
	}
}

func TestAcceptsGzip(t *testing.T) {
	for header, want := range map[string]bool{
		"": false, "gzip": true, "deflate, gzip;q=1.0, *;q=0.5": true, "gzip;q=0": false, "GZIP": true, "br": false, "x-gzip": false,
	} {
		if got := acceptsGzip(header); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", header, got, want)
		}
	}
}

// BenchmarkScrape10k is one text scrape of 10,000 services of 10
// backends: the handler's own writing, and client_golang's registry
// (what every scrape cost before), with the Go runtime's metrics.
func BenchmarkScrape10k(b *testing.B) {
	snap := &status.Snapshot{Time: time.Now()}
	for i := range 10000 {
		s := status.Service{Name: fmt.Sprint("svc-", i), Key: fmt.Sprintf("10.100.%d.%d:80/tcp", i/250, i%250), State: status.OK}
		for j := range 10 {
			s.Backends = append(s.Backends, status.Backend{
				Address: netip.AddrPortFrom(netip.AddrFrom4([4]byte{172, 16, byte(i >> 4), byte(i<<4 | j)}), 8080), Configured: true, ConfiguredWeight: 1, InKernel: true, Weight: 1,
				Stats: status.Stats{Conns: uint64(i * j), InBytes: 1 << 30},
			})
		}
		snap.Services = append(snap.Services, s)
	}
	m := New(Options{Status: fixed(snap)})
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"handler", m.Handler()}, {"registry", m.full}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				w := &countWriter{ResponseRecorder: httptest.NewRecorder()}
				bc.h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
				n = w.n
			}
			b.ReportMetric(float64(n)/(1<<20), "MiB/scrape")
		})
	}
}

type countWriter struct {
	*httptest.ResponseRecorder
	n int
}

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
