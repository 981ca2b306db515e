package migrate

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/lb"
)

// entry is one service of an IPVS table and where it was read.
type entry struct {
	st   *lb.ServiceState
	line int
	// dests holds the line of each destination.
	dests map[netip.AddrPort]int
	// order lists the destinations in the order read.
	order []netip.AddrPort
}

// maxLine bounds one line of ipvsadm output.
const maxLine = 64 << 10

// Ipvsadm imports the output of "ipvsadm -Sn" (or a script of ipvsadm
// -A/-a commands in that form) read from r, naming it file in issues.
func Ipvsadm(file string, r io.Reader) Result {
	var issues []Issue
	more := 0
	add := func(line int, what, why string) {
		if len(issues) >= MaxIssues {
			more++
			return
		}
		issues = append(issues, Issue{File: file, Line: line, What: what, Why: why})
	}
	byKey := map[lb.ServiceKey]*entry{}
	var keys []lb.ServiceKey
	// The input is bounded as a keepalived configuration is: it may be
	// a pipe that never ends.
	lr := &io.LimitedReader{R: r, N: DefaultLimits.Bytes + 1}
	sc := bufio.NewScanner(lr)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		args := strings.Fields(line)
		if args[0] == "ipvsadm" {
			args = args[1:]
		}
		c, err := parseCommand(args)
		if err != nil {
			add(n, line, err.Error()+": not imported")
			continue
		}
		for _, w := range c.warn {
			add(n, line, w)
		}
		e := byKey[c.svc.Key]
		switch c.cmd {
		case "A":
			if e != nil {
				add(n, line, fmt.Sprintf("the service was added on line %d: not imported twice", e.line))
				continue
			}
			byKey[c.svc.Key] = &entry{st: &lb.ServiceState{Service: c.svc, Dests: map[netip.AddrPort]lb.Destination{}}, line: n, dests: map[netip.AddrPort]int{}}
			keys = append(keys, c.svc.Key)
		case "a":
			if e == nil {
				add(n, line, "no service was added before it: not imported")
				continue
			}
			if prev, dup := e.dests[c.dest.Addr]; dup {
				add(n, line, fmt.Sprintf("the server was added on line %d: not imported twice", prev))
				continue
			}
			e.st.Dests[c.dest.Addr] = c.dest
			e.dests[c.dest.Addr] = n
			e.order = append(e.order, c.dest.Addr)
		}
	}
	var stop *Issue
	switch err := sc.Err(); {
	case lr.N <= 0:
		stop = &Issue{File: file, Line: n + 1, What: "read", Why: fmt.Sprintf("the input is more than %d bytes (%d MiB): the rest is not imported", DefaultLimits.Bytes, DefaultLimits.Bytes>>20)}
	case err != nil:
		stop = &Issue{File: file, Line: n + 1, What: "read", Why: err.Error() + ": the rest is not imported"}
	}
	entries := make([]*entry, len(keys))
	for i, k := range keys {
		entries[i] = byKey[k]
	}
	res := fromTable("ipvsadm", file, file, entries, issues)
	res.MoreIssues += more
	if stop != nil {
		// Listed whatever else is left out.
		if len(res.Issues) >= MaxIssues {
			res.Issues = res.Issues[:MaxIssues-1]
			res.MoreIssues++
		}
		res.Issues = append(res.Issues, *stop)
	}
	return res
}

// Table imports an IPVS table read from the kernel, naming it source.
// Issues name the services by their place in key order, from 1.
func Table(source string, svcs map[lb.ServiceKey]*lb.ServiceState) Result {
	keys := make([]lb.ServiceKey, 0, len(svcs))
	for k := range svcs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, lb.ServiceKey.Compare)
	entries := make([]*entry, len(keys))
	for i, k := range keys {
		e := &entry{st: svcs[k], line: i + 1, dests: map[netip.AddrPort]int{}}
		for a := range e.st.Dests {
			e.order = append(e.order, a)
			e.dests[a] = i + 1
		}
		slices.SortFunc(e.order, netip.AddrPort.Compare)
		entries[i] = e
	}
	return fromTable("ipvsadm --live", source, source, entries, nil)
}

