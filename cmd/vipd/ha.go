package main

import (
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/ha/vrrp"
)

// openElector returns what opens the VRRP virtual router of a
// configuration's [ha] section, in vipd's network namespace.
func openElector(log *slog.Logger) func(agent.ElectorOptions) (agent.Elector, error) {
	return func(o agent.ElectorOptions) (agent.Elector, error) {
		h := o.HA
		if h.Mode != "vrrp" {
			return nil, fmt.Errorf("mode %q: vipd speaks vrrp", h.Mode)
		}
		r, err := vrrp.New(vrrp.Options{
			Interface:     h.Interface,
			VRID:          h.VRID,
			Priority:      h.Priority,
			Interval:      uint16(h.Interval / (10 * time.Millisecond)),
			Preempt:       h.Preempt,
			PreemptDelay:  h.PreemptDelay,
			StartAsMaster: o.StartAsMaster,
			Addrs:         o.Addrs,
			Peers:         h.Peers,
			Source:        h.Source,
			Logger:        log.With("vrid", h.VRID),
			OnTransition: func(t vrrp.Transition) {
				o.Report(agent.RoleChange{Master: t.To == vrrp.Master, Reason: t.Reason, Cause: string(t.Cause), MasterAddr: t.Master})
			},
			OnReassert: o.Reassert,
		})
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

// linkUp reports whether an interface is up with a carrier (or, as a
// dummy or loopback interface, has no carrier to lose).
func linkUp(name string) (bool, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return false, err
	}
	a := l.Attrs()
	if a.Flags&net.FlagUp == 0 {
		return false, nil
	}
	return a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown, nil
}
