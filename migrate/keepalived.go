package migrate

import (
	"encoding/hex"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/lb"
)

// KeepalivedOptions configure a keepalived import.
type KeepalivedOptions struct {
	// FS, when set, is where files are read from (tests); nil reads the
	// operating system's files.
	FS fs.FS
	// Limits bound the reading; the zero value means DefaultLimits.
	Limits Limits
}

// Keepalived imports the keepalived configuration in file, with the files
// it includes.
func Keepalived(file string, opts KeepalivedOptions) Result {
	lim := opts.Limits
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	r := &reader{fsys: opts.FS, limits: lim}
	r.file(filepath.Clean(file), nil, 0)
	nodes := r.parse()
	m := &kmapper{files: r.order, issues: r.issues, more: r.more, groups: map[string]*node{}, limits: lim, keys: map[string]string{}, vips: map[netip.Addr]bool{}}
	m.top(nodes)
	return m.result(file)
}

// kmapper maps keepalived statements to vipd services.
type kmapper struct {
	// files are the files read, in order.
	files  []string
	issues []Issue
	// more counts the issues past MaxIssues, not kept.
	more   int
	limits Limits
	groups map[string]*node
	svcs   []*service
	// keys holds the origin of each service key, to refuse duplicates.
	keys map[string]string
	vips map[netip.Addr]bool
	// ha is the rendered [ha] section, if a vrrp_instance mapped.
	ha      haPart
	haFrom  *node
	haVIPs  []*node
	expands int
}

func (m *kmapper) issue(n *node, what, why string) {
	if len(m.issues) >= MaxIssues {
		m.more++
		return
	}
	m.issues = append(m.issues, Issue{File: n.file, Line: n.line, What: what, Why: why})
}

func loc(n *node) string { return fmt.Sprintf("%s:%d", n.file, n.line) }

func (m *kmapper) top(nodes []*node) {
	for _, n := range nodes {
		if n.key == "virtual_server_group" && len(n.args) > 0 {
			if _, dup := m.groups[n.args[0]]; dup {
				m.issue(n, n.String(), "group defined twice: the first definition is used")
				continue
			}
			m.groups[n.args[0]] = n
		}
	}
	for _, n := range nodes {
		switch n.key {
		case "virtual_server":
			m.virtualServer(n)
		case "virtual_server_group":
			// expanded by the virtual servers that use them
		case "vrrp_instance":
			m.vrrp(n)
		case "global_defs":
			for _, k := range n.kids {
				m.issue(k, "global_defs: "+k.key, "a setting of keepalived's own process: vipd has no equivalent")
			}
		case "vrrp_sync_group":
			m.issue(n, n.String(), "vipd runs one virtual router: there is nothing to synchronize")
		case "vrrp_script":
			m.issue(n, n.String(), "vipd's [ha] tracks interfaces and backends, not scripts")
		case "static_ipaddress", "static_routes", "static_rules":
			m.issue(n, n.key, "vipd manages only its VIPs, not other addresses, routes or rules")
		default:
			m.issue(n, n.key, "not an LVS or VRRP setting vipd knows: not imported")
		}
	}
	m.finish()
	m.checkHAVIPs()
}

// vsDefaults are the settings of a virtual_server that apply to all of its
// services.
type vsDefaults struct {
	delayLoop   float64
	connTimeout float64
	retry       int
	hasRetry    bool
	alpha       bool
	virtualhost string
	inhibit     bool
	proto       string
	sched       string
	flags       []string
	forward     string
	tunnel      tunnel
	persistence int64
	netmask     string
	netmaskNode *node
	onePacket   bool
	quorum      int
	hysteresis  int
	quorumNode  *node
	sorry       netip.AddrPort
	sorryNode   *node
	family      string
	realServers []*node
}

// virtualServer maps one virtual_server block to one service, or to one
// service per member of its group.
func (m *kmapper) virtualServer(n *node) {
	if !n.block {
		m.issue(n, n.String(), "virtual_server without a block: not imported")
		return
	}
	d := vsDefaults{delayLoop: 60, connTimeout: 5, proto: "tcp", sched: "wlc", forward: "masq"}
	for _, k := range n.kids {
		m.vsSetting(n, k, &d)
	}
	var keys []vsKey
	switch {
	case len(n.args) == 2 && n.args[0] == "group":
		g, ok := m.groups[n.args[1]]
		if !ok {
			m.issue(n, n.String(), "no virtual_server_group of that name: not imported")
			return
		}
		keys = m.groupKeys(g)
	case len(n.args) == 2 && n.args[0] == "fwmark":
		mark, err := strconv.ParseUint(n.args[1], 0, 32)
		if err != nil || mark == 0 {
			m.issue(n, n.String(), "fwmark is not a nonzero 32-bit mark: not imported")
			return
		}
		keys = []vsKey{{fwmark: uint32(mark), from: loc(n)}}
	case len(n.args) == 2:
		a, err := netip.ParseAddr(n.args[0])
		p, perr := strconv.ParseUint(n.args[1], 10, 16)
		if err != nil || perr != nil {
			m.issue(n, n.String(), "not an address and port: not imported")
			return
		}
		keys = []vsKey{{addr: a.Unmap(), port: uint16(p), from: loc(n)}}
	default:
		m.issue(n, n.String(), "want virtual_server IP PORT, fwmark N or group NAME: not imported")
		return
	}
	for _, k := range keys {
		m.service(n, k, &d)
	}
}

// vsKey is one IPVS service of a virtual_server.
type vsKey struct {
	addr   netip.Addr
	port   uint16
	fwmark uint32
	from   string
}

