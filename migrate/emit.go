// Package migrate turns the configuration of another IPVS manager, a
// keepalived.conf or the output of "ipvsadm -Sn", into a vipd TOML
// configuration. It is pure: it reads files and text, never the kernel.
//
// Whatever has no equivalent in vipd is reported as an Issue with its file
// and line, never dropped silently; the configuration carries a comment
// with the origin of every service.
package migrate

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Issue is one construct of the source that the import could not carry
// over as it is.
type Issue struct {
	File string
	Line int
	// What names the construct, such as `real_server 10.0.0.1 80: PING_CHECK`.
	What string
	// Why says what vipd lacks, or what it does instead.
	Why string
}

func (i Issue) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", i.File, i.Line, i.What, i.Why)
}

// Result is an imported configuration.
type Result struct {
	// TOML is the vipd configuration.
	TOML []byte
	// Issues are the constructs that were not carried over as they are,
	// in file and line order.
	Issues []Issue
	// Services is the number of [[service]] tables in TOML.
	Services int
	// Pools is the number of [[kubernetes.pool]] tables in TOML.
	Pools int
	// MoreIssues counts the issues past the first MaxIssues, which
	// Issues does not list.
	MoreIssues int
}

// MaxIssues is the most issues a Result lists, so that a huge or hostile
// configuration cannot make an import keep (and print) an issue for each
// of its lines; the others are counted in Result.MoreIssues.
const MaxIssues = 1000

// capIssues returns r with at most MaxIssues issues, the others counted.
func capIssues(r Result) Result {
	if n := len(r.Issues); n > MaxIssues {
		r.MoreIssues += n - MaxIssues
		r.Issues = r.Issues[:MaxIssues:MaxIssues]
	}
	return r
}

// service is one vipd service being built.
type service struct {
	origin string
	// file and line are where the service was read, for issues.
	file string
	line int
	// from is the statement the service was read from, if any.
	from *node
	// comments are written above the table, one per line.
	comments []string

	name      string
	vip       netip.Addr
	port      uint16
	proto     string // "tcp", "udp" or "sctp"; "" for fwmark
	fwmark    uint32
	family    string // "ipv6" for an IPv6 fwmark service
	scheduler string
	flags     []string
	forward   string
	tunnel    tunnel
	// persistence is in seconds; netmask is 0 for the default.
	persistence int64
	netmask     int
	onePacket   bool

	onFailure  string
	quorum     int
	hysteresis int
	sorry      netip.AddrPort
	check      *check
	backends   []backend
}

// tunnel holds the tunnel settings of tunnel forwarding.
type tunnel struct {
	typ  string // "" (ipip), "gue" or "gre"
	port uint16
	csum string // "", "csum" or "remcsum"
}

// backend is one [[service.backend]].
type backend struct {
	addr    netip.AddrPort
	weight  int
	upper   uint32
	lower   uint32
	forward string // set only where it differs from the service's
	tunnel  tunnel
	check   *check
	comment string
	// from is the statement the backend was read from, if any.
	from *node
}

// check is a check table: its keys in order, values already in TOML.
type check struct {
	kv [][2]string
}

func (c *check) set(k, v string) {
	for i := range c.kv {
		if c.kv[i][0] == k {
			c.kv[i][1] = v
			return
		}
	}
	c.kv = append(c.kv, [2]string{k, v})
}

func (c *check) equal(o *check) bool {
	if c == nil || o == nil {
		return c == o
	}
	return slices.Equal(c.kv, o.kv)
}

// key returns the IPVS identity of s, for duplicate detection.
func (s *service) key() string {
	if s.fwmark != 0 {
		return fmt.Sprintf("fwmark %d %s", s.fwmark, s.family)
	}
	return fmt.Sprintf("%s %s", s.proto, netip.AddrPortFrom(s.vip, s.port))
}

// defaultName is vipd's default name of s.
func (s *service) defaultName() string {
	if s.fwmark != 0 {
		if s.family == "ipv6" {
			return fmt.Sprintf("fwmark-%d-ipv6", s.fwmark)
		}
		return fmt.Sprintf("fwmark-%d", s.fwmark)
	}
	return fmt.Sprintf("%s-%s-%d", s.proto, s.vip, s.port)
}

// header starts every imported configuration.
func header(kind, source string) string {
	return fmt.Sprintf("# Imported by \"vipd import %s\" from %s.\n# Review it, then run: vipd check FILE; vipd plan FILE\n", kind, source)
}

