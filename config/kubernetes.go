package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// Kubernetes is the [kubernetes] section: vipd as the LoadBalancer
// implementation of a cluster, a source of services besides the file
// (see package source/kubernetes).
type Kubernetes struct {
	// Enabled says the section is there.
	Enabled bool
	// Kubeconfig is the path of a kubeconfig file; "" means the
	// in-cluster configuration.
	Kubeconfig string
	// Program is the path of the provider program the daemon runs the
	// source in; "" means vipd-kubernetes in the directory of the vipd
	// executable.
	Program string
	// LoadBalancerClass is the spec.loadBalancerClass vipd serves;
	// DefaultClass serves the Services without one too.
	LoadBalancerClass string
	DefaultClass      bool
	// Namespaces restricts the Services served (empty: all);
	// ServiceSelector is a label selector they must match.
	Namespaces      []string
	ServiceSelector string
	// Backends is the default backend mode: "nodeport" or "endpoints".
	Backends string
	// Pools are the addresses vipd hands out.
	Pools []KubernetesPool
	// MetalLBAnnotations reads MetalLB's Service annotations
	// (loadBalancerIPs, address-pool, allow-shared-ip) as vipd's own
	// addresses, pool and sharing key, where a Service has none of
	// vipd's.
	MetalLBAnnotations bool
	// LeaderElection lets several vipd nodes serve one cluster: the one
	// that holds the Lease LeaseNamespace/LeaseName hands out addresses
	// and writes status; every node programs what the status shows.
	// Identity is the node's name in the Lease ("": the hostname), and
	// the durations are client-go's (zero: 15s, 10s and 2s).
	LeaderElection                            bool
	LeaseNamespace, LeaseName, Identity       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// APIQPS and APIBurst are the client's rate limit on its requests
	// to the API server (status writes, Events): a steady rate per
	// second and a burst. Zero means the source's defaults (see
	// source/kubernetes).
	APIQPS   float64
	APIBurst int
	// NodeHealth is how nodeport-mode Services probe their Nodes.
	NodeHealth KubernetesNodeHealth

	// ranges are the pools' addresses, sorted by their first address,
	// with the main file they are written in, for the errors that name
	// a pool (see poolHolding).
	ranges []poolRange
	file   string
	src    []byte
}

// poolRange is one entry of a pool's addresses: pool indexes Pools.
// maxLast is the highest last address of the ranges up to this one,
// in order, so that a search can stop.
type poolRange struct {
	first, last, maxLast netip.Addr
	pool                 int
	// text is the entry as written.
	text string
}

// poolHolding returns the index of the pool that holds a, and whether
// one does.
func (k *Kubernetes) poolHolding(a netip.Addr) (int, bool) {
	a = a.Unmap()
	// The ranges that start at or before a, walked back while one of
	// them may still reach it.
	i, _ := slices.BinarySearchFunc(k.ranges, a, func(r poolRange, a netip.Addr) int {
		if r.first.Compare(a) <= 0 {
			return -1
		}
		return 1
	})
	for j := i - 1; j >= 0 && k.ranges[j].maxLast.Compare(a) >= 0; j-- {
		r := &k.ranges[j]
		if r.first.BitLen() == a.BitLen() && r.last.Compare(a) >= 0 {
			return r.pool, true
		}
	}
	return 0, false
}

// poolVIPError says why vip, a VIP of the file's services, must not be
// in a pool, naming the pool and the line of its addresses; "" when no
// pool holds it. pos caches the index of the main file's positions
// across calls (nil at first).
func (k *Kubernetes) poolVIPError(vip netip.Addr, pos **positions) string {
	i, ok := k.poolHolding(vip)
	if !ok {
		return ""
	}
	where := k.file
	if k.src != nil {
		if *pos == nil {
			*pos = indexPositions(k.src)
		}
		where = fmt.Sprintf("%s:%d", k.file, (*pos).line(fmt.Sprintf("kubernetes.pool.%d.addresses", i)))
	}
	return fmt.Sprintf("vip %s is in [[kubernetes.pool]] %q (%s): a Kubernetes Service could take it on another port, and vipd would open that port through the filter; take it out of the pool", vip, k.Pools[i].Name, where)
}