// groupKeys expands a virtual_server_group.
func (m *kmapper) groupKeys(g *node) []vsKey {
	var out []vsKey
	for _, e := range g.kids {
		switch {
		case e.key == "fwmark" && len(e.args) == 1:
			mark, err := strconv.ParseUint(e.args[0], 0, 32)
			if err != nil || mark == 0 {
				m.issue(e, e.String(), "not a nonzero 32-bit mark: not imported")
				continue
			}
			out = append(out, vsKey{fwmark: uint32(mark), from: loc(e)})
		case len(e.args) == 1:
			addrs, err := expandRange(e.key, m.limits.Services-m.expands)
			p, perr := strconv.ParseUint(e.args[0], 10, 16)
			if err != nil || perr != nil {
				why := "not an address (or range) and port"
				if err != nil {
					why = err.Error()
				}
				m.issue(e, e.String(), why+": not imported")
				continue
			}
			m.expands += len(addrs)
			for _, a := range addrs {
				out = append(out, vsKey{addr: a, port: uint16(p), from: loc(e)})
			}
		default:
			m.issue(e, e.String(), "want IP[-LAST] PORT or fwmark N: not imported")
		}
	}
	return out
}

// expandRange expands "10.0.0.3-10" (the last byte of an IPv4 address) or
// "ae00::2-9" (the last 16 bits of an IPv6 one), or a plain address.
func expandRange(s string, max int) ([]netip.Addr, error) {
	first, last, isRange := strings.Cut(s, "-")
	a, err := netip.ParseAddr(first)
	if err != nil {
		return nil, fmt.Errorf("%q is not an address", first)
	}
	a = a.Unmap()
	if !isRange {
		return []netip.Addr{a}, nil
	}
	base := 10
	if a.Is6() {
		base = 16
	}
	end, err := strconv.ParseUint(last, base, 16)
	if err != nil {
		return nil, fmt.Errorf("range end %q is not a number", last)
	}
	b := a.AsSlice()
	var start uint64
	if a.Is4() {
		start = uint64(b[3])
		if end > 255 {
			return nil, fmt.Errorf("range end %d is above 255", end)
		}
	} else {
		start = uint64(b[14])<<8 | uint64(b[15])
	}
	if end < start {
		return nil, fmt.Errorf("range %s ends before it starts", s)
	}
	if int(end-start+1) > max {
		return nil, fmt.Errorf("range %s expands to more than the %d services allowed", s, max)
	}
	var out []netip.Addr
	for v := start; v <= end; v++ {
		if a.Is4() {
			b[3] = byte(v)
		} else {
			b[14], b[15] = byte(v>>8), byte(v)
		}
		x, _ := netip.AddrFromSlice(b)
		out = append(out, x)
	}
	return out, nil
}

func (m *kmapper) num(k *node, min, max float64) (float64, bool) {
	if len(k.args) != 1 {
		m.issue(k, k.String(), "want one number: ignored")
		return 0, false
	}
	f, err := strconv.ParseFloat(k.args[0], 64)
	if err != nil || f < min || f > max || math.IsNaN(f) {
		m.issue(k, k.String(), fmt.Sprintf("want a number within %g..%g: ignored", min, max))
		return 0, false
	}
	return f, true
}

// vsSetting reads one statement of a virtual_server block.
func (m *kmapper) vsSetting(vs, k *node, d *vsDefaults) {
	switch k.key {
	case "delay_loop":
		if f, ok := m.num(k, 0.01, 1e6); ok {
			d.delayLoop = f
		}
	case "connect_timeout":
		if f, ok := m.num(k, 0.001, 1e6); ok {
			d.connTimeout = f
		}
	case "retry", "nb_get_retry":
		if f, ok := m.num(k, 0, 999); ok {
			d.retry, d.hasRetry = int(f), true
		}
	case "delay_before_retry":
		m.issue(k, k.String(), "vipd probes a failing backend at the check's interval: no separate retry delay")
	case "lb_algo", "lvs_sched":
		if len(k.args) == 1 && slices.Contains(lb.Schedulers, k.args[0]) {
			d.sched = k.args[0]
		} else {
			m.issue(k, k.String(), "unknown scheduler: wlc is used")
		}
	case "lb_kind", "lvs_method":
		if f, t, ok := m.forward(k); ok {
			d.forward, d.tunnel = f, t
		}
	case "persistence_timeout":
		d.persistence = 360 // keepalived's default when the value is left out
		if len(k.args) > 0 {
			if f, ok := m.num(k, 1, math.MaxUint32); ok {
				d.persistence = int64(f)
			}
		}
	case "persistence_granularity":
		if len(k.args) == 1 {
			d.netmask, d.netmaskNode = k.args[0], k
		} else {
			m.issue(k, k.String(), "want one netmask: ignored")
		}
	case "protocol":
		switch p := strings.ToLower(strings.Join(k.args, "")); p {
		case "tcp", "udp", "sctp":
			d.proto = p
		default:
			m.issue(k, k.String(), "vipd balances tcp, udp and sctp: tcp is used")
		}
	case "ops":
		d.onePacket = true
	case "sh-port", "sh-fallback", "mh-port", "mh-fallback":
		d.flags = append(d.flags, k.key)
	case "hashed":
		m.issue(k, k.key, "vipd has no setting for the hashed flag")
	case "ip_family":
		if len(k.args) == 1 && (k.args[0] == "inet6" || k.args[0] == "inet") {
			if k.args[0] == "inet6" {
				d.family = "ipv6"
			}
		} else {
			m.issue(k, k.String(), "want inet or inet6: ignored")
		}
	case "alpha":
		d.alpha = true
	case "omega":
		m.issue(k, k.key, "vipd runs no quorum_down command on shutdown")
	case "quorum":
		if f, ok := m.num(k, 1, 65535); ok {
			d.quorum, d.quorumNode = int(f), k
		}
	case "hysteresis":
		if f, ok := m.num(k, 0, 65535); ok {
			d.hysteresis = int(f)
		}
	case "quorum_up", "quorum_down":
		m.issue(k, k.key, "vipd runs no commands on quorum changes")
	case "sorry_server":
		if len(k.args) >= 1 {
			a, err := netip.ParseAddr(k.args[0])
			port := uint64(0)
			var perr error
			if len(k.args) >= 2 {
				port, perr = strconv.ParseUint(k.args[1], 10, 16)
			}
			if err == nil && perr == nil {
				d.sorry, d.sorryNode = netip.AddrPortFrom(a.Unmap(), uint16(port)), k
				break
			}
		}
		m.issue(k, k.String(), "want sorry_server IP [PORT]: ignored")
	case "sorry_server_inhibit":
		m.issue(k, k.key, "vipd adds its sorry backend at its configured weight 1; no inhibit")
	case "sorry_server_lvs_method":
		m.issue(k, k.String(), "vipd's sorry backend forwards like the service's first backend")
	case "virtualhost":
		if len(k.args) == 1 {
			d.virtualhost = k.args[0]
		}
	case "inhibit_on_failure":
		d.inhibit = true
	case "real_server":
		d.realServers = append(d.realServers, k)
	default:
		m.issue(k, k.String(), "no equivalent in vipd: not imported")
	}
}