// fromTable maps IPVS services to vipd services.
func fromTable(kind, source, file string, entries []*entry, issues []Issue) Result {
	add := func(line int, what, why string) {
		issues = append(issues, Issue{File: file, Line: line, What: what, Why: why})
	}
	vips := map[netip.Addr]bool{}
	for _, e := range entries {
		if e.st.Key.FWMark == 0 {
			vips[e.st.Key.Addr] = true
		}
	}
	var svcs []*service
	for _, e := range entries {
		st := e.st
		k := st.Key
		s := &service{origin: fmt.Sprintf("%s:%d", file, e.line), file: file, line: e.line, scheduler: st.Scheduler,
			persistence: int64(st.Persistent), onePacket: st.OnePacket}
		what := k.String()
		if k.FWMark != 0 {
			s.fwmark = k.FWMark
			if k.Family == lb.IPv6 {
				s.family = "ipv6"
			}
		} else {
			s.vip, s.port, s.proto = k.Addr, k.Port, k.Proto.String()
			if why := badVIP(k.Addr); why != "" {
				add(e.line, what, "vipd cannot bind the VIP ("+why+"): service not imported")
				continue
			}
			if k.Port == 0 && st.Persistent == 0 {
				add(e.line, what, "port 0 (all ports) needs persistence: service not imported")
				continue
			}
		}
		if !slices.Contains(lb.Schedulers, st.Scheduler) {
			add(e.line, what, fmt.Sprintf("unknown scheduler %q: service not imported", st.Scheduler))
			continue
		}
		if st.Flags != 0 {
			for f := range strings.SplitSeq(st.Flags.String(), ",") {
				if f != "" {
					s.flags = append(s.flags, f)
				}
			}
		}
		full := 32
		if k.Family == lb.IPv6 {
			full = 128
		}
		if st.Persistent > 0 && st.Netmask > 0 && st.Netmask != full {
			s.netmask = st.Netmask
		}
		if s.onePacket && (k.FWMark == 0 && k.Proto != lb.UDP || st.Persistent > 0) {
			add(e.line, what+": -o", "vipd schedules single packets only of udp services without persistence: one_packet not set")
			s.onePacket = false
		}
		s.name = s.defaultName()
		// The service forwards as most of its backends do; the others
		// override it.
		count := map[lb.Forward]int{}
		for _, a := range e.order {
			count[st.Dests[a].Forward]++
		}
		fwd := lb.Masq
		for _, f := range []lb.Forward{lb.Masq, lb.DirectRoute, lb.Tunnel} {
			if count[f] > count[fwd] {
				fwd = f
			}
		}
		s.forward = forwardName(fwd)
		var tun lb.Destination
		for _, a := range e.order {
			if d := st.Dests[a]; d.Forward == lb.Tunnel && fwd == lb.Tunnel {
				tun = d
				break
			}
		}
		s.tunnel = tunnelOf(tun)
		for _, a := range e.order {
			d := st.Dests[a]
			line := e.dests[a]
			dw := fmt.Sprintf("%s: server %s", what, a)
			switch {
			case vips[a.Addr()]:
				add(line, dw, vipBackend(a.Addr()))
				continue
			case badBackend(a.Addr()) != "":
				add(line, dw, "not a unicast address ("+badBackend(a.Addr())+"): not imported")
				continue
			case lb.FamilyOf(a.Addr()) != k.Family && d.Forward != lb.Tunnel:
				add(line, dw, "only tunnel forwarding mixes families: not imported")
				continue
			case a.Port() == 0 && k.FWMark == 0 && k.Port != 0:
				add(line, dw, "port 0 serves only fwmark and all-ports services: not imported")
				continue
			case (d.Forward == lb.DirectRoute || d.Forward == lb.Tunnel) && k.FWMark == 0 && a.Port() != k.Port:
				add(line, dw, fmt.Sprintf("%s forwarding cannot change the port: not imported", forwardName(d.Forward)))
				continue
			case d.Lower > d.Upper:
				add(line, dw, "lower threshold above the upper one: thresholds not set")
				d.Lower, d.Upper = 0, 0
			}
			b := backend{addr: a, weight: d.Weight, upper: d.Upper, lower: d.Lower, comment: fmt.Sprintf("from %s:%d", file, line)}
			if d.Forward != fwd || tunnelOf(d) != s.tunnel {
				b.forward, b.tunnel = forwardName(d.Forward), tunnelOf(d)
			}
			s.backends = append(s.backends, b)
		}
		if len(s.backends) == 0 {
			add(e.line, what, "no server vipd can program (vipd needs at least one backend): service not imported")
			continue
		}
		svcs = append(svcs, s)
	}
	toml, svcs, issues := settle(header(kind, source), haPart{}, svcs, issues)
	return capIssues(Result{TOML: toml, Issues: tidy(issues, []string{file}), Services: len(svcs)})
}

