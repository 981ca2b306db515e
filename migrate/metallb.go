package migrate

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/vipd/vipd/config"
)

// MetalLBOptions configure a MetalLB import.
type MetalLBOptions struct {
	// FS, when set, is where files are read from (tests); nil reads the
	// operating system's files.
	FS fs.FS
	// Limits bound the reading; the zero value means DefaultLimits. Of
	// them a MetalLB import uses Bytes (all files together) and Depth
	// (nesting of the YAML, beyond which it is refused).
	Limits Limits
	// Nodes is the most YAML nodes the files may hold together, counted
	// before they are parsed; 0 means MaxMetalLBNodes.
	Nodes int
}

// MaxMetalLBNodes bounds the YAML nodes of a MetalLB import. A parsed
// node costs a few hundred bytes, so that the files' size alone (16 MiB
// of "[a,a,a,...]") would not bound the memory of the parse; a MetalLB
// configuration of a thousand resources, read with kubectl get -o yaml and
// its managedFields, holds a tenth of this.
const MaxMetalLBNodes = 1 << 18

// MetalLB imports MetalLB's custom resources (metallb.io/v1beta1 and
// v1beta2) from files of YAML: documents separated by "---", and the
// lists "kubectl get -o yaml" writes. IPAddressPools become
// [[kubernetes.pool]]s; BGPPeers and BGPAdvertisements [bgp]; with no
// BGPPeer, L2Advertisements' interfaces become [daemon] uplinks.
func MetalLB(files []string, opts MetalLBOptions) Result {
	lim := opts.Limits
	if lim == (Limits{}) {
		lim = DefaultLimits
	}
	nodes := opts.Nodes
	if nodes <= 0 {
		nodes = MaxMetalLBNodes
	}
	m := &mmapper{communities: map[string]mcommunity{}}
	r := &reader{fsys: opts.FS, limits: lim}
	counted := 0
	for _, f := range files {
		f = filepath.Clean(f)
		m.files = append(m.files, f)
		data, err := r.readFile(f)
		if err != nil {
			m.issue(f, 0, "read "+f, err.Error())
			if errors.Is(err, errTooLarge) {
				break
			}
			continue
		}
		// Count before parsing: every node but a document's first is
		// introduced by one of these bytes (a flow separator, a key's
		// colon, a sequence's dash, a line's end), so that this bounds
		// the nodes the parse can build.
		counted += 1 + countAny(data, ",:-[{?\n")
		if counted > nodes {
			m.issue(f, 0, "read "+f, fmt.Sprintf("the files read may hold more than %d YAML nodes (counted before parsing): reading stopped", nodes))
			break
		}
		m.read(f, data, lim.Depth)
	}
	return m.result(files)
}

// countAny counts the bytes of data that are in set.
func countAny(data []byte, set string) int {
	n := 0
	for _, c := range []byte(set) {
		n += bytes.Count(data, []byte{c})
	}
	return n
}

// mpool is an IPAddressPool.
type mpool struct {
	file        string
	line        int
	name        string
	addresses   []string
	autoAssign  bool
	avoid       bool
	namespaces  []string
	selector    string
	advertised  bool
	avoidBuggy  *yaml.Node
	nsSelectors *yaml.Node
	// badSelector is set when a service selector could not be mapped.
	badSelector *yaml.Node
}

// madv is an L2Advertisement or a BGPAdvertisement.
type madv struct {
	file, kind string
	line       int
	name       string
	// pools are the pools named; nil is every pool.
	pools      []string
	poolsNode  *yaml.Node
	interfaces []string
	// communities are the names or values, resolved at the end.
	communities []*yaml.Node
	localPref   *int64
}

// mpeer is a BGPPeer.
type mpeer struct {
	file     string
	line     int
	name     string
	address  string
	asn      int64
	myASN    int64
	myNode   *yaml.Node
	port     int64
	hold     string
	keep     string
	password string
	multihop bool
	source   string
	routerID string
	ridNode  *yaml.Node
}

// mcommunity is one named community of a Community resource.
type mcommunity struct {
	value string
	file  string
	line  int
}

// mmapper maps MetalLB's resources to vipd's sections.
type mmapper struct {
	files       []string
	issues      []Issue
	more        int
	pools       []*mpool
	l2          []*madv
	bgpAdv      []*madv
	peers       []*mpeer
	communities map[string]mcommunity
}