// forward parses lb_kind NAT|DR|TUN [type ipip|gue|gre] [port N] [nocsum|csum|remcsum].
func (m *kmapper) forward(k *node) (string, tunnel, bool) {
	if len(k.args) == 0 {
		m.issue(k, k.key, "want NAT, DR or TUN: ignored")
		return "", tunnel{}, false
	}
	var t tunnel
	switch strings.ToUpper(k.args[0]) {
	case "NAT":
		return "masq", t, true
	case "DR":
		return "droute", t, true
	case "TUN":
		rest := k.args[1:]
		for i := 0; i < len(rest); i++ {
			switch rest[i] {
			case "type":
				if i+1 < len(rest) {
					i++
					if rest[i] != "ipip" {
						t.typ = rest[i]
					}
				}
			case "port":
				if i+1 < len(rest) {
					i++
					p, err := strconv.ParseUint(rest[i], 10, 16)
					if err != nil {
						m.issue(k, k.String(), "tunnel port is not a port: ignored")
					}
					t.port = uint16(p)
				}
			case "csum", "remcsum":
				t.csum = rest[i]
			case "nocsum":
			default:
				m.issue(k, k.String(), fmt.Sprintf("unknown tunnel option %q: ignored", rest[i]))
			}
		}
		return "tunnel", t, true
	}
	m.issue(k, k.String(), "want NAT, DR or TUN: ignored")
	return "", t, false
}

// service builds the service of one key of a virtual_server.
func (m *kmapper) service(n *node, k vsKey, d *vsDefaults) {
	s := &service{origin: loc(n), from: n, file: n.file, line: n.line, scheduler: d.sched, flags: d.flags, forward: d.forward, tunnel: d.tunnel,
		persistence: d.persistence, onePacket: d.onePacket}
	if k.from != loc(n) {
		s.origin = fmt.Sprintf("%s (virtual_server_group member %s)", loc(n), k.from)
	}
	what := n.String()
	if k.fwmark != 0 {
		s.fwmark = k.fwmark
		s.family = d.family
		if s.family == "" && len(d.realServers) > 0 {
			if a, err := netip.ParseAddr(firstArg(d.realServers[0])); err == nil && a.Unmap().Is6() {
				s.family = "ipv6"
			}
		}
		what = fmt.Sprintf("%s: fwmark %d", n.String(), k.fwmark)
	} else {
		s.vip, s.port, s.proto = k.addr, k.port, d.proto
		what = fmt.Sprintf("%s: %s %s", n.String(), d.proto, netip.AddrPortFrom(k.addr, k.port))
		if why := badVIP(k.addr); why != "" {
			m.issue(n, what, "vipd cannot bind the VIP ("+why+"): service not imported")
			return
		}
		if k.port == 0 && d.persistence == 0 {
			m.issue(n, what, "port 0 (all ports) needs persistence_timeout: service not imported")
			return
		}
	}
	if s.onePacket && (s.proto != "udp" && s.fwmark == 0 || s.persistence > 0) {
		m.issue(n, what+": ops", "vipd schedules single packets only of udp services without persistence: one_packet not set")
		s.onePacket = false
	}
	if d.netmask != "" && s.persistence > 0 {
		s.netmask = netmaskBits(d.netmask, s.family == "ipv6" || s.vip.Is6())
		if s.netmask <= 0 {
			m.issue(d.netmaskNode, d.netmaskNode.String(), "not a netmask of the service's family: ignored")
			s.netmask = 0
		}
	}
	for _, f := range s.flags {
		if !strings.HasPrefix(f, s.scheduler+"-") {
			m.issue(n, what+": "+f, fmt.Sprintf("the flag belongs to scheduler %s, not %s: not set", strings.SplitN(f, "-", 2)[0], s.scheduler))
			s.flags = slices.DeleteFunc(slices.Clone(s.flags), func(x string) bool { return x == f })
		}
	}
	s.name = s.defaultName()
	if prev, dup := m.keys[s.key()]; dup {
		m.issue(n, what, "the same IPVS service as "+prev+": not imported twice")
		return
	}
	m.keys[s.key()] = s.origin

	inhibited, removed := 0, 0
	var checked bool
	for _, rs := range d.realServers {
		b, inhibit, ok := m.realServer(n, rs, s, d)
		if !ok {
			continue
		}
		if b.check != nil {
			checked = true
			if inhibit {
				inhibited++
			} else {
				removed++
			}
		}
		s.backends = append(s.backends, b)
	}
	if len(s.backends) == 0 {
		m.issue(n, what, "no real server vipd can program (vipd needs at least one backend): service not imported")
		delete(m.keys, s.key())
		return
	}
	if checked {
		s.onFailure = "remove"
		if inhibited > 0 && removed == 0 {
			s.onFailure = "quiesce"
		} else if inhibited > 0 {
			m.issue(n, what+": inhibit_on_failure", "set on some real servers only; vipd's on_failure is per service: remove is used")
		}
		// One check for all: a [service.check] table.
		same := true
		for _, b := range s.backends {
			same = same && b.check.equal(s.backends[0].check)
		}
		if same && len(s.backends) > 1 {
			s.check = s.backends[0].check
			for i := range s.backends {
				s.backends[i].check = nil
			}
		} else {
			for i := range s.backends {
				if s.backends[i].check == nil {
					s.backends[i].check = &check{kv: [][2]string{{"type", quote("none")}}}
				}
			}
		}
	}
	if d.quorum > 0 {
		m.quorum(n, what, s, d, checked)
	}
	if d.sorry.IsValid() {
		m.sorry(n, what, s, d, checked)
	}
	m.svcs = append(m.svcs, s)
}

