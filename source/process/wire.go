package process

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/frame"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
	"github.com/vipd/vipd/source"
)

// Version is the version of the wire: both ends send it in their hello,
// and each refuses a peer of another version.
const Version = 1

// DefaultMaxFrame bounds a frame's JSON: a snapshot of thousands of
// Services with their backends fits many times over.
const DefaultMaxFrame = 64 << 20

// The message types.
const (
	// TypeHello opens the conversation, from each end.
	TypeHello = "hello"
	// TypeOptions gives the child its options (parent to child).
	TypeOptions = "options"
	// TypePools hands the running child new pools (parent to child);
	// the child answers with TypePoolsResult.
	TypePools = "pools"
	// TypePoolsResult says whether the child took the pools.
	TypePoolsResult = "pools_result"
	// TypePublish carries a snapshot (child to parent); the parent
	// answers with TypePublished once the agent has taken it.
	TypePublish = "publish"
	// TypePublished is the agent's answer to a Publish: its conflicts
	// and error.
	TypePublished = "published"
	// TypeReport is a Sink.Report (child to parent).
	TypeReport = "report"
	// TypeFatal says the source cannot go on (child to parent): its
	// Run returned this error, and the child exits.
	TypeFatal = "fatal"
	// TypePing asks the child whether it is alive (parent to child);
	// the child answers with TypePong and the same Ping.
	TypePing = "ping"
	// TypePong answers a TypePing.
	TypePong = "pong"
)

// Message is one frame. Type says which one field is set.
type Message struct {
	Type        string     `json:"type"`
	Hello       *Hello     `json:"hello,omitempty"`
	Options     *Options   `json:"options,omitempty"`
	Pools       []Pool     `json:"pools,omitempty"`
	PoolsResult *Result    `json:"pools_result,omitempty"`
	Publish     *Publish   `json:"publish,omitempty"`
	Published   *Published `json:"published,omitempty"`
	Report      *Result    `json:"report,omitempty"`
	Fatal       *Result    `json:"fatal,omitempty"`
	Ping        *Ping      `json:"ping,omitempty"`
	Pong        *Ping      `json:"pong,omitempty"`
}

// Ping is a ping or its answer: the parent numbers its pings.
type Ping struct {
	Seq uint64 `json:"seq"`
}

// Hello is the first message of each end.
type Hello struct {
	// Version is the wire's Version.
	Version int `json:"version"`
	// Schema fingerprints the wire's types (see Schema): a parent and a
	// child of different builds whose types differ refuse each other.
	Schema string `json:"schema"`
}

// Result is an error, or none ("").
type Result struct {
	Error string `json:"error,omitempty"`
}

// err returns r's error, nil when none.
func (r *Result) err() error {
	if r == nil || r.Error == "" {
		return nil
	}
	return errors.New(r.Error)
}

// resultOf returns err as a Result.
func resultOf(err error) *Result {
	if err == nil {
		return &Result{}
	}
	return &Result{Error: err.Error()}
}

// Options are the Kubernetes source's options (the data of
// source/kubernetes.Options, field for field, but its logger), derived
// by the parent from its validated configuration.
type Options struct {
	Kubeconfig         string
	LoadBalancerClass  string
	DefaultClass       bool
	Namespaces         []string
	ServiceSelector    string
	Backends           string
	Pools              []Pool
	MetalLBAnnotations bool
	NoPacketFilter     bool
	LeaderElection     *bool
	LeaseNamespace     string
	LeaseName          string
	Identity           string
	LeaseDuration      time.Duration
	RenewDeadline      time.Duration
	RetryPeriod        time.Duration
	APIQPS             float64
	APIBurst           int
	NodeHealth         *NodeHealth
	// LogLevel is the least level the child logs at.
	LogLevel int `json:"log_level"`
}

// Pool is one address pool, as source/kubernetes.Pool.
type Pool struct {
	Name                  string
	Addresses             []string
	AutoAssign            *bool
	AvoidNetworkBroadcast bool
	Namespaces            []string
	ServiceSelector       string
	ShareAcrossNamespaces bool
	SNAT                  bool
}

