package status

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// si is appendSI as a string.
func si(v uint64, unit string) string { return string(appendSI(nil, v, unit)) }

// tabwriterTable is the table as RenderTable wrote it with text/tabwriter
// (padding 2) before it laid out its own grid: the reference the grid
// must match byte for byte.
func tabwriterTable(snap *Snapshot) string {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	clean := func(c string) string {
		return strings.Map(func(r rune) rune {
			if r == '\t' || r == '\n' || r == '\r' {
				return ' '
			}
			return r
		}, c)
	}
	row := func(cells ...string) {
		for i := range cells {
			cells[i] = clean(cells[i])
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	cnt := func(active, inactive uint64, st Stats) []string {
		return []string{si(active, ""), si(inactive, ""), si(st.Conns, ""), si(st.InBytes, "B"), si(st.OutBytes, "B"),
			si(st.ConnRate, ""), si(st.InByteRate, "B"), si(st.OutByteRate, "B")}
	}
	dash := []string{"-", "-", "-", "-", "-", "-", "-", "-"}
	svc := func(s *Service, label string) {
		c := dash
		if s.State != Missing {
			c = cnt(s.ActiveConns, s.InactiveConns, s.Stats)
		}
		row(append(append([]string{label, string(s.State), "", ""}, c...), serviceDetail(s))...)
		for j := range s.Backends {
			b := &s.Backends[j]
			weight, conf, state := "-", "-", "-"
			if b.InKernel {
				weight = fmt.Sprint(b.Weight)
			}
			if b.Configured {
				conf = fmt.Sprint(b.ConfiguredWeight)
			}
			if b.Health != nil {
				state = b.Health.State + " " + ago(snap.Time.Sub(b.Health.Since))
			}
			c := dash
			if b.InKernel {
				c = cnt(uint64(b.ActiveConns), uint64(b.InactiveConns), b.Stats)
			}
			row(append(append([]string{"  -> " + b.Address.String(), state, weight, conf}, c...), backendDetail(s, b))...)
		}
	}
	fmt.Fprintf(tw, "vipd status at %s\n", snap.Time.Format(time.RFC3339))
	fmt.Fprintln(tw, summary(snap))
	if len(snap.Services)+len(snap.Removed) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SERVICE / BACKEND\tSTATE\tWEIGHT\tCONF\tACTIVE\tINACT\tCONNS\tIN\tOUT\tCONN/S\tIN/S\tOUT/S\tDETAIL")
	}
	for i := range snap.Services {
		svc(&snap.Services[i], snap.Services[i].Name+" "+snap.Services[i].Key)
	}
	for i := range snap.Removed {
		svc(&snap.Removed[i], snap.Removed[i].Key)
	}
	tw.Flush()
	var out strings.Builder
	for line := range bytes.Lines(buf.Bytes()) {
		out.Write(bytes.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	return out.String()
}

// randomSnapshot makes a snapshot of n services whose names, states,
// health errors and counters vary: wide and narrow cells, cells of
// several bytes a rune, tabs and line breaks, empty details.
func randomSnapshot(r *rand.Rand, n int) *Snapshot {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	words := []string{"web", "dns", "api-gateway", "ünïcødé", "日本語", "tab\there", "line\nbreak", "cr\r", "", "x", "trailing  "}
	pick := func() string { return words[r.IntN(len(words))] }
	num := func() uint64 { return r.Uint64() >> r.UintN(64) }
	stats := func() Stats {
		return Stats{Conns: num(), InBytes: num(), OutBytes: num(), ConnRate: num(), InByteRate: num(), OutByteRate: num()}
	}
	snap := &Snapshot{Time: now, HealthChecks: true}
	for i := range n {
		name := pick()
		if r.IntN(2) == 0 {
			name += fmt.Sprint(i)
		}
		s := Service{Name: name, Key: fmt.Sprintf("192.0.2.%d:%d/tcp", i%250, r.IntN(65536)),
			Scheduler: []string{"rr", "wrr", "mh", "sh"}[r.IntN(4)], State: []State{OK, Degraded, Down, Missing}[r.IntN(4)],
			ActiveConns: num(), InactiveConns: num(), Stats: stats()}
		if r.IntN(3) == 0 {
			s.Forwarding = []string{"masq", "droute", "tunnel", "mixed"}[r.IntN(4)]
		}
		if r.IntN(5) == 0 {
			s.Drift = []string{"scheduler " + pick()}
		}
		for j := range r.IntN(6) {
			b := Backend{Address: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i), byte(j), 1}), uint16(r.IntN(65536))),
				Forward: "masq", Configured: r.IntN(4) > 0, ConfiguredWeight: r.IntN(1000), InKernel: r.IntN(4) > 0,
				Weight: r.IntN(100000), ActiveConns: uint32(num()), InactiveConns: uint32(num()), Stats: stats(),
				AdminDrained: r.IntN(8) == 0}
			if j%2 == 1 {
				b.Address = netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", r.IntN(1<<16))), 443)
			}
			if r.IntN(2) == 0 {
				b.Health = &Health{State: []string{"up", "down"}[r.IntN(2)], Since: now.Add(-time.Duration(r.Int64N(int64(72 * time.Hour)))), Error: pick()}
			}
			b.Reason = []Reason{"", Draining, Sorry, Drift}[r.IntN(4)]
			if b.Reason == Drift {
				b.Drift = []string{"weight " + pick()}
			}
			s.Backends = append(s.Backends, b)
		}
		if r.IntN(10) == 0 {
			s.State = Removed
			snap.Removed = append(snap.Removed, s)
			continue
		}
		snap.Services = append(snap.Services, s)
	}
	return snap
}

// TestTableMatchesTabwriter checks the table's grid against text/tabwriter
// on random snapshots.
func TestTableMatchesTabwriter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 300 {
		snap := randomSnapshot(r, r.IntN(20))
		var got bytes.Buffer
		if err := RenderTable(&got, snap); err != nil {
			t.Fatal(err)
		}
		if want := tabwriterTable(snap); got.String() != want {
			t.Fatalf("snapshot %d: the grid differs from tabwriter's\n--- got\n%s\n--- want\n%s", i, got.String(), want)
		}
	}
}

// TestWriteJSONMatchesMarshal checks WriteJSON against json.Marshal on
// random snapshots, with and without services, HA, BGP and sources, and
// with the text WriteJSON looks for in the strings of each.
func TestWriteJSONMatchesMarshal(t *testing.T) {
	const lists = `"services":null,"removed_services":null`
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 300 {
		snap := randomSnapshot(r, r.IntN(12))
		switch i % 4 {
		case 0:
			snap.Services, snap.Removed = nil, nil
		case 1:
			snap.Services, snap.Removed = []Service{}, []Service{}
		case 2:
			snap.HA = &HA{Role: "backup", VRID: 7, Master: lists, Reason: lists}
			snap.BGP = &BGP{ASN: 65001, RouterID: lists, Withheld: []BGPWithheld{{Route: "192.0.2.1/32", Reason: lists}}}
			snap.Sources = []Source{{Name: lists, Services: 3, Error: lists}}
		}
		if len(snap.Services) > 0 {
			snap.Services[0].Name = lists
		}
		want, err := json.Marshal(snap)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := WriteJSON(&got, snap); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("snapshot %d:\n%s\nwant json.Marshal's:\n%s", i, got.Bytes(), want)
		}
	}
}