// poolsHoldVIPs reports whether a pool of k holds the VIP of one of
// services.
func (k *Kubernetes) poolsHoldVIPs(services []lb.VirtualService) bool {
	if len(k.ranges) == 0 {
		return false
	}
	for i := range services {
		if vip := services[i].VIP; vip.IsValid() {
			if _, ok := k.poolHolding(vip); ok {
				return true
			}
		}
	}
	return false
}

// PoolOf returns the name of the [[kubernetes.pool]] that holds a, and
// whether one does.
func (k *Kubernetes) PoolOf(a netip.Addr) (string, bool) {
	i, ok := k.poolHolding(a)
	if !ok {
		return "", false
	}
	return k.Pools[i].Name, true
}

// samePools reports whether k and o have the same pools' addresses.
func (k *Kubernetes) samePools(o *Kubernetes) bool {
	return slices.Equal(k.ranges, o.ranges)
}

// MaxKubernetesAPIQPS bounds api_qps and api_burst: beyond, the limit is
// the API server's own (priority and fairness), not the client's.
const MaxKubernetesAPIQPS = 100000

// KubernetesPool is one [[kubernetes.pool]].
type KubernetesPool struct {
	Name string
	// Addresses are CIDRs, ranges ("A-B") and single addresses.
	Addresses []string
	// AutoAssign lets Services that name no pool take addresses from it.
	AutoAssign bool
	// AvoidNetworkBroadcast keeps network and broadcast addresses out of
	// automatic allocation.
	AvoidNetworkBroadcast bool
	// Namespaces and ServiceSelector say which Services may use the pool
	// (empty: every namespace, every Service); ShareAcrossNamespaces lets
	// Services of different namespaces share its addresses under one
	// sharing key.
	Namespaces            []string
	ServiceSelector       string
	ShareAcrossNamespaces bool
	// SNAT masquerades the traffic of the pool's Services to their
	// backends, so that replies return through vipd whatever the
	// backends' routes (the one-arm layout).
	SNAT bool
}

