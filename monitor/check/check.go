// Package check describes vipd's health checks: what a check of a backend
// is (Spec and the options of each kind), what a service does with its
// backends' health (Policy), and the parsers and validators of their
// configured forms. It is the description alone: no probing, no sockets,
// no files, no user database. The config package builds these values
// and monitor/health runs them; both import this package, and neither
// imports the other.
package check

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"time"
)

// Kind is the type of a health check.
type Kind uint8

// The kinds of health check.
const (
	KindTCP Kind = iota + 1
	KindHTTP
	KindHTTPS
	KindUDP
	KindDNS
	KindExec
)

var kindNames = [...]string{
	KindTCP:   "tcp",
	KindHTTP:  "http",
	KindHTTPS: "https",
	KindUDP:   "udp",
	KindDNS:   "dns",
	KindExec:  "exec",
}

// String returns the kind's configuration name, such as "https".
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseKind parses a check type name.
func ParseKind(s string) (Kind, error) {
	for k, name := range kindNames {
		if name != "" && strings.EqualFold(s, name) {
			return Kind(k), nil
		}
	}
	return 0, fmt.Errorf("unknown check type %q (want tcp, http, https, udp, dns or exec)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// State is the health of a check or a backend.
type State uint8

// The states. Down is the zero value: a check starts down unless its Spec
// says otherwise.
const (
	Down State = iota
	Up
)

// String returns "up" or "down".
func (s State) String() string {
	switch s {
	case Down:
		return "down"
	case Up:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// ParseState parses "up" or "down".
func ParseState(s string) (State, error) {
	switch strings.ToLower(s) {
	case "down":
		return Down, nil
	case "up":
		return Up, nil
	}
	return 0, fmt.Errorf("unknown state %q (want up or down)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Defaults for the zero fields of a Spec.
const (
	DefaultInterval = 2 * time.Second
	DefaultTimeout  = time.Second
	DefaultRise     = 2
	DefaultFall     = 3
	DefaultJitter   = 0.1
	// MaxJitter is the largest jitter fraction a Spec may ask for.
	MaxJitter = 0.5
	// MinInterval is the shortest interval a Spec may ask for.
	MinInterval = 10 * time.Millisecond
)

// Spec is one configured health check of a backend: the typed form the
// config package produces. The zero value of every field but Kind selects
// a default, so a Spec of Kind alone is a complete check.
//
// Only the options struct of the Spec's Kind may be set: Dial for tcp,
// http, https, udp and dns checks, HTTP for http and https, TCP, UDP, DNS
// and Exec for their kinds.
type Spec struct {
	// Kind is the type of check.
	Kind Kind
	// Addr overrides the address probed; the zero Addr probes the
	// backend's address. To probe through the forwarding path of a
	// direct-routing or tunnel service, set it to the VIP and set
	// Dial.Mark (see DialOptions).
	Addr netip.Addr
	// Port overrides the port probed; zero probes the backend's port.
	Port uint16
	// Interval is the time between the starts of two probes, at least
	// MinInterval.
	Interval time.Duration
	// Timeout bounds one probe. Zero means DefaultTimeout or Interval,
	// whichever is shorter.
	Timeout time.Duration
	// Rise is the number of consecutive successes that bring a down
	// check up, and Fall the number of consecutive failures that take an
	// up check down.
	Rise int
	Fall int
	// Initial is the state before the first probe of a new target (an
	// edited check keeps the state it has). Down (the default) sends no
	// traffic to a backend before it has answered once, so a cold start
	// never programs dead servers; Up keeps traffic flowing until a probe
	// fails. Either way the first probe decides at once: a check in its
	// initial state changes state on its first result if that result
	// disagrees, and needs Rise or Fall results after that.
	Initial State
	// Jitter spreads probes: each interval is Interval times a random
	// factor in [1-Jitter, 1+Jitter]. Zero means DefaultJitter; a
	// negative value turns jitter off. At most MaxJitter.
	Jitter float64

	// Dial sets socket options of network checks.
	Dial DialOptions
	// TCP configures tcp checks.
	TCP TCPOptions
	// HTTP configures http and https checks.
	HTTP HTTPOptions
	// UDP configures udp checks.
	UDP UDPOptions
	// DNS configures dns checks.
	DNS DNSOptions
	// Exec configures exec checks.
	Exec ExecOptions
}

// DialOptions set socket options of the probes of tcp, http, https, udp
// and dns checks.
//
// They let a check probe through the forwarding path of a direct-routing or
// tunnel service: with Spec.Addr set to the VIP and Mark set to a mark the
// daemon assigns to the backend, the probe is addressed to the VIP but a
// policy route sends marked packets to the backend, as IPVS forwards
// clients' packets. A backend that lacks the VIP on its loopback (or
// tunnel) interface then fails the check, where a plain check of its own
// address would pass. Setting up the path is the operator's or the
// daemon's job, not this package's. For direct routing, say:
//
//	ip rule add fwmark 0x100 lookup 100 pref 90
//	ip route add 192.0.2.10 via 10.0.0.11 dev eth1 table 100
//	ip rule add pref 100 lookup local; ip rule del pref 0
//	sysctl net.ipv4.conf.eth1.accept_local=1
//
// The rule must come before the local table's, which is moved out of its
// way, since the VIP is a local address of the balancer; and since the
// backend answers from the VIP, a local address too, the interface must
// accept such packets (accept_local, and a loose or no rp_filter).
//
// IPVS also schedules connections that the balancer itself opens to a
// virtual service (its local-client support), whatever their mark, so
// probe a port of the VIP that is no virtual service, such as the
// backend's health port (Spec.Port), or the probe is balanced like any
// client's.
type DialOptions struct {
	// Mark sets SO_MARK on the probe's socket; it needs CAP_NET_ADMIN.
	Mark uint32
	// Device binds the probe's socket to an interface (SO_BINDTODEVICE);
	// it needs CAP_NET_RAW.
	Device string
	// Source binds the probe's socket to a local address.
	Source netip.Addr
}

// TCPOptions configure tcp checks.
type TCPOptions struct {
	// HalfOpen probes with a SYN from a shared raw socket rather than a
	// connect: a SYN-ACK that acknowledges it is up (the kernel answers
	// it with a reset, since no socket owns the probe's port, which
	// ends the handshake on the backend), a reset is down (connection
	// refused), and silence until the timeout is down. The backend's
	// application accepts nothing: the check proves that the port
	// answers SYNs, not that the application behind it takes
	// connections. It needs CAP_NET_RAW and Linux, and does not work
	// with Dial.Mark or Dial.Device (Dial.Source it does).
	HalfOpen bool
}

// Target returns the address a check with this spec probes for a backend:
// the backend's address and port unless Addr or Port override them.
func (s *Spec) Target(backend netip.AddrPort) netip.AddrPort {
	addr, port := backend.Addr(), backend.Port()
	if s.Addr.IsValid() {
		addr = s.Addr
	}
	if s.Port != 0 {
		port = s.Port
	}
	return netip.AddrPortFrom(addr.Unmap(), port)
}

// WithDefaults returns s with every zero field set to its default.
func (s Spec) WithDefaults() Spec {
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if s.Timeout == 0 {
		s.Timeout = min(DefaultTimeout, s.Interval)
	}
	if s.Rise == 0 {
		s.Rise = DefaultRise
	}
	if s.Fall == 0 {
		s.Fall = DefaultFall
	}
	switch {
	case s.Jitter == 0:
		s.Jitter = DefaultJitter
	case s.Jitter < 0:
		s.Jitter = -1
	}
	switch s.Kind {
	case KindHTTP, KindHTTPS:
		s.HTTP = s.HTTP.WithDefaults()
	case KindDNS:
		s.DNS = s.DNS.WithDefaults()
	}
	return s
}

// Validate reports every problem of s (after defaults) at once. It checks
// what can be checked without the backend's address or the file system;
// monitor/health.NewProber reports the rest.
func (s Spec) Validate() error {
	s = s.WithDefaults()
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Kind < KindTCP || s.Kind > KindExec {
		add("check type is missing or unknown (%s)", s.Kind)
	}
	if s.Interval < MinInterval {
		add("interval %s is shorter than %s", s.Interval, MinInterval)
	}
	if s.Timeout < 0 {
		add("timeout %s is negative", s.Timeout)
	}
	if s.Rise < 1 {
		add("rise %d is less than 1", s.Rise)
	}
	if s.Fall < 1 {
		add("fall %d is less than 1", s.Fall)
	}
	if s.Jitter > MaxJitter {
		add("jitter %g is more than %g", s.Jitter, MaxJitter)
	}
	if s.Initial != Up && s.Initial != Down {
		add("initial state %s is unknown", s.Initial)
	}
	wrong := func(name string, opts any, kinds ...Kind) {
		for _, k := range kinds {
			if s.Kind == k {
				return
			}
		}
		if !reflect.ValueOf(opts).IsZero() {
			add("%s options do not apply to %s checks", name, s.Kind)
		}
	}
	wrong("dial", s.Dial, KindTCP, KindHTTP, KindHTTPS, KindUDP, KindDNS)
	wrong("tcp", s.TCP, KindTCP)
	wrong("http", s.HTTP, KindHTTP, KindHTTPS)
	wrong("udp", s.UDP, KindUDP)
	wrong("dns", s.DNS, KindDNS)
	wrong("exec", s.Exec, KindExec)
	if err := s.Dial.validate(); err != nil {
		errs = append(errs, err)
	}
	if s.Kind == KindTCP && s.TCP.HalfOpen && (s.Dial.Mark != 0 || s.Dial.Device != "") {
		add("half-open tcp checks do not work with dial mark or device")
	}
	switch s.Kind {
	case KindHTTP, KindHTTPS:
		if err := s.HTTP.Validate(); err != nil {
			errs = append(errs, err)
		}
	case KindDNS:
		if err := s.DNS.Validate(); err != nil {
			errs = append(errs, err)
		}
	case KindExec:
		if err := s.Exec.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (o DialOptions) validate() error {
	if (o.Mark != 0 || o.Device != "") && !socketOptionsSupported {
		return errors.New("dial mark and device need Linux")
	}
	if strings.ContainsRune(o.Device, 0) || len(o.Device) > 15 {
		return fmt.Errorf("dial device %q is not an interface name", o.Device)
	}
	return nil
}

// Target asks for one check of one backend of one service. A backend may
// have several targets (say a tcp and an http check): it is up when all
// of its checks are.
type Target struct {
	// Service is the service's name (lb.VirtualService.Name).
	Service string
	// Backend is the backend's address (lb.Destination.Addr).
	Backend netip.AddrPort
	// Spec is the check.
	Spec Spec
}
