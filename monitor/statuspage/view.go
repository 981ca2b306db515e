package statuspage

import (
	"fmt"
	"html/template"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/monitor/status"
)

// pageView is what the template renders.
type pageView struct {
	Title   string
	Version string
	Asset   string
	App     string
	Time    time.Time
	Age     string
	Query   query
	// Total is the number of services in the snapshot, Matched those
	// the filter matched; Pages the number of pages of those.
	Total, Matched, Pages int
	First, Last           int
	Prev, Next            string
	Counts                []count
	Backends              count
	Services              []serviceView
	HA                    *status.HA
	BGP                   *status.BGP
	Sources               []status.Source
	Reload                *status.Reload
	Drains                []drainView
	MoreDrains            int
	HealthChecks          bool
	Foreign               int
	Now                   time.Time
}

type count struct {
	Name  string
	N     int
	Of    int
	Class string
}

// serviceView is a service as the page shows it: flat, with its text
// made, which keeps the template's reflection cheap.
type serviceView struct {
	Name, Key, Origin, Scheduler, Forwarding, State string
	Persistence                                     uint32
	Drift                                           string
	Serving, Of                                     int
	Active, Inactive                                uint64
	Rate, InOut                                     string
	Spark                                           spark
	Backends                                        []backendView
}

type backendView struct {
	Address, Forward, Reason, Drift string
	Serving                         bool
	Weight, Configured              int
	// Health is "up", "down", or "" when unchecked; Since how long it
	// has been so, Error the last failure.
	Health, Since, Error string
	Active, Inactive     uint32
	Rate, InOut          string
	Strip                []run
}

// drainView is a backend waiting at weight 0, or a removed service.
type drainView struct {
	Service, Key, Backend string
	Why                   string
	Active, Inactive      uint64
}

// maxDrains bounds the drains listed.
const maxDrains = 100

// spark is a connection-rate sparkline: Path is its SVG path, Max the
// top of its scale, Last the newest value.
type spark struct {
	Path string
	Max  uint64
	Last string
}

// run is a stretch of buckets in one state in a backend's strip.
type run struct {
	X, W  int
	Class string
	Title string
}

// The sparklines' geometry, in SVG units: a bucket is bucketW wide.
const (
	bucketW = 2
	sparkW  = Buckets * bucketW
	sparkH  = 18
)

func (s *Server) view(snap *status.Snapshot, q query) *pageView {
	now := s.opts.Now()
	v := &pageView{Version: version(snap), Asset: assetTag, App: s.opts.Version, Time: snap.Time, Query: q,
		Total: len(snap.Services), HA: snap.HA, BGP: snap.BGP, Sources: snap.Sources, Reload: snap.Reload,
		HealthChecks: snap.HealthChecks, Foreign: snap.Foreign, Now: now}
	v.Age = ago(now, snap.Time)

	// Counts by state, and backends serving, over every service.
	states := map[status.State]int{}
	for i := range snap.Services {
		sv := &snap.Services[i]
		states[sv.State]++
		for j := range sv.Backends {
			v.Backends.Of++
			if sv.Backends[j].Serving() {
				v.Backends.N++
			}
		}
	}
	for _, st := range []status.State{status.OK, status.Degraded, status.Down, status.Missing} {
		v.Counts = append(v.Counts, count{Name: string(st), N: states[st], Class: string(st)})
	}
	v.drains(snap)

	// Filter, then the page.
	matched := s.filter(snap, q.Q)
	v.Matched = len(matched)
	v.Pages = max(1, (len(matched)+PageSize-1)/PageSize)
	if q.Page > v.Pages {
		q.Page = v.Pages
		v.Query.Page = q.Page
	}
	lo := (q.Page - 1) * PageSize
	hi := min(lo+PageSize, len(matched))
	if lo < hi {
		v.First, v.Last = lo+1, hi
	}
	if q.Page > 1 {
		v.Prev = link(q.Q, q.Page-1)
	}
	if q.Page < v.Pages {
		v.Next = link(q.Q, q.Page+1)
	}
	for _, i := range matched[lo:hi] {
		v.Services = append(v.Services, s.serviceView(&snap.Services[i]))
	}
	v.Title = fmt.Sprintf("vipd: %d services, %d/%d backends serving", v.Total, v.Backends.N, v.Backends.Of)
	if n := states[status.Down] + states[status.Missing]; n > 0 {
		v.Title = fmt.Sprintf("(%d down) %s", n, v.Title)
	}
	return v
}

