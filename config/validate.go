package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// The raw structures mirror the file. Optional values are pointers so that
// "unset" and "zero" differ; durations are decoded later so that their
// errors carry positions.

type rawConfig struct {
	Include    []string      `toml:"include"`
	Daemon     rawDaemon     `toml:"daemon"`
	HA         rawHA         `toml:"ha"`
	Kubernetes rawKubernetes `toml:"kubernetes"`
	BGP        rawBGP        `toml:"bgp"`
	Service    []rawService  `toml:"service"`
}

type rawDaemon struct {
	Interface      *string   `toml:"interface"`
	Uplinks        []string  `toml:"uplinks"`
	StrictARP      *bool     `toml:"strict_arp"`
	ManageSysctls  *bool     `toml:"manage_sysctls"`
	ManageIPTables *bool     `toml:"manage_iptables"`
	FilterVIPPorts *bool     `toml:"filter_vip_ports"`
	SNATMark       *int64    `toml:"snat_mark"`
	MetricsListen  *string   `toml:"metrics_listen"`
	StatusPage     *bool     `toml:"status_page"`
	ControlSocket  *string   `toml:"control_socket"`
	StateDir       *string   `toml:"state_dir"`
	OnStop         *string   `toml:"on_stop"`
	ResyncInterval *duration `toml:"resync_interval"`
	StatsInterval  *duration `toml:"stats_interval"`
	Drain          *bool     `toml:"drain"`
	DrainServices  *bool     `toml:"drain_services"`
	DrainTimeout   *duration `toml:"drain_timeout"`
	DrainGrace     *duration `toml:"drain_grace"`
	GARPCount      *int64    `toml:"garp_count"`
	GARPInterval   *duration `toml:"garp_interval"`
	GARPRefresh    *duration `toml:"garp_refresh"`
	Watch          *bool     `toml:"watch"`
	ReloadGuard    *float64  `toml:"reload_guard"`
	OnApplyError   *string   `toml:"on_apply_error"`
	CheckUser      *string   `toml:"check_user"`
}

type rawService struct {
	Name               string       `toml:"name"`
	VIP                string       `toml:"vip"`
	Port               *int64       `toml:"port"`
	Protocol           string       `toml:"protocol"`
	FWMark             int64        `toml:"fwmark"`
	Family             string       `toml:"family"`
	NodePort           bool         `toml:"nodeport"`
	Interfaces         []string     `toml:"interfaces"`
	Scheduler          string       `toml:"scheduler"`
	SchedulerFlags     []string     `toml:"scheduler_flags"`
	Forward            string       `toml:"forward"`
	Tunnel             string       `toml:"tunnel"`
	TunnelPort         int64        `toml:"tunnel_port"`
	TunnelChecksum     string       `toml:"tunnel_checksum"`
	Persistence        *duration    `toml:"persistence"`
	PersistenceNetmask *int64       `toml:"persistence_netmask"`
	OnePacket          bool         `toml:"one_packet"`
	SNAT               *bool        `toml:"snat"`
	Allow              []string     `toml:"allow"`
	Announce           *bool        `toml:"announce"`
	Check              *rawCheck    `toml:"check"`
	OnFailure          string       `toml:"on_failure"`
	Quorum             int64        `toml:"quorum"`
	QuorumHysteresis   int64        `toml:"quorum_hysteresis"`
	Sorry              string       `toml:"sorry"`
	Backend            []rawBackend `toml:"backend"`
}

type rawBackend struct {
	Address        string    `toml:"address"`
	Port           *int64    `toml:"port"`
	Weight         *int64    `toml:"weight"`
	UpperThreshold int64     `toml:"upper_threshold"`
	LowerThreshold int64     `toml:"lower_threshold"`
	Forward        string    `toml:"forward"`
	Tunnel         string    `toml:"tunnel"`
	TunnelPort     int64     `toml:"tunnel_port"`
	TunnelChecksum string    `toml:"tunnel_checksum"`
	Check          *rawCheck `toml:"check"`
}

// duration accepts "1m30s" or a whole number of seconds.
type duration struct{ raw any }

func (d *duration) UnmarshalTOML(v any) error { d.raw = v; return nil }

func (d *duration) parse() (time.Duration, error) {
	switch v := d.raw.(type) {
	case int64:
		if v < 0 || v > math.MaxInt64/int64(time.Second) {
			return 0, fmt.Errorf("%d seconds is out of range", v)
		}
		return time.Duration(v) * time.Second, nil
	case string:
		t, err := time.ParseDuration(v)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration (like \"30s\" or \"5m\")", v)
		}
		if t < 0 {
			return 0, fmt.Errorf("%s is negative", v)
		}
		return t, nil
	}
	return 0, fmt.Errorf("want a duration string (like \"30s\") or seconds, not %T", d.raw)
}

type validator struct {
	file string
	// src is the whole file. Its positions are indexed on the first
	// error only: a valid file never needs them.
	src  []byte
	pos  *positions
	errs Errors
}

// positions returns the index of src's key positions, building it on the
// first call.
func (v *validator) positions() *positions {
	if v.pos == nil {
		v.pos = indexPositions(v.src)
	}
	return v.pos
}

