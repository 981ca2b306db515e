package status

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
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

// WriteJSON writes snap as compact JSON, as json.Marshal does, but a
// service at a time: the JSON of 10,000 services of 10 backends is 30
// MB, which json.Marshal holds whole (and grows by doubling).
func WriteJSON(w io.Writer, snap *Snapshot) error {
	head := *snap
	head.Services, head.Removed = nil, nil
	b, err := json.Marshal(&head)
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	// The lists' place: the first such text, as the fields before them
	// are a time, a bool and numbers (and a quote in a string is
	// escaped).
	const lists = `"services":null,"removed_services":null`
	i := bytes.Index(b, []byte(lists))
	if i < 0 {
		return fmt.Errorf("encode status: no %s in %s", lists, b)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	list := func(l []Service) error {
		if l == nil {
			bw.WriteString("null")
			return nil
		}
		bw.WriteByte('[')
		for i := range l {
			if i > 0 {
				bw.WriteByte(',')
			}
			buf.Reset()
			if err := enc.Encode(&l[i]); err != nil {
				return fmt.Errorf("encode status: %w", err)
			}
			bw.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
		}
		bw.WriteByte(']')
		return nil
	}
	bw.Write(b[:i])
	bw.WriteString(`"services":`)
	if err := list(snap.Services); err != nil {
		return err
	}
	bw.WriteString(`,"removed_services":`)
	if err := list(snap.Removed); err != nil {
		return err
	}
	bw.Write(b[i+len(lists):])
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write status: %w", err)
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
	out := bufio.NewWriterSize(w, 64<<10)
	var head bytes.Buffer
	fmt.Fprintf(&head, "vipd status at %s\n", snap.Time.Format(time.RFC3339))
	fmt.Fprintln(&head, summary(snap))
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
		fmt.Fprintf(&head, "ha: %s of vrid %d%s, priority %d (configured %d)%s%s\n", h.Role, h.VRID, since, h.Priority, h.Configured, master, drained)
	}
	if b := snap.BGP; b != nil {
		renderBGP(&head, snap.Time, b)
	}
	for _, src := range snap.Sources {
		state := "in step"
		if src.Error != "" {
			state = "out of step, its last services keep serving: " + src.Error
		}
		fmt.Fprintf(&head, "source %s: %d services, %s\n", src.Name, src.Services, state)
	}
	for line := range bytes.Lines(head.Bytes()) {
		out.Write(bytes.TrimRight(line, " \n"))
		out.WriteByte('\n')
	}
	if len(snap.Services)+len(snap.Removed) > 0 {
		out.WriteByte('\n')
		// Two passes: the columns' widths, then the rows. Nothing of
		// the table is held but a line: at 10,000 services it is 10 MiB.
		g := &grid{cols: len(tableHeader), width: make([]int, len(tableHeader))}
		for _, w := range []*bufio.Writer{nil, out} {
			g.w = w
			for _, h := range tableHeader {
				g.add(h)
			}
			for i := range snap.Services {
				s := &snap.Services[i]
				serviceRows(g, snap.Time, s, s.Name, " ", s.Key)
			}
			for i := range snap.Removed {
				s := &snap.Removed[i]
				serviceRows(g, snap.Time, s, s.Key)
			}
		}
	}
	if err := out.Flush(); err != nil {
		return fmt.Errorf("render status table: %w", err)
	}
	return nil
}

// tableHeader is the table's first row.
var tableHeader = []string{"SERVICE / BACKEND", "STATE", "WEIGHT", "CONF", "ACTIVE", "INACT", "CONNS", "IN", "OUT", "CONN/S", "IN/S", "OUT/S", "DETAIL"}

// grid lays out rows of cells in columns, as text/tabwriter does with a
// padding of two blanks: every cell but a row's last is padded to the
// width of its column's widest cell (in runes) and two blanks. Its lines
// end without blanks. Tabs and line breaks in a cell become blanks.
//
// The rows are given twice: with no writer, to measure the columns, then
// with w, to write them.
type grid struct {
	cols  int
	width []int // the widest cell of each column, in runes
	w     *bufio.Writer
	col   int    // the column of the next cell
	cell  []byte // scratch for a cell's text
	line  []byte // the row being written
}

// add adds a cell of the text of the given strings, one after the other.
func (g *grid) add(parts ...string) {
	g.cell = g.cell[:0]
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			c := p[i]
			if c == '\t' || c == '\n' || c == '\r' {
				c = ' '
			}
			g.cell = append(g.cell, c)
		}
	}
	g.end()
}

// addSI adds a cell of v with an SI prefix (appendSI).
func (g *grid) addSI(v uint64, unit string) {
	g.cell = appendSI(g.cell[:0], v, unit)
	g.end()
}

// addInt adds a cell of v in decimal.
func (g *grid) addInt(v int) {
	g.cell = strconv.AppendInt(g.cell[:0], int64(v), 10)
	g.end()
}

