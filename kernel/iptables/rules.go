package iptables

import (
	"bufio"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/lb"
)

// The chains vipd owns. Every chain whose name starts with chainPrefix is
// vipd's, and nothing else is.
const (
	chainPrefix = "VIPD-"
	// chainMark marks new connections to SNAT services (nat PREROUTING
	// and OUTPUT jump to it).
	chainMark = "VIPD-MARK-SNAT"
	// chainMasq masquerades marked IPVS traffic (nat POSTROUTING jumps
	// to it).
	chainMasq = "VIPD-POSTROUTING"
	// chainFilter drops new connections to VIP ports no service serves
	// and from sources a service does not allow (filter INPUT jumps to
	// it).
	chainFilter = "VIPD-FILTER"
)

// policyComment starts the comment that records the policy the chains
// implement.
const policyComment = "vipd policy "

// table is what vipd wants, or has, in one iptables table: its own chains
// with their rules, and the jumps to them from built-in chains. Rules and
// jumps are "-A CHAIN ..." lines as iptables-save prints them.
type table struct {
	name   string
	chains []string
	rules  []string
	jumps  []string
}

// renderOptions are the parts of Options that change the rules.
type renderOptions struct {
	noIPVSMatch bool
}

// render returns the tables that implement policy p for family fam: the
// nat table and the filter table, whose chain always drops the sources
// services do not allow, and with p.FilterVIPs or a floating SNAT source
// does more.
// A disabled policy renders empty tables.
func render(fam lb.Family, p lb.RulePolicy, o renderOptions) []table {
	nat := table{name: "nat"}
	filter := table{name: "filter"}
	if !p.Enabled {
		return []table{nat, filter}
	}
	mark := fmt.Sprintf("%#x/%#x", p.SNATMark, p.SNATMark)
	ipvs := " -m ipvs --ipvs"
	if o.noIPVSMatch {
		ipvs = ""
	}
	nat.chains = []string{chainMark, chainMasq}
	nat.rules = []string{
		fmt.Sprintf("-A %s -m set --match-set %s dst,dst -j MARK --set-xmark %s", chainMark, setName(lb.SetSNAT, fam), mark),
		fmt.Sprintf("-A %s -m mark ! --mark %s -m comment --comment %s -j RETURN", chainMasq, mark, quote(policyComment+p.String())),
		fmt.Sprintf("-A %s -j MARK --set-xmark 0x0/%#x", chainMasq, p.SNATMark),
		snatRule(fam, p, ipvs),
	}
	nat.jumps = []string{
		jump("PREROUTING", chainMark, "vipd mark traffic to snat services"),
		jump("OUTPUT", chainMark, "vipd mark traffic to snat services"),
		jump("POSTROUTING", chainMasq, "vipd masquerade marked ipvs traffic"),
	}
	src := p.SNATSource(fam)
	icmp := "icmp"
	if fam == lb.IPv6 {
		icmp = "ipv6-icmp"
	}
	filter.chains = []string{chainFilter}
	if src.IsValid() {
		// What reaches the floating SNAT source itself was not
		// translated back: a backend's packet for a connection this
		// node does not track (yet), such as the answer to a
		// handshake begun on the peer before a takeover. Dropped, it
		// is sent again and finds the connection tracked; answered
		// with a reset, it would end the connection.
		filter.rules = append(filter.rules, fmt.Sprintf("-A %s -d %s ! -p %s -m comment --comment %s -j DROP",
			chainFilter, netip.PrefixFrom(src, src.BitLen()), icmp, quote("vipd drop unsolicited traffic to the floating snat source")))
	}
	// One rule for every service's allow list: a new connection to
	// a restricted address,protocol:port from a source its allowed
	// entries do not admit is dropped. Filter INPUT runs before
	// IPVS, which takes its packets in LOCAL_IN at a later
	// priority.
	filter.rules = append(filter.rules, fmt.Sprintf("-A %s -m conntrack --ctstate NEW -m set --match-set %s dst,dst -m set ! --match-set %s dst,dst,src -m comment --comment %s -j DROP",
		chainFilter, setName(lb.SetRestricted, fam), setName(lb.SetAllowed, fam), quote("vipd drop sources a service does not allow")))
	if p.FilterVIPs {
		filter.rules = append(filter.rules,
			fmt.Sprintf("-A %s -m set ! --match-set %s dst -j RETURN", chainFilter, setName(lb.SetVIPs, fam)),
			fmt.Sprintf("-A %s -m set --match-set %s dst,dst -j RETURN", chainFilter, setName(lb.SetServed, fam)),
			fmt.Sprintf("-A %s -p %s -j RETURN", chainFilter, icmp),
			fmt.Sprintf("-A %s -m conntrack --ctstate NEW -m comment --comment %s -j DROP", chainFilter, quote("vipd drop vip ports no service serves")),
		)
	}
	filter.jumps = []string{jump("INPUT", chainFilter, "vipd filter traffic to vips")}
	return []table{nat, filter}
}

// snatRule is the rule that rewrites the source of marked IPVS traffic:
// to the policy's floating SNAT source of fam, keeping the client's port
// when no other connection uses it (a peer that takes over then maps a
// connection the same way), or else masqueraded with random ports.
func snatRule(fam lb.Family, p lb.RulePolicy, ipvs string) string {
	if src := p.SNATSource(fam); src.IsValid() {
		return fmt.Sprintf("-A %s%s -m comment --comment %s -j SNAT --to-source %s", chainMasq, ipvs, quote("vipd snat ipvs traffic to snat services"), src)
	}
	return fmt.Sprintf("-A %s%s -m comment --comment %s -j MASQUERADE --random-fully", chainMasq, ipvs, quote("vipd masquerade ipvs traffic to snat services"))
}

