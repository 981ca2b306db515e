package kubernetes

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	checkdesc "github.com/vipd/vipd/monitor/check"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// noNodePorts returns an error when svc is in nodeport mode and has a
// port without a nodePort, as spec.allocateLoadBalancerNodePorts false
// leaves them: that port gets no backends.
func noNodePorts(svc *corev1.Service, st settings) error {
	if st.mode != BackendsNodePort {
		return nil
	}
	var missing []string
	for _, p := range svc.Spec.Ports {
		if p.NodePort == 0 {
			name := p.Name
			if name == "" {
				name = strconv.Itoa(int(p.Port))
			}
			missing = append(missing, fmt.Sprintf("%s/%s", name, strings.ToLower(string(p.Protocol))))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	why := "it has no nodePort"
	if a := svc.Spec.AllocateLoadBalancerNodePorts; a != nil && !*a {
		why = "spec.allocateLoadBalancerNodePorts is false and it has no nodePort"
	}
	return allocErrorf(ReasonNoNodePorts, "port %s gets no backends in nodeport mode: %s (set %s: %s, or give it a nodePort)",
		strings.Join(missing, ", "), why, AnnotationBackends, BackendsEndpoints)
}

// keepPorts leaves out of vss the backends that droute or tunnel
// forwarding would reach at the wrong port (an endpoint that listens on
// another port than the Service's), and returns an error naming the
// first, with the file's message.
func keepPorts(vss []lb.VirtualService) error {
	var first error
	for i := range vss {
		vs := &vss[i]
		vs.Backends = slices.DeleteFunc(vs.Backends, func(d lb.Destination) bool {
			if d.Forward == lb.Masq || d.Addr.Port() == vs.Service.Key.Port {
				return false
			}
			if first == nil {
				first = allocErrorf(ReasonPortChange, "%s: %s forwarding cannot change the port (%d to %d): the backend sees the VIP's packet unchanged; endpoint %s left out",
					AnnotationForwarding, d.Forward, vs.Service.Key.Port, d.Addr.Port(), d.Addr)
			}
			return true
		})
	}
	return first
}

// servicesOf returns the virtual services of svc at the addresses it
// holds, with the health checking of those that have any, and warns of
// what it leaves out.
func (c *controller) servicesOf(svc *corev1.Service, held []netip.Addr, st settings, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) ([]lb.VirtualService, map[string]config.ServiceHealth) {
	vss := virtualServices(svc, held, st, nodes, eps)
	c.warn(svc, "ports", keepPorts(vss))
	c.warn(svc, "source-ranges", c.sourceRangesErr(svc))
	snat := false
	for i := range vss {
		vs := &vss[i]
		on := c.alloc.snat(vs.VIP)
		if st.snat != nil {
			on = *st.snat
		}
		// A pool's snat is for the Services that forward with masq:
		// direct routing and tunnels never see the replies.
		vs.SNAT = on && st.forward == lb.Masq
		snat = snat || vs.SNAT
	}
	if snat && c.s.opts.NoPacketFilter {
		c.warn(svc, "snat", allocErrorf(ReasonSNATUnavailable,
			"the Service asks for SNAT, and vipd keeps no packet-filter rules to do it ([daemon] manage_iptables is off): it is not served"))
		return nil, nil
	}
	c.warn(svc, "snat", nil)
	check, policy := st.check, checkdesc.Policy{}
	if check == nil {
		check, policy = c.s.opts.NodeHealth.check(svc, st), nodeHealthPolicy
	}
	if check == nil {
		return vss, nil
	}
	hs := make(map[string]config.ServiceHealth, len(vss))
	for _, vs := range vss {
		h := config.ServiceHealth{Policy: policy, Checks: make(map[netip.AddrPort]*checkdesc.Spec, len(vs.Backends))}
		for _, b := range vs.Backends {
			h.Checks[b.Addr] = check
		}
		hs[vs.Name] = h
	}
	return vss, hs
}

// settings are a Service's choices that are not about its address.
type settings struct {
	mode      string
	scheduler string
	flags     lb.SchedFlags
	// forward is the forwarding method of every backend.
	forward lb.Forward
	// check is the health check of every backend, from vipd.io/check.
	check *checkdesc.Spec
	// snat, from vipd.io/snat, says whether traffic to the backends
	// comes from the load balancer's address; nil leaves it to the pool.
	snat *bool
}

// settingsOf returns svc's backend mode and scheduler, from its
// annotations and the defaults. With a bad annotation it returns the
// Service's last valid settings (the defaults when it had none, as after
// a restart) and the error.
func (c *controller) settingsOf(svc *corev1.Service) (settings, error) {
	key := keyOf(svc)
	st, err := parseSettings(svc, c.s.opts.Backends)
	if err != nil {
		last, ok := c.lastGood[key]
		if !ok {
			last = settings{mode: c.s.opts.Backends, scheduler: config.DefaultScheduler, forward: lb.Masq}
		}
		return last, err
	}
	c.lastGood[key] = st
	return st, nil
}

// parseSettings validates svc's vipd.io/backends, vipd.io/scheduler,
// vipd.io/scheduler-flags, vipd.io/forwarding and vipd.io/check
// annotations, with the file's messages.
func parseSettings(svc *corev1.Service, defaultMode string) (settings, error) {
	st := settings{mode: defaultMode, scheduler: config.DefaultScheduler, forward: lb.Masq}
	if mode, ok := svc.Annotations[AnnotationBackends]; ok {
		if mode != BackendsNodePort && mode != BackendsEndpoints {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s %q must be %q or %q", AnnotationBackends, mode, BackendsNodePort, BackendsEndpoints)
		}
		st.mode = mode
	}
	if sched, ok := svc.Annotations[AnnotationScheduler]; ok {
		if !slices.Contains(lb.Schedulers, sched) {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: unknown scheduler %q (want one of %s)", AnnotationScheduler, sched, strings.Join(lb.Schedulers, " "))
		}
		st.scheduler = sched
	}
	if flags, ok := svc.Annotations[AnnotationSchedulerFlags]; ok {
		for _, f := range strings.Split(flags, ",") {
			f = strings.TrimSpace(f)
			flag, ok := lb.ParseSchedFlag(f)
			switch {
			case !ok:
				return settings{}, allocErrorf(ReasonBadAnnotation, "%s: unknown scheduler flag %q (want sh-fallback, sh-port, mh-fallback or mh-port)", AnnotationSchedulerFlags, f)
			case flag.Scheduler() != st.scheduler:
				return settings{}, allocErrorf(ReasonBadAnnotation, "%s: scheduler flag %q needs scheduler %q, not %q", AnnotationSchedulerFlags, f, flag.Scheduler(), st.scheduler)
			}
			st.flags |= flag
		}
	}
	if text, ok := svc.Annotations[AnnotationForwarding]; ok {
		fwd, err := config.ParseForward(text)
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: %v", AnnotationForwarding, err)
		}
		if st.mode == BackendsNodePort && fwd != lb.Masq {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: a nodeport service forwards with masq, not %s", AnnotationForwarding, fwd)
		}
		st.forward = fwd
	}
	if text, ok := svc.Annotations[AnnotationCheck]; ok {
		check, err := config.ParseCheck(text)
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: %v", AnnotationCheck, err)
		}
		// The check probes each backend's address. In endpoints mode
		// that is a pod, and a port of its own is the pod's; in
		// nodeport mode it is a Node, whose other ports are not the
		// Service's.
		if check != nil && check.Port != 0 && st.mode == BackendsNodePort {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: port %d: in nodeport mode the backends are the Nodes, and a check port would reach their other services (leave port out: the check probes the node port)", AnnotationCheck, check.Port)
		}
		st.check = check
	}
	if text, ok := svc.Annotations[AnnotationSNAT]; ok {
		on, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s %q must be \"true\" or \"false\"", AnnotationSNAT, truncate(text))
		}
		if on && st.forward != lb.Masq {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: SNAT needs masq forwarding, not %s", AnnotationSNAT, st.forward)
		}
		st.snat = &on
	}
	return st, nil
}