func (m *mmapper) issue(file string, line int, what, why string) {
	if len(m.issues) >= MaxIssues {
		m.more++
		return
	}
	m.issues = append(m.issues, Issue{File: file, Line: line, What: what, Why: why})
}

func (m *mmapper) at(file string, n *yaml.Node, what, why string) {
	m.issue(file, n.Line, what, why)
}

// yamlLine finds the line in a YAML parser's error; yamlQuoted the text
// of the file it quotes (an anchor's name, a value), which an issue
// leaves out.
var (
	yamlLine   = regexp.MustCompile(`line ([0-9]+)`)
	yamlQuoted = regexp.MustCompile("(['`\"])[^'`\"]*(['`\"])")
)

// read parses the documents of one file.
func (m *mmapper) read(file string, data []byte, depth int) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if err == io.EOF {
			return
		}
		if err != nil {
			line := 0
			if s := yamlLine.FindStringSubmatch(err.Error()); s != nil {
				line, _ = strconv.Atoi(s[1])
			}
			msg := yamlLine.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: "), "")
			msg = yamlQuoted.ReplaceAllString(strings.TrimPrefix(msg, ": "), "$1...$1")
			m.issue(file, line, "YAML", msg+": the rest of the file is not imported")
			return
		}
		if tooDeep(&doc, depth) {
			m.issue(file, doc.Line, "YAML", fmt.Sprintf("nested more than %d deep: document not imported", depth))
			continue
		}
		if len(doc.Content) == 1 {
			m.object(file, doc.Content[0], true)
		}
	}
}

// tooDeep reports whether n nests deeper than depth; it follows no alias.
func tooDeep(n *yaml.Node, depth int) bool {
	if depth < 0 {
		return true
	}
	for _, k := range n.Content {
		if tooDeep(k, depth-1) {
			return true
		}
	}
	return false
}

// deref follows an alias: the walk reads fixed fields at fixed depths, so
// an alias costs one step, never an expansion.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.AliasNode {
		return nil
	}
	return n
}

// field is one key of a mapping and its value.
type field struct {
	key string
	k   *yaml.Node
	v   *yaml.Node
}

// fields lists the keys of the mapping n, or reports that n is none.
func (m *mmapper) fields(file string, n *yaml.Node, what string) ([]field, bool) {
	n = deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		if n != nil && n.Tag == "!!null" {
			return nil, true
		}
		line := 0
		if n != nil {
			line = n.Line
		}
		m.issue(file, line, what, "not a mapping: not imported")
		return nil, false
	}
	out := make([]field, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k == nil || v == nil || k.Kind != yaml.ScalarNode || !tomlSafe(k.Value) {
			m.at(file, n.Content[i], what, "a key that is not a string: not imported")
			continue
		}
		out = append(out, field{key: k.Value, k: k, v: v})
	}
	return out, true
}

// str returns the scalar n, or reports that it is none.
func (m *mmapper) str(file string, n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || !tomlSafe(n.Value) {
		m.at(file, n, what, "not a string: not imported")
		return "", false
	}
	return n.Value, true
}

// strs returns the sequence of scalars n; what is not a string is
// reported and left out.
func (m *mmapper) strs(file string, n *yaml.Node, what string) []string {
	if n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		m.at(file, n, what, "not a list: not imported")
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for _, e := range n.Content {
		e = deref(e)
		if e == nil {
			continue
		}
		if s, ok := m.str(file, e, what); ok {
			out = append(out, s)
		}
	}
	return out
}

func (m *mmapper) boolean(file string, n *yaml.Node, what string) (bool, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		b, err := strconv.ParseBool(strings.ToLower(n.Value))
		if err == nil {
			return b, true
		}
	}
	m.at(file, n, what, "not true or false: not imported")
	return false, false
}

func (m *mmapper) integer(file string, n *yaml.Node, what string) (int64, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		if i, err := strconv.ParseInt(n.Value, 10, 64); err == nil {
			return i, true
		}
	}
	m.at(file, n, what, "not an integer: not imported")
	return 0, false
}

const (
	metallbV1beta1 = "metallb.io/v1beta1"
	metallbV1beta2 = "metallb.io/v1beta2"
)

