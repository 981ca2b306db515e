package metrics

import (
	"bufio"
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/monitor/status"
)

// textFamily is one metric family the status text writer writes.
type textFamily struct {
	name  string
	write func(*textWriter)
}

// statusFamilies returns the families of snap's status metrics as the
// registry would expose statusCollector's metrics in the text format,
// byte for byte: the families that have metrics, sorted by name, each
// with its metrics in the registry's order (by label values, the labels
// taken in the order of their names). errors is the value of
// vipd_status_errors_total. At 10,000 services of 10 backends, a
// million samples, this takes a fraction of a second where building
// const metrics, gathering and encoding them takes many seconds and
// gigabytes of allocations.
func statusFamilies(snap *status.Snapshot, errors float64) []textFamily {
	errorsFamily := textFamily{statusErrors, func(w *textWriter) {
		w.header(statusErrors, "counter")
		w.sample(statusErrors, errors)
	}}
	if snap == nil {
		return []textFamily{errorsFamily}
	}

	// Backends by (backend, service, vip), services by (service, vip):
	// the order of every family whose labels sort that way.
	type beRef struct {
		s    *status.Service
		b    *status.Backend
		addr string
	}
	var bes []beRef
	svcs := make([]*status.Service, len(snap.Services))
	for i := range snap.Services {
		s := &snap.Services[i]
		svcs[i] = s
		for j := range s.Backends {
			bes = append(bes, beRef{s, &s.Backends[j], s.Backends[j].Address.String()})
		}
	}
	slices.SortFunc(bes, func(x, y beRef) int {
		return cmp.Or(strings.Compare(x.addr, y.addr), strings.Compare(x.s.Name, y.s.Name), strings.Compare(x.s.Key, y.s.Key))
	})
	slices.SortFunc(svcs, func(x, y *status.Service) int {
		return cmp.Or(strings.Compare(x.Name, y.Name), strings.Compare(x.Key, y.Key))
	})
	// groups returns the runs of refs with equal keys, in order.
	addrGroups := runs(len(bes), func(i, j int) bool { return bes[i].addr == bes[j].addr })
	nameGroups := runs(len(svcs), func(i, j int) bool { return svcs[i].Name == svcs[j].Name })

	// backendFamily writes a family labelled backend, service, vip with
	// a sample for each backend m keeps.
	backendFamily := func(m *statusMetric) textFamily {
		return textFamily{m.name, func(w *textWriter) {
			first := true
			for _, r := range bes {
				if !m.backend(r.b) {
					continue
				}
				if first {
					w.header(m.name, m.typeName())
					first = false
				}
				w.sample(m.name, m.backendValue(r.b), "backend", r.addr, "service", r.s.Name, "vip", r.s.Key)
			}
		}}
	}
	// backendDirFamily writes a family labelled backend, direction,
	// service, vip for the backends m keeps.
	backendDirFamily := func(m *statusMetric) textFamily {
		name, in, out := m.name, m.backendIn, m.backendOut
		return textFamily{name, func(w *textWriter) {
			first := true
			for _, g := range addrGroups {
				for _, dir := range [...]string{"in", "out"} {
					for _, r := range bes[g[0]:g[1]] {
						if !m.backend(r.b) {
							continue
						}
						if first {
							w.header(name, m.typeName())
							first = false
						}
						v := in(r.b)
						if dir == "out" {
							v = out(r.b)
						}
						w.sample(name, float64(v), "backend", r.addr, "direction", dir, "service", r.s.Name, "vip", r.s.Key)
					}
				}
			}
		}}
	}
	// serviceDirFamily writes a family labelled direction, service, vip
	// for the services m keeps.
	serviceDirFamily := func(m *statusMetric) textFamily {
		name, in, out := m.name, m.serviceIn, m.serviceOut
		return textFamily{name, func(w *textWriter) {
			first := true
			for _, dir := range [...]string{"in", "out"} {
				for _, s := range svcs {
					if !m.service(s) {
						continue
					}
					if first {
						w.header(name, m.typeName())
						first = false
					}
					v := in(s)
					if dir == "out" {
						v = out(s)
					}
					w.sample(name, float64(v), "direction", dir, "service", s.Name, "vip", s.Key)
				}
			}
		}}
	}

	// A backend's up is that of its first configured occurrence under
	// the service's name (a NodePort service has an entry per address).
	type upKey struct{ service, addr string }
	up := map[upKey]float64{}
	for i := range snap.Services {
		s := &snap.Services[i]
		for j := range s.Backends {
			b := &s.Backends[j]
			k := upKey{s.Name, b.Address.String()}
			if _, ok := up[k]; b.Configured && !ok {
				up[k] = b2f(b.Health == nil || b.Health.State != "down")
			}
		}
	}
	states := slices.Sorted(slices.Values(serviceStates))
	bfds := bfdPeers(snap)

	out := make([]textFamily, 0, len(statusMetrics))
	for i := range statusMetrics {
		m := &statusMetrics[i]
		var f textFamily
		switch {
		case m.name == statusErrors:
			f = errorsFamily
		case m.scope == perBackend && m.backendIn != nil:
			f = backendDirFamily(m)
		case m.scope == perBackend:
			f = backendFamily(m)
		case m.scope == perService && m.serviceIn != nil:
			f = serviceDirFamily(m)
		case m.scope == perService:
			f = textFamily{m.name, func(w *textWriter) {
				first := true
				for _, s := range svcs {
					if !m.service(s) {
						continue
					}
					if first {
						w.header(m.name, m.typeName())
						first = false
					}
					w.sample(m.name, m.serviceValue(s), "service", s.Name, "vip", s.Key)
				}
			}}
		case m.scope == backendUp:
			f = textFamily{m.name, func(w *textWriter) {
				first := true
				for _, g := range addrGroups {
					// Within an address, by service name, each name once.
					last := ""
					for i, r := range bes[g[0]:g[1]] {
						v, ok := up[upKey{r.s.Name, r.addr}]
						if !ok || (i > 0 && r.s.Name == last) {
							continue
						}
						last = r.s.Name
						if first {
							w.header(m.name, m.typeName())
							first = false
						}
						w.sample(m.name, v, "backend", r.addr, "service", r.s.Name)
					}
				}
			}}
		case m.name == "vipd_foreign_services":
			f = textFamily{m.name, func(w *textWriter) {
				w.header(m.name, m.typeName())
				w.sample(m.name, float64(snap.Foreign))
			}}
		case m.scope == perBFD:
			f = textFamily{m.name, func(w *textWriter) {
				for i, p := range bfds {
					if i == 0 {
						w.header(m.name, m.typeName())
					}
					if m.bfdByReason == nil {
						w.sample(m.name, m.bfdValue(p.BFD), "peer", p.Address)
						continue
					}
					for j, v := range m.bfdByReason(p.BFD) {
						w.sample(m.name, float64(v), "peer", p.Address, "reason", bfdReasons[j])
					}
				}
			}}
		case m.scope == serviceState:
			f = textFamily{m.name, func(w *textWriter) {
				for i, g := range nameGroups {
					if i == 0 {
						w.header(m.name, m.typeName())
					}
					for _, st := range states {
						for _, s := range svcs[g[0]:g[1]] {
							w.sample(m.name, b2f(s.State == st), "service", s.Name, "state", string(st), "vip", s.Key)
						}
					}
				}
			}}
		case m.name == "vipd_status_timestamp_seconds":
			f = textFamily{m.name, func(w *textWriter) {
				w.header(m.name, m.typeName())
				w.sample(m.name, unix(snap.Time))
			}}
		default:
			panic("metrics: no text writer for status metric " + m.name)
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(x, y textFamily) int { return strings.Compare(x.name, y.name) })
	return out
}

// runs returns the [start, end) bounds of the runs of consecutive equal
// elements among n, as same says.
func runs(n int, same func(i, j int) bool) [][2]int {
	var out [][2]int
	for i := 0; i < n; {
		j := i + 1
		for j < n && same(i, j) {
			j++
		}
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

// textWriter writes the Prometheus text format (version 0.0.4) as
// github.com/prometheus/common/expfmt does.
type textWriter struct {
	w   *bufio.Writer
	num []byte
}

var (
	helpEscaper  = strings.NewReplacer("\\", `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer("\\", `\\`, "\n", `\n`, "\"", `\"`)
)

// header writes a family's HELP and TYPE lines.
func (w *textWriter) header(name, typ string) {
	w.w.WriteString("# HELP ")
	w.w.WriteString(name)
	w.w.WriteByte(' ')
	helpEscaper.WriteString(w.w, statusHelp[name])
	w.w.WriteString("\n# TYPE ")
	w.w.WriteString(name)
	w.w.WriteByte(' ')
	w.w.WriteString(typ)
	w.w.WriteByte('\n')
}

// sample writes one sample; labels are name, value pairs, sorted by name.
func (w *textWriter) sample(name string, v float64, labels ...string) {
	w.w.WriteString(name)
	for i := 0; i < len(labels); i += 2 {
		if i == 0 {
			w.w.WriteByte('{')
		} else {
			w.w.WriteByte(',')
		}
		w.w.WriteString(labels[i])
		w.w.WriteString(`="`)
		if val := labels[i+1]; strings.ContainsAny(val, "\\\n\"") {
			labelEscaper.WriteString(w.w, val)
		} else {
			w.w.WriteString(val)
		}
		w.w.WriteByte('"')
	}
	if len(labels) > 0 {
		w.w.WriteByte('}')
	}
	w.w.WriteByte(' ')
	switch {
	case v == 1:
		w.w.WriteByte('1')
	case v == 0:
		w.w.WriteByte('0')
	case v == -1:
		w.w.WriteString("-1")
	case math.IsNaN(v):
		w.w.WriteString("NaN")
	case math.IsInf(v, +1):
		w.w.WriteString("+Inf")
	case math.IsInf(v, -1):
		w.w.WriteString("-Inf")
	default:
		w.num = strconv.AppendFloat(w.num[:0], v, 'g', -1, 64)
		w.w.Write(w.num)
	}
	w.w.WriteByte('\n')
}