// KubernetesNodeHealth is the [kubernetes.node_health] table: the probes
// of the Nodes that nodeport-mode Services balance to, as cloud load
// balancers probe them (see source/kubernetes.NodeHealth).
type KubernetesNodeHealth struct {
	// Enabled probes Nodes at all.
	Enabled bool
	// Port and Path are every Node's health endpoint for Services with
	// externalTrafficPolicy Cluster: kube-proxy's (10256, /healthz) by
	// default; Port zero probes them not.
	Port uint16
	Path string
	// Local probes Services with externalTrafficPolicy Local at their
	// spec.healthCheckNodePort instead.
	Local bool
	// Interval, Timeout, Rise and Fall are the probes' timing.
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// The defaults of [kubernetes.node_health]: a Node that stops answering
// leaves within Fall × Interval plus one Interval.
const (
	DefaultNodeHealthPort     = 10256
	DefaultNodeHealthPath     = "/healthz"
	DefaultNodeHealthInterval = time.Second
	DefaultNodeHealthTimeout  = 500 * time.Millisecond
	DefaultNodeHealthRise     = 2
	DefaultNodeHealthFall     = 2
)

// The backend modes.
const (
	BackendsNodePort  = "nodeport"
	BackendsEndpoints = "endpoints"
)

// EqualBesidesPools reports whether two sections are the same but for
// their [[kubernetes.pool]] tables, which a reload hands to the running
// source.
func (k Kubernetes) EqualBesidesPools(o Kubernetes) bool {
	k.Pools, o.Pools = nil, nil
	return k.Equal(o)
}

// Equal reports whether two sections are the same.
func (k Kubernetes) Equal(o Kubernetes) bool {
	return k.Enabled == o.Enabled && k.Kubeconfig == o.Kubeconfig && k.Program == o.Program && k.LoadBalancerClass == o.LoadBalancerClass &&
		k.DefaultClass == o.DefaultClass && slices.Equal(k.Namespaces, o.Namespaces) && k.ServiceSelector == o.ServiceSelector &&
		k.Backends == o.Backends && k.LeaderElection == o.LeaderElection && k.LeaseNamespace == o.LeaseNamespace &&
		k.LeaseName == o.LeaseName && k.Identity == o.Identity && k.LeaseDuration == o.LeaseDuration &&
		k.RenewDeadline == o.RenewDeadline && k.RetryPeriod == o.RetryPeriod && k.APIQPS == o.APIQPS &&
		k.APIBurst == o.APIBurst && k.MetalLBAnnotations == o.MetalLBAnnotations && slices.EqualFunc(k.Pools, o.Pools, func(a, b KubernetesPool) bool {
		return a.Name == b.Name && slices.Equal(a.Addresses, b.Addresses) && a.AutoAssign == b.AutoAssign &&
			a.AvoidNetworkBroadcast == b.AvoidNetworkBroadcast && slices.Equal(a.Namespaces, b.Namespaces) &&
			a.ServiceSelector == b.ServiceSelector && a.ShareAcrossNamespaces == b.ShareAcrossNamespaces && a.SNAT == b.SNAT
	}) && k.NodeHealth == o.NodeHealth
}

// rawKubernetes is the [kubernetes] section as written.
type rawKubernetes struct {
	Kubeconfig         *string        `toml:"kubeconfig"`
	Program            *string        `toml:"program"`
	LoadBalancerClass  *string        `toml:"load_balancer_class"`
	DefaultClass       *bool          `toml:"default_class"`
	Namespaces         []string       `toml:"namespaces"`
	ServiceSelector    *string        `toml:"service_selector"`
	Backends           *string        `toml:"backends"`
	Pool               []rawK8sPool   `toml:"pool"`
	LeaderElection     *bool          `toml:"leader_election"`
	LeaseNamespace     *string        `toml:"lease_namespace"`
	LeaseName          *string        `toml:"lease_name"`
	Identity           *string        `toml:"identity"`
	LeaseDuration      *duration      `toml:"lease_duration"`
	RenewDeadline      *duration      `toml:"renew_deadline"`
	RetryPeriod        *duration      `toml:"retry_period"`
	APIQPS             *float64       `toml:"api_qps"`
	APIBurst           *int64         `toml:"api_burst"`
	MetalLBAnnotations *bool          `toml:"metallb_annotations"`
	NodeHealth         *rawNodeHealth `toml:"node_health"`
}

type rawNodeHealth struct {
	Enabled  *bool     `toml:"enabled"`
	Port     *int64    `toml:"port"`
	Path     *string   `toml:"path"`
	Local    *bool     `toml:"local"`
	Interval *duration `toml:"interval"`
	Timeout  *duration `toml:"timeout"`
	Rise     *int64    `toml:"rise"`
	Fall     *int64    `toml:"fall"`
}

type rawK8sPool struct {
	Name                  *string  `toml:"name"`
	Addresses             []string `toml:"addresses"`
	AutoAssign            *bool    `toml:"auto_assign"`
	AvoidNetworkBroadcast *bool    `toml:"avoid_network_broadcast"`
	Namespaces            []string `toml:"namespaces"`
	ServiceSelector       *string  `toml:"service_selector"`
	ShareAcrossNamespaces *bool    `toml:"share_across_namespaces"`
	SNAT                  *bool    `toml:"snat"`
}

// set reports whether the section has any key.
func (k *rawKubernetes) set() bool {
	return k.Kubeconfig != nil || k.Program != nil || k.LoadBalancerClass != nil || k.DefaultClass != nil || k.Namespaces != nil ||
		k.ServiceSelector != nil || k.Backends != nil || k.Pool != nil || k.LeaderElection != nil || k.LeaseNamespace != nil ||
		k.LeaseName != nil || k.Identity != nil || k.LeaseDuration != nil || k.RenewDeadline != nil || k.RetryPeriod != nil ||
		k.APIQPS != nil || k.APIBurst != nil || k.MetalLBAnnotations != nil || k.NodeHealth != nil
}

// kubernetes validates the [kubernetes] section into cfg.Kubernetes. The
// addresses of the pools are checked when the source starts (see
// source/kubernetes), which names the pool.
func (v *validator) kubernetes(k *rawKubernetes, cfg *Config) {
	if !k.set() {
		return
	}
	const ctx = "kubernetes"
	out := Kubernetes{Enabled: true, Backends: BackendsNodePort}
	if k.Kubeconfig != nil {
		out.Kubeconfig = *k.Kubeconfig
		if out.Kubeconfig != "" && out.Kubeconfig[0] != '/' {
			v.errorf("kubernetes.kubeconfig", ctx, "kubeconfig %q must be an absolute path (or \"\" for the in-cluster configuration)", out.Kubeconfig)
		}
	}
	if k.Program != nil {
		out.Program = *k.Program
		if out.Program == "" || out.Program[0] != '/' {
			v.errorf("kubernetes.program", ctx, "program %q must be an absolute path (or left out for vipd-kubernetes beside vipd)", out.Program)
		}
	}
	if k.LoadBalancerClass != nil {
		out.LoadBalancerClass = *k.LoadBalancerClass
	}
	setBool(&out.DefaultClass, k.DefaultClass)
	if out.LoadBalancerClass == "" && !out.DefaultClass {
		v.errorf("kubernetes", ctx, "serves no Service: set load_balancer_class, or default_class = true")
	}
	for _, ns := range k.Namespaces {
		if ns == "" || len(ns) > 63 {
			v.errorf("kubernetes.namespaces", ctx, "namespaces: %q is not a namespace name", ns)
		}
	}
	out.Namespaces = k.Namespaces
	if k.ServiceSelector != nil {
		out.ServiceSelector = *k.ServiceSelector
		if _, err := labels.Parse(out.ServiceSelector); err != nil {
			v.errorf("kubernetes.service_selector", ctx, "service_selector %q is not a label selector: %v", out.ServiceSelector, err)
		}
	}
	if k.Backends != nil {
		switch *k.Backends {
		case BackendsNodePort, BackendsEndpoints:
			out.Backends = *k.Backends
		default:
			v.errorf("kubernetes.backends", ctx, "backends %q must be %q or %q", *k.Backends, BackendsNodePort, BackendsEndpoints)
		}
	}
	if len(k.Pool) == 0 {
		v.errorf("kubernetes", ctx, "no pools: add a [[kubernetes.pool]] with the addresses to hand out")
	}
	for i, p := range k.Pool {
		pctx := fmt.Sprintf("kubernetes.pool %d", i+1)
		pool := KubernetesPool{AutoAssign: true}
		if p.Name == nil || *p.Name == "" {
			v.errorf("kubernetes.pool", pctx, "name is required")
		} else {
			pool.Name = *p.Name
			if slices.ContainsFunc(out.Pools, func(q KubernetesPool) bool { return q.Name == pool.Name }) {
				v.errorf("kubernetes.pool.name", pctx, "pool %q is defined twice", pool.Name)
			}
		}
		if len(p.Addresses) == 0 {
			v.errorf("kubernetes.pool", pctx, "addresses are required: CIDRs, ranges (\"A-B\") or single addresses")
		}
		pool.Addresses = p.Addresses
		for _, a := range p.Addresses {
			first, last, _, err := ParsePoolRange(a)
			if err != nil {
				v.errorf(fmt.Sprintf("kubernetes.pool.%d.addresses", i), pctx, "pool %q: %v", pool.Name, err)
				continue
			}
			out.ranges = append(out.ranges, poolRange{first: first, last: last, pool: i, text: a})
		}
		setBool(&pool.AutoAssign, p.AutoAssign)
		setBool(&pool.AvoidNetworkBroadcast, p.AvoidNetworkBroadcast)
		for _, ns := range p.Namespaces {
			if ns == "" || len(ns) > 63 {
				v.errorf(fmt.Sprintf("kubernetes.pool.%d.namespaces", i), pctx, "namespaces: %q is not a namespace name", ns)
			}
		}
		pool.Namespaces = p.Namespaces
		if p.ServiceSelector != nil {
			pool.ServiceSelector = *p.ServiceSelector
			if _, err := labels.Parse(pool.ServiceSelector); err != nil {
				v.errorf(fmt.Sprintf("kubernetes.pool.%d.service_selector", i), pctx, "pool %q: service_selector %q is not a label selector: %v", pool.Name, pool.ServiceSelector, err)
			}
		}
		setBool(&pool.ShareAcrossNamespaces, p.ShareAcrossNamespaces)
		setBool(&pool.SNAT, p.SNAT)
		if pool.SNAT && !cfg.Spec.Rules.Enabled {
			v.errorf(fmt.Sprintf("kubernetes.pool.%d.snat", i), pctx, "pool %q: snat needs [daemon] manage_iptables = true: vipd's rules do the SNAT", pool.Name)
		}
		out.Pools = append(out.Pools, pool)
	}
	out.NodeHealth = v.nodeHealth(k.NodeHealth)
	out.LeaderElection = true
	setBool(&out.LeaderElection, k.LeaderElection)
	setBool(&out.MetalLBAnnotations, k.MetalLBAnnotations)
	for _, f := range []struct {
		raw  *string
		out  *string
		name string
	}{{k.LeaseNamespace, &out.LeaseNamespace, "lease_namespace"}, {k.LeaseName, &out.LeaseName, "lease_name"}, {k.Identity, &out.Identity, "identity"}} {
		if f.raw == nil {
			continue
		}
		*f.out = *f.raw
		if *f.raw == "" || len(*f.raw) > 253 || strings.ContainsAny(*f.raw, " /\t\n") {
			v.errorf("kubernetes."+f.name, ctx, "%s %q is not a name Kubernetes takes", f.name, *f.raw)
		}
	}
	out.LeaseDuration = v.duration(k.LeaseDuration, 0, "kubernetes.lease_duration", ctx, "lease_duration")
	out.RenewDeadline = v.duration(k.RenewDeadline, 0, "kubernetes.renew_deadline", ctx, "renew_deadline")
	out.RetryPeriod = v.duration(k.RetryPeriod, 0, "kubernetes.retry_period", ctx, "retry_period")
	if out.LeaseDuration%time.Second != 0 || out.LeaseDuration < 0 {
		v.errorf("kubernetes.lease_duration", ctx, "lease_duration %s must be whole seconds (a Lease stores seconds)", out.LeaseDuration)
	}
	if out.RenewDeadline < 0 || out.RetryPeriod < 0 {
		v.errorf("kubernetes", ctx, "renew_deadline and retry_period must not be negative")
	}
	if k.APIQPS != nil {
		out.APIQPS = *k.APIQPS
		if !(out.APIQPS > 0 && out.APIQPS <= MaxKubernetesAPIQPS) {
			v.errorf("kubernetes.api_qps", ctx, "api_qps %v must be above 0 and at most %d (requests per second)", out.APIQPS, MaxKubernetesAPIQPS)
		}
	}
	if k.APIBurst != nil {
		if *k.APIBurst < 1 || *k.APIBurst > MaxKubernetesAPIQPS {
			v.errorf("kubernetes.api_burst", ctx, "api_burst %d must be between 1 and %d (requests)", *k.APIBurst, MaxKubernetesAPIQPS)
		} else {
			out.APIBurst = int(*k.APIBurst)
		}
	}
	slices.SortStableFunc(out.ranges, func(a, b poolRange) int { return a.first.Compare(b.first) })
	widest := 0 // the range up to i that ends last
	for i := range out.ranges {
		r := &out.ranges[i]
		r.maxLast = r.last
		if i == 0 {
			continue
		}
		if w := out.ranges[widest]; w.maxLast.Compare(r.first) >= 0 && w.first.Is4() == r.first.Is4() {
			// An address in two entries: the Kubernetes source would
			// refuse the pools once started.
			other := "pool " + strconv.Quote(out.Pools[w.pool].Name) + "'s " + w.text
			if w.pool == r.pool {
				other = w.text
			}
			v.errorf(fmt.Sprintf("kubernetes.pool.%d.addresses", r.pool), fmt.Sprintf("kubernetes.pool %d", r.pool+1), "pool %q: %s overlaps %s", out.Pools[r.pool].Name, r.text, other)
		}
		if out.ranges[i-1].maxLast.Compare(r.maxLast) > 0 {
			r.maxLast = out.ranges[i-1].maxLast
		}
		if r.last.Compare(out.ranges[widest].last) > 0 {
			widest = i
		}
	}
	out.file, out.src = v.file, v.src
	// The [ha] section's floating addresses (a gateway, a SNAT source)
	// are the load balancer's own, as VIPs are.
	for _, a := range cfg.HA.Floating() {
		if i, ok := out.poolHolding(a); ok {
			v.errorf(fmt.Sprintf("kubernetes.pool.%d.addresses", i), fmt.Sprintf("kubernetes.pool %d", i+1),
				"pool %q holds %s, a floating address of [ha]: a Kubernetes Service could take it; take it out of the pool", out.Pools[i].Name, a)
		}
	}
	cfg.Kubernetes = out
}

// nodeHealth validates the [kubernetes.node_health] table (nil: absent)
// into its defaults and values.
func (v *validator) nodeHealth(r *rawNodeHealth) KubernetesNodeHealth {
	const ctx, path = "kubernetes.node_health", "kubernetes.node_health"
	out := KubernetesNodeHealth{Enabled: true, Port: DefaultNodeHealthPort, Path: DefaultNodeHealthPath, Local: true,
		Interval: DefaultNodeHealthInterval, Timeout: DefaultNodeHealthTimeout, Rise: DefaultNodeHealthRise, Fall: DefaultNodeHealthFall}
	if r == nil {
		return out
	}
	before := len(v.errs)
	setBool(&out.Enabled, r.Enabled)
	setBool(&out.Local, r.Local)
	if r.Port != nil {
		if *r.Port < 0 || *r.Port > 65535 {
			v.errorf(path+".port", ctx, "port %d is outside 0..65535 (0: no probe for Services with externalTrafficPolicy Cluster)", *r.Port)
		} else {
			out.Port = uint16(*r.Port)
		}
	}
	if r.Path != nil {
		out.Path = *r.Path
		if !strings.HasPrefix(out.Path, "/") || len(out.Path) > 1024 || strings.ContainsFunc(out.Path, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
			v.errorf(path+".path", ctx, "path %q must start with / and hold no spaces or control characters", out.Path)
		}
	}
	out.Interval = v.duration(r.Interval, out.Interval, path+".interval", ctx, "interval")
	out.Timeout = v.duration(r.Timeout, out.Timeout, path+".timeout", ctx, "timeout")
	if out.Interval < check.MinInterval || out.Interval > time.Hour {
		v.errorf(path+".interval", ctx, "interval %s is outside %s..1h", out.Interval, check.MinInterval)
	}
	if out.Timeout <= 0 || out.Timeout > out.Interval {
		v.errorf(path+".timeout", ctx, "timeout %s must be above 0 and at most the interval (%s)", out.Timeout, out.Interval)
	}
	for _, f := range []struct {
		raw  *int64
		out  *int
		name string
	}{{r.Rise, &out.Rise, "rise"}, {r.Fall, &out.Fall, "fall"}} {
		if f.raw == nil {
			continue
		}
		if *f.raw < 1 || *f.raw > 1000 {
			v.errorf(path+"."+f.name, ctx, "%s %d is outside 1..1000", f.name, *f.raw)
			continue
		}
		*f.out = int(*f.raw)
	}
	if len(v.errs) > before {
		return out
	}
	spec := check.Spec{Kind: check.KindHTTP, Port: max(out.Port, 1), Interval: out.Interval, Timeout: out.Timeout,
		Rise: out.Rise, Fall: out.Fall, HTTP: check.HTTPOptions{Path: out.Path}}
	for _, err := range unjoin(spec.Validate()) {
		v.errorf(path, ctx, "%s", strings.TrimSpace(err.Error()))
	}
	return out
}

// ParsePoolRange parses one entry of a pool's addresses: a CIDR
// ("192.0.2.0/28", "2001:db8::/120"), a range ("192.0.2.10-192.0.2.20")
// or a single address. It returns the first and last address the entry
// holds and, for a CIDR, the addresses avoid_network_broadcast keeps out
// of automatic allocation: the network and broadcast addresses of IPv4
// CIDRs of prefixes up to /30, the first (subnet-router anycast) address
// of IPv6 CIDRs up to /126. Addresses vipd cannot serve (loopback,
// multicast, unspecified, link-local) are refused.
func ParsePoolRange(s string) (first, last netip.Addr, avoid []netip.Addr, err error) {
	s = strings.TrimSpace(s)
	if f, l, ok := strings.Cut(s, "-"); ok {
		a, err1 := netip.ParseAddr(strings.TrimSpace(f))
		b, err2 := netip.ParseAddr(strings.TrimSpace(l))
		switch {
		case err1 != nil || err2 != nil || a.Zone() != "" || b.Zone() != "":
			return first, last, nil, fmt.Errorf("range %q is not ADDRESS-ADDRESS", s)
		case a.Unmap().BitLen() != b.Unmap().BitLen():
			return first, last, nil, fmt.Errorf("range %q mixes IPv4 and IPv6", s)
		case a.Unmap().Compare(b.Unmap()) > 0:
			return first, last, nil, fmt.Errorf("range %q ends before it starts", s)
		}
		first, last = a.Unmap(), b.Unmap()
		return first, last, nil, checkPoolRange(s, first, last)
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return first, last, nil, fmt.Errorf("%q is not a CIDR: %w", s, err)
		}
		if p.Addr().Is4In6() {
			return first, last, nil, fmt.Errorf("CIDR %q: write IPv4 CIDRs as IPv4", s)
		}
		if p != p.Masked() {
			return first, last, nil, fmt.Errorf("CIDR %q has host bits set (did you mean %s?)", s, p.Masked())
		}
		first, last = p.Addr(), lastOf(p)
		switch bits := p.Bits(); {
		case p.Addr().Is4() && bits <= 30:
			avoid = []netip.Addr{first, last}
		case p.Addr().Is6() && bits <= 126:
			avoid = []netip.Addr{first}
		}
		return first, last, avoid, checkPoolRange(s, first, last)
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return first, last, nil, fmt.Errorf("%q is not a CIDR, a range or an address", s)
	}
	first, last = a.Unmap(), a.Unmap()
	return first, last, nil, checkPoolRange(s, first, last)
}

// checkPoolRange refuses ranges that hold addresses vipd cannot serve.
func checkPoolRange(s string, first, last netip.Addr) error {
	for _, a := range []netip.Addr{first, last} {
		if a.IsLoopback() || a.IsMulticast() || a.IsUnspecified() || a.IsLinkLocalUnicast() {
			return fmt.Errorf("%q holds %s, which is not a unicast address vipd can bind", s, a)
		}
	}
	return nil
}

// lastOf returns the last address of p.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