// object maps one resource, or the items of a list.
func (m *mmapper) object(file string, n *yaml.Node, top bool) {
	fs, ok := m.fields(file, n, "resource")
	if !ok || len(fs) == 0 {
		return
	}
	var api, kind, name string
	var spec, items *yaml.Node
	for _, f := range fs {
		switch f.key {
		case "apiVersion":
			api, _ = m.str(file, f.v, "apiVersion")
		case "kind":
			kind, _ = m.str(file, f.v, "kind")
		case "metadata":
			mfs, _ := m.fields(file, f.v, "metadata")
			for _, mf := range mfs {
				if mf.key == "name" {
					name, _ = m.str(file, mf.v, "metadata.name")
				}
			}
		case "spec":
			spec = f.v
		case "items":
			items = f.v
		}
	}
	line := deref(n).Line
	if top && items != nil && (kind == "List" || strings.HasSuffix(kind, "List")) {
		if items.Kind != yaml.SequenceNode {
			if items.Tag != "!!null" {
				m.at(file, items, "items", "not a list: not imported")
			}
			return
		}
		for _, it := range items.Content {
			m.object(file, it, false)
		}
		return
	}
	what := kind
	if name != "" {
		what += " " + name
	}
	if what == "" {
		what = "resource"
	}
	if api != metallbV1beta1 && !(api == metallbV1beta2 && kind == "BGPPeer") {
		why := "not a MetalLB resource vipd imports (metallb.io/v1beta1, or v1beta2 for BGPPeer): not imported"
		if kind == "ConfigMap" {
			why = "MetalLB's configuration before 0.13 was a ConfigMap: convert it to its custom resources first (MetalLB's configmaptocrs), then import those"
		}
		m.issue(file, line, what, why)
		return
	}
	if name == "" {
		m.issue(file, line, what, "no metadata.name: not imported")
		return
	}
	var sfs []field
	if spec != nil {
		if sfs, ok = m.fields(file, spec, what+": spec"); !ok {
			return
		}
	}
	switch kind {
	case "IPAddressPool":
		m.pool(file, line, name, sfs)
	case "L2Advertisement", "BGPAdvertisement":
		m.advertisement(file, line, kind, name, sfs)
	case "BGPPeer":
		m.peer(file, line, name, sfs)
	case "Community":
		m.community(file, name, sfs)
	case "BFDProfile":
		m.issue(file, line, what, "vipd has no BFD: its BGP sessions rely on the hold time")
	default:
		m.issue(file, line, what, "not a MetalLB resource vipd knows: not imported")
	}
}

func (m *mmapper) pool(file string, line int, name string, sfs []field) {
	p := &mpool{file: file, line: line, name: name, autoAssign: true}
	what := "IPAddressPool " + name
	for _, f := range sfs {
		w := what + ": " + f.key
		switch f.key {
		case "addresses":
			for _, a := range m.strs(file, f.v, w) {
				if i := strings.IndexByte(a, '-'); i > 0 {
					a = strings.TrimSpace(a[:i]) + "-" + strings.TrimSpace(a[i+1:])
				}
				p.addresses = append(p.addresses, strings.TrimSpace(a))
			}
		case "autoAssign":
			if b, ok := m.boolean(file, f.v, w); ok {
				p.autoAssign = b
			}
		case "avoidBuggyIPs":
			if b, ok := m.boolean(file, f.v, w); ok {
				p.avoid = b
				if b {
					p.avoidBuggy = f.k
				}
			}
		case "serviceAllocation":
			m.allocation(file, p, f.v, what+": serviceAllocation")
		default:
			m.at(file, f.k, w, "no equivalent in vipd: not imported")
		}
	}
	if p.badSelector != nil {
		m.at(file, p.badSelector, what+": serviceAllocation.serviceSelectors", "a selector vipd cannot write, and without it the pool would be open to every Service: pool not imported")
		return
	}
	if p.nsSelectors != nil && len(p.namespaces) == 0 {
		m.at(file, p.nsSelectors, what+": serviceAllocation.namespaceSelectors", "vipd restricts a pool to namespaces by name only, and without them the pool would be open to every namespace: pool not imported (list the namespaces in its namespaces)")
		return
	}
	if p.nsSelectors != nil {
		m.at(file, p.nsSelectors, what+": serviceAllocation.namespaceSelectors", "vipd restricts a pool to namespaces by name only: the pool is restricted to the namespaces listed, not those the selectors match")
	}
	if p.avoidBuggy != nil && slices.ContainsFunc(p.addresses, func(a string) bool { return !isV4Slash24OrWider(a) }) {
		m.at(file, p.avoidBuggy, what+": avoidBuggyIPs", "vipd keeps out the network and broadcast addresses of each CIDR (avoid_network_broadcast), MetalLB every address ending in .0 or .255: they differ for ranges, single addresses and CIDRs longer than /24")
	}
	if len(p.addresses) == 0 {
		m.issue(file, line, what, "no addresses: not imported")
		return
	}
	if slices.ContainsFunc(m.pools, func(q *mpool) bool { return q.name == name }) {
		m.issue(file, line, what, "a second IPAddressPool of that name: not imported")
		return
	}
	m.pools = append(m.pools, p)
}