func firstArg(n *node) string {
	if len(n.args) == 0 {
		return ""
	}
	return n.args[0]
}

// quorum maps keepalived's quorum, a sum of weights, to vipd's, a count of
// healthy backends.
func (m *kmapper) quorum(n *node, what string, s *service, d *vsDefaults, checked bool) {
	if !checked {
		m.issue(d.quorumNode, d.quorumNode.String(), "vipd's quorum needs health checks, and no real server has one: not set")
		return
	}
	w := s.backends[0].weight
	for _, b := range s.backends {
		if b.weight != w || w == 0 {
			m.issue(d.quorumNode, d.quorumNode.String(), "keepalived sums the weights of live servers, vipd counts healthy backends; with unequal weights there is no exact equivalent: not set")
			return
		}
	}
	q := (d.quorum + w - 1) / w
	h := (d.hysteresis + w - 1) / w
	if q > len(s.backends) {
		m.issue(d.quorumNode, d.quorumNode.String(), fmt.Sprintf("quorum of %d backends is more than the service's %d: not set", q, len(s.backends)))
		return
	}
	s.quorum, s.hysteresis = q, h
	s.comments = append(s.comments, fmt.Sprintf("quorum %d hysteresis %d (%s): below quorum vipd fails open, programming every backend", d.quorum, d.hysteresis, loc(d.quorumNode)))
	m.issue(d.quorumNode, d.quorumNode.String(), fmt.Sprintf("below quorum keepalived serves the live servers (or the sorry server), vipd fails open and programs every backend; keepalived loses quorum below %d and regains it at %d, vipd below %d and at %d",
		max(d.quorum-d.hysteresis, 0), d.quorum+d.hysteresis, q, q+h))
}

func (m *kmapper) sorry(n *node, what string, s *service, d *vsDefaults, checked bool) {
	if !checked {
		m.issue(d.sorryNode, d.sorryNode.String(), "vipd's sorry backend needs health checks, and no real server has one: not set")
		return
	}
	a := d.sorry
	if a.Port() == 0 && s.fwmark == 0 {
		a = netip.AddrPortFrom(a.Addr(), s.port)
	}
	if lb.FamilyOf(a.Addr()) != lb.FamilyOf(s.backends[0].addr.Addr()) && s.forward != "tunnel" {
		m.issue(d.sorryNode, d.sorryNode.String(), "the sorry server's family differs from the service's: not set")
		return
	}
	s.sorry = a
}

