package kubernetes

import (
	"errors"
	"strings"

	"github.com/vipd/vipd/source"
	corev1 "k8s.io/api/core/v1"
)

// ReasonConflict is the reason of the Event on a Service whose virtual
// service the agent refused because another source owns its key or name.
const ReasonConflict = "Conflict"

// ReasonNoNodePorts is the reason of the Event on a Service in nodeport
// mode that has a port without a nodePort (spec.allocateLoadBalancerNodePorts
// false): that port gets no backends.
const ReasonNoNodePorts = "NoNodePorts"

// ReasonPortChange is the reason of the Event on a Service forwarded with
// droute or tunnel whose endpoints listen on another port than the
// Service's: those endpoints are left out, for those methods cannot
// change the port.
const ReasonPortChange = "PortChange"

// ReasonSNATUnavailable is the reason of the Event on a Service that asks
// for SNAT (vipd.io/snat, or its pool's snat) when vipd keeps no
// packet-filter rules ([daemon] manage_iptables off): nothing could do
// the SNAT, so the Service is not served rather than served with replies
// that bypass vipd.
const ReasonSNATUnavailable = "SNATUnavailable"

// ReasonSourceRangesUnenforceable is the reason of the Event on a Service
// with source ranges when vipd keeps no packet-filter rules ([daemon]
// manage_iptables off): nothing could enforce them, so the Service is not
// served rather than served to every source.
const ReasonSourceRangesUnenforceable = "SourceRangesUnenforceable"

// warnings are the subjects of a Service's warning Events, one lasting
// warning each: see warn.
var warnings = []string{"address", "settings", "nodeports", "ports", "source-ranges", "snat"}

// warn records a warning Event on svc about what (its "address" or its
// "settings"), once per distinct message; a nil err ends the warning.
func (c *controller) warn(svc *corev1.Service, what string, err error) {
	key := keyOf(svc) + " " + what
	if err == nil {
		delete(c.events, key)
		return
	}
	reason := "Error"
	var ae *AllocError
	if errors.As(err, &ae) {
		reason = ae.Reason
	}
	msg := reason + ": " + err.Error()
	if c.events[key] == msg {
		return
	}
	c.events[key] = msg
	c.s.log.Warn("kubernetes: "+err.Error(), "service", keyOf(svc), "reason", reason)
	c.event(svc, corev1.EventTypeWarning, reason, err.Error())
}

// event records an Event on svc when this instance leads: the others only
// log.
func (c *controller) event(svc *corev1.Service, kind, reason, msg string) {
	if c.leading() {
		c.recorder.Event(svc, kind, reason, msg)
	}
}

// noteConflicts makes an Event of each new refusal.
func (c *controller) noteConflicts(present map[string]*corev1.Service, conflicts []source.Conflict) {
	now := map[string]string{}
	for _, cf := range conflicts {
		now[cf.Service] = cf.Error()
		if c.conflicts[cf.Service] == cf.Error() {
			continue
		}
		c.s.log.Warn("kubernetes: "+cf.Error(), "service", cf.Service)
		parts := strings.SplitN(cf.Service, "/", 4)
		if len(parts) < 3 || parts[0] != "k8s" {
			continue
		}
		if svc := present[parts[1]+"/"+parts[2]]; svc != nil {
			c.event(svc, corev1.EventTypeWarning, ReasonConflict, cf.Error())
		}
	}
	c.conflicts = now
}