// isV4Slash24OrWider reports whether a is an IPv4 CIDR of /24 or wider,
// where MetalLB's avoidBuggyIPs and vipd's avoid_network_broadcast differ
// at most in the .0 and .255 addresses inside the CIDR.
func isV4Slash24OrWider(a string) bool {
	_, bits, ok := strings.Cut(a, "/")
	if !ok || strings.Contains(a, ":") {
		return false
	}
	n, err := strconv.Atoi(bits)
	return err == nil && n == 24
}

func (m *mmapper) allocation(file string, p *mpool, n *yaml.Node, what string) {
	fs, _ := m.fields(file, n, what)
	for _, f := range fs {
		w := what + "." + f.key
		switch f.key {
		case "namespaces":
			p.namespaces = m.strs(file, f.v, w)
		case "namespaceSelectors":
			if f.v.Kind == yaml.SequenceNode && len(f.v.Content) > 0 {
				p.nsSelectors = f.k
			}
		case "serviceSelectors":
			if f.v.Kind != yaml.SequenceNode {
				m.at(file, f.v, w, "not a list: not imported")
				continue
			}
			if len(f.v.Content) == 0 {
				continue
			}
			if len(f.v.Content) > 1 {
				m.at(file, f.v.Content[1], w, "vipd's pool has one service_selector, MetalLB's pool takes a Service any of its selectors matches: only the first is imported, and Services only the others match cannot use the pool")
			}
			if s, ok := m.selector(file, deref(f.v.Content[0]), w); ok {
				p.selector = s
			} else {
				// Without it the pool would be open to every Service.
				p.badSelector = f.k
			}
		case "priority":
			m.at(file, f.k, w, "vipd tries the pools a Service may use in their order in the file, with no priority: put the pools in the order of their priorities")
		default:
			m.at(file, f.k, w, "no equivalent in vipd: not imported")
		}
	}
}

// selector renders a metav1.LabelSelector in the syntax of labels.Parse.
func (m *mmapper) selector(file string, n *yaml.Node, what string) (string, bool) {
	if n == nil {
		return "", false
	}
	fs, ok := m.fields(file, n, what)
	if !ok {
		return "", false
	}
	var parts []string
	for _, f := range fs {
		switch f.key {
		case "matchLabels":
			lfs, ok := m.fields(file, f.v, what+".matchLabels")
			if !ok {
				return "", false
			}
			for _, l := range lfs {
				v, ok := m.str(file, l.v, what+".matchLabels."+l.key)
				if !ok {
					return "", false
				}
				parts = append(parts, l.key+"="+v)
			}
		case "matchExpressions":
			if f.v.Kind != yaml.SequenceNode {
				m.at(file, f.v, what+".matchExpressions", "not a list: not imported")
				return "", false
			}
			for _, e := range f.v.Content {
				efs, ok := m.fields(file, e, what+".matchExpressions")
				if !ok {
					return "", false
				}
				var key, op string
				var values []string
				for _, ef := range efs {
					switch ef.key {
					case "key":
						key, _ = m.str(file, ef.v, what+".matchExpressions.key")
					case "operator":
						op, _ = m.str(file, ef.v, what+".matchExpressions.operator")
					case "values":
						values = m.strs(file, ef.v, what+".matchExpressions.values")
					}
				}
				switch op {
				case "In":
					parts = append(parts, key+" in ("+strings.Join(values, ",")+")")
				case "NotIn":
					parts = append(parts, key+" notin ("+strings.Join(values, ",")+")")
				case "Exists":
					parts = append(parts, key)
				case "DoesNotExist":
					parts = append(parts, "!"+key)
				default:
					m.at(file, e, what+".matchExpressions", "an operator that is not In, NotIn, Exists or DoesNotExist: not imported")
					return "", false
				}
			}
		default:
			m.at(file, f.k, what+"."+f.key, "not a label selector's field: not imported")
			return "", false
		}
	}
	return strings.Join(parts, ","), true
}

