package main

import (
	"fmt"
	"log/slog"
	"time"

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
			RejoinDelay:   h.SyncCatchUp,
			StartAsMaster: o.StartAsMaster,
			// The router stands back without a carrier, and comes
			// back, by its own link messages: the agent's main loop
			// is no hop on a returning master's way.
			CarrierFault: true,
			Addrs:        o.Addrs,
			Peers:        h.Peers,
			Source:       h.Source,
			Logger:       log.With("vrid", h.VRID),
			OnTransition: func(t vrrp.Transition) {
				o.Report(agent.RoleChange{Master: t.To == vrrp.Master, Reason: t.Reason, Cause: string(t.Cause), MasterAddr: t.Master, At: t.At, Late: t.Late,
					MasterDown: t.Cause == vrrp.CauseMasterDown})
			},
			OnReassert: o.Reassert,
			OnSuspect:  o.Suspect,
		})
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}