// realServer maps one real_server block.
func (m *kmapper) realServer(vs, rs *node, s *service, d *vsDefaults) (backend, bool, bool) {
	b := backend{weight: 1, comment: "from " + loc(rs), from: rs}
	what := rs.String()
	a, err := netip.ParseAddr(firstArg(rs))
	if err != nil || len(rs.args) > 2 {
		m.issue(rs, what, "want real_server IP [PORT]: not imported")
		return b, false, false
	}
	a = a.Unmap()
	port := s.port
	if len(rs.args) == 2 {
		p, err := strconv.ParseUint(rs.args[1], 10, 16)
		if err != nil {
			m.issue(rs, what, "not a port: not imported")
			return b, false, false
		}
		port = uint16(p)
	}
	if port == 0 && s.fwmark == 0 && s.port != 0 {
		m.issue(rs, what, "port 0 serves only fwmark and all-ports services: not imported")
		return b, false, false
	}
	b.addr = netip.AddrPortFrom(a, port)
	if why := badBackend(a); why != "" {
		m.issue(rs, what, "not a unicast address ("+why+"): not imported")
		return b, false, false
	}
	if s.vip.IsValid() && a == s.vip {
		m.issue(rs, what, vipBackend(a))
		return b, false, false
	}
	fwd, tun := s.forward, s.tunnel
	inhibit := d.inhibit
	var checks []*node
	for _, k := range rs.kids {
		switch k.key {
		case "weight":
			if f, ok := m.num(k, 0, 65535); ok {
				b.weight = int(f)
			}
		case "uthreshold":
			if f, ok := m.num(k, 0, math.MaxInt32); ok {
				b.upper = uint32(f)
			}
		case "lthreshold":
			if f, ok := m.num(k, 0, math.MaxInt32); ok {
				b.lower = uint32(f)
			}
		case "inhibit_on_failure":
			inhibit = true
		case "lb_kind", "lvs_method":
			if f, t, ok := m.forward(k); ok {
				fwd, tun = f, t
			}
		case "TCP_CHECK", "HTTP_GET", "SSL_GET", "MISC_CHECK", "UDP_CHECK", "DNS_CHECK", "PING_CHECK", "SMTP_CHECK", "BFD_CHECK", "FILE_CHECK":
			checks = append(checks, k)
		case "notify_up", "notify_down":
			m.issue(k, k.key, "vipd runs no commands on backend state changes (its metrics and log report them)")
		case "delay_loop", "connect_timeout", "retry", "delay_before_retry", "warmup", "alpha", "virtualhost":
			m.issue(k, what+": "+k.String(), "set it on the checker or the virtual_server: not imported here")
		default:
			m.issue(k, what+": "+k.String(), "no equivalent in vipd: not imported")
		}
	}
	if b.lower > b.upper {
		m.issue(rs, what+": lthreshold", "lower threshold above the upper one: thresholds not set")
		b.lower, b.upper = 0, 0
	}
	if fwd != s.forward || tun != s.tunnel {
		b.forward, b.tunnel = fwd, tun
	}
	if (fwd == "droute" || fwd == "tunnel") && s.fwmark == 0 && port != s.port {
		m.issue(rs, what, fmt.Sprintf("%s forwarding cannot change the port (%d to %d): the port of the virtual server is used", fwd, s.port, port))
		b.addr = netip.AddrPortFrom(a, s.port)
	}
	fam := lb.FamilyOf(a)
	svcFam := lb.IPv4
	if s.vip.IsValid() {
		svcFam = lb.FamilyOf(s.vip)
	} else if s.family == "ipv6" {
		svcFam = lb.IPv6
	}
	if fam != svcFam && fwd != "tunnel" {
		m.issue(rs, what, fmt.Sprintf("an %s real server of an %s service: only tunnel forwarding mixes families: not imported", fam, svcFam))
		return b, false, false
	}
	for _, o := range s.backends {
		if o.addr == b.addr {
			m.issue(rs, what, "listed twice: not imported again")
			return b, false, false
		}
	}
	if len(checks) > 0 {
		b.check = m.check(checks[0], s, d, b)
		for _, c := range checks[1:] {
			m.issue(c, what+": "+c.key, "vipd runs one check per backend: only the first checker ("+checks[0].key+") is imported")
		}
	}
	return b, inhibit, true
}