// ServiceName names the virtual service of one port and address of a
// Kubernetes Service: "k8s/NAMESPACE/NAME/PORT/PROTO", where PORT is the
// port's name, or its number when it has none; IPv6 addresses add
// "/ipv6", so that a dual-stack Service's two virtual services differ.
func ServiceName(svc *corev1.Service, p corev1.ServicePort, fam lb.Family) string {
	port := p.Name
	if port == "" {
		port = strconv.Itoa(int(p.Port))
	}
	name := fmt.Sprintf("k8s/%s/%s/%s/%s", svc.Namespace, svc.Name, port, strings.ToLower(string(p.Protocol)))
	if fam == lb.IPv6 {
		name += "/ipv6"
	}
	return name
}

// virtualServices maps a Service to its virtual services: one per port
// and address.
func virtualServices(svc *corev1.Service, addrs []netip.Addr, st settings, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) []lb.VirtualService {
	var out []lb.VirtualService
	// The Service's source ranges restrict every port of every VIP;
	// lb.Desired keeps the ranges of each VIP's family, and a VIP with
	// none of its family admits no source. A bad annotation admits none
	// at all (its error is for the caller's Event).
	allow, _ := sourceRanges(svc)
	for _, vip := range addrs {
		fam := lb.FamilyOf(vip)
		for _, p := range svc.Spec.Ports {
			proto, err := lb.ParseProto(string(p.Protocol))
			if err != nil {
				continue
			}
			vs := lb.VirtualService{
				Name: ServiceName(svc, p, fam),
				Service: lb.Service{
					Key:       lb.ServiceKey{Family: fam, Proto: proto, Addr: vip, Port: uint16(p.Port)},
					Scheduler: st.scheduler,
					Flags:     st.flags,
				},
				VIP:      vip,
				Announce: true,
				Allow:    allow,
			}
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				timeout := corev1.DefaultClientIPServiceAffinitySeconds
				if cfg := svc.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
					timeout = *cfg.ClientIP.TimeoutSeconds
				}
				vs.Service.Persistent = uint32(timeout)
				vs.Service.Netmask = 32
				if fam == lb.IPv6 {
					vs.Service.Netmask = 128
				}
			}
			if st.mode == BackendsEndpoints {
				vs.Backends = endpointBackends(p, fam, eps, st.forward)
			} else {
				vs.Backends = nodePortBackends(svc, p, fam, nodes, eps)
			}
			out = append(out, vs)
		}
	}
	return out
}

