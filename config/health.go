package config

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// ServiceHealth is the health checking of one service.
type ServiceHealth struct {
	// Policy says what failures do to the service.
	Policy check.Policy
	// Checks holds the check of each checked backend. A backend without
	// one is always up. Backends with the same check share it: a Spec is
	// replaced, never changed in place.
	Checks map[netip.AddrPort]*check.Spec
}

// Targets returns the health-check targets of every service, for
// health.Manager.Update. Exec checks get the user check_user names.
func (c *Config) Targets() []check.Target {
	if len(c.Health) == 0 {
		return nil
	}
	var out []check.Target
	for i := range c.Spec.Services {
		vs := &c.Spec.Services[i]
		h, ok := c.Health[vs.Name]
		if !ok {
			continue
		}
		for _, b := range vs.Backends {
			if p, ok := h.Checks[b.Addr]; ok {
				spec := *p
				if spec.Kind == check.KindExec {
					spec.Exec.User = c.execUser
				}
				out = append(out, check.Target{Service: vs.Name, Backend: b.Addr, Spec: spec})
			}
		}
	}
	return out
}

// Policies returns each service's failure policy by name.
func (c *Config) Policies() map[string]check.Policy {
	out := make(map[string]check.Policy, len(c.Health))
	for name, h := range c.Health {
		out[name] = h.Policy
	}
	return out
}

// rawCheck is a [service.check] or [service.backend.check] table.
type rawCheck struct {
	Type     string    `toml:"type"`
	Interval *duration `toml:"interval"`
	Timeout  *duration `toml:"timeout"`
	Rise     int64     `toml:"rise"`
	Fall     int64     `toml:"fall"`
	Initial  string    `toml:"initial"`
	Jitter   *number   `toml:"jitter"`
	Address  string    `toml:"address"`
	Port     int64     `toml:"port"`
	Mark     int64     `toml:"mark"`
	Device   string    `toml:"device"`
	Source   string    `toml:"source"`
	HalfOpen bool      `toml:"half_open"`

	Method     string            `toml:"method"`
	Path       string            `toml:"path"`
	Host       string            `toml:"host"`
	SNI        string            `toml:"sni"`
	Status     string            `toml:"status"`
	Body       string            `toml:"body"`
	BodyRegexp string            `toml:"body_regexp"`
	Insecure   bool              `toml:"insecure"`
	CAFile     string            `toml:"ca_file"`
	Headers    map[string]string `toml:"headers"`
	KeepAlive  bool              `toml:"keep_alive"`

	Payload string `toml:"payload"`
	Expect  string `toml:"expect"`

	Name         string `toml:"name"`
	Record       string `toml:"record"`
	TCP          bool   `toml:"tcp"`
	ExpectAnswer bool   `toml:"expect_answer"`
	NoRecursion  bool   `toml:"no_recursion"`

	Command string   `toml:"command"`
	Args    []string `toml:"args"`
	Env     []string `toml:"env"`
}

