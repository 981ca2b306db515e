package status

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// RenderJSON writes snap as indented JSON, for scripts. The JSON decodes
// back into a Snapshot.
func RenderJSON(w io.Writer, snap *Snapshot) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(snap); err != nil {
		return fmt.Errorf("render status as json: %w", err)
	}
	return nil
}

// RenderTable writes snap as a table for people: a summary line, then a
// row per service and one per backend below it, with the kernel's
// counters (ipvsadm -Ln --stats) and rates (--rate) beside what vipd knows
// of each: configured weight, health, drains and drift. Counts and bytes
// are humanised with SI prefixes, rates are per second, and health
// durations count back from the snapshot's time.
func RenderTable(w io.Writer, snap *Snapshot) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "vipd status at %s\n", snap.Time.Format(time.RFC3339))
	fmt.Fprintln(tw, summary(snap))
	if h := snap.HA; h != nil {
		drained := ""
		if h.Drained {
			drained = ", drained (vipd undrain --node puts it back)"
		}
		since := ""
		if !h.Since.IsZero() {
			since = fmt.Sprintf(" since %s (%s)", h.Since.Format(time.RFC3339), h.Reason)
		}
		master := ""
		if h.Master != "" && h.Role != "master" {
			master = ", master " + h.Master
		}
		fmt.Fprintf(tw, "ha: %s of vrid %d%s, priority %d (configured %d)%s%s\n", h.Role, h.VRID, since, h.Priority, h.Configured, master, drained)
	}
	if b := snap.BGP; b != nil {
		renderBGP(tw, snap.Time, b)
	}
	for _, src := range snap.Sources {
		state := "in step"
		if src.Error != "" {
			state = "out of step, its last services keep serving: " + src.Error
		}
		fmt.Fprintf(tw, "source %s: %d services, %s\n", src.Name, src.Services, state)
	}
	if len(snap.Services)+len(snap.Removed) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "SERVICE / BACKEND\tSTATE\tWEIGHT\tCONF\tACTIVE\tINACT\tCONNS\tIN\tOUT\tCONN/S\tIN/S\tOUT/S\tDETAIL")
	}
	for i := range snap.Services {
		s := &snap.Services[i]
		serviceRows(tw, snap.Time, s, s.Name+" "+s.Key)
	}
	for i := range snap.Removed {
		s := &snap.Removed[i]
		serviceRows(tw, snap.Time, s, s.Key)
	}
	tw.Flush() // cannot fail: it writes to a buffer
	// Padding before an empty last cell leaves trailing blanks.
	out := bufio.NewWriterSize(w, 64<<10)
	for line := range bytes.Lines(buf.Bytes()) {
		out.Write(bytes.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("render status table: %w", err)
	}
	return nil
}

// serviceRows writes the row of a service, labelled label, and those of
// its backends.
func serviceRows(w io.Writer, now time.Time, s *Service, label string) {
	row(w, label, string(s.State), "", "", serviceCounts(s), serviceDetail(s))
	for j := range s.Backends {
		b := &s.Backends[j]
		weight, conf := "-", "-"
		if b.InKernel {
			weight = fmt.Sprint(b.Weight)
		}
		if b.Configured {
			conf = fmt.Sprint(b.ConfiguredWeight)
		}
		state := "-"
		if b.Health != nil {
			state = b.Health.State + " " + ago(now.Sub(b.Health.Since))
		}
		row(w, "  -> "+b.Address.String(), state, weight, conf, backendCounts(b), backendDetail(s, b))
	}
}