// NodeHealth is the Node probes, as source/kubernetes.NodeHealth.
type NodeHealth struct {
	Port              uint16
	Path              string
	Local             bool
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// OptionsOf returns the options of cfg's [kubernetes] section, as the
// daemon gave them to the source in its own process.
func OptionsOf(cfg *config.Config) Options {
	k := cfg.Kubernetes
	le := k.LeaderElection
	o := Options{
		Kubeconfig: k.Kubeconfig, LoadBalancerClass: k.LoadBalancerClass, DefaultClass: k.DefaultClass,
		Namespaces: k.Namespaces, ServiceSelector: k.ServiceSelector, Backends: k.Backends,
		LeaderElection: &le, LeaseNamespace: k.LeaseNamespace, LeaseName: k.LeaseName, Identity: k.Identity,
		LeaseDuration: k.LeaseDuration, RenewDeadline: k.RenewDeadline, RetryPeriod: k.RetryPeriod,
		APIQPS: k.APIQPS, APIBurst: k.APIBurst, MetalLBAnnotations: k.MetalLBAnnotations,
		NoPacketFilter: !cfg.Daemon.ManageIPTables, Pools: PoolsOf(k),
	}
	if nh := k.NodeHealth; nh.Enabled {
		o.NodeHealth = &NodeHealth{Port: nh.Port, Path: nh.Path, Local: nh.Local, Interval: nh.Interval,
			Timeout: nh.Timeout, Rise: nh.Rise, Fall: nh.Fall}
	}
	return o
}

// PoolsOf returns the pools of k's [[kubernetes.pool]] tables.
func PoolsOf(k config.Kubernetes) []Pool {
	var out []Pool
	for _, p := range k.Pools {
		auto := p.AutoAssign
		out = append(out, Pool{Name: p.Name, Addresses: p.Addresses, AutoAssign: &auto,
			AvoidNetworkBroadcast: p.AvoidNetworkBroadcast, Namespaces: p.Namespaces, ServiceSelector: p.ServiceSelector,
			ShareAcrossNamespaces: p.ShareAcrossNamespaces, SNAT: p.SNAT})
	}
	return out
}

// Publish is a source.Snapshot on the wire, with the pools' counts.
type Publish struct {
	// Seq numbers the child's publishes; the answer carries it.
	Seq uint64 `json:"seq"`
	// Delta says that Services and Health hold only the services of
	// Changed: the rest are those of the last snapshot the parent's
	// sink took from this child, whose names and order Changed keeps
	// (see source.Snapshot.Changed). A child sends one only after a
	// publish the sink took, so that an update of a few services does
	// not cross the wire with all of them.
	Delta    bool                     `json:"delta,omitempty"`
	Services []VirtualService         `json:"services"`
	Health   map[string]ServiceHealth `json:"health"`
	Changed  []string                 `json:"changed"`
	// Counts are the pools' addresses (source/kubernetes.PoolCount).
	Counts []PoolCount `json:"counts"`
}

// VirtualService is lb.VirtualService on the wire: its zero fields left
// out, its backends in short.
type VirtualService struct {
	Name       string         `json:"name"`
	Service    lb.Service     `json:"service"`
	VIP        netip.Addr     `json:"vip,omitzero"`
	NodePort   bool           `json:"node_port,omitzero"`
	Interfaces []string       `json:"interfaces,omitzero"`
	Announce   bool           `json:"announce,omitzero"`
	SNAT       bool           `json:"snat,omitzero"`
	Allow      []netip.Prefix `json:"allow,omitzero"`
	Backends   []Destination  `json:"backends,omitzero"`
}

// Destination is lb.Destination on the wire, field for field (the two
// convert to each other), in short: a snapshot carries one per Node or
// endpoint of every Service port.
type Destination struct {
	Addr          netip.AddrPort `json:"a"`
	Weight        int            `json:"w,omitzero"`
	Forward       lb.Forward     `json:"f,omitzero"`
	Tunnel        lb.TunnelType  `json:"t,omitzero"`
	TunnelPort    uint16         `json:"tp,omitzero"`
	TunnelCsum    lb.TunnelCsum  `json:"tc,omitzero"`
	Upper         uint32         `json:"u,omitzero"`
	Lower         uint32         `json:"l,omitzero"`
	ActiveConns   uint32         `json:"ac,omitzero"`
	InactiveConns uint32         `json:"ic,omitzero"`
	Stats         *lb.Stats      `json:"s,omitzero"`
}

// virtualServiceOf returns vs on the wire.
func virtualServiceOf(vs *lb.VirtualService) VirtualService {
	w := VirtualService{Name: vs.Name, Service: vs.Service, VIP: vs.VIP, NodePort: vs.NodePort, Interfaces: vs.Interfaces,
		Announce: vs.Announce, SNAT: vs.SNAT, Allow: vs.Allow}
	if vs.Backends != nil {
		w.Backends = make([]Destination, len(vs.Backends))
		for i, d := range vs.Backends {
			w.Backends[i] = Destination(d)
		}
	}
	return w
}

// virtualService returns w as an lb.VirtualService.
func (w *VirtualService) virtualService() lb.VirtualService {
	vs := lb.VirtualService{Name: w.Name, Service: w.Service, VIP: w.VIP, NodePort: w.NodePort, Interfaces: w.Interfaces,
		Announce: w.Announce, SNAT: w.SNAT, Allow: w.Allow}
	if w.Backends != nil {
		vs.Backends = make([]lb.Destination, len(w.Backends))
		for i, d := range w.Backends {
			vs.Backends[i] = lb.Destination(d)
		}
	}
	return vs
}

// PoolCount is the addresses of one pool and family.
type PoolCount struct {
	Pool, Family       string
	Total, InUse, Free float64
}

// Published answers a Publish.
type Published struct {
	Seq       uint64            `json:"seq"`
	Conflicts []source.Conflict `json:"conflicts"`
	Error     string            `json:"error,omitempty"`
}

// ServiceHealth is config.ServiceHealth on the wire: each distinct
// check once, in Specs, and each backend's index in Specs (a service's
// backends mostly share one check).
type ServiceHealth struct {
	Policy check.Policy
	Specs  []Spec
	Checks map[netip.AddrPort]int
}

// Spec is check.Spec on the wire: its Kind and Initial as numbers. It
// has no exec checks and no CA bundle or file: those never come from
// Kubernetes, and a child that could ask for them could make the daemon
// run a command or read a file.
type Spec struct {
	Kind     uint8
	Addr     netip.Addr
	Port     uint16
	Interval time.Duration
	Timeout  time.Duration
	Rise     int
	Fall     int
	Initial  uint8
	Jitter   float64
	Dial     check.DialOptions
	TCP      check.TCPOptions
	HTTP     HTTPOptions
	UDP      check.UDPOptions
	DNS      check.DNSOptions
}

// HTTPOptions is check.HTTPOptions on the wire, without a CA.
type HTTPOptions struct {
	Method             string
	Path               string
	Host               string
	SNI                string
	Header             map[string]string
	Status             []check.StatusRange
	Body               string
	BodyRegexp         string
	InsecureSkipVerify bool
	FollowRedirects    bool
	KeepAlive          bool
}

// specOf returns s on the wire; it refuses what the wire does not carry.
func specOf(s check.Spec) (Spec, error) {
	if !reflect.ValueOf(s.Exec).IsZero() {
		return Spec{}, errors.New("exec checks do not cross the wire")
	}
	if s.HTTP.CA != nil || s.HTTP.CAFile != "" {
		return Spec{}, errors.New("a check's CA does not cross the wire")
	}
	h := s.HTTP
	return Spec{Kind: uint8(s.Kind), Addr: s.Addr, Port: s.Port, Interval: s.Interval, Timeout: s.Timeout, Rise: s.Rise,
		Fall: s.Fall, Initial: uint8(s.Initial), Jitter: s.Jitter, Dial: s.Dial, TCP: s.TCP, UDP: s.UDP, DNS: s.DNS,
		HTTP: HTTPOptions{Method: h.Method, Path: h.Path, Host: h.Host, SNI: h.SNI, Header: h.Header, Status: h.Status,
			Body: h.Body, BodyRegexp: h.BodyRegexp, InsecureSkipVerify: h.InsecureSkipVerify, FollowRedirects: h.FollowRedirects,
			KeepAlive: h.KeepAlive}}, nil
}

// spec returns w as a check.Spec.
func (w Spec) spec() check.Spec {
	h := w.HTTP
	return check.Spec{Kind: check.Kind(w.Kind), Addr: w.Addr, Port: w.Port, Interval: w.Interval, Timeout: w.Timeout,
		Rise: w.Rise, Fall: w.Fall, Initial: check.State(w.Initial), Jitter: w.Jitter, Dial: w.Dial, TCP: w.TCP, UDP: w.UDP,
		DNS: w.DNS, HTTP: check.HTTPOptions{Method: h.Method, Path: h.Path, Host: h.Host, SNI: h.SNI, Header: h.Header,
			Status: h.Status, Body: h.Body, BodyRegexp: h.BodyRegexp, InsecureSkipVerify: h.InsecureSkipVerify,
			FollowRedirects: h.FollowRedirects, KeepAlive: h.KeepAlive}}
}

// PublishOf returns snap on the wire; delta sends only the services of
// snap.Changed (see Publish.Delta), when it names any.
func PublishOf(seq uint64, snap source.Snapshot, counts []PoolCount, delta bool) (*Publish, error) {
	p := &Publish{Seq: seq, Changed: snap.Changed, Counts: counts}
	health := snap.Health
	if delta && snap.Changed != nil {
		p.Delta, health = true, nil
		changed := make(map[string]bool, len(snap.Changed))
		for _, name := range snap.Changed {
			changed[name] = true
		}
		for i := range snap.Services {
			if changed[snap.Services[i].Name] {
				p.Services = append(p.Services, virtualServiceOf(&snap.Services[i]))
			}
		}
		for _, name := range snap.Changed {
			if h, ok := snap.Health[name]; ok {
				if health == nil {
					health = map[string]config.ServiceHealth{}
				}
				health[name] = h
			}
		}
	} else if snap.Services != nil {
		p.Services = make([]VirtualService, len(snap.Services))
		for i := range snap.Services {
			p.Services[i] = virtualServiceOf(&snap.Services[i])
		}
	}
	if health != nil {
		p.Health = make(map[string]ServiceHealth, len(health))
	}
	for name, h := range health {
		w := ServiceHealth{Policy: h.Policy}
		if h.Checks != nil {
			w.Checks = make(map[netip.AddrPort]int, len(h.Checks))
		}
		for addr, s := range h.Checks {
			ws, err := specOf(*s)
			if err != nil {
				return nil, fmt.Errorf("service %q, backend %s: %w", name, addr, err)
			}
			i := slices.IndexFunc(w.Specs, ws.equal)
			if i < 0 {
				i = len(w.Specs)
				w.Specs = append(w.Specs, ws)
			}
			w.Checks[addr] = i
		}
		p.Health[name] = w
	}
	return p, nil
}

// equal reports whether two specs are the same (a test proves it
// compares every field).
func (w Spec) equal(o Spec) bool {
	a, b := w.HTTP, o.HTTP
	return w.Kind == o.Kind && w.Addr == o.Addr && w.Port == o.Port && w.Interval == o.Interval && w.Timeout == o.Timeout &&
		w.Rise == o.Rise && w.Fall == o.Fall && w.Initial == o.Initial && w.Jitter == o.Jitter && w.Dial == o.Dial &&
		w.TCP == o.TCP && bytes.Equal(w.UDP.Payload, o.UDP.Payload) && bytes.Equal(w.UDP.Expect, o.UDP.Expect) &&
		(w.UDP.Payload == nil) == (o.UDP.Payload == nil) && (w.UDP.Expect == nil) == (o.UDP.Expect == nil) && w.DNS == o.DNS &&
		a.Method == b.Method && a.Path == b.Path && a.Host == b.Host && a.SNI == b.SNI && maps.Equal(a.Header, b.Header) &&
		(a.Header == nil) == (b.Header == nil) && slices.Equal(a.Status, b.Status) && (a.Status == nil) == (b.Status == nil) &&
		a.Body == b.Body && a.BodyRegexp == b.BodyRegexp && a.InsecureSkipVerify == b.InsecureSkipVerify &&
		a.FollowRedirects == b.FollowRedirects && a.KeepAlive == b.KeepAlive
}

// Snapshot returns p as a source.Snapshot, refusing a check that does
// not validate. A delta takes the rest from base, the last snapshot the
// sink took, whose services index names by position (nil: none, and
// a delta is refused).
func (p *Publish) Snapshot(base *source.Snapshot, index map[string]int) (source.Snapshot, error) {
	snap := source.Snapshot{Changed: p.Changed}
	if p.Services != nil {
		snap.Services = make([]lb.VirtualService, len(p.Services))
		for i := range p.Services {
			snap.Services[i] = p.Services[i].virtualService()
		}
	}
	if p.Health != nil {
		snap.Health = make(map[string]config.ServiceHealth, len(p.Health))
	}
	for name, w := range p.Health {
		h := config.ServiceHealth{Policy: w.Policy}
		if w.Checks != nil {
			h.Checks = make(map[netip.AddrPort]*check.Spec, len(w.Checks))
		}
		specs := make([]check.Spec, len(w.Specs))
		for i, ws := range w.Specs {
			specs[i] = ws.spec()
			if err := specs[i].Validate(); err != nil {
				return source.Snapshot{}, fmt.Errorf("service %q: check: %w", name, err)
			}
		}
		for addr, i := range w.Checks {
			if i < 0 || i >= len(specs) {
				return source.Snapshot{}, fmt.Errorf("service %q, backend %s: check %d of %d", name, addr, i, len(specs))
			}
			// The backends of one spec share it.
			h.Checks[addr] = &specs[i]
		}
		snap.Health[name] = h
	}
	if !p.Delta {
		return snap, nil
	}
	if base == nil {
		return source.Snapshot{}, errors.New("a delta without a snapshot taken before")
	}
	if len(p.Services) != len(p.Changed) {
		return source.Snapshot{}, fmt.Errorf("a delta of %d services names %d", len(p.Services), len(p.Changed))
	}
	out := source.Snapshot{Services: slices.Clone(base.Services), Health: maps.Clone(base.Health), Changed: p.Changed}
	for k, vs := range snap.Services {
		i, ok := index[vs.Name]
		if !ok || vs.Name != p.Changed[k] {
			return source.Snapshot{}, fmt.Errorf("a delta's service %q is not a service of the snapshot before, or not its change %d", vs.Name, k)
		}
		out.Services[i] = vs
		if h, ok := snap.Health[vs.Name]; ok {
			if out.Health == nil {
				out.Health = map[string]config.ServiceHealth{}
			}
			out.Health[vs.Name] = h
		} else {
			delete(out.Health, vs.Name)
		}
	}
	for name := range snap.Health {
		if !slices.Contains(p.Changed, name) {
			return source.Snapshot{}, fmt.Errorf("a delta's health names service %q, which it does not change", name)
		}
	}
	return out, nil
}

// Schema fingerprints the wire's types: their fields' names, JSON names
// and kinds, recursively.
func Schema() string {
	var b strings.Builder
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		fmt.Fprintf(&b, "%s:%s;", t.String(), t.Kind())
		if seen[t] {
			return
		}
		seen[t] = true
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array:
			walk(t.Elem())
		case reflect.Map:
			walk(t.Key())
			walk(t.Elem())
		case reflect.Struct:
			for i := range t.NumField() {
				f := t.Field(i)
				fmt.Fprintf(&b, "%s %q{", f.Name, f.Tag.Get("json"))
				walk(f.Type)
				b.WriteString("}")
			}
		}
	}
	walk(reflect.TypeFor[Message]())
	h := fnv.New64a()
	h.Write([]byte(b.String()))
	return fmt.Sprintf("%016x", h.Sum64())
}