func (m *mmapper) advertisement(file string, line int, kind, name string, sfs []field) {
	a := &madv{file: file, line: line, kind: kind, name: name}
	what := kind + " " + name
	for _, f := range sfs {
		w := what + ": " + f.key
		switch {
		case f.key == "ipAddressPools":
			a.pools = m.strs(file, f.v, w)
			if a.pools == nil {
				a.pools = []string{}
			}
			a.poolsNode = f.k
		case f.key == "interfaces" && kind == "L2Advertisement":
			a.interfaces = m.strs(file, f.v, w)
		case f.key == "communities" && kind == "BGPAdvertisement":
			if f.v.Kind != yaml.SequenceNode {
				m.at(file, f.v, w, "not a list: not imported")
				continue
			}
			for _, c := range f.v.Content {
				if c = deref(c); c != nil {
					a.communities = append(a.communities, c)
				}
			}
		case f.key == "localPref" && kind == "BGPAdvertisement":
			if i, ok := m.integer(file, f.v, w); ok {
				a.localPref = &i
			}
		case f.key == "aggregationLength" || f.key == "aggregationLengthV6":
			want := int64(32)
			if f.key == "aggregationLengthV6" {
				want = 128
			}
			if i, ok := m.integer(file, f.v, w); ok && i != want {
				m.at(file, f.k, w, fmt.Sprintf("vipd announces each address as a host route (/%d): no aggregate route", want))
			}
		case f.key == "ipAddressPoolSelectors":
			m.at(file, f.k, w, "vipd does not select pools by label: list them in ipAddressPools")
		case f.key == "nodeSelectors":
			m.at(file, f.k, w, "every vipd node announces every address: restrict the nodes by where vipd runs")
		case f.key == "peers":
			m.at(file, f.k, w, "vipd announces every address to every [[bgp.peer]]")
		default:
			m.at(file, f.k, w, "no equivalent in vipd: not imported")
		}
	}
	if kind == "L2Advertisement" {
		m.l2 = append(m.l2, a)
	} else {
		m.bgpAdv = append(m.bgpAdv, a)
	}
}

func (m *mmapper) peer(file string, line int, name string, sfs []field) {
	p := &mpeer{file: file, line: line, name: name}
	what := "BGPPeer " + name
	for _, f := range sfs {
		w := what + ": " + f.key
		switch f.key {
		case "peerAddress":
			p.address, _ = m.str(file, f.v, w)
		case "peerASN":
			p.asn, _ = m.integer(file, f.v, w)
		case "myASN":
			p.myASN, _ = m.integer(file, f.v, w)
			p.myNode = f.k
		case "peerPort":
			p.port, _ = m.integer(file, f.v, w)
		case "holdTime":
			p.hold, _ = m.str(file, f.v, w)
		case "keepaliveTime":
			p.keep, _ = m.str(file, f.v, w)
		case "password":
			p.password, _ = m.str(file, f.v, w)
		case "passwordSecret":
			m.at(file, f.k, w, "vipd import reads no Secret: set the peer's password to the Secret's password key")
		case "ebgpMultiHop":
			p.multihop, _ = m.boolean(file, f.v, w)
		case "sourceAddress":
			p.source, _ = m.str(file, f.v, w)
		case "routerID":
			p.routerID, _ = m.str(file, f.v, w)
			p.ridNode = f.k
		case "nodeSelectors":
			m.at(file, f.k, w, "every vipd node peers with every [[bgp.peer]]: restrict the nodes by where vipd runs")
		case "bfdProfile":
			m.at(file, f.k, w, "vipd has no BFD: the session relies on its hold time")
		default:
			m.at(file, f.k, w, "no equivalent in vipd: not imported")
		}
	}
	if p.address == "" || p.asn == 0 {
		m.issue(file, line, what, "no peerAddress or peerASN: not imported")
		return
	}
	m.peers = append(m.peers, p)
}