// check maps a checker block; nil when vipd has no equivalent.
func (m *kmapper) check(k *node, s *service, d *vsDefaults, b backend) *check {
	c := &check{}
	var typ string
	switch k.key {
	case "TCP_CHECK":
		typ = "tcp"
	case "HTTP_GET":
		typ = "http"
	case "SSL_GET":
		typ = "https"
	case "MISC_CHECK":
		typ = "exec"
	case "UDP_CHECK":
		typ = "udp"
	case "DNS_CHECK":
		typ = "dns"
	default:
		why := "vipd has no such check (it has tcp, http, https, udp, dns and exec)"
		if k.key == "PING_CHECK" {
			why = "vipd has no ICMP echo check (it has tcp, http, https, udp, dns and exec)"
		}
		m.issue(k, k.key, why+": the backend is imported unchecked")
		return nil
	}
	c.set("type", quote(typ))
	interval, timeout := d.delayLoop, d.connTimeout
	retry := 1
	if typ == "exec" {
		// keepalived bounds a MISC_CHECK by delay_loop unless misc_timeout.
		retry, timeout = 0, interval
	}
	if d.hasRetry {
		retry = d.retry
	}
	var urls []*node
	for _, x := range k.kids {
		switch x.key {
		case "delay_loop":
			if f, ok := m.num(x, 0.01, 1e6); ok {
				interval = f
			}
		case "connect_timeout":
			if typ == "exec" {
				m.issue(x, x.String(), "MISC_CHECK takes misc_timeout: ignored")
			} else if f, ok := m.num(x, 0.001, 1e6); ok {
				timeout = f
			}
		case "retry", "nb_get_retry":
			if f, ok := m.num(x, 0, 999); ok {
				retry = int(f)
			}
		case "delay_before_retry":
			m.issue(x, x.String(), "vipd probes a failing backend at the check's interval: no separate retry delay")
		case "connect_port":
			if p, err := strconv.ParseUint(firstArg(x), 10, 16); err == nil && p > 0 && typ != "exec" {
				c.set("port", strconv.FormatUint(p, 10))
			} else {
				m.issue(x, x.String(), "not a port: ignored")
			}
		case "connect_ip":
			if a, err := netip.ParseAddr(firstArg(x)); err == nil && typ != "exec" {
				c.set("address", quote(a.Unmap().String()))
			} else {
				m.issue(x, x.String(), "not an address: ignored")
			}
		case "bindto", "bind_to":
			if a, err := netip.ParseAddr(firstArg(x)); err == nil && typ != "exec" {
				c.set("source", quote(a.Unmap().String()))
			} else {
				m.issue(x, x.String(), "not an address: ignored")
			}
		case "bind_if":
			if len(x.args) == 1 && typ != "exec" {
				c.set("device", quote(x.args[0]))
			} else {
				m.issue(x, x.String(), "want one interface: ignored")
			}
		case "fwmark":
			if v, err := strconv.ParseUint(firstArg(x), 0, 32); err == nil && typ != "exec" {
				c.set("mark", strconv.FormatUint(v, 10))
			} else {
				m.issue(x, x.String(), "not a 32-bit mark: ignored")
			}
		case "url":
			urls = append(urls, x)
		case "virtualhost":
			if (typ == "http" || typ == "https") && len(x.args) == 1 {
				c.set("host", quote(x.args[0]))
			} else {
				m.issue(x, x.String(), "applies to HTTP_GET and SSL_GET: ignored")
			}
		case "misc_path":
			m.miscPath(x, c)
		case "misc_timeout":
			if f, ok := m.num(x, 0.001, 1e6); ok {
				timeout = f
			}
		case "misc_dynamic":
			m.issue(x, x.key, "vipd does not set weights from a check's exit status")
		case "payload":
			if p, ok := m.hexString(x); ok {
				c.set("payload", quote(p))
			}
		case "require_reply":
			if len(x.args) == 0 {
				c.set("expect", quote(""))
			} else if p, ok := m.hexString(x); ok {
				c.set("expect", quote(p))
			}
		case "type":
			if typ == "dns" && len(x.args) == 1 {
				c.set("record", quote(strings.ToUpper(x.args[0])))
			} else {
				m.issue(x, x.String(), "no equivalent in vipd: ignored")
			}
		case "name":
			if typ == "dns" && len(x.args) == 1 && tomlSafe(x.args[0]) {
				c.set("name", quote(x.args[0]))
			} else {
				m.issue(x, x.String(), "no equivalent in vipd: ignored")
			}
		default:
			m.issue(x, k.key+": "+x.String(), "no equivalent in vipd: ignored")
		}
	}
	if typ == "http" || typ == "https" {
		m.urls(k, c, urls, d)
		if typ == "https" {
			// keepalived's SSL_GET does not verify the server's certificate.
			c.set("insecure", "true")
		}
	}
	if typ == "udp" {
		hasExpect := false
		for _, p := range c.kv {
			hasExpect = hasExpect || p[0] == "expect"
		}
		if !hasExpect {
			m.issue(k, k.key, "without require_reply keepalived counts silence as success; vipd's udp check needs a reply")
		}
		for i, p := range c.kv {
			if p[0] == "expect" && p[1] == `""` {
				c.kv = slices.Delete(c.kv, i, i+1)
				break
			}
		}
	}
	if typ == "exec" && !slices.ContainsFunc(c.kv, func(p [2]string) bool { return p[0] == "command" }) {
		m.issue(k, k.key, "no usable misc_path: the backend is imported unchecked")
		return nil
	}
	c.set("interval", seconds(interval))
	c.set("timeout", seconds(min(timeout, interval)))
	if timeout > interval {
		m.issue(k, k.key+": timeout", fmt.Sprintf("the timeout %gs is longer than the interval %gs; vipd bounds a probe by its interval", timeout, interval))
	}
	// keepalived takes a server in on its first success and out after
	// retry failed attempts following the first.
	c.set("rise", "1")
	c.set("fall", strconv.Itoa(retry+1))
	// Without alpha keepalived starts with every server up.
	if d.alpha {
		c.set("initial", quote("down"))
	} else {
		c.set("initial", quote("up"))
	}
	return c
}

// urls maps the url blocks of HTTP_GET and SSL_GET: vipd checks one path.
func (m *kmapper) urls(k *node, c *check, urls []*node, d *vsDefaults) {
	if d.virtualhost != "" && !slices.ContainsFunc(c.kv, func(p [2]string) bool { return p[0] == "host" }) {
		c.set("host", quote(d.virtualhost))
	}
	if len(urls) == 0 {
		m.issue(k, k.key, "no url block: vipd checks / with status 200-299")
		c.set("path", quote("/"))
		c.set("status", quote("200-299"))
		return
	}
	u := urls[0]
	status := ""
	for _, x := range u.kids {
		switch x.key {
		case "path":
			if len(x.args) == 1 && strings.HasPrefix(x.args[0], "/") && tomlSafe(x.args[0]) {
				c.set("path", quote(x.args[0]))
			} else {
				m.issue(x, x.String(), "not a path starting with /: / is used")
			}
		case "status_code":
			var parts []string
			for _, a := range x.args {
				lo, hi, _ := strings.Cut(a, "-")
				l, err1 := strconv.Atoi(lo)
				h := l
				var err2 error
				if hi != "" {
					h, err2 = strconv.Atoi(hi)
				}
				if err1 != nil || err2 != nil || l < 100 || h > 599 || l > h {
					m.issue(x, x.String(), fmt.Sprintf("%q is not a status or range within 100-599: left out", a))
					continue
				}
				parts = append(parts, a)
			}
			status = strings.Join(parts, ",")
		case "digest":
			m.issue(x, "url: digest", "vipd does not compare an MD5 digest of the body (it matches body or body_regexp): not checked")
		case "virtualhost":
			if len(x.args) == 1 {
				c.set("host", quote(x.args[0]))
			}
		case "regex":
			if len(x.args) == 1 && tomlSafe(x.args[0]) {
				c.set("body_regexp", quote(x.args[0]))
			} else {
				m.issue(x, x.String(), "want one regular expression: ignored")
			}
		default:
			m.issue(x, "url: "+x.String(), "no equivalent in vipd: ignored")
		}
	}
	if status == "" {
		status = "200-299" // keepalived's default
	}
	c.set("status", quote(status))
	for _, x := range urls[1:] {
		m.issue(x, "url "+urlPath(x), "vipd checks one URL per backend: only "+urlPath(u)+" is checked")
	}
}