func (v *validator) errorf(path, ctx, format string, args ...any) {
	v.errs = append(v.errs, &Error{File: v.file, Line: v.positions().line(path), Ctx: ctx, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) sort() {
	slices.SortStableFunc(v.errs, func(a, b *Error) int { return a.Line - b.Line })
}

// unknownKeys reports the keys the decoder found no place for: each once,
// at every line it is defined on, and none inside one already reported
// (the keys of an unknown table), so that the errors take no more than
// the file's size. After MaxErrors of them, the others are counted in one
// more error, which costs nothing per key.
func (v *validator) unknownKeys(keys []toml.Key) {
	if len(keys) > MaxErrors {
		// Only the first keys are kept, so that the others can be
		// freed while the positions of these are indexed.
		n := len(keys)
		keys = slices.Clone(keys[:MaxErrors])
		v.unknownKeys(keys)
		v.errs = append(v.errs, &Error{File: v.file, Line: v.errs[len(v.errs)-1].Line,
			Msg: fmt.Sprintf("and up to %d more unknown keys, not listed", n-MaxErrors)})
		return
	}
	// The keys reported, as a tree of their parts.
	type edge struct {
		parent int
		part   string
	}
	ids := map[edge]int{}
	var reported []bool // by id - 1
next:
	for _, k := range keys {
		id := 0
		for _, part := range k {
			e := edge{id, part}
			n, ok := ids[e]
			if !ok {
				reported = append(reported, false)
				n = len(reported)
				ids[e] = n
			}
			if reported[n-1] {
				continue next
			}
			id = n
		}
		if id > 0 {
			reported[id-1] = true
		}
		v.unknownKey(k)
	}
}

func (v *validator) unknownKey(k toml.Key) {
	key := k.String()
	lines := v.positions().matching(k)
	if len(lines) == 0 {
		lines = []int{0}
	}
	slices.Sort(lines)
	for _, l := range slices.Compact(lines) {
		v.errs = append(v.errs, &Error{File: v.file, Line: l, Msg: fmt.Sprintf("unknown key %q", key)})
	}
}

func (v *validator) duration(d *duration, def time.Duration, path, ctx, name string) time.Duration {
	if d == nil {
		return def
	}
	t, err := d.parse()
	if err != nil {
		v.errorf(path, ctx, "%s: %v", name, err)
		return def
	}
	return t
}

func validIfName(s string) error {
	if s == "" || len(s) > 15 || strings.ContainsAny(s, "/ \t\n:") || s == "." || s == ".." {
		return fmt.Errorf("%q is not a valid interface name", s)
	}
	return nil
}

func (v *validator) config(raw *rawConfig, x *cross) *Config {
	cfg := &Config{}
	v.daemon(&raw.Daemon, cfg)
	v.ha(&raw.HA, cfg)
	v.bgp(&raw.BGP, cfg)
	v.kubernetes(&raw.Kubernetes, cfg)
	cfg.Include = v.include(raw.Include, cfg.Daemon.Watch)
	v.services(raw.Service, cfg, x)
	return cfg
}

// cross holds what must be unique among the services of all the files of
// a configuration, for validator.services.
type cross struct {
	names     map[string]svcRef
	keys      map[lb.ServiceKey]string
	nodePorts map[string]string
	announce  map[netip.Addr]bool
	// vips holds the first service on each VIP, backends the first
	// backend on each address.
	vips     map[netip.Addr]string
	backends map[netip.Addr]backendRef
	// poolPos indexes the main file's positions for the errors of VIPs
	// in a pool, once.
	poolPos *positions
}

// backendRef names a backend by its service and address.
type backendRef struct {
	service string
	addr    netip.AddrPort
}

// svcRef names a service by its file and its index in the file.
type svcRef struct {
	file string
	i    int
}

func newCross() *cross {
	return &cross{
		names:     map[string]svcRef{},
		keys:      map[lb.ServiceKey]string{},
		nodePorts: map[string]string{},
		announce:  map[netip.Addr]bool{},
		vips:      map[netip.Addr]string{},
		backends:  map[netip.Addr]backendRef{},
	}
}

// services validates the [[service]] tables of v's file with cfg's daemon
// settings and appends them to cfg, checking them against the services
// already in x.
func (v *validator) services(raw []rawService, cfg *Config, x *cross) {
	for i := range raw {
		vs, ok := v.service(i, &raw[i], cfg)
		if !ok {
			continue
		}
		path := fmt.Sprintf("service.%d", i)
		ctx := fmt.Sprintf("service %q", vs.Name)
		if prev, dup := x.names[vs.Name]; dup {
			if prev.file == v.file {
				v.errorf(path+".name", ctx, "name already used by service %d", prev.i+1)
			} else {
				v.errorf(path+".name", ctx, "name already used by service %d of %s", prev.i+1, prev.file)
			}
		}
		x.names[vs.Name] = svcRef{v.file, i}
		if vs.NodePort {
			k := fmt.Sprintf("%s/%d/%s", vs.Service.Key.Proto, vs.Service.Key.Port, vs.Service.Key.Family)
			if prev, dup := x.nodePorts[k]; dup {
				v.errorf(path+".port", ctx, "nodeport %s %d is also used by service %q", vs.Service.Key.Proto, vs.Service.Key.Port, prev)
			}
			x.nodePorts[k] = vs.Name
		} else {
			if prev, dup := x.keys[vs.Service.Key]; dup {
				v.errorf(path, ctx, "%s is also used by service %q", vs.Service.Key, prev)
			}
			x.keys[vs.Service.Key] = vs.Name
		}
		if vs.VIP.IsValid() {
			if prev, seen := x.announce[vs.VIP]; seen && prev != vs.Announce {
				v.errorf(path+".announce", ctx, "announce = %t conflicts with another service on VIP %s", vs.Announce, vs.VIP)
			}
			x.announce[vs.VIP] = vs.Announce
		}
		v.vipBackends(path, ctx, &vs, x)
		if vs.VIP.IsValid() {
			if msg := cfg.Kubernetes.poolVIPError(vs.VIP, &x.poolPos); msg != "" {
				v.errorf(path+".vip", ctx, "%s", msg)
			}
		}
		if h, ok := v.serviceHealth(i, &raw[i], &vs); ok && (len(h.Checks) > 0 || h.Policy != (check.Policy{})) {
			if cfg.Health == nil {
				cfg.Health = map[string]ServiceHealth{}
			}
			cfg.Health[vs.Name] = h
		}
		cfg.Spec.Services = append(cfg.Spec.Services, vs)
	}
	// A NodePort service would collide with a VIP service on a host
	// address; that is only known at run time, where the kernel refuses.
}

// vipBackends refuses a backend on a VIP of the configuration, vs's own
// or another service's: vipd puts the VIP on this host, so IPVS would
// deliver the connections to this host instead of a backend (and, on a
// VIP's service port, back into IPVS).
// path and ctx name vs, which was validated without errors: its backends
// are its [[service.backend]] tables in order.
func (v *validator) vipBackends(path, ctx string, vs *lb.VirtualService, x *cross) {
	for j, b := range vs.Backends {
		a := b.Addr.Addr()
		owner, onVIP := x.vips[a]
		if !onVIP && a == vs.VIP {
			owner, onVIP = vs.Name, true
		}
		if onVIP {
			v.errorf(path+".backend."+strconv.Itoa(j)+".address", ctx+": backend "+strconv.Quote(b.Addr.String()), "address %s is the vip of service %q", a, owner)
		}
	}
	if vs.VIP.IsValid() {
		if _, seen := x.vips[vs.VIP]; !seen {
			if b, ok := x.backends[vs.VIP]; ok {
				v.errorf(path+".vip", ctx, "vip %s is the address of backend %q of service %q", vs.VIP, b.addr.String(), b.service)
			}
			x.vips[vs.VIP] = vs.Name
		}
	}
	for _, b := range vs.Backends {
		if _, seen := x.backends[b.Addr.Addr()]; !seen {
			x.backends[b.Addr.Addr()] = backendRef{vs.Name, b.Addr}
		}
	}
}

// include validates the main file's include patterns and returns them
// resolved: a relative pattern is relative to the main file's directory.
// With watch (the daemon watches the files) a wildcard pattern's
// directory must exist: the watcher watches it for new files and cannot
// watch what is not there. Without this a daemon would refuse to start
// on a configuration that "vipd check" passed, and a reload that names a
// missing directory would stop the watching of every file.
func (v *validator) include(patterns []string, watch bool) []string {
	var out []string
	for _, p := range patterns {
		if p == "" {
			v.errorf("include", "", "include: empty pattern")
			continue
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(v.file), p)
		}
		p = filepath.Clean(p)
		if _, err := filepath.Match(p, ""); err != nil {
			v.errorf("include", "", "include: %q: %v", p, err)
			continue
		}
		if hasMeta(filepath.Dir(p)) {
			// The watcher watches each pattern's directory: it must be
			// one directory.
			v.errorf("include", "", "include: %q: only the file name may hold wildcards (*, ?, [)", p)
			continue
		}
		if watch && hasMeta(filepath.Base(p)) {
			dir := filepath.Dir(p)
			fi, err := os.Stat(dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				v.errorf("include", "", "include: %q: directory %s does not exist, and with watch = true vipd watches it for files: create it, or set watch = false", p, dir)
				continue
			case err != nil:
				v.errorf("include", "", "include: %q: %v", p, err)
				continue
			case !fi.IsDir():
				v.errorf("include", "", "include: %q: %s is not a directory", p, dir)
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// hasMeta reports whether path holds glob metacharacters.
func hasMeta(path string) bool { return strings.ContainsAny(path, `*?[\`) }

func (v *validator) daemon(d *rawDaemon, cfg *Config) {
	out := Daemon{
		Interface:      DefaultInterface,
		StrictARP:      true,
		ManageSysctls:  true,
		ManageIPTables: true,
		MetricsListen:  DefaultMetricsListen,
		StatusPage:     true,
		ControlSocket:  DefaultControlSocket,
		StateDir:       DefaultStateDir,
		ResyncInterval: 30 * time.Second,
		StatsInterval:  DefaultStatsInterval,
		Removal:        lb.RemovalPolicy{Drain: true, DrainTimeout: 5 * time.Minute, Grace: DefaultDrainGrace},
		GARP:           GARP{Count: 3, Interval: time.Second},
		Watch:          true,
		ReloadGuard:    0.5,
		OnApplyError:   ApplyRollback,
		CheckUser:      DefaultCheckUser,
	}
	const ctx = "daemon"
	if d.Interface != nil {
		out.Interface = *d.Interface
		if err := validIfName(*d.Interface); err != nil {
			v.errorf("daemon.interface", ctx, "interface: %v", err)
		}
	}
	for _, u := range d.Uplinks {
		if err := validIfName(u); err != nil {
			v.errorf("daemon.uplinks", ctx, "uplinks: %v", err)
		} else if u == out.Interface {
			v.errorf("daemon.uplinks", ctx, "uplinks: %q is vipd's dummy interface; announce on a real uplink", u)
		}
	}
	out.Uplinks = d.Uplinks
	setBool(&out.StrictARP, d.StrictARP)
	setBool(&out.ManageSysctls, d.ManageSysctls)
	setBool(&out.ManageIPTables, d.ManageIPTables)
	setBool(&out.Removal.Drain, d.Drain)
	setBool(&out.Removal.DrainServices, d.DrainServices)
	setBool(&out.StatusPage, d.StatusPage)
	filter := true
	setBool(&filter, d.FilterVIPPorts)
	mark := int64(DefaultSNATMark)
	if d.SNATMark != nil {
		mark = *d.SNATMark
		if mark <= 0 || mark > math.MaxUint32 {
			v.errorf("daemon.snat_mark", ctx, "snat_mark %#x must be a nonzero 32-bit mark", mark)
		}
	}
	if d.MetricsListen != nil {
		out.MetricsListen = *d.MetricsListen
		if *d.MetricsListen != "" {
			if _, _, err := net.SplitHostPort(*d.MetricsListen); err != nil {
				v.errorf("daemon.metrics_listen", ctx, "metrics_listen %q is not host:port (use \"\" to disable)", *d.MetricsListen)
			}
		}
	}
	if d.ControlSocket != nil {
		out.ControlSocket = *d.ControlSocket
		if !strings.HasPrefix(*d.ControlSocket, "/") {
			v.errorf("daemon.control_socket", ctx, "control_socket %q must be an absolute path", *d.ControlSocket)
		}
	}
	if d.StateDir != nil {
		out.StateDir = *d.StateDir
		if !strings.HasPrefix(*d.StateDir, "/") {
			v.errorf("daemon.state_dir", ctx, "state_dir %q must be an absolute path", *d.StateDir)
		}
	}
	if d.OnStop != nil {
		switch *d.OnStop {
		case "keep":
			out.OnStop = StopKeep
		case "clean":
			out.OnStop = StopClean
		default:
			v.errorf("daemon.on_stop", ctx, "on_stop %q must be \"keep\" or \"clean\"", *d.OnStop)
		}
	}
	out.ResyncInterval = v.duration(d.ResyncInterval, out.ResyncInterval, "daemon.resync_interval", ctx, "resync_interval")
	if d.ResyncInterval != nil && out.ResyncInterval < time.Second {
		v.errorf("daemon.resync_interval", ctx, "resync_interval %s is below 1s", out.ResyncInterval)
	}
	out.StatsInterval = v.duration(d.StatsInterval, out.StatsInterval, "daemon.stats_interval", ctx, "stats_interval")
	if d.StatsInterval != nil && (out.StatsInterval < time.Second || out.StatsInterval > 10*time.Minute) {
		v.errorf("daemon.stats_interval", ctx, "stats_interval %s is outside 1s..10m", out.StatsInterval)
	}
	out.Removal.DrainTimeout = v.duration(d.DrainTimeout, out.Removal.DrainTimeout, "daemon.drain_timeout", ctx, "drain_timeout")
	out.Removal.Grace = v.duration(d.DrainGrace, out.Removal.Grace, "daemon.drain_grace", ctx, "drain_grace")
	if d.DrainGrace != nil && out.Removal.Grace > 10*time.Minute {
		v.errorf("daemon.drain_grace", ctx, "drain_grace %s is above 10m", out.Removal.Grace)
	}
	if d.GARPCount != nil {
		if *d.GARPCount < 0 || *d.GARPCount > 100 {
			v.errorf("daemon.garp_count", ctx, "garp_count %d is outside 0..100", *d.GARPCount)
		} else {
			out.GARP.Count = int(*d.GARPCount)
		}
	}
	out.GARP.Interval = v.duration(d.GARPInterval, out.GARP.Interval, "daemon.garp_interval", ctx, "garp_interval")
	out.GARP.Refresh = v.duration(d.GARPRefresh, 0, "daemon.garp_refresh", ctx, "garp_refresh")
	if out.GARP.Refresh != 0 && out.GARP.Refresh < time.Second {
		v.errorf("daemon.garp_refresh", ctx, "garp_refresh %s is below 1s", out.GARP.Refresh)
	}
	setBool(&out.Watch, d.Watch)
	if d.ReloadGuard != nil {
		if g := *d.ReloadGuard; g <= 0 || g > 1 || math.IsNaN(g) {
			v.errorf("daemon.reload_guard", ctx, "reload_guard %v must be a share in (0, 1] (1 disables the guard)", g)
		} else {
			out.ReloadGuard = g
		}
	}
	if d.OnApplyError != nil {
		switch m := ApplyErrorMode(*d.OnApplyError); m {
		case ApplyRollback, ApplyContinue:
			out.OnApplyError = m
		default:
			v.errorf("daemon.on_apply_error", ctx, "on_apply_error %q must be \"rollback\" or \"continue\"", *d.OnApplyError)
		}
	}
	if d.CheckUser != nil {
		out.CheckUser = *d.CheckUser
		if _, _, err := check.ParseUserSpec(*d.CheckUser); err != nil {
			v.errorf("daemon.check_user", ctx, "check_user %q: %v", *d.CheckUser, err)
		}
	}
	cfg.Daemon = out
	cfg.Spec.StrictARP = out.StrictARP
	cfg.Spec.ManageSysctls = out.ManageSysctls
	if out.ManageIPTables {
		cfg.Spec.Rules = lb.RulePolicy{Enabled: true, SNATMark: uint32(mark), FilterVIPs: filter}
	}
}

func setBool(dst *bool, v *bool) {
	if v != nil {
		*dst = *v
	}
}

func parseForward(s string) (lb.Forward, bool) {
	switch s {
	case "masq", "nat":
		return lb.Masq, true
	case "droute", "dr":
		return lb.DirectRoute, true
	case "tunnel", "tun":
		return lb.Tunnel, true
	}
	return 0, false
}

func parseTunnel(s string) (lb.TunnelType, bool) {
	switch s {
	case "", "ipip":
		return lb.IPIP, true
	case "gue":
		return lb.GUE, true
	case "gre":
		return lb.GRE, true
	}
	return 0, false
}

func parseCsum(s string) (lb.TunnelCsum, bool) {
	switch s {
	case "", "none":
		return lb.CsumNone, true
	case "csum":
		return lb.Csum, true
	case "remcsum":
		return lb.RemCsum, true
	}
	return 0, false
}

// allow validates a service's allow list for its key k (whose family the
// prefixes must have); allPorts says the service is an all-ports one and
// rules that vipd manages its iptables rules, which enforce the list. A
// plain address stands for itself alone (/32 or /128).
func (v *validator) allow(path, ctx string, list []string, k lb.ServiceKey, allPorts, rules bool) []netip.Prefix {
	switch {
	case len(list) == 0:
		v.errorf(path, ctx, "allow is empty, which would admit no source; leave it out to admit every source")
		return nil
	case len(list) > MaxAllow:
		v.errorf(path, ctx, "allow has %d entries, more than %d", len(list), MaxAllow)
		return nil
	case k.FWMark != 0:
		v.errorf(path, ctx, "allow is not supported for fwmark services; restrict sources in the rules that set the mark")
		return nil
	case allPorts:
		v.errorf(path, ctx, "allow is not supported for all-ports (port 0) services")
		return nil
	case !rules:
		v.errorf(path, ctx, "allow needs daemon.manage_iptables = true: vipd's rules enforce it")
		return nil
	}
	out := make([]netip.Prefix, 0, len(list))
	seen := make(map[netip.Prefix]int, len(list))
	for i, s := range list {
		p, err := parseAllow(s)
		switch {
		case err != nil:
			v.errorf(path, ctx, "allow[%d]: %v", i, err)
			continue
		case lb.FamilyOf(p.Addr()) != k.Family:
			v.errorf(path, ctx, "allow[%d]: %s is %s, the service is %s", i, p, lb.FamilyOf(p.Addr()), k.Family)
			continue
		}
		if j, dup := seen[p]; dup {
			v.errorf(path, ctx, "allow[%d]: %s is listed already (allow[%d])", i, p, j)
			continue
		}
		seen[p] = i
		out = append(out, p)
	}
	return out
}

// parseAllow parses an entry of an allow list: a prefix without host
// bits, or an address, which stands for itself alone.
func parseAllow(s string) (netip.Prefix, error) {
	shown := s
	if len(shown) > 64 {
		shown = shown[:64] + "..."
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return netip.Prefix{}, fmt.Errorf("%q is not a prefix (like \"192.0.2.0/24\") or an address", shown)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is not a prefix (like \"192.0.2.0/24\") or an address", shown)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%s has host bits set (the prefix is %s)", p, m)
	}
	return p, nil
}

func parseVIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Zone() != "" {
		return a, fmt.Errorf("%q has a zone; VIPs are global addresses", s)
	}
	a = a.Unmap()
	if why := notUnicast(a); why != "" {
		return a, fmt.Errorf("%s is not a unicast address vipd can bind (%s)", a, why)
	}
	if a.IsLoopback() || a.IsLinkLocalUnicast() {
		return a, fmt.Errorf("%s is not a unicast address vipd can bind (%s)", a, scope(a))
	}
	return a, nil
}

// The IPv4 ranges that hold no unicast address of a host (RFC 1122,
// 3.2.1.3 and RFC 1112, 4): "this network" and class E, which holds the
// limited broadcast address.
var (
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	classE      = netip.MustParsePrefix("240.0.0.0/4")
)

// notUnicast says why a (unmapped) is no unicast address of any host, or
// returns "" if it may be one. Such an address is neither a VIP nor a
// backend.
func notUnicast(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "limited broadcast"
	case classE.Contains(a):
		return "class E, reserved"
	case thisNetwork.Contains(a):
		return "\"this network\", 0.0.0.0/8"
	}
	return ""
}

// scope names the scope of a loopback or link-local address.
func scope(a netip.Addr) string {
	if a.IsLoopback() {
		return "loopback"
	}
	return "link-local"
}

// maxNameLen is the longest service name, in bytes.
const maxNameLen = 64

// validServiceName checks a service name: at most maxNameLen letters,
// digits, '-', '_', '.' and ':'. The colon is there for the default names
// of IPv6 services ("tcp-2001:db8::10-80"), which an operator may also
// write out. Names appear in logs, metrics labels and the arguments of
// "vipd drain", where "*" stands for every service.
func validServiceName(s string) error {
	if len(s) > maxNameLen {
		return fmt.Errorf("name %.20q... is longer than %d bytes", s, maxNameLen)
	}
	for _, c := range s {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return fmt.Errorf("name %q holds %q: use ASCII letters, digits, '-', '_', '.' and ':'", s, c)
		}
	}
	return nil
}

// service validates one [[service]] table.
func (v *validator) service(i int, r *rawService, cfg *Config) (lb.VirtualService, bool) {
	before := len(v.errs)
	vs := lb.VirtualService{Name: r.Name}
	// Identify the service first, so that later errors can name it.
	sv := v.serviceKey(i, r, &vs)
	v.serviceScheduler(sv, r, &vs.Service)
	fwd := lb.Masq
	if r.Forward != "" {
		f, ok := parseForward(r.Forward)
		if !ok {
			v.errorf(sv.path+".forward", sv.ctx, "forward %q must be masq, droute or tunnel", r.Forward)
		}
		fwd = f
	}
	tun := v.tunnel(sv.path, sv.ctx, fwd, r.Tunnel, r.TunnelPort, r.TunnelChecksum, lb.Destination{})
	v.servicePersistence(sv, r, &vs)
	v.serviceExposure(sv, r, &vs, fwd, cfg)
	v.serviceBackends(sv, r, &vs, fwd, tun)
	return vs, len(v.errs) == before
}

// serviceKey is what validator.service's helpers share about a service
// once it is identified.
type serviceKey struct {
	// path is the service's key path ("service.3"), ctx its name for
	// messages.
	path, ctx string
	proto     lb.Proto
	fam       lb.Family
	port      uint16
	// portOK says that port was set, to a valid port.
	portOK bool
}

// serviceKey identifies the service r, the i-th of the file: protocol,
// VIP, port, name, family and the kernel key (a VIP and port, NodePort,
// or a firewall mark), and the NodePort interfaces.
func (v *validator) serviceKey(i int, r *rawService, vs *lb.VirtualService) serviceKey {
	path := "service." + strconv.Itoa(i)
	proto := lb.TCP
	if r.Protocol != "" {
		p, err := lb.ParseProto(r.Protocol)
		if err != nil {
			v.errorf(path+".protocol", v.svcCtx(i, r), "protocol: %v", err)
		}
		proto = p
	}
	if r.VIP != "" {
		a, err := parseVIP(r.VIP)
		if err != nil {
			v.errorf(path+".vip", v.svcCtx(i, r), "vip: %v", err)
		} else {
			vs.VIP = a
		}
	}
	var port uint16
	portOK := r.Port != nil
	if r.Port != nil {
		if *r.Port < 0 || *r.Port > 65535 {
			v.errorf(path+".port", v.svcCtx(i, r), "port %d is outside 0..65535", *r.Port)
			portOK = false
		} else {
			port = uint16(*r.Port)
		}
	}
	if vs.Name == "" {
		vs.Name = v.defaultName(r, proto)
	} else if err := validServiceName(vs.Name); err != nil {
		v.errorf(path+".name", v.svcCtx(i, r), "%v", err)
	}
	ctx := "service " + strconv.Quote(vs.Name)

	sv := serviceKey{path: path, ctx: ctx, proto: proto, port: port, portOK: portOK}
	sv.fam = v.serviceFamily(sv, r, vs)
	v.kernelKey(sv, r, vs)
	for _, name := range r.Interfaces {
		if err := validIfName(name); err != nil {
			v.errorf(path+".interfaces", ctx, "interfaces: %v", err)
		}
	}
	if len(r.Interfaces) > 0 && !r.NodePort {
		v.errorf(path+".interfaces", ctx, "interfaces only applies to nodeport services")
	}
	vs.Interfaces = r.Interfaces

	return sv
}

// serviceFamily returns the service's address family: the family
// setting, or else the VIP's, or else the first backend's.
func (v *validator) serviceFamily(sv serviceKey, r *rawService, vs *lb.VirtualService) lb.Family {
	path, ctx := sv.path, sv.ctx
	fam := lb.IPv4
	switch r.Family {
	case "":
		switch {
		case vs.VIP.IsValid():
			fam = lb.FamilyOf(vs.VIP)
		case len(r.Backend) > 0:
			if a, err := netip.ParseAddr(hostPart(r.Backend[0].Address)); err == nil {
				fam = lb.FamilyOf(a)
			}
		}
	case "ipv4", "4":
		fam = lb.IPv4
	case "ipv6", "6":
		fam = lb.IPv6
	default:
		v.errorf(path+".family", ctx, "family %q must be \"ipv4\" or \"ipv6\"", r.Family)
	}
	if r.Family != "" && vs.VIP.IsValid() && lb.FamilyOf(vs.VIP) != fam {
		v.errorf(path+".family", ctx, "family %s does not match vip %s", fam, vs.VIP)
	}

	return fam
}

// kernelKey sets the service's kernel key: a VIP and port, a NodePort
// port on the host's addresses, or a firewall mark.
func (v *validator) kernelKey(sv serviceKey, r *rawService, vs *lb.VirtualService) {
	path, ctx, proto, port, fam := sv.path, sv.ctx, sv.proto, sv.port, sv.fam
	svc := &vs.Service
	switch {
	case r.FWMark != 0:
		if r.FWMark < 0 || r.FWMark > math.MaxUint32 {
			v.errorf(path+".fwmark", ctx, "fwmark %d is not a 32-bit mark", r.FWMark)
		}
		if r.Port != nil {
			v.errorf(path+".port", ctx, "port is not used by a fwmark service (the mark selects the traffic)")
		}
		if r.Protocol != "" {
			v.errorf(path+".protocol", ctx, "protocol is not used by a fwmark service (the mark selects the traffic)")
		}
		if r.NodePort {
			v.errorf(path+".nodeport", ctx, "a service is either nodeport or fwmark, not both")
		}
		svc.Key = lb.ServiceKey{Family: fam, FWMark: uint32(r.FWMark)}
	case r.NodePort:
		if r.VIP != "" {
			v.errorf(path+".vip", ctx, "a nodeport service listens on the host's addresses and has no vip")
		}
		if r.Port == nil || port == 0 {
			v.errorf(path+".port", ctx, "a nodeport service needs a port")
		}
		svc.Key = lb.ServiceKey{Family: fam, Proto: proto, Port: port}
		vs.NodePort = true
	default:
		if r.VIP == "" {
			v.errorf(path, ctx, "vip is missing (or set nodeport = true, or fwmark)")
		}
		if r.Port == nil {
			v.errorf(path, ctx, "port is missing")
		}
		svc.Key = lb.ServiceKey{Family: fam, Proto: proto, Addr: vs.VIP, Port: port}
	}
}

// serviceScheduler sets the scheduler and its flags.
func (v *validator) serviceScheduler(sv serviceKey, r *rawService, svc *lb.Service) {
	path, ctx := sv.path, sv.ctx
	svc.Scheduler = DefaultScheduler
	if r.Scheduler != "" {
		svc.Scheduler = r.Scheduler
		if !knownScheduler(r.Scheduler) {
			v.errorf(path+".scheduler", ctx, "unknown scheduler %q (want one of %s)", r.Scheduler, strings.Join(lb.Schedulers, " "))
		}
	}
	for _, f := range r.SchedulerFlags {
		flag, ok := lb.ParseSchedFlag(f)
		switch {
		case !ok:
			v.errorf(path+".scheduler_flags", ctx, "unknown scheduler flag %q (want sh-fallback, sh-port, mh-fallback or mh-port)", f)
		case flag.Scheduler() != svc.Scheduler:
			v.errorf(path+".scheduler_flags", ctx, "scheduler flag %q needs scheduler %q, not %q", f, flag.Scheduler(), svc.Scheduler)
		default:
			svc.Flags |= flag
		}
	}

}

// servicePersistence sets persistence, its netmask and one-packet
// scheduling, which port 0 (all ports) depends on.
func (v *validator) servicePersistence(sv serviceKey, r *rawService, vs *lb.VirtualService) {
	path, ctx, fam, proto, port, portOK := sv.path, sv.ctx, sv.fam, sv.proto, sv.port, sv.portOK
	svc := &vs.Service
	if r.Persistence != nil {
		p := v.duration(r.Persistence, 0, path+".persistence", ctx, "persistence")
		switch {
		case p%time.Second != 0:
			v.errorf(path+".persistence", ctx, "persistence %s is not a whole number of seconds", p)
		case p > 0 && p.Seconds() > math.MaxUint32:
			v.errorf(path+".persistence", ctx, "persistence %s is too long", p)
		default:
			svc.Persistent = uint32(p / time.Second)
		}
	}
	if r.PersistenceNetmask != nil {
		maxBits := int64(32)
		if fam == lb.IPv6 {
			maxBits = 128
		}
		switch m := *r.PersistenceNetmask; {
		case svc.Persistent == 0:
			v.errorf(path+".persistence_netmask", ctx, "persistence_netmask needs persistence")
		case m < 1 || m > maxBits:
			v.errorf(path+".persistence_netmask", ctx, "persistence_netmask /%d is outside /1../%d for %s", m, maxBits, fam)
		default:
			svc.Netmask = int(m)
		}
	} else if svc.Persistent != 0 {
		svc.Netmask = 32
		if fam == lb.IPv6 {
			svc.Netmask = 128
		}
	}
	if svc.Key.FWMark == 0 && !vs.NodePort && portOK && port == 0 && svc.Persistent == 0 {
		v.errorf(path+".port", ctx, "port 0 (all ports) needs persistence, as in IPVS")
	}
	if r.OnePacket {
		switch {
		case svc.Key.FWMark == 0 && proto != lb.UDP:
			v.errorf(path+".one_packet", ctx, "one_packet applies to udp only, not %s", proto)
		case svc.Persistent != 0:
			v.errorf(path+".one_packet", ctx, "one_packet schedules every packet and cannot be combined with persistence")
		}
		svc.OnePacket = true
	}

}

// serviceExposure sets how the service meets its clients: announcement
// of its VIP, SNAT, and its allow list.
func (v *validator) serviceExposure(sv serviceKey, r *rawService, vs *lb.VirtualService, fwd lb.Forward, cfg *Config) {
	path, ctx, port, portOK := sv.path, sv.ctx, sv.port, sv.portOK
	svc := &vs.Service
	vs.Announce = vs.VIP.IsValid()
	if r.Announce != nil {
		if !vs.VIP.IsValid() && *r.Announce {
			v.errorf(path+".announce", ctx, "announce needs a vip")
		}
		vs.Announce = *r.Announce && vs.VIP.IsValid()
	}
	// NodePort traffic is masqueraded by default, as kube-proxy does: the
	// backends answer the host, which answers the client.
	vs.SNAT = vs.NodePort
	if r.SNAT != nil {
		vs.SNAT = *r.SNAT
	}
	if r.SNAT != nil && vs.SNAT && fwd != lb.Masq {
		v.errorf(path+".snat", ctx, "snat needs forward = \"masq\", not %q", fwd)
	}
	if vs.SNAT && svc.Key.FWMark == 0 && !vs.NodePort && portOK && port == 0 {
		v.errorf(path+".snat", ctx, "snat is not supported for all-ports (port 0) services")
	}
	if vs.SNAT && svc.Key.FWMark != 0 {
		v.errorf(path+".snat", ctx, "snat is not supported for fwmark services; masquerade with your own mark rules")
	}
	if vs.NodePort && fwd != lb.Masq {
		v.errorf(path+".forward", ctx, "a nodeport service forwards with masq, not %s", fwd)
	}
	if vs.SNAT && !cfg.Daemon.ManageIPTables {
		v.errorf(path+".snat", ctx, "snat needs daemon.manage_iptables = true")
	}
	if r.Allow != nil {
		vs.Allow = v.allow(path+".allow", ctx, r.Allow, svc.Key, portOK && port == 0, cfg.Daemon.ManageIPTables)
	}

}

// serviceBackends validates the backends, each once.
func (v *validator) serviceBackends(sv serviceKey, r *rawService, vs *lb.VirtualService, fwd lb.Forward, tun lb.Destination) {
	path, ctx := sv.path, sv.ctx
	if len(r.Backend) == 0 {
		v.errorf(path, ctx, "no backends (add [[service.backend]] tables)")
	}
	seen := make(map[netip.AddrPort]int, len(r.Backend))
	if len(r.Backend) > 0 {
		vs.Backends = make([]lb.Destination, 0, len(r.Backend))
	}
	for j := range r.Backend {
		d, ok := v.backend(path, ctx, j, &r.Backend[j], *vs, fwd, tun)
		if !ok {
			continue
		}
		if prev, dup := seen[d.Addr]; dup {
			v.errorf(fmt.Sprintf("%s.backend.%d", path, j), ctx, "backend %s is listed twice (also backend %d)", d.Addr, prev+1)
			continue
		}
		seen[d.Addr] = j
		vs.Backends = append(vs.Backends, d)
	}
}

func (v *validator) svcCtx(i int, r *rawService) string {
	if r.Name != "" {
		return fmt.Sprintf("service %q", r.Name)
	}
	return fmt.Sprintf("service %d", i+1)
}

func (v *validator) defaultName(r *rawService, proto lb.Proto) string {
	switch {
	case r.FWMark != 0:
		return fmt.Sprintf("fwmark-%d", r.FWMark)
	case r.NodePort && r.Port != nil:
		return fmt.Sprintf("nodeport-%s-%d", proto, *r.Port)
	case r.Port != nil:
		return fmt.Sprintf("%s-%s-%d", proto, r.VIP, *r.Port)
	}
	return r.VIP
}

// tunnel validates tunnel settings against the forwarding method.
func (v *validator) tunnel(path, ctx string, fwd lb.Forward, typ string, port int64, csum string, base lb.Destination) lb.Destination {
	d := base
	if fwd != lb.Tunnel {
		if typ != "" || port != 0 || csum != "" {
			v.errorf(path+".tunnel", ctx, "tunnel settings need forward = \"tunnel\"")
		}
		return lb.Destination{}
	}
	if typ != "" {
		t, ok := parseTunnel(typ)
		if !ok {
			v.errorf(path+".tunnel", ctx, "tunnel %q must be ipip, gue or gre", typ)
		}
		d.Tunnel = t
	}
	if port != 0 {
		if port < 1 || port > 65535 {
			v.errorf(path+".tunnel_port", ctx, "tunnel_port %d is outside 1..65535", port)
		} else {
			d.TunnelPort = uint16(port)
		}
	}
	if csum != "" {
		c, ok := parseCsum(csum)
		if !ok {
			v.errorf(path+".tunnel_checksum", ctx, "tunnel_checksum %q must be none, csum or remcsum", csum)
		}
		d.TunnelCsum = c
	}
	switch {
	case d.Tunnel == lb.GUE && d.TunnelPort == 0:
		v.errorf(path+".tunnel", ctx, "a gue tunnel needs tunnel_port (the backends' FOU port)")
	case d.Tunnel != lb.GUE && d.TunnelPort != 0:
		v.errorf(path+".tunnel_port", ctx, "tunnel_port applies to gue tunnels only")
	case d.Tunnel == lb.IPIP && d.TunnelCsum != lb.CsumNone:
		v.errorf(path+".tunnel_checksum", ctx, "tunnel_checksum applies to gue and gre tunnels only")
	case d.Tunnel == lb.GRE && d.TunnelCsum == lb.RemCsum:
		v.errorf(path+".tunnel_checksum", ctx, "remcsum applies to gue tunnels only")
	}
	return d
}

func hostPart(s string) string {
	if ap, err := parseAddrPort(s); err == nil {
		return ap.Addr().String()
	}
	return s
}

// errNoPort is parseAddrPort's error for text without a colon.
var errNoPort = errors.New("no port")

// parseAddrPort is netip.ParseAddrPort, without allocating an error for
// the common address without a port.
func parseAddrPort(s string) (netip.AddrPort, error) {
	if strings.IndexByte(s, ':') < 0 {
		return netip.AddrPort{}, errNoPort
	}
	return netip.ParseAddrPort(s)
}

// backend validates one [[service.backend]] table.
func (v *validator) backend(svcPath, svcCtx string, j int, r *rawBackend, vs lb.VirtualService, svcFwd lb.Forward, svcTun lb.Destination) (lb.Destination, bool) {
	before := len(v.errs)
	d := lb.Destination{Weight: 1, Forward: svcFwd}
	// The key path and the context are only needed for errors: build
	// them then. The context names the backend by number until its
	// address is known.
	path := func() string { return svcPath + ".backend." + strconv.Itoa(j) }
	named := false
	ctx := func() string {
		if named {
			return svcCtx + ": backend " + strconv.Quote(d.Addr.String())
		}
		return svcCtx + ": backend " + strconv.Itoa(j+1)
	}
	var addr netip.Addr
	svcPort := vs.Service.Key.Port
	port := svcPort
	explicitPort := false
	if ap, err := parseAddrPort(r.Address); err == nil {
		addr, port, explicitPort = ap.Addr(), ap.Port(), true
	} else if a, err := netip.ParseAddr(r.Address); err == nil {
		addr = a
	} else {
		if r.Address == "" {
			v.errorf(path(), ctx(), "address is missing")
		} else {
			v.errorf(path()+".address", ctx(), "address %q is not an IP address or address:port", r.Address)
		}
		return d, false
	}
	addr = addr.Unmap()
	if r.Port != nil {
		if explicitPort {
			v.errorf(path()+".port", fmt.Sprintf("%s: backend %q", svcCtx, r.Address), "port is given twice (address %q has one)", r.Address)
		}
		if *r.Port < 0 || *r.Port > 65535 {
			v.errorf(path()+".port", ctx(), "port %d is outside 0..65535", *r.Port)
		} else {
			port = uint16(*r.Port)
			explicitPort = true
		}
	}
	d.Addr = netip.AddrPortFrom(addr, port)
	named = true
	if why := notUnicast(addr); why != "" {
		v.errorf(path()+".address", ctx(), "%s is not a unicast address (%s)", addr, why)
	} else if addr.Zone() != "" {
		v.errorf(path()+".address", ctx(), "%s is not a unicast address (it has a zone)", addr)
	}
	if r.Weight != nil {
		switch w := *r.Weight; {
		case w < 0:
			v.errorf(path()+".weight", ctx(), "weight %d is negative", w)
		case w > 65535:
			v.errorf(path()+".weight", ctx(), "weight %d is above 65535", w)
		default:
			d.Weight = int(w)
		}
	}
	// The kernel takes thresholds as signed 32-bit values and refuses a
	// lower threshold above the upper one, also when the upper is 0.
	if r.UpperThreshold < 0 || r.UpperThreshold > math.MaxInt32 {
		v.errorf(path()+".upper_threshold", ctx(), "upper_threshold %d is outside 0..%d", r.UpperThreshold, math.MaxInt32)
	} else {
		d.Upper = uint32(r.UpperThreshold)
	}
	if r.LowerThreshold < 0 || r.LowerThreshold > math.MaxInt32 {
		v.errorf(path()+".lower_threshold", ctx(), "lower_threshold %d is outside 0..%d", r.LowerThreshold, math.MaxInt32)
	} else {
		d.Lower = uint32(r.LowerThreshold)
	}
	switch {
	case d.Lower != 0 && d.Upper == 0:
		v.errorf(path()+".lower_threshold", ctx(), "lower_threshold needs upper_threshold (new connections resume below lower once upper was reached)")
	case d.Lower > d.Upper:
		v.errorf(path()+".lower_threshold", ctx(), "lower_threshold %d is above upper_threshold %d", d.Lower, d.Upper)
	}
	if r.Forward != "" {
		f, ok := parseForward(r.Forward)
		if !ok {
			v.errorf(path()+".forward", ctx(), "forward %q must be masq, droute or tunnel", r.Forward)
		}
		d.Forward = f
	}
	overridden := r.Forward != "" || r.Tunnel != "" || r.TunnelPort != 0 || r.TunnelChecksum != ""
	switch {
	case d.Forward == lb.Tunnel && !overridden:
		d.Tunnel, d.TunnelPort, d.TunnelCsum = svcTun.Tunnel, svcTun.TunnelPort, svcTun.TunnelCsum
	case d.Forward == lb.Tunnel:
		// A backend inherits the service's tunnel settings unless it
		// names a tunnel type of its own.
		base := svcTun
		if svcFwd != lb.Tunnel || r.Tunnel != "" {
			base = lb.Destination{}
		}
		t := v.tunnel(path(), ctx(), d.Forward, r.Tunnel, r.TunnelPort, r.TunnelChecksum, base)
		d.Tunnel, d.TunnelPort, d.TunnelCsum = t.Tunnel, t.TunnelPort, t.TunnelCsum
	case r.Tunnel != "" || r.TunnelPort != 0 || r.TunnelChecksum != "":
		v.errorf(path()+".tunnel", ctx(), "tunnel settings need forward = \"tunnel\"")
	}
	// Service-wide forwarding errors are reported once, on the service;
	// a backend is checked again only where it overrides forwarding.
	if r.Forward != "" && vs.NodePort && d.Forward != lb.Masq {
		v.errorf(path()+".forward", ctx(), "a nodeport service forwards with masq, not %s", d.Forward)
	}
	if r.Forward != "" && vs.SNAT && d.Forward != lb.Masq {
		v.errorf(path()+".forward", ctx(), "snat needs masq forwarding, not %s", d.Forward)
	}
	fam := vs.Service.Key.Family
	if lb.FamilyOf(addr) != fam && d.Forward != lb.Tunnel {
		v.errorf(path()+".address", ctx(), "%s backend on an %s service (only tunnel forwarding mixes families)", lb.FamilyOf(addr), fam)
	}
	if (d.Forward == lb.DirectRoute || d.Forward == lb.Tunnel) && explicitPort && vs.Service.Key.FWMark == 0 && port != svcPort {
		v.errorf(path()+".port", ctx(), "%s forwarding cannot change the port (%d to %d): the backend sees the VIP's packet unchanged", d.Forward, svcPort, port)
	}
	if vs.Service.Key.FWMark == 0 && port == 0 && svcPort != 0 {
		v.errorf(path()+".port", ctx(), "port 0 is only valid for fwmark and all-ports services")
	}
	return d, len(v.errs) == before
}