// row writes one table row; counts are the eight counter and rate cells.
func row(w io.Writer, name, state, weight, conf string, counts [8]string, detail string) {
	cells := append([]string{name, state, weight, conf}, counts[:]...)
	cells = append(cells, detail)
	for i, c := range cells {
		// A tab or newline (in a health error, say) would break the grid.
		cells[i] = strings.Map(func(r rune) rune {
			if r == '\t' || r == '\n' || r == '\r' {
				return ' '
			}
			return r
		}, c)
	}
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

func serviceCounts(s *Service) [8]string {
	if s.State == Missing {
		return dashes()
	}
	return counts(s.ActiveConns, s.InactiveConns, s.Stats)
}

func backendCounts(b *Backend) [8]string {
	if !b.InKernel {
		return dashes()
	}
	return counts(uint64(b.ActiveConns), uint64(b.InactiveConns), b.Stats)
}

func counts(active, inactive uint64, st Stats) [8]string {
	return [8]string{
		si(active, ""), si(inactive, ""),
		si(st.Conns, ""), si(st.InBytes, "B"), si(st.OutBytes, "B"),
		si(st.ConnRate, ""), si(st.InByteRate, "B"), si(st.OutByteRate, "B"),
	}
}

func dashes() [8]string {
	return [8]string{"-", "-", "-", "-", "-", "-", "-", "-"}
}

// summary is the line that sums up a snapshot.
func summary(snap *Snapshot) string {
	if len(snap.Services) == 0 {
		parts := []string{"no services configured"}
		return strings.Join(append(parts, extras(snap)...), "; ")
	}
	n := map[State]int{}
	for _, s := range snap.Services {
		n[s.State]++
	}
	var states []string
	for _, st := range []State{OK, Degraded, Down, Missing} {
		if n[st] > 0 {
			states = append(states, fmt.Sprintf("%d %s", n[st], st))
		}
	}
	head := fmt.Sprintf("%s: %s", plural(len(snap.Services), "service"), strings.Join(states, ", "))
	return strings.Join(append([]string{head}, extras(snap)...), "; ")
}

func extras(snap *Snapshot) []string {
	var parts []string
	if snap.Draining > 0 {
		parts = append(parts, plural(snap.Draining, "backend")+" draining after removal")
	}
	if len(snap.Removed) > 0 {
		parts = append(parts, plural(len(snap.Removed), "removed service"))
	}
	if snap.Foreign > 0 {
		parts = append(parts, plural(snap.Foreign, "foreign service"))
	}
	if !snap.HealthChecks {
		parts = append(parts, "health checks off")
	}
	return parts
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// serviceDetail describes a service's settings and drift.
func serviceDetail(s *Service) string {
	var parts []string
	switch s.State {
	case Missing:
		parts = append(parts, "not in the kernel")
	case Removed:
		parts = append(parts, "removed from the configuration")
	}
	sched := s.Scheduler
	if len(s.Flags) > 0 {
		sched += " " + strings.Join(s.Flags, ",")
	}
	p := []string{sched}
	switch s.Forwarding {
	case "":
	case "mixed":
		p = append(p, "mixed forwarding")
	default:
		p = append(p, s.Forwarding)
	}
	if s.OnePacket {
		p = append(p, "one-packet")
	}
	if s.Persistence != nil {
		p = append(p, fmt.Sprintf("persistent %ds /%d", s.Persistence.Timeout, s.Persistence.Netmask))
	}
	if s.NodePort {
		p = append(p, "nodeport")
	}
	parts = append(parts, strings.Join(p, ", "))
	if len(s.Drift) > 0 {
		parts = append(parts, "drift: "+strings.Join(s.Drift, ", "))
	}
	return strings.Join(parts, "; ")
}

// backendDetail explains a backend's weight and health.
func backendDetail(s *Service, b *Backend) string {
	var parts []string
	if s.Forwarding == "mixed" {
		parts = append(parts, b.Forward)
	}
	if b.AdminDrained {
		parts = append(parts, "admin drain")
	}
	if b.Health != nil && b.Health.State == "down" {
		h := "health down"
		if b.Health.Error != "" {
			h += ": " + b.Health.Error
		}
		parts = append(parts, h)
	}
	switch b.Reason {
	case Draining:
		if s.State == Removed {
			parts = append(parts, "draining")
		} else {
			parts = append(parts, "removed from the configuration, draining")
		}
	case Sorry:
		parts = append(parts, "sorry backend")
	case Drift:
		parts = append(parts, "drift: "+strings.Join(b.Drift, ", "))
	}
	return strings.Join(parts, "; ")
}

// si formats v with an SI prefix and three significant digits: 999, 1.23k,
// 45.6M; unit follows the prefix.
func si(v uint64, unit string) string {
	if v < 1000 {
		return fmt.Sprintf("%d%s", v, unit)
	}
	const prefixes = "kMGTPE"
	f := float64(v)
	i := -1
	for f >= 999.5 && i < len(prefixes)-1 {
		f /= 1000
		i++
	}
	var s string
	switch {
	case f < 9.995:
		s = fmt.Sprintf("%.2f", f)
	case f < 99.95:
		s = fmt.Sprintf("%.1f", f)
	default:
		s = fmt.Sprintf("%.0f", f)
	}
	return s + prefixes[i:i+1] + unit
}

// ago formats a duration coarsely, to two units: 42s, 5m12s, 3h04m, 2d03h.
func ago(d time.Duration) string {
	d = max(d, 0).Truncate(time.Second)
	s := int64(d / time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", s)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd%02dh", s/86400, s%86400/3600)
}

// renderBGP writes a node's BGP lines: the announcements, a line per
// peer and a line per VIP withheld.
func renderBGP(w io.Writer, now time.Time, b *BGP) {
	drained := ""
	if b.Drained {
		drained = ", drained (vipd undrain --node puts it back)"
	}
	fmt.Fprintf(w, "bgp: AS%d router id %s, %d VIPs announced, %d withheld%s\n", b.ASN, b.RouterID, len(b.Announced), len(b.Withheld), drained)
	for _, p := range b.Peers {
		since := ""
		if !p.Since.IsZero() {
			since = " for " + ago(now.Sub(p.Since))
		}
		fmt.Fprintf(w, "bgp peer %s AS%d: %s%s, %d routes\n", p.Address, p.ASN, p.State, since, p.Routes)
	}
	for _, h := range b.Withheld {
		fmt.Fprintf(w, "bgp withheld %s: %s\n", h.Route, h.Reason)
	}
}