func link(q string, page int) string {
	vals := url.Values{}
	if q != "" {
		vals.Set("q", q)
	}
	if page > 1 {
		vals.Set("page", strconv.Itoa(page))
	}
	return "?" + vals.Encode()
}

func (v *pageView) drains(snap *status.Snapshot) {
	add := func(d drainView) {
		if len(v.Drains) < maxDrains {
			v.Drains = append(v.Drains, d)
		} else {
			v.MoreDrains++
		}
	}
	for i := range snap.Services {
		sv := &snap.Services[i]
		for j := range sv.Backends {
			b := &sv.Backends[j]
			if b.Reason == status.Draining || b.Reason == status.AdminDrain || (b.AdminDrained && b.InKernel) {
				why := string(b.Reason)
				if b.AdminDrained {
					why = string(status.AdminDrain)
				}
				add(drainView{Service: sv.Name, Key: sv.Key, Backend: b.Address.String(), Why: why,
					Active: uint64(b.ActiveConns), Inactive: uint64(b.InactiveConns)})
			}
		}
	}
	for i := range snap.Removed {
		sv := &snap.Removed[i]
		add(drainView{Key: sv.Key, Why: "service removed", Active: sv.ActiveConns, Inactive: sv.InactiveConns})
	}
}

func (s *Server) serviceView(sv *status.Service) serviceView {
	out := serviceView{Name: sv.Name, Key: sv.Key, Origin: cmpOr(sv.Source, "file"), Scheduler: sv.Scheduler,
		Forwarding: sv.Forwarding, State: string(sv.State), Drift: strings.Join(sv.Drift, "; "), Of: len(sv.Backends),
		Active: sv.ActiveConns, Inactive: sv.InactiveConns, Rate: human(sv.Stats.ConnRate, ""),
		InOut: human(sv.Stats.InByteRate, "B") + " / " + human(sv.Stats.OutByteRate, "B")}
	if sv.Persistence != nil {
		out.Persistence = sv.Persistence.Timeout
	}
	var rates [Buckets]Point
	var strips map[netip.AddrPort][Buckets]state
	if s.opts.History != nil {
		rates, strips = s.opts.History.series(sv)
	}
	out.Spark = sparkline(rates)
	now := s.opts.Now()
	out.Backends = make([]backendView, 0, len(sv.Backends))
	for j := range sv.Backends {
		b := &sv.Backends[j]
		bv := backendView{Address: b.Address.String(), Forward: b.Forward, Reason: string(b.Reason), Drift: strings.Join(b.Drift, "; "),
			Serving: b.Serving(), Weight: b.Weight, Configured: b.ConfiguredWeight, Active: b.ActiveConns, Inactive: b.InactiveConns,
			Rate: human(b.Stats.ConnRate, ""), InOut: human(b.Stats.InByteRate, "B") + " / " + human(b.Stats.OutByteRate, "B")}
		if bv.Serving {
			out.Serving++
		}
		if h := b.Health; h != nil {
			bv.Health, bv.Error = h.State, h.Error
			if !h.Since.IsZero() {
				bv.Since = ago(now, h.Since)
			}
		}
		if st, ok := strips[b.Address]; ok {
			bv.Strip = strip(st)
		}
		out.Backends = append(out.Backends, bv)
	}
	return out
}