// check validates a check table. It returns nil for type = "none".
func (v *validator) check(path, ctx string, r *rawCheck) (*check.Spec, bool) {
	before := len(v.errs)
	ctx += ": check"
	if r.Type == "none" {
		return nil, true
	}
	var s check.Spec
	if r.Type == "" {
		v.errorf(path, ctx, "type is missing (tcp, http, https, udp, dns, exec or none)")
		return nil, false
	}
	k, err := check.ParseKind(r.Type)
	if err != nil {
		v.errorf(path+".type", ctx, "type %q must be tcp, http, https, udp, dns, exec or none", r.Type)
		return nil, false
	}
	s.Kind = k
	s.Interval = v.duration(r.Interval, 0, path+".interval", ctx, "interval")
	s.Timeout = v.duration(r.Timeout, 0, path+".timeout", ctx, "timeout")
	if r.Rise < 0 || r.Rise > 1000 || r.Fall < 0 || r.Fall > 1000 {
		v.errorf(path+".rise", ctx, "rise and fall must be within 1..1000")
	}
	s.Rise, s.Fall = int(r.Rise), int(r.Fall)
	if r.Initial != "" {
		st, err := check.ParseState(r.Initial)
		if err != nil {
			v.errorf(path+".initial", ctx, "initial %q must be \"down\" or \"up\"", r.Initial)
		}
		s.Initial = st
	}
	if r.Jitter != nil {
		switch j := float64(*r.Jitter); {
		case j < 0 || j > check.MaxJitter:
			v.errorf(path+".jitter", ctx, "jitter %g is outside 0..%g", j, check.MaxJitter)
		case j == 0:
			s.Jitter = -1 // an explicit 0 turns jitter off
		default:
			s.Jitter = j
		}
	}
	if r.Address != "" {
		a, err := netip.ParseAddr(r.Address)
		if err != nil {
			v.errorf(path+".address", ctx, "address %q is not an IP address", r.Address)
		}
		s.Addr = a
	}
	if r.Port < 0 || r.Port > 65535 {
		v.errorf(path+".port", ctx, "port %d is outside 1..65535", r.Port)
	} else {
		s.Port = uint16(r.Port)
	}
	if r.Mark < 0 || r.Mark > math.MaxUint32 {
		v.errorf(path+".mark", ctx, "mark %d is not a 32-bit mark", r.Mark)
	} else {
		s.Dial.Mark = uint32(r.Mark)
	}
	s.Dial.Device = r.Device
	if r.Source != "" {
		a, err := netip.ParseAddr(r.Source)
		if err != nil {
			v.errorf(path+".source", ctx, "source %q is not an IP address", r.Source)
		}
		s.Dial.Source = a
	}
	if r.HalfOpen {
		// Each refusal on the line of the key it names.
		if k != check.KindTCP {
			v.errorf(path+".half_open", ctx, "half_open applies to tcp checks only, not %s", k)
		}
		const why = "a half-open check's SYNs leave from one raw socket that all checks share, which cannot carry one check's %s"
		if r.Mark != 0 {
			v.errorf(path+".mark", ctx, "mark cannot be used with half_open: "+why, "mark")
		}
		if r.Device != "" {
			v.errorf(path+".device", ctx, "device cannot be used with half_open: "+why, "device")
		}
		s.TCP.HalfOpen = true
	}
	s.HTTP = check.HTTPOptions{Method: r.Method, Path: r.Path, Host: r.Host, SNI: r.SNI, Header: r.Headers,
		Body: r.Body, BodyRegexp: r.BodyRegexp, InsecureSkipVerify: r.Insecure, CAFile: r.CAFile, KeepAlive: r.KeepAlive}
	if r.KeepAlive && k != check.KindHTTP && k != check.KindHTTPS {
		v.errorf(path+".keep_alive", ctx, "keep_alive applies to http and https checks only, not %s", k)
	}
	if r.Status != "" {
		st, err := check.ParseStatusRanges(r.Status)
		if err != nil {
			v.errorf(path+".status", ctx, "status: %v", err)
		}
		s.HTTP.Status = st
	}
	if r.Payload != "" || r.Expect != "" {
		s.UDP = check.UDPOptions{Payload: []byte(r.Payload), Expect: []byte(r.Expect)}
	}
	s.DNS = check.DNSOptions{Name: r.Name, Type: r.Record, TCP: r.TCP, ExpectAnswer: r.ExpectAnswer, NoRecursion: r.NoRecursion}
	s.Exec = check.ExecOptions{Command: r.Command, Args: r.Args, Env: r.Env}
	if k == check.KindExec {
		// Each error on the line of its key; Validate would name the
		// check's.
		if err := check.CheckExecCommand(r.Command); err != nil {
			v.errorf(path+".command", ctx, "%v", err)
		}
		seen := map[string]bool{}
		for _, kv := range r.Env {
			name, _, _ := strings.Cut(kv, "=")
			switch err := check.CheckExecEnv(kv); {
			case err != nil:
				v.errorf(path+".env", ctx, "%v", err)
			case seen[name]:
				v.errorf(path+".env", ctx, "exec env sets %s twice", name)
			}
			seen[name] = true
		}
	}
	if len(v.errs) > before {
		return nil, false
	}
	for _, err := range unjoin(s.Validate()) {
		v.errorf(path, ctx, "%s", strings.TrimSpace(err.Error()))
	}
	return &s, len(v.errs) == before
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

// serviceHealth validates the health settings of service i.
func (v *validator) serviceHealth(i int, r *rawService, vs *lb.VirtualService) (ServiceHealth, bool) {
	path := "service." + strconv.Itoa(i)
	ctx := "service " + strconv.Quote(vs.Name)
	h := ServiceHealth{Checks: map[netip.AddrPort]*check.Spec{}}
	if r.OnFailure != "" {
		a, err := check.ParseAction(r.OnFailure)
		if err != nil {
			v.errorf(path+".on_failure", ctx, "on_failure %q must be \"quiesce\" or \"remove\"", r.OnFailure)
		}
		h.Policy.Action = a
	}
	if r.Quorum < 0 || r.Quorum > 65535 {
		v.errorf(path+".quorum", ctx, "quorum %d is outside 0..65535", r.Quorum)
	}
	if r.QuorumHysteresis < 0 || r.QuorumHysteresis > 65535 {
		v.errorf(path+".quorum_hysteresis", ctx, "quorum_hysteresis %d is outside 0..65535", r.QuorumHysteresis)
	}
	if r.QuorumHysteresis > 0 && r.Quorum == 0 {
		v.errorf(path+".quorum_hysteresis", ctx, "quorum_hysteresis needs quorum")
	}
	if r.Quorum > int64(len(r.Backend)) {
		v.errorf(path+".quorum", ctx, "quorum %d is more than the %d backends", r.Quorum, len(r.Backend))
	}
	h.Policy.Quorum, h.Policy.Hysteresis = int(r.Quorum), int(r.QuorumHysteresis)
	if r.Sorry != "" {
		d, err := sorryBackend(r.Sorry, vs)
		if err != nil {
			v.errorf(path+".sorry", ctx, "sorry: %v", err)
		}
		h.Policy.Sorry = d
	}
	var def *check.Spec
	if r.Check != nil {
		s, ok := v.check(path+".check", ctx, r.Check)
		if !ok {
			return h, false
		}
		def = s
	}
	for j := range r.Backend {
		b := &r.Backend[j]
		if j >= len(vs.Backends) {
			break
		}
		addr := vs.Backends[j].Addr
		spec := def
		if b.Check != nil {
			s, ok := v.check(fmt.Sprintf("%s.backend.%d.check", path, j), fmt.Sprintf("%s: backend %q", ctx, addr.String()), b.Check)
			if !ok {
				continue
			}
			spec = s
		}
		if spec != nil {
			h.Checks[addr] = spec
		}
	}
	if (h.Policy.Quorum > 0 || h.Policy.Sorry.Addr.IsValid()) && len(h.Checks) == 0 {
		v.errorf(path, ctx, "quorum and sorry need health checks (add a [service.check] table)")
	}
	return h, true
}

// sorryBackend parses "addr" or "addr:port" into a destination that
// forwards like the service's first backend.
func sorryBackend(s string, vs *lb.VirtualService) (lb.Destination, error) {
	fwd := lb.Masq
	if len(vs.Backends) > 0 {
		fwd = vs.Backends[0].Forward
	}
	d := lb.Destination{Weight: 1, Forward: fwd}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		d.Addr = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	} else if a, err := netip.ParseAddr(s); err == nil {
		d.Addr = netip.AddrPortFrom(a.Unmap(), vs.Service.Key.Port)
	} else {
		return d, fmt.Errorf("%q is not an IP address or address:port", s)
	}
	if lb.FamilyOf(d.Addr.Addr()) != vs.Service.Key.Family && fwd != lb.Tunnel {
		return d, errors.New("the sorry backend's family differs from the service's")
	}
	if len(vs.Backends) > 0 && vs.Backends[0].Forward == lb.Tunnel {
		b := vs.Backends[0]
		d.Tunnel, d.TunnelPort, d.TunnelCsum = b.Tunnel, b.TunnelPort, b.TunnelCsum
	}
	return d, nil
}