func (m *mmapper) community(file, name string, sfs []field) {
	for _, f := range sfs {
		if f.key != "communities" || f.v.Kind != yaml.SequenceNode {
			m.at(file, f.k, "Community "+name+": "+f.key, "not a list of communities: not imported")
			continue
		}
		for _, c := range f.v.Content {
			cfs, _ := m.fields(file, c, "Community "+name+": communities")
			var cn, cv string
			for _, cf := range cfs {
				switch cf.key {
				case "name":
					cn, _ = m.str(file, cf.v, "Community "+name+": name")
				case "value":
					cv, _ = m.str(file, cf.v, "Community "+name+": value")
				}
			}
			if cn == "" || cv == "" {
				m.issue(file, deref(c).Line, "Community "+name, "a community without a name or a value: not imported")
				continue
			}
			if _, dup := m.communities[cn]; dup {
				m.issue(file, deref(c).Line, "Community "+name+": "+cn, "a second community of that name: not imported")
				continue
			}
			m.communities[cn] = mcommunity{value: cv, file: file, line: deref(c).Line}
		}
	}
}

// The kinds of a munit.
const (
	unitDaemon = iota
	unitBGP
	unitPeer
	unitKubernetes
	unitPool
)

// munit is one table of the output: what vipd's parser refuses in it is
// left out and reported at the line it was read from.
type munit struct {
	kind       int
	text       string
	file, what string
	line       int
	// commented units are written as comments: they need a setting the
	// import does not know.
	commented bool
}

// printable returns s with its control characters taken out, for a
// comment.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

func from(file string, line int) string {
	return fmt.Sprintf("# from %s:%d\n", printable(file), line)
}

// result decides how the addresses are announced, renders the sections
// and has vipd's parser validate them.
func (m *mmapper) result(files []string) Result {
	var units []munit
	bgp := len(m.peers) > 0
	advs, other := m.l2, m.bgpAdv
	if bgp {
		advs, other = m.bgpAdv, m.l2
	}
	for _, a := range other {
		why := "no BGPPeer to announce to: not imported"
		if bgp {
			why = "vipd announces every address one way, and this import announces them by BGP (there are BGPPeers): not imported; to answer ARP and neighbour solicitations instead, drop [bgp] and set [daemon] uplinks"
		}
		m.issue(a.file, a.line, a.kind+" "+a.name, why)
	}
	for _, a := range advs {
		if a.pools == nil {
			for _, p := range m.pools {
				p.advertised = true
			}
			continue
		}
		for _, name := range a.pools {
			i := slices.IndexFunc(m.pools, func(p *mpool) bool { return p.name == name })
			if i < 0 {
				m.issue(a.file, a.poolsNode.Line, a.kind+" "+a.name+": ipAddressPools", "no IPAddressPool of that name was imported")
				continue
			}
			m.pools[i].advertised = true
		}
	}
	for _, p := range m.pools {
		if !p.advertised {
			m.issue(p.file, p.line, "IPAddressPool "+p.name, "in no "+map[bool]string{true: "BGPAdvertisement", false: "L2Advertisement"}[bgp]+": MetalLB hands out its addresses without announcing them, vipd announces every address it hands out")
		}
	}
	if bgp {
		units = append(units, m.bgpUnits()...)
	} else if u, ok := m.daemonUnit(); ok {
		units = append(units, u)
	}
	if len(m.pools) > 0 {
		var b strings.Builder
		b.WriteString("[kubernetes]\n# MetalLB serves the LoadBalancer Services without a spec.loadBalancerClass: so\n" +
			"# does this. Set load_balancer_class instead to move Services one at a time.\n")
		kv(&b, "default_class", "true")
		b.WriteString("# Services annotated for MetalLB (loadBalancerIPs, address-pool,\n# allow-shared-ip) keep what they ask for.\n")
		kv(&b, "metallb_annotations", "true")
		units = append(units, munit{kind: unitKubernetes, text: b.String(), file: m.pools[0].file, line: m.pools[0].line, what: "[kubernetes]"})
	}
	for _, p := range m.pools {
		var b strings.Builder
		b.WriteString(from(p.file, p.line))
		b.WriteString("[[kubernetes.pool]]\n")
		kv(&b, "name", quote(p.name))
		kv(&b, "addresses", quoteList(p.addresses))
		kv(&b, "auto_assign", strconv.FormatBool(p.autoAssign))
		if p.avoid {
			kv(&b, "avoid_network_broadcast", "true")
		}
		if len(p.namespaces) > 0 {
			kv(&b, "namespaces", quoteList(p.namespaces))
		}
		if p.selector != "" {
			kv(&b, "service_selector", quote(p.selector))
		}
		units = append(units, munit{kind: unitPool, text: b.String(), file: p.file, line: p.line, what: "IPAddressPool " + p.name})
	}
	var source []string
	for _, f := range files {
		source = append(source, printable(f))
	}
	head := header("metallb", strings.Join(source, ", "))
	toml, n := m.settle(head, units)
	return capIssues(Result{TOML: toml, Issues: tidy(m.issues, m.files), Pools: n, MoreIssues: m.more})
}