func urlPath(u *node) string {
	for _, x := range u.kids {
		if x.key == "path" {
			return firstArg(x)
		}
	}
	return "(no path)"
}

// miscPath maps a MISC_CHECK command to an exec check's command and args.
func (m *kmapper) miscPath(x *node, c *check) {
	words := strings.Fields(strings.Join(x.args, " "))
	switch {
	case len(words) == 0:
		m.issue(x, x.key, "no command: ignored")
	case !strings.HasPrefix(words[0], "/"):
		m.issue(x, x.String(), "vipd runs commands by absolute path only (never looked up in PATH): not imported")
	case strings.ContainsAny(strings.Join(words, ""), "'\"\\$`|;&<>*?"):
		m.issue(x, x.String(), "vipd runs the command without a shell, and the line holds shell syntax: not imported")
	case !tomlSafe(strings.Join(words, "")):
		m.issue(x, x.String(), "not valid UTF-8: not imported")
	default:
		c.set("command", quote(words[0]))
		if len(words) > 1 {
			c.set("args", quoteList(words[1:]))
		}
	}
}

// hexString decodes keepalived's hexadecimal payload; it must be text a
// TOML string can hold.
func (m *kmapper) hexString(x *node) (string, bool) {
	raw, err := hex.DecodeString(strings.Join(x.args, ""))
	switch {
	case err != nil:
		m.issue(x, x.String(), "not hexadecimal: ignored")
		return "", false
	case !tomlSafe(string(raw)) || strings.ContainsRune(string(raw), 0):
		m.issue(x, x.String(), "vipd's udp payloads are text, and these bytes are not: ignored")
		return "", false
	}
	return string(raw), true
}

// netmaskBits converts persistence_granularity, a dotted IPv4 mask or an
// IPv6 prefix length, to a prefix length; -1 when it is neither.
func netmaskBits(s string, v6 bool) int {
	if v6 {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 128 {
			return -1
		}
		return n
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 1 && n <= 32 {
		return n
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return -1
	}
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n := 0
	for v&0x80000000 != 0 {
		n++
		v <<= 1
	}
	if v != 0 || n == 0 {
		return -1
	}
	return n
}

// badVIP says why vipd cannot bind a, or "".
func badVIP(a netip.Addr) string {
	if why := badBackend(a); why != "" {
		return why
	}
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	}
	return ""
}

// badBackend says why a is no unicast address of a host, or "".
func badBackend(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	case a.Zone() != "":
		return "has a zone"
	case a.Is4() && (a.As4()[0] == 0 || a.As4()[0] >= 240):
		return "reserved"
	}
	return ""
}

// result renders the services and the [ha] section.
func (m *kmapper) result(file string) Result {
	toml, svcs, issues := settle(header("keepalived", file), m.ha, m.svcs, m.issues)
	return capIssues(Result{TOML: toml, Issues: tidy(issues, m.files), Services: len(svcs), MoreIssues: m.more})
}

// finish refuses backends on the VIP of any service (vipd binds its VIPs
// on the host, so IPVS would deliver to the host itself), and services
// left without backends.
func (m *kmapper) finish() {
	for _, s := range m.svcs {
		if s.vip.IsValid() {
			m.vips[s.vip] = true
		}
	}
	out := m.svcs[:0]
	for _, s := range m.svcs {
		bs := s.backends[:0]
		for _, b := range s.backends {
			if m.vips[b.addr.Addr()] {
				m.issue(b.from, b.from.String(), vipBackend(b.addr.Addr()))
				continue
			}
			bs = append(bs, b)
		}
		s.backends = bs
		if len(bs) == 0 {
			m.issues = append(m.issues, Issue{File: s.from.file, Line: s.from.line, What: s.from.String() + ": " + s.key(), Why: "no real server vipd can program (vipd needs at least one backend): service not imported"})
			continue
		}
		if s.quorum > len(bs) {
			m.issues = append(m.issues, Issue{File: s.from.file, Line: s.from.line, What: s.key() + ": quorum", Why: fmt.Sprintf("quorum %d is more than the %d backends left: not set", s.quorum, len(bs))})
			s.quorum, s.hysteresis = 0, 0
		}
		out = append(out, s)
	}
	m.svcs = out
	m.vips = map[netip.Addr]bool{}
	for _, s := range m.svcs {
		if s.vip.IsValid() {
			m.vips[s.vip] = true
		}
	}
}