// number accepts a TOML integer or float.
type number float64

func (n *number) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		*n = number(x)
	case float64:
		*n = number(x)
	default:
		return fmt.Errorf("want a number, not %T", v)
	}
	return nil
}

// ExecUser returns the user exec checks run as, check_user looked up; ok
// is false when the configuration has no exec check.
func (c *Config) ExecUser() (u check.User, ok bool) {
	if c.execUser == nil {
		return check.User{}, false
	}
	return *c.execUser, true
}

// HalfOpen reports whether c has half-open tcp checks of IPv4 and of
// IPv6 targets.
func (c *Config) HalfOpen() (v4, v6 bool) {
	for i := range c.Spec.Services {
		vs := &c.Spec.Services[i]
		h, ok := c.Health[vs.Name]
		if !ok || len(h.Checks) == 0 {
			continue
		}
		for _, b := range vs.Backends {
			spec, ok := h.Checks[b.Addr]
			if !ok || !spec.TCP.HalfOpen {
				continue
			}
			if spec.Target(b.Addr).Addr().Is4() {
				v4 = true
			} else {
				v6 = true
			}
			if v4 && v6 {
				return
			}
		}
	}
	return
}

// hasExec reports whether h has an exec check.
func hasExec(h ServiceHealth) bool {
	for _, s := range h.Checks {
		if s.Kind == check.KindExec {
			return true
		}
	}
	return false
}