// render writes the services after head (the comments and the [ha]
// section, if any). starts holds the line of each service's first line.
func render(head string, svcs []*service) (toml []byte, starts []int) {
	var b strings.Builder
	b.WriteString(head)
	line := 1 + strings.Count(head, "\n")
	for _, s := range svcs {
		from := b.Len()
		b.WriteString("\n")
		starts = append(starts, line+1)
		fmt.Fprintf(&b, "# from %s\n", s.origin)
		for _, c := range s.comments {
			fmt.Fprintf(&b, "# %s\n", c)
		}
		b.WriteString("[[service]]\n")
		kv(&b, "name", quote(s.name))
		if s.fwmark != 0 {
			kv(&b, "fwmark", strconv.FormatUint(uint64(s.fwmark), 10))
			if s.family != "" {
				kv(&b, "family", quote(s.family))
			}
			if s.vip.IsValid() {
				kv(&b, "vip", quote(s.vip.String()))
			}
		} else {
			kv(&b, "vip", quote(s.vip.String()))
			kv(&b, "port", strconv.Itoa(int(s.port)))
			kv(&b, "protocol", quote(s.proto))
		}
		kv(&b, "scheduler", quote(s.scheduler))
		if len(s.flags) > 0 {
			kv(&b, "scheduler_flags", quoteList(s.flags))
		}
		kv(&b, "forward", quote(s.forward))
		writeTunnel(&b, s.forward, s.tunnel)
		if s.persistence > 0 {
			kv(&b, "persistence", quote((fmt.Sprintf("%ds", s.persistence))))
			if s.netmask > 0 {
				kv(&b, "persistence_netmask", strconv.Itoa(s.netmask))
			}
		}
		if s.onePacket {
			kv(&b, "one_packet", "true")
		}
		if s.onFailure != "" {
			kv(&b, "on_failure", quote(s.onFailure))
		}
		if s.quorum > 0 {
			kv(&b, "quorum", strconv.Itoa(s.quorum))
			if s.hysteresis > 0 {
				kv(&b, "quorum_hysteresis", strconv.Itoa(s.hysteresis))
			}
		}
		if s.sorry.IsValid() {
			kv(&b, "sorry", quote(s.sorry.String()))
		}
		if s.check != nil {
			b.WriteString("\n[service.check]\n")
			writeCheck(&b, s.check)
		}
		for _, d := range s.backends {
			b.WriteString("\n")
			if d.comment != "" {
				fmt.Fprintf(&b, "# %s\n", d.comment)
			}
			b.WriteString("[[service.backend]]\n")
			kv(&b, "address", quote(d.addr.Addr().String()))
			kv(&b, "port", strconv.Itoa(int(d.addr.Port())))
			kv(&b, "weight", strconv.Itoa(d.weight))
			if d.upper > 0 {
				kv(&b, "upper_threshold", strconv.FormatUint(uint64(d.upper), 10))
			}
			if d.lower > 0 {
				kv(&b, "lower_threshold", strconv.FormatUint(uint64(d.lower), 10))
			}
			if d.forward != "" {
				kv(&b, "forward", quote(d.forward))
				writeTunnel(&b, d.forward, d.tunnel)
			}
			if d.check != nil {
				b.WriteString("[service.backend.check]\n")
				writeCheck(&b, d.check)
			}
		}
		line += strings.Count(b.String()[from:], "\n")
	}
	return []byte(b.String()), starts
}

func writeTunnel(b *strings.Builder, forward string, t tunnel) {
	if forward != "tunnel" {
		return
	}
	if t.typ != "" {
		kv(b, "tunnel", quote(t.typ))
	}
	if t.port != 0 {
		kv(b, "tunnel_port", strconv.Itoa(int(t.port)))
	}
	if t.csum != "" {
		kv(b, "tunnel_checksum", quote(t.csum))
	}
}

func writeCheck(b *strings.Builder, c *check) {
	for _, p := range c.kv {
		kv(b, p[0], p[1])
	}
}

func kv(b *strings.Builder, k, v string) {
	b.WriteString(k)
	b.WriteString(" = ")
	b.WriteString(v)
	b.WriteByte('\n')
}

// quote returns s as a TOML basic string. s must be valid UTF-8 (see
// tomlSafe).
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// tomlSafe reports whether s can be written as a TOML string.
func tomlSafe(s string) bool { return utf8.ValidString(s) }

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// seconds renders a duration in seconds as a TOML duration string.
func seconds(f float64) string {
	if f == float64(int64(f)) {
		return quote(fmt.Sprintf("%ds", int64(f)))
	}
	return quote(strconv.FormatFloat(f*1000, 'f', -1, 64) + "ms")
}

// tidy drops repeated issues (a virtual_server of a group maps its
// statements once per member) and orders them by file, in the order files
// were read, then by line.
func tidy(is []Issue, files []string) []Issue {
	rank := map[string]int{}
	for i, f := range files {
		if _, ok := rank[f]; !ok {
			rank[f] = i
		}
	}
	seen := map[Issue]bool{}
	out := make([]Issue, 0, len(is))
	for _, i := range is {
		if !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	slices.SortStableFunc(out, func(a, b Issue) int {
		ra, oka := rank[a.File]
		rb, okb := rank[b.File]
		switch {
		case a.File == b.File:
			return a.Line - b.Line
		case oka && okb:
			return ra - rb
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		}
		return strings.Compare(a.File, b.File)
	})
	return out
}