// vrrp maps the first vrrp_instance to the [ha] section.
func (m *kmapper) vrrp(n *node) {
	if m.haFrom != nil {
		m.issue(n, n.String(), fmt.Sprintf("vipd runs one virtual router per daemon: only the first vrrp_instance (%s) is imported", loc(m.haFrom)))
		return
	}
	m.haFrom = n
	var (
		b                 strings.Builder
		iface, vrid       string
		version3, preempt = false, true
		interval          = 1.0
		peers, tracks     []string
		v6Peers           bool
		unicastTTL        *node
	)
	kvs := [][2]string{}
	for _, k := range n.kids {
		switch k.key {
		case "interface":
			if len(k.args) == 1 && tomlSafe(k.args[0]) {
				iface = k.args[0]
			}
		case "virtual_router_id":
			if f, ok := m.num(k, 1, 255); ok {
				vrid = strconv.Itoa(int(f))
			}
		case "priority":
			if f, ok := m.num(k, 1, 255); ok {
				if f == 255 {
					m.issue(k, k.String(), "255 is an address owner's priority, which vipd never is: 254 is used")
					f = 254
				}
				kvs = append(kvs, [2]string{"priority", strconv.Itoa(int(f))})
			}
		case "advert_int":
			if f, ok := m.num(k, 0.01, 40.95); ok {
				interval = math.Round(f*100) / 100
				if interval != f {
					m.issue(k, k.String(), fmt.Sprintf("VRRPv3 counts centiseconds: %gs is used", interval))
				}
			}
		case "nopreempt":
			preempt = false
		case "preempt_delay":
			if f, ok := m.num(k, 0, 3600); ok {
				kvs = append(kvs, [2]string{"preempt_delay", seconds(f)})
			}
		case "unicast_peer":
			for _, p := range k.kids {
				a, err := netip.ParseAddr(p.key)
				if err != nil {
					m.issue(p, p.String(), "not an address: ignored")
					continue
				}
				if len(p.args) > 0 {
					m.issue(p, p.String(), "vipd takes the peer's address only: the rest is ignored")
				}
				peers = append(peers, quote(a.Unmap().String()))
				v6Peers = v6Peers || !a.Unmap().Is4()
			}
		case "unicast_ttl":
			unicastTTL = k
		case "unicast_src_ip", "mcast_src_ip":
			if a, err := netip.ParseAddr(firstArg(k)); err == nil {
				kvs = append(kvs, [2]string{"source", quote(a.Unmap().String())})
			} else {
				m.issue(k, k.String(), "not an address: ignored")
			}
		case "track_interface":
			for _, t := range k.kids {
				if !tomlSafe(t.key) {
					continue
				}
				tracks = append(tracks, quote(t.key))
				if len(t.args) > 0 {
					m.issue(t, "track_interface "+t.String(), "vipd takes track_priority off the priority for each interface down; per-interface weights have no equivalent")
				} else {
					m.issue(t, "track_interface "+t.key, "keepalived goes to FAULT when the interface is down; vipd takes track_priority off the priority")
				}
			}
		case "lvs_sync_daemon_interface":
			if len(k.args) >= 1 && tomlSafe(k.args[0]) {
				kvs = append(kvs, [2]string{"sync_interface", quote(k.args[0])})
			}
		case "version":
			version3 = firstArg(k) == "3"
		case "state":
			m.issue(k, k.String(), "vipd starts as backup and elects the master by priority; there is no initial state")
		case "authentication":
			m.issue(k, k.key, "VRRPv3 has no authentication")
		case "virtual_ipaddress":
			m.haVIPs = append(m.haVIPs, k.kids...)
		default:
			m.issue(k, k.key, "no equivalent in vipd's [ha]: not imported")
		}
	}
	if !version3 {
		m.issue(n, n.String(), "vipd speaks VRRPv3 only, keepalived v2 by default: set vrrp_version 3 on the keepalived peers for the switch-over")
	}
	switch {
	case unicastTTL != nil && firstArg(unicastTTL) != "255":
		m.issue(unicastTTL, unicastTTL.String(), "vipd accepts advertisements only with TTL (hop limit) 255: set unicast_ttl 255 on the keepalived peers for the switch-over")
	case unicastTTL == nil && v6Peers:
		m.issue(n, n.String(), "keepalived sends IPv6 unicast advertisements with hop limit 64, and vipd accepts only 255: set unicast_ttl 255 on the keepalived peers for the switch-over")
	}
	if iface == "" || vrid == "" {
		m.issue(n, n.String(), "no interface or virtual_router_id: [ha] not written")
		return
	}
	fmt.Fprintf(&b, "# from %s\n[ha]\n", loc(n))
	kv(&b, "mode", quote("vrrp"))
	kv(&b, "interface", quote(iface))
	kv(&b, "vrid", vrid)
	kv(&b, "advert_interval", seconds(interval))
	kv(&b, "preempt", strconv.FormatBool(preempt))
	for _, p := range kvs {
		kv(&b, p[0], p[1])
	}
	if len(peers) > 0 {
		kv(&b, "unicast_peers", "["+strings.Join(peers, ", ")+"]")
	}
	if len(tracks) > 0 {
		kv(&b, "track_interfaces", "["+strings.Join(tracks, ", ")+"]")
	}
	// keepalived leaves IPVS's sloppy_tcp and sloppy_sctp as they are
	// (off); vipd's [ha] turns them on unless told.
	kv(&b, "sloppy", "false")
	m.ha = haPart{text: b.String(), file: n.file, line: n.line}
}

// checkHAVIPs reports the virtual addresses of the imported vrrp_instance
// that are no VIP of an imported service: vipd binds only those.
func (m *kmapper) checkHAVIPs() {
	for _, v := range m.haVIPs {
		a, err := netip.ParsePrefix(v.key)
		if err != nil {
			x, err2 := netip.ParseAddr(v.key)
			if err2 != nil {
				m.issue(v, "virtual_ipaddress "+v.String(), "not an address: ignored")
				continue
			}
			a = netip.PrefixFrom(x, x.BitLen())
		}
		switch {
		case !m.vips[a.Addr().Unmap()]:
			m.issue(v, "virtual_ipaddress "+v.String(), "not the VIP of an imported service: vipd binds and moves only the VIPs of its services")
		case len(v.args) > 0:
			m.issue(v, "virtual_ipaddress "+v.String(), "vipd binds VIPs on its own interface: the options are not imported")
		}
	}
}

// vipBackend is the issue of a real server on a VIP.
func vipBackend(a netip.Addr) string {
	return fmt.Sprintf("the address %s is the VIP of an imported service, which vipd binds on this host, so IPVS would deliver to the host itself: real server not imported", a)
}