// resolveExec counts c's services with exec checks and, if there are any,
// looks up the user they run as, check_user. base is the configuration c
// was parsed from, with delta d (nil and full for none): with a partial
// delta only the services it replaced are counted again, and the user is
// base's when check_user did not change, so that a reload that adds no
// exec check reads no user database. An unknown user is an error on the
// line of check_user, or, when it is the default, of the first exec check.
func (c *Config) resolveExec(base *Config, d Delta) error {
	n := 0
	if base != nil && base.execCounted && !d.Full {
		n = base.execN
		for i := d.From; i < d.OldTo; i++ {
			if hasExec(base.Health[base.Spec.Services[i].Name]) {
				n--
			}
		}
		for i := d.From; i < d.NewTo; i++ {
			if hasExec(c.Health[c.Spec.Services[i].Name]) {
				n++
			}
		}
	} else {
		for _, h := range c.Health {
			if hasExec(h) {
				n++
			}
		}
	}
	var u *check.User
	if n > 0 {
		if base != nil && base.execUser != nil && base.Daemon.CheckUser == c.Daemon.CheckUser {
			u = base.execUser
		} else {
			lu, err := LookupUser(c.Daemon.CheckUser)
			if err != nil {
				return Errors{c.checkUserError(err)}
			}
			u = &lu
		}
	}
	c.execN, c.execCounted, c.execUser = n, true, u
	return nil
}

// checkUserError returns the error of a check_user that cannot be looked
// up, on the line of check_user, or of the first exec check when the
// setting is left to its default.
func (c *Config) checkUserError(err error) *Error {
	fix := ""
	name, group, _ := strings.Cut(c.Daemon.CheckUser, ":")
	switch {
	case errors.Is(err, ErrUnknownUser):
		fix = "; create it (useradd --system --user-group --no-create-home --shell /usr/sbin/nologin " + name + ")"
	case errors.Is(err, ErrUnknownGroup):
		fix = "; create it (groupadd --system " + group + ")"
	}
	main := &validator{file: c.File, src: c.Source()}
	if l, ok := main.positions().exact("daemon.check_user"); ok {
		return &Error{File: c.File, Line: l, Ctx: "daemon", Msg: fmt.Sprintf("check_user %q: %v%s, or set check_user to an existing unprivileged user", c.Daemon.CheckUser, err, fix)}
	}
	e := &Error{File: c.File, Ctx: "daemon",
		Msg: fmt.Sprintf("exec checks run as check_user %q (the default): %v%s, or set check_user in [daemon] of %s to an existing unprivileged user", c.Daemon.CheckUser, err, fix, c.File)}
	for pi := range c.parts {
		p := &c.parts[pi]
		for i := p.first; i < c.partEnd(pi); i++ {
			vs := &c.Spec.Services[i]
			h := c.Health[vs.Name]
			for j, b := range vs.Backends {
				if s := h.Checks[b.Addr]; s == nil || s.Kind != check.KindExec {
					continue
				}
				pos := (&validator{file: p.file, src: p.src}).positions()
				path := fmt.Sprintf("service.%d.backend.%d.check", i-p.first, j)
				if _, ok := pos.exact(path); !ok {
					path = fmt.Sprintf("service.%d.check", i-p.first)
				}
				e.File, e.Line = p.file, pos.line(path)
				e.Ctx = fmt.Sprintf("service %q: check", vs.Name)
				return e
			}
		}
	}
	return e
}