func forwardName(f lb.Forward) string {
	switch f {
	case lb.DirectRoute:
		return "droute"
	case lb.Tunnel:
		return "tunnel"
	}
	return "masq"
}

func tunnelOf(d lb.Destination) tunnel {
	if d.Forward != lb.Tunnel {
		return tunnel{}
	}
	var t tunnel
	switch d.Tunnel {
	case lb.GUE:
		t.typ, t.port = "gue", d.TunnelPort
	case lb.GRE:
		t.typ = "gre"
	}
	switch d.TunnelCsum {
	case lb.Csum:
		t.csum = "csum"
	case lb.RemCsum:
		t.csum = "remcsum"
	}
	return t
}

// command is one parsed ipvsadm -A or -a line.
type command struct {
	cmd  string // "A" or "a"
	svc  lb.Service
	dest lb.Destination
	warn []string
}

// parseCommand parses the arguments of one ipvsadm command.
func parseCommand(args []string) (command, error) {
	c := command{svc: lb.Service{Scheduler: "wlc"}, dest: lb.Destination{Weight: 1, Forward: lb.DirectRoute}}
	var (
		svcAddr, realAddr string
		proto             lb.Proto
		persistent        bool
		netmask, flags    string
		v6                bool
	)
	next := func(i *int, name string) (string, error) {
		if *i+1 >= len(args) {
			return "", fmt.Errorf("%s needs a value", name)
		}
		*i++
		return args[*i], nil
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		var err error
		var v string
		switch a {
		case "-A", "--add-service", "-E", "--edit-service":
			c.cmd = "A"
		case "-a", "--add-server", "-e", "--edit-server":
			c.cmd = "a"
		case "-t", "--tcp-service":
			proto = lb.TCP
			svcAddr, err = next(&i, a)
		case "-u", "--udp-service":
			proto = lb.UDP
			svcAddr, err = next(&i, a)
		case "--sctp-service":
			proto = lb.SCTP
			svcAddr, err = next(&i, a)
		case "-f", "--fwmark-service":
			if v, err = next(&i, a); err == nil {
				m, perr := strconv.ParseUint(v, 0, 32)
				if perr != nil || m == 0 {
					return c, fmt.Errorf("fwmark %q is not a nonzero 32-bit mark", v)
				}
				c.svc.Key.FWMark = uint32(m)
			}
		case "-6", "--ipv6":
			v6 = true
		case "-s", "--scheduler":
			c.svc.Scheduler, err = next(&i, a)
		case "-p", "--persistent":
			persistent = true
			c.svc.Persistent = 300
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				t, perr := strconv.ParseUint(args[i], 10, 32)
				if perr != nil || t == 0 {
					return c, fmt.Errorf("persistence %q is not a timeout in seconds", args[i])
				}
				c.svc.Persistent = uint32(t)
			}
		case "-M", "--netmask":
			netmask, err = next(&i, a)
		case "-o", "--ops":
			c.svc.OnePacket = true
		case "-b", "--sched-flags":
			flags, err = next(&i, a)
		case "--pe":
			v, err = next(&i, a)
			c.warn = append(c.warn, fmt.Sprintf("persistence engine %q: vipd has no persistence engines: not set", v))
		case "-r", "--real-server":
			realAddr, err = next(&i, a)
		case "-g", "--gatewaying":
			c.dest.Forward = lb.DirectRoute
		case "-m", "--masquerading":
			c.dest.Forward = lb.Masq
		case "-i", "--ipip":
			c.dest.Forward = lb.Tunnel
		case "-w", "--weight":
			if v, err = next(&i, a); err == nil {
				w, perr := strconv.ParseUint(v, 10, 16)
				if perr != nil {
					return c, fmt.Errorf("weight %q is not within 0..65535", v)
				}
				c.dest.Weight = int(w)
			}
		case "-x", "--u-threshold", "-y", "--l-threshold":
			if v, err = next(&i, a); err == nil {
				t, perr := strconv.ParseUint(v, 10, 31)
				if perr != nil {
					return c, fmt.Errorf("threshold %q is not a count", v)
				}
				if a == "-x" || a == "--u-threshold" {
					c.dest.Upper = uint32(t)
				} else {
					c.dest.Lower = uint32(t)
				}
			}
		case "--tun-type":
			if v, err = next(&i, a); err == nil {
				switch v {
				case "ipip":
					c.dest.Tunnel = lb.IPIP
				case "gue":
					c.dest.Tunnel = lb.GUE
				case "gre":
					c.dest.Tunnel = lb.GRE
				default:
					return c, fmt.Errorf("tunnel type %q is not ipip, gue or gre", v)
				}
			}
		case "--tun-port":
			if v, err = next(&i, a); err == nil {
				p, perr := strconv.ParseUint(v, 10, 16)
				if perr != nil || p == 0 {
					return c, fmt.Errorf("tunnel port %q is not a port", v)
				}
				c.dest.TunnelPort = uint16(p)
			}
		case "--tun-nocsum":
			c.dest.TunnelCsum = lb.CsumNone
		case "--tun-csum":
			c.dest.TunnelCsum = lb.Csum
		case "--tun-remcsum":
			c.dest.TunnelCsum = lb.RemCsum
		default:
			return c, fmt.Errorf("unknown option %q", a)
		}
		if err != nil {
			return c, err
		}
	}
	if c.cmd == "" {
		return c, fmt.Errorf("neither -A nor -a")
	}
	switch {
	case c.svc.Key.FWMark != 0 && svcAddr != "":
		return c, fmt.Errorf("both a fwmark and an address")
	case c.svc.Key.FWMark != 0:
		c.svc.Key.Family = lb.IPv4
		if v6 {
			c.svc.Key.Family = lb.IPv6
		}
	case svcAddr == "":
		return c, fmt.Errorf("no service (-t, -u, --sctp-service or -f)")
	default:
		ap, err := netip.ParseAddrPort(svcAddr)
		if err != nil {
			return c, fmt.Errorf("service %q is not ADDRESS:PORT (ipvsadm -Sn prints numbers)", svcAddr)
		}
		a := ap.Addr().Unmap()
		c.svc.Key = lb.ServiceKey{Family: lb.FamilyOf(a), Proto: proto, Addr: a, Port: ap.Port()}
	}
	fam := c.svc.Key.Family
	if c.cmd == "A" {
		if netmask != "" {
			if !persistent {
				return c, fmt.Errorf("a netmask without persistence")
			}
			bits := netmaskBits(netmask, fam == lb.IPv6)
			if bits < 0 {
				return c, fmt.Errorf("netmask %q is not one of the service's family", netmask)
			}
			c.svc.Netmask = bits
		} else if persistent {
			c.svc.Netmask = cmp.Or(map[lb.Family]int{lb.IPv6: 128}[fam], 32)
		}
		if flags != "" {
			f, err := schedFlags(flags, c.svc.Scheduler)
			if err != nil {
				return c, err
			}
			c.svc.Flags = f
		}
		return c, nil
	}
	if realAddr == "" {
		return c, fmt.Errorf("no real server (-r)")
	}
	ra, err := netip.ParseAddrPort(realAddr)
	if err != nil {
		a, err2 := netip.ParseAddr(strings.Trim(realAddr, "[]"))
		if err2 != nil {
			return c, fmt.Errorf("real server %q is not ADDRESS[:PORT]", realAddr)
		}
		ra = netip.AddrPortFrom(a, c.svc.Key.Port)
	}
	c.dest.Addr = netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port())
	if c.svc.Key.FWMark != 0 && !v6 {
		// A fwmark service's family, when -6 is left out, is its
		// servers'.
		c.svc.Key.Family = lb.FamilyOf(c.dest.Addr.Addr())
	}
	if c.dest.Forward != lb.Tunnel && (c.dest.Tunnel != lb.IPIP || c.dest.TunnelPort != 0 || c.dest.TunnelCsum != lb.CsumNone) {
		return c, fmt.Errorf("tunnel options without -i")
	}
	return c, nil
}

// schedFlags parses ipvsadm's -b list: sh-fallback, sh-port, mh-fallback,
// mh-port, or flag-1 and flag-2, which mean the fallback and port flags of
// the scheduler.
func schedFlags(s, sched string) (lb.SchedFlags, error) {
	var out lb.SchedFlags
	for f := range strings.SplitSeq(s, ",") {
		switch f {
		case "flag-1":
			f = sched + "-fallback"
		case "flag-2":
			f = sched + "-port"
		}
		fl, ok := lb.ParseSchedFlag(f)
		if !ok || fl.Scheduler() != sched {
			return 0, fmt.Errorf("scheduler flag %q does not apply to scheduler %s", f, sched)
		}
		out |= fl
	}
	return out, nil
}