// end measures or writes the cell in g.cell.
func (g *grid) end() {
	col := g.col
	g.col = (g.col + 1) % g.cols
	n := utf8.RuneCount(g.cell)
	if g.w == nil {
		g.width[col] = max(g.width[col], n)
		return
	}
	g.line = append(g.line, g.cell...)
	if col < g.cols-1 {
		for range g.width[col] + 2 - n {
			g.line = append(g.line, ' ')
		}
		return
	}
	g.w.Write(bytes.TrimRight(g.line, " "))
	g.w.WriteByte('\n')
	g.line = g.line[:0]
}

// serviceRows adds the row of a service, labelled with the text of label,
// and those of its backends.
func serviceRows(g *grid, now time.Time, s *Service, label ...string) {
	g.add(label...)
	g.add(string(s.State))
	g.add()
	g.add()
	if s.State == Missing {
		dashes(g)
	} else {
		counts(g, s.ActiveConns, s.InactiveConns, &s.Stats)
	}
	g.add(serviceDetail(s))
	for j := range s.Backends {
		b := &s.Backends[j]
		g.cell = b.Address.AppendTo(append(g.cell[:0], "  -> "...))
		g.end()
		if b.Health != nil {
			g.add(b.Health.State, " ", ago(now.Sub(b.Health.Since)))
		} else {
			g.add("-")
		}
		if b.InKernel {
			g.addInt(b.Weight)
		} else {
			g.add("-")
		}
		if b.Configured {
			g.addInt(b.ConfiguredWeight)
		} else {
			g.add("-")
		}
		if b.InKernel {
			counts(g, uint64(b.ActiveConns), uint64(b.InactiveConns), &b.Stats)
		} else {
			dashes(g)
		}
		g.add(backendDetail(s, b))
	}
}

// counts adds the eight counter and rate cells.
func counts(g *grid, active, inactive uint64, st *Stats) {
	g.addSI(active, "")
	g.addSI(inactive, "")
	g.addSI(st.Conns, "")
	g.addSI(st.InBytes, "B")
	g.addSI(st.OutBytes, "B")
	g.addSI(st.ConnRate, "")
	g.addSI(st.InByteRate, "B")
	g.addSI(st.OutByteRate, "B")
}

// dashes adds eight cells of "-": no counters.
func dashes(g *grid) {
	for range 8 {
		g.add("-")
	}
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

// appendSI appends v to b with an SI prefix and three significant digits:
// 999, 1.23k, 45.6M; unit follows the prefix.
func appendSI(b []byte, v uint64, unit string) []byte {
	if v < 1000 {
		return append(strconv.AppendUint(b, v, 10), unit...)
	}
	const prefixes = "kMGTPE"
	f := float64(v)
	i := -1
	for f >= 999.5 && i < len(prefixes)-1 {
		f /= 1000
		i++
	}
	prec := 0
	switch {
	case f < 9.995:
		prec = 2
	case f < 99.95:
		prec = 1
	}
	b = strconv.AppendFloat(b, f, 'f', prec, 64)
	return append(append(b, prefixes[i]), unit...)
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

// renderBFD writes the line of a BGP peer's BFD session.
func renderBFD(w io.Writer, now time.Time, peer string, b *BFD) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	since := ""
	if !b.Since.IsZero() {
		since = " for " + ago(now.Sub(b.Since))
	}
	last := ""
	if b.LastDown != "" {
		last = " (last: " + b.LastDown + ")"
	}
	dropped := ""
	if d := b.Dropped; d.Total() > 0 {
		dropped = fmt.Sprintf(" (ttl %d, malformed %d, discriminator %d)", d.TTL, d.Malformed, d.Discriminator)
	}
	fmt.Fprintf(w, "bgp peer %s bfd: %s%s, remote %s, tx %s, rx %s, multiplier %d (remote %d), detection %s, %d downs%s, packets %d received, %d sent, %d dropped%s\n",
		peer, b.State, since, b.RemoteState, ms(b.TxInterval), ms(b.RxInterval), b.DetectMult, b.RemoteDetectMult, ms(b.DetectionTime),
		b.Downs, last, b.Received, b.Sent, b.Dropped.Total(), dropped)
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
		limited := ""
		if !p.Limited.IsZero() {
			limited = ", cut " + ago(now.Sub(p.Limited)) + " ago for sending more than max_prefixes"
		}
		bfd := ""
		if p.BFD != nil {
			bfd = ", bfd " + p.BFD.State
		}
		fmt.Fprintf(w, "bgp peer %s AS%d: %s%s, %d routes%s%s\n", p.Address, p.ASN, p.State, since, p.Routes, limited, bfd)
		if p.BFD != nil {
			renderBFD(w, now, p.Address, p.BFD)
		}
	}
	for _, h := range b.Withheld {
		fmt.Fprintf(w, "bgp withheld %s: %s\n", h.Route, h.Reason)
	}
}
