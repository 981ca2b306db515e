package statuspage

import (
	"net/netip"
	"sync"
	"time"

	"github.com/vipd/vipd/monitor/status"
)

// The history's shape: Buckets buckets of Step each, ten minutes. A bucket
// holds the highest connection rate of the snapshots taken in it, and a
// backend is serving in it only if it was in every one of them (a short
// failure is not hidden by a later snapshot); buckets in which no
// snapshot was taken (nobody asked: no page open, no scrape) stay empty
// and the sparklines show a gap.
const (
	Step    = 10 * time.Second
	Buckets = 60
)

// History is the recent past of every service's connection rate and of
// every backend's state (serving or not), fed with each snapshot the
// daemon takes. Its memory is bounded: per service a fixed ring of
// Buckets rates (4 bytes each) and per backend two 64-bit masks (a bit
// per bucket: known, serving), and a service or backend not seen for
// Buckets buckets is forgotten. Its methods are safe for concurrent use.
type History struct {
	mu sync.Mutex
	// head is the number (Unix time / Step) of the newest bucket; 0
	// before the first snapshot.
	head int64
	// last is the time of the last snapshot observed.
	last     time.Time
	services map[string]*series
}

// series is one service's history.
type series struct {
	rate [Buckets]uint32
	// has has a bit per bucket that holds a rate.
	has uint64
	// seen is the last bucket the service was in a snapshot.
	seen     int64
	backends []backendSeries
}

// backendSeries is one backend's history: bit i of known says bucket i
// holds its state, of up that it was serving.
type backendSeries struct {
	addr      netip.AddrPort
	known, up uint64
	seen      int64
}

// NewHistory returns an empty History.
func NewHistory() *History {
	return &History{services: map[string]*series{}}
}

// seriesKey names a service in the history: its kernel service and name
// (a NodePort service has one entry per kernel service).
func seriesKey(s *status.Service) string {
	return s.Key + " " + s.Name
}

// Observe records snap. A snapshot older than the newest bucket, or the
// one observed last, is ignored.
func (h *History) Observe(snap *status.Snapshot) {
	if snap == nil {
		return
	}
	b := snap.Time.Unix() / int64(Step/time.Second)
	h.mu.Lock()
	defer h.mu.Unlock()
	if b < h.head || snap.Time.Equal(h.last) {
		return
	}
	h.last = snap.Time
	if b > h.head {
		h.advance(b)
	}
	bit := uint64(1) << uint(mod(b))
	for _, list := range [][]status.Service{snap.Services, snap.Removed} {
		for i := range list {
			s := &list[i]
			k := seriesKey(s)
			se := h.services[k]
			if se == nil {
				se = &series{}
				h.services[k] = se
			}
			r := uint32(min(s.Stats.ConnRate, 1<<32-1))
			if se.has&bit == 0 || r > se.rate[mod(b)] {
				se.rate[mod(b)] = r
			}
			se.has |= bit
			se.seen = b
			se.observe(s.Backends, b, bit)
		}
	}
}

// observe records the backends' states in bucket b.
func (se *series) observe(backends []status.Backend, b int64, bit uint64) {
	same := len(backends) == len(se.backends)
	for i := 0; same && i < len(backends); i++ {
		same = backends[i].Address == se.backends[i].addr
	}
	if !same {
		// Backends came or went: rebuild the list in the snapshot's
		// order, carrying over what is known, and keep those gone
		// until they age out.
		old := make(map[netip.AddrPort]backendSeries, len(se.backends))
		for _, bs := range se.backends {
			old[bs.addr] = bs
		}
		next := make([]backendSeries, 0, len(backends))
		for i := range backends {
			bs := old[backends[i].Address]
			bs.addr = backends[i].Address
			delete(old, bs.addr)
			next = append(next, bs)
		}
		for _, bs := range se.backends {
			if _, gone := old[bs.addr]; gone && bs.known != 0 {
				next = append(next, bs)
			}
		}
		se.backends = next
	}
	for i := range backends {
		bs := &se.backends[i]
		first := bs.known&bit == 0
		bs.known |= bit
		bs.seen = b
		switch {
		case !backends[i].Serving():
			bs.up &^= bit
		case first:
			bs.up |= bit
		}
	}
}

// advance makes b the newest bucket: it empties the buckets between the
// old head and b, and forgets what no bucket holds any more.
func (h *History) advance(b int64) {
	var clear uint64
	if h.head == 0 || b-h.head >= Buckets {
		clear = ^uint64(0)
	} else {
		for n := h.head + 1; n <= b; n++ {
			clear |= 1 << uint(mod(n))
		}
	}
	h.head = b
	for k, se := range h.services {
		if se.seen <= b-Buckets {
			delete(h.services, k)
			continue
		}
		se.has &^= clear
		for i := range se.rate {
			if clear&(1<<uint(i)) != 0 {
				se.rate[i] = 0
			}
		}
		kept := se.backends[:0]
		for _, bs := range se.backends {
			bs.known &^= clear
			bs.up &^= clear
			if bs.seen > b-Buckets {
				kept = append(kept, bs)
			}
		}
		se.backends = kept
	}
}

// Len returns the number of services the history holds.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.services)
}

// Point is one bucket of a series: Ok says it holds a value.
type Point struct {
	Ok    bool
	Value uint64
}

// rates returns the connection rates of s, oldest bucket first, and the
// serving state of each of its backends (by address), as of the newest
// bucket. The caller holds no lock.
func (h *History) series(s *status.Service) (rates [Buckets]Point, backends map[netip.AddrPort][Buckets]state) {
	h.mu.Lock()
	defer h.mu.Unlock()
	se := h.services[seriesKey(s)]
	if se == nil {
		return rates, nil
	}
	backends = make(map[netip.AddrPort][Buckets]state, len(se.backends))
	first := h.head - Buckets + 1
	for i := range Buckets {
		idx := mod(first + int64(i))
		if se.has&(1<<uint(idx)) != 0 {
			rates[i] = Point{Ok: true, Value: uint64(se.rate[idx])}
		}
	}
	for _, bs := range se.backends {
		var st [Buckets]state
		for i := range Buckets {
			idx := uint(mod(first + int64(i)))
			switch {
			case bs.known&(1<<idx) == 0:
				st[i] = unknown
			case bs.up&(1<<idx) != 0:
				st[i] = serving
			default:
				st[i] = notServing
			}
		}
		backends[bs.addr] = st
	}
	return rates, backends
}

// state is a backend's state in one bucket.
type state uint8

const (
	unknown state = iota
	serving
	notServing
)

// mod returns bucket b's index in the rings.
func mod(b int64) int64 {
	return (b%Buckets + Buckets) % Buckets
}