// sparkline draws rates as an SVG path, scaled to their maximum; a bucket
// without a value breaks the line.
func sparkline(rates [Buckets]Point) spark {
	var sp spark
	for _, p := range rates {
		if p.Ok {
			sp.Max = max(sp.Max, p.Value)
		}
	}
	var b strings.Builder
	pen := false
	for i, p := range rates {
		if !p.Ok {
			pen = false
			continue
		}
		y := float64(sparkH - 1)
		if sp.Max > 0 {
			y = 1 + float64(sparkH-2)*(1-float64(p.Value)/float64(sp.Max))
		}
		x := i*bucketW + bucketW/2
		if pen {
			fmt.Fprintf(&b, "L%d %.1f", x, y)
		} else {
			// A lone point is a short dash.
			fmt.Fprintf(&b, "M%d %.1fh1", x-1, y)
			pen = true
		}
		sp.Last = strconv.FormatUint(p.Value, 10)
	}
	sp.Path = b.String()
	return sp
}

// strip draws a backend's states as runs of one state.
func strip(st [Buckets]state) []run {
	var out []run
	for i := 0; i < Buckets; {
		j := i
		for j < Buckets && st[j] == st[i] {
			j++
		}
		if st[i] != unknown {
			r := run{X: i * bucketW, W: (j - i) * bucketW, Class: "up", Title: "serving"}
			if st[i] == notServing {
				r.Class, r.Title = "down", "not serving"
			}
			mins := float64((Buckets-i)*int(Step/time.Second)) / 60
			r.Title = fmt.Sprintf("%s, from %.1f min ago for %ds", r.Title, mins, (j-i)*int(Step/time.Second))
			out = append(out, r)
		}
		i = j
	}
	return out
}

// ago says how long ago t was, briefly: "3s", "5m", "2h", "4d".
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// index is the text the filter searches, of one snapshot: per service,
// its name, key, source, state, scheduler, forwarding and backends'
// addresses, lowercased.
type index struct {
	snap *status.Snapshot
	text []string
}

// filter returns the indexes of the services that match q, all of them
// for an empty q.
func (s *Server) filter(snap *status.Snapshot, q string) []int {
	out := make([]int, 0, len(snap.Services))
	if q == "" {
		for i := range snap.Services {
			out = append(out, i)
		}
		return out
	}
	s.mu.Lock()
	idx := s.idx
	if idx == nil || idx.snap != snap {
		idx = &index{snap: snap, text: make([]string, len(snap.Services))}
		var b strings.Builder
		for i := range snap.Services {
			sv := &snap.Services[i]
			b.Reset()
			for _, f := range []string{sv.Name, sv.Key, cmpOr(sv.Source, "file"), string(sv.State), sv.Scheduler, sv.Forwarding} {
				b.WriteString(f)
				b.WriteByte(' ')
			}
			for j := range sv.Backends {
				b.WriteString(sv.Backends[j].Address.String())
				b.WriteByte(' ')
			}
			idx.text[i] = strings.ToLower(b.String())
		}
		s.idx = idx
	}
	s.mu.Unlock()
	lq := strings.ToLower(q)
	for i, t := range idx.text {
		if strings.Contains(t, lq) {
			out = append(out, i)
		}
	}
	return out
}

var funcs = template.FuncMap{
	"rfc3339": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
	"ago": ago,
	"add": func(a, b int) int { return a + b },
	"since": func(now, t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return ago(now, t)
	},
	"join": strings.Join,
	"rate": func(n uint64) string { return human(n, "") },
	"bytes": func(n uint64) string {
		return human(n, "B")
	},
	"sparkW": func() int { return sparkW },
	"sparkH": func() int { return sparkH },
}

// human prints n with a k/M/G suffix.
func human(n uint64, unit string) string {
	switch {
	case n >= 10_000_000_000:
		return strconv.FormatUint(n/1_000_000_000, 10) + "G" + unit
	case n >= 10_000_000:
		return strconv.FormatUint(n/1_000_000, 10) + "M" + unit
	case n >= 10_000:
		return strconv.FormatUint(n/1_000, 10) + "k" + unit
	}
	return strconv.FormatUint(n, 10) + unit
}