// sourceRanges returns the source prefixes svc admits:
// spec.loadBalancerSourceRanges, or when that is empty the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation
// (comma separated, as cloud providers read it); nil admits every source. The API
// server validates the field; an annotation with a range that does not
// parse, or either with more ranges than config.MaxAllow, admits no
// source (a list whose one prefix is invalid, see lb.VirtualService.Allow)
// and the error says why, as cloud providers refuse such a Service.
func sourceRanges(svc *corev1.Service) ([]netip.Prefix, error) {
	const annotation = "service.beta.kubernetes.io/load-balancer-source-ranges"
	// As many as the file's allow key takes.
	const maxSourceRanges = config.MaxAllow
	ranges, from := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(ranges) == 0 {
		v := strings.TrimSpace(svc.Annotations[annotation])
		if v == "" {
			return nil, nil
		}
		ranges, from = strings.Split(v, ","), annotation
	}
	none := []netip.Prefix{{}}
	if len(ranges) > maxSourceRanges {
		return none, allocErrorf(ReasonBadAnnotation, "%s has %d ranges, more than %d: no source is admitted", from, len(ranges), maxSourceRanges)
	}
	out := make([]netip.Prefix, 0, len(ranges))
	for _, r := range ranges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			if len(r) > 64 {
				r = r[:64] + "..."
			}
			return none, allocErrorf(ReasonBadAnnotation, "%s: %q is not a CIDR range: no source is admitted", from, r)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// sourceRangesErr says why svc's source ranges are not what it asks
// for: a bad annotation (no source is admitted), or no packet filter to
// enforce them (the Service is not served); nil when they are.
func (c *controller) sourceRangesErr(svc *corev1.Service) error {
	ranges, err := sourceRanges(svc)
	if err != nil {
		return err
	}
	if len(ranges) > 0 && c.s.opts.NoPacketFilter {
		return allocErrorf(ReasonSourceRangesUnenforceable,
			"the Service has source ranges, and vipd keeps no packet-filter rules to enforce them ([daemon] manage_iptables is off): it is not served")
	}
	return nil
}

// nodeReady reports whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// epReady reports whether an endpoint is ready (a nil Ready is), and
// epServingTerminating whether it is terminating but still serving.
func epReady(c discoveryv1.EndpointConditions) bool { return c.Ready == nil || *c.Ready }

func epServingTerminating(c discoveryv1.EndpointConditions) bool {
	return !epReady(c) && c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating
}

// nodePortBackends returns the Ready Nodes' internal addresses of family
// fam at p's nodePort, with weight 1. With externalTrafficPolicy Local it
// returns only the Nodes with a ready endpoint of the Service of family
// fam, each weighted by how many it has, so that a Node with three pods
// takes three times the connections of a Node with one; when no endpoint
// is ready, the Nodes with a serving and terminating one, weighted by
// those (KEP-1669: kube-proxy sends a Node's traffic to them then, so
// that a rollout of one replica does not go dark). Nodes labelled
// node.kubernetes.io/exclude-from-external-load-balancers are left out.
func nodePortBackends(svc *corev1.Service, p corev1.ServicePort, fam lb.Family, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) []lb.Destination {
	if p.NodePort == 0 {
		return nil
	}
	var local map[string]int
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		local = localEndpoints(fam, eps)
	}
	var out []lb.Destination
	for _, n := range nodes {
		weight := 1
		if local != nil {
			if weight = local[n.Name]; weight == 0 {
				continue
			}
		}
		if !nodeReady(n) {
			continue
		}
		if _, ok := n.Labels[corev1.LabelNodeExcludeBalancers]; ok {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || lb.FamilyOf(ip) != fam {
				continue
			}
			out = append(out, lb.Destination{Addr: netip.AddrPortFrom(ip.Unmap(), uint16(p.NodePort)), Weight: weight, Forward: lb.Masq})
			break
		}
	}
	return sortDests(out)
}