func jump(from, to, comment string) string {
	return fmt.Sprintf("-A %s -m comment --comment %s -j %s", from, quote(comment), to)
}

// quote quotes s the way iptables-save prints a comment.
func quote(s string) string {
	if strings.ContainsAny(s, " \t\"'") {
		return strconv.Quote(s)
	}
	return s
}

// parseSave parses iptables-save output into vipd's part of each table:
// the chains named with chainPrefix, their rules, and the rules of other
// chains that jump to them. Everything else is left out.
func parseSave(out string) map[string]*table {
	tables := map[string]*table{}
	var cur *table
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = &table{name: line[1:]}
			tables[cur.name] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			if name, _, _ := strings.Cut(line[1:], " "); strings.HasPrefix(name, chainPrefix) {
				cur.chains = append(cur.chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			chain, _, _ := strings.Cut(line[len("-A "):], " ")
			switch {
			case strings.HasPrefix(chain, chainPrefix):
				cur.rules = append(cur.rules, line)
			case strings.HasPrefix(jumpTarget(line), chainPrefix):
				cur.jumps = append(cur.jumps, line)
			}
		}
	}
	return tables
}

// jumpTarget returns the chain a rule jumps or goes to, or "".
func jumpTarget(rule string) string {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "--jump" || f[i] == "-g" || f[i] == "--goto" {
			return f[i+1]
		}
	}
	return ""
}

// normalize makes rules comparable across the spellings iptables-save
// uses: runs of blanks and quoting do not matter.
func normalize(rule string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(rule, `"`, "")), " ")
}

func normalizeAll(rules []string) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = normalize(r)
	}
	return out
}

// equal reports whether the live table have implements want exactly: the
// same chains, the same rules in the same order, and each jump exactly
// once (wherever it stands in its built-in chain).
func equal(want, have *table) bool {
	if have == nil {
		have = &table{}
	}
	wc, hc := slices.Clone(want.chains), slices.Clone(have.chains)
	slices.Sort(wc)
	slices.Sort(hc)
	if !slices.Equal(wc, hc) || !slices.Equal(normalizeAll(want.rules), normalizeAll(have.rules)) {
		return false
	}
	wj, hj := normalizeAll(want.jumps), normalizeAll(have.jumps)
	slices.Sort(wj)
	slices.Sort(hj)
	return slices.Equal(wj, hj)
}

// parsePolicy finds the policy comment in a table and parses it. It
// returns false when there is none or it does not parse.
func parsePolicy(t *table) (lb.RulePolicy, bool) {
	if t == nil {
		return lb.RulePolicy{}, false
	}
	for _, r := range t.rules {
		_, rest, ok := strings.Cut(normalize(r), "--comment "+policyComment)
		if !ok {
			continue
		}
		p := lb.RulePolicy{Enabled: true}
		var haveMark, haveFilter bool
		for _, f := range strings.Fields(rest) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "snat-mark":
				m, err := strconv.ParseUint(v, 0, 32)
				if err != nil {
					return lb.RulePolicy{}, false
				}
				p.SNATMark, haveMark = uint32(m), true
			case "snat-source", "snat-source6":
				a, err := netip.ParseAddr(v)
				if err != nil || a.Is6() != (k == "snat-source6") {
					return lb.RulePolicy{}, false
				}
				if a.Is6() {
					p.SNATSource6 = a
				} else {
					p.SNATSource4 = a
				}
			case "filter-vips":
				b, err := strconv.ParseBool(v)
				if err != nil {
					return lb.RulePolicy{}, false
				}
				p.FilterVIPs, haveFilter = b, true
			}
		}
		return p, haveMark && haveFilter
	}
	return lb.RulePolicy{}, false
}

// restoreScript returns the iptables-restore --noflush input that turns
// the live tables have into want, touching nothing but vipd's chains and
// the jumps to them: wanted chains are declared (which flushes them) and
// refilled, stale vipd chains and jumps deleted, missing jumps inserted at
// the top of their built-in chains and duplicate jumps removed. It returns
// "" when there is nothing to write.
func restoreScript(want []table, have map[string]*table) string {
	var b strings.Builder
	for i := range want {
		w := &want[i]
		h := have[w.name]
		if h == nil {
			h = &table{}
		}
		if len(w.chains) == 0 && len(h.chains) == 0 && len(h.jumps) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", w.name)
		for _, c := range w.chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		// Count live jumps; delete stale and duplicate ones.
		wantJump := map[string]bool{}
		for _, j := range w.jumps {
			wantJump[normalize(j)] = true
		}
		seen := map[string]bool{}
		for _, j := range h.jumps {
			n := normalize(j)
			if wantJump[n] && !seen[n] {
				seen[n] = true
				continue
			}
			fmt.Fprintf(&b, "-D%s\n", strings.TrimPrefix(j, "-A"))
		}
		var stale []string
		for _, c := range h.chains {
			if !slices.Contains(w.chains, c) {
				stale = append(stale, c)
			}
		}
		for _, c := range stale {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, c := range stale {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		for _, r := range w.rules {
			fmt.Fprintf(&b, "%s\n", r)
		}
		for _, j := range w.jumps {
			if !seen[normalize(j)] {
				chain, rest, _ := strings.Cut(strings.TrimPrefix(j, "-A "), " ")
				fmt.Fprintf(&b, "-I %s 1 %s\n", chain, rest)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}