// daemonUnit makes [daemon] uplinks of the L2Advertisements' interfaces.
func (m *mmapper) daemonUnit() (munit, bool) {
	var uplinks []string
	var first *madv
	for _, a := range m.l2 {
		if len(a.interfaces) == 0 {
			m.issue(a.file, a.line, "L2Advertisement "+a.name, "MetalLB answers on every interface, vipd on its [daemon] uplinks only: set them")
			continue
		}
		if first == nil {
			first = a
		} else if !slices.Equal(a.interfaces, first.interfaces) || !slices.Equal(a.pools, first.pools) {
			m.issue(a.file, a.line, "L2Advertisement "+a.name+": interfaces", "vipd answers for every address on every uplink: the interfaces of all L2Advertisements are joined")
		}
		for _, i := range a.interfaces {
			if !slices.Contains(uplinks, i) {
				uplinks = append(uplinks, i)
			}
		}
	}
	if first == nil {
		return munit{}, false
	}
	var b strings.Builder
	b.WriteString(from(first.file, first.line))
	b.WriteString("# The interfaces MetalLB's speakers answered ARP and neighbour solicitations\n# on: check that they are this host's.\n[daemon]\n")
	kv(&b, "uplinks", quoteList(uplinks))
	return munit{kind: unitDaemon, text: b.String(), file: first.file, line: first.line, what: "L2Advertisement " + first.name}, true
}

// bgpUnits makes [bgp] of the BGPPeers and the first BGPAdvertisement's
// attributes.
func (m *mmapper) bgpUnits() []munit {
	first := m.peers[0]
	var rid string
	var ridFrom *mpeer
	for _, p := range m.peers {
		if p.myASN != first.myASN && p.myNode != nil {
			m.at(p.file, p.myNode, "BGPPeer "+p.name+": myASN", fmt.Sprintf("vipd speaks BGP as one AS, the myASN of BGPPeer %s: not imported", first.name))
		}
		if p.routerID == "" {
			continue
		}
		if ridFrom == nil {
			rid, ridFrom = p.routerID, p
		} else if p.routerID != rid {
			m.at(p.file, p.ridNode, "BGPPeer "+p.name+": routerID", fmt.Sprintf("vipd has one router_id, the routerID of BGPPeer %s: not imported", ridFrom.name))
		}
	}
	var communities, large []string
	var localPref *int64
	var attrsFrom *madv
	for _, a := range m.bgpAdv {
		var cs, ls []string
		for _, c := range a.communities {
			v, ok := m.str(a.file, c, "BGPAdvertisement "+a.name+": communities")
			if !ok {
				continue
			}
			if named, ok := m.communities[v]; ok {
				v = named.value
			}
			if rest, ok := strings.CutPrefix(v, "large:"); ok {
				ls = append(ls, rest)
			} else {
				cs = append(cs, v)
			}
		}
		if attrsFrom == nil {
			communities, large, localPref, attrsFrom = cs, ls, a.localPref, a
			continue
		}
		if !slices.Equal(cs, communities) || !slices.Equal(ls, large) || (a.localPref == nil) != (localPref == nil) || (a.localPref != nil && *a.localPref != *localPref) {
			m.issue(a.file, a.line, "BGPAdvertisement "+a.name, fmt.Sprintf("vipd gives every Kubernetes address the same communities and local_pref, those of BGPAdvertisement %s: these are not imported", attrsFrom.name))
		}
	}
	commented := ridFrom == nil
	if commented {
		m.issue(first.file, first.line, "BGPPeer "+first.name, "no routerID: vipd needs [bgp] router_id (MetalLB takes the node's address): the [bgp] section is printed as comments; set router_id and uncomment it")
	}
	var b strings.Builder
	b.WriteString(from(first.file, first.line))
	b.WriteString("[bgp]\n")
	kv(&b, "asn", strconv.FormatInt(first.myASN, 10))
	if ridFrom != nil {
		kv(&b, "router_id", quote(rid))
	}
	if len(communities) > 0 {
		kv(&b, "communities", quoteList(communities))
	}
	if len(large) > 0 {
		kv(&b, "large_communities", quoteList(large))
	}
	if localPref != nil {
		kv(&b, "local_pref", strconv.FormatInt(*localPref, 10))
	}
	units := []munit{{kind: unitBGP, text: b.String(), file: first.file, line: first.line, what: "BGPPeer " + first.name, commented: commented}}
	for _, p := range m.peers {
		var b strings.Builder
		b.WriteString(from(p.file, p.line))
		b.WriteString("[[bgp.peer]]\n")
		kv(&b, "address", quote(p.address))
		kv(&b, "asn", strconv.FormatInt(p.asn, 10))
		if p.port != 0 {
			kv(&b, "port", strconv.FormatInt(p.port, 10))
		}
		if p.source != "" {
			kv(&b, "source", quote(p.source))
		}
		if p.password != "" {
			kv(&b, "password", quote(p.password))
		}
		if p.multihop {
			// FRR's ebgp-multihop, which MetalLB sets, is a TTL of 255.
			kv(&b, "multihop", "255")
		}
		if p.hold != "" {
			kv(&b, "hold_time", quote(p.hold))
		}
		if p.keep != "" {
			kv(&b, "keepalive", quote(p.keep))
		}
		units = append(units, munit{kind: unitPeer, text: b.String(), file: p.file, line: p.line, what: "BGPPeer " + p.name, commented: commented})
	}
	return units
}