// maxNodeWeight bounds the weight of a Node: its count of local
// endpoints, beyond which the proportions no longer matter.
const maxNodeWeight = 1000

// localEndpoints counts the ready endpoints of family fam on each Node
// (those of every family when the Service has no EndpointSlice of fam:
// they still say where its pods run); when none is ready anywhere, the
// serving and terminating ones.
func localEndpoints(fam lb.Family, eps []*discoveryv1.EndpointSlice) map[string]int {
	want := discoveryv1.AddressTypeIPv4
	if fam == lb.IPv6 {
		want = discoveryv1.AddressTypeIPv6
	}
	if !slices.ContainsFunc(eps, func(es *discoveryv1.EndpointSlice) bool { return es.AddressType == want }) {
		want = ""
	}
	ready, terminating := map[string]map[string]bool{}, map[string]map[string]bool{}
	add := func(m map[string]map[string]bool, node string, addrs []string) {
		if m[node] == nil {
			m[node] = map[string]bool{}
		}
		for _, a := range addrs {
			m[node][a] = true
		}
	}
	for _, es := range eps {
		if want != "" && es.AddressType != want {
			continue
		}
		for _, ep := range es.Endpoints {
			switch {
			case ep.NodeName == nil || len(ep.Addresses) == 0:
			case epReady(ep.Conditions):
				add(ready, *ep.NodeName, ep.Addresses[:1])
			case epServingTerminating(ep.Conditions):
				add(terminating, *ep.NodeName, ep.Addresses[:1])
			}
		}
	}
	if len(ready) == 0 {
		ready = terminating
	}
	out := make(map[string]int, len(ready))
	for node, addrs := range ready {
		out[node] = min(len(addrs), maxNodeWeight)
	}
	return out
}

// endpointBackends returns the endpoints of port p of family fam,
// forwarded with fwd: ready ones with weight 1, serving and terminating
// ones with weight 0 (drained), others not at all. When none is ready,
// the serving and terminating ones get weight 1 (KEP-1669), so that a
// rollout of one replica does not go dark.
func endpointBackends(p corev1.ServicePort, fam lb.Family, eps []*discoveryv1.EndpointSlice, fwd lb.Forward) []lb.Destination {
	want := discoveryv1.AddressTypeIPv4
	if fam == lb.IPv6 {
		want = discoveryv1.AddressTypeIPv6
	}
	best := map[netip.AddrPort]int{}
	for _, es := range eps {
		if es.AddressType != want {
			continue
		}
		var port int32
		found := false
		for _, sp := range es.Ports {
			name, proto := "", corev1.ProtocolTCP
			if sp.Name != nil {
				name = *sp.Name
			}
			if sp.Protocol != nil {
				proto = *sp.Protocol
			}
			if name == p.Name && proto == p.Protocol && sp.Port != nil {
				port, found = *sp.Port, true
				break
			}
		}
		if !found {
			continue
		}
		for _, ep := range es.Endpoints {
			weight := -1
			cond := ep.Conditions
			switch {
			case epReady(cond):
				weight = 1
			case epServingTerminating(cond):
				weight = 0
			}
			if weight < 0 {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ap := netip.AddrPortFrom(ip.Unmap(), uint16(port))
				if w, ok := best[ap]; !ok || weight > w {
					best[ap] = weight
				}
			}
		}
	}
	// Without a ready endpoint, the serving and terminating ones carry
	// the traffic.
	anyReady := slices.Contains(slices.Collect(maps.Values(best)), 1)
	var out []lb.Destination
	for ap, w := range best {
		if !anyReady {
			w = 1
		}
		out = append(out, lb.Destination{Addr: ap, Weight: w, Forward: fwd})
	}
	return sortDests(out)
}

func sortDests(d []lb.Destination) []lb.Destination {
	slices.SortFunc(d, func(a, b lb.Destination) int { return a.Addr.Compare(b.Addr) })
	return d
}