// ErrFrameTooBig is the error of a frame longer than the bound.
var ErrFrameTooBig = frame.ErrTooBig

// Conn reads and writes frames (package frame) of Messages.
type Conn struct {
	r        io.Reader
	w        io.Writer
	maxFrame int
}

// NewConn returns a Conn over r and w whose frames are at most maxFrame
// bytes (zero: DefaultMaxFrame). Writes must not be concurrent.
func NewConn(r io.Reader, w io.Writer, maxFrame int) *Conn {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	return &Conn{r: r, w: w, maxFrame: maxFrame}
}

// Write sends m.
func (c *Conn) Write(m *Message) error {
	if err := frame.Write(c.w, m, c.maxFrame); err != nil {
		return fmt.Errorf("%s message: %w", m.Type, err)
	}
	return nil
}

// Read reads the next message. It refuses a frame over the bound before
// reading it, JSON with unknown fields, and unknown types; io.EOF says
// the peer closed between frames.
func (c *Conn) Read() (*Message, error) {
	m := &Message{}
	if err := frame.Read(c.r, m, c.maxFrame); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return m, nil
}

// check refuses a message of an unknown type, or without its body.
func (m *Message) check() error {
	var ok bool
	switch m.Type {
	case TypeHello:
		ok = m.Hello != nil
	case TypeOptions:
		ok = m.Options != nil
	case TypePools:
		ok = m.Pools != nil
	case TypePoolsResult:
		ok = m.PoolsResult != nil
	case TypePublish:
		ok = m.Publish != nil
	case TypePublished:
		ok = m.Published != nil
	case TypeReport:
		ok = m.Report != nil
	case TypeFatal:
		ok = m.Fatal != nil
	case TypePing:
		ok = m.Ping != nil
	case TypePong:
		ok = m.Pong != nil
	default:
		return fmt.Errorf("unknown message type %q", m.Type)
	}
	if !ok {
		return fmt.Errorf("a %s message without its body", m.Type)
	}
	return nil
}

// hello returns this end's hello.
func hello() *Message {
	return &Message{Type: TypeHello, Hello: &Hello{Version: Version, Schema: Schema()}}
}

// checkHello refuses a first message that is not a hello of this
// version and schema.
func checkHello(m *Message) error {
	if m.Type != TypeHello {
		return fmt.Errorf("the first message is %q, not a hello", m.Type)
	}
	if m.Hello.Version != Version {
		return fmt.Errorf("wire version %d, want %d (vipd and vipd-kubernetes of different versions?)", m.Hello.Version, Version)
	}
	if m.Hello.Schema != Schema() {
		return fmt.Errorf("wire schema %s, want %s (vipd and vipd-kubernetes of different builds?)", m.Hello.Schema, Schema())
	}
	return nil
}