// render writes the units after head; starts holds the line of each
// unit's first line.
func renderUnits(head string, units []munit) ([]byte, []int) {
	var b strings.Builder
	b.WriteString(head)
	starts := make([]int, len(units))
	for i, u := range units {
		b.WriteString("\n")
		starts[i] = strings.Count(b.String(), "\n") + 1
		text := u.text
		if u.commented {
			text = "# " + strings.ReplaceAll(strings.TrimSuffix(text, "\n"), "\n", "\n# ") + "\n"
		}
		b.WriteString(text)
	}
	return []byte(b.String()), starts
}

// settle renders the units and has vipd's parser validate them, leaving
// out each unit it refuses (a [bgp] with its peers, [kubernetes] with its
// pools) with an issue, until it accepts what is left. It returns the
// configuration and the number of pools in it.
func (m *mmapper) settle(head string, units []munit) ([]byte, int) {
	for {
		toml, starts := renderUnits(head, units)
		_, err := config.Parse("import.toml", toml)
		if err == nil {
			return toml, countUnits(units, unitPool)
		}
		var errs config.Errors
		if !errors.As(err, &errs) {
			errs = config.Errors{{Msg: err.Error()}}
		}
		drop := map[int]string{}
		for _, e := range errs {
			i := -1
			for j, st := range starts {
				if st <= e.Line && e.Line > 0 {
					i = j
				}
			}
			msg := e.Msg
			if e.Ctx != "" {
				msg = e.Ctx + ": " + e.Msg
			}
			if i < 0 {
				// Not attributable: nothing can be imported.
				for j := range units {
					drop[j] = msg
				}
				break
			}
			if _, seen := drop[i]; !seen {
				drop[i] = msg
			}
			// A section goes with its tables.
			if k := units[i].kind; k == unitBGP || k == unitKubernetes {
				for j := i + 1; j < len(units) && units[j].kind == k+1; j++ {
					if _, seen := drop[j]; !seen {
						drop[j] = "its section is not imported"
					}
				}
			}
		}
		kept := units[:0]
		for i, u := range units {
			if msg, ok := drop[i]; ok {
				m.issue(u.file, u.line, u.what, "vipd refuses what it maps to ("+msg+"): not imported")
				continue
			}
			kept = append(kept, u)
		}
		units = kept
		if len(units) == 0 {
			toml, _ := renderUnits(head, nil)
			return toml, 0
		}
	}
}

func countUnits(units []munit, kind int) int {
	n := 0
	for _, u := range units {
		if u.kind == kind && !u.commented {
			n++
		}
	}
	return n
}
