package main

import (
	"context"
	"log/slog"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/ha/bgp"
)

// openAnnouncer returns what starts the BGP speaker of a configuration's
// [bgp] section, in vipd's network namespace.
func openAnnouncer(log *slog.Logger) func(context.Context, agent.AnnouncerOptions) (agent.Announcer, error) {
	return func(ctx context.Context, o agent.AnnouncerOptions) (agent.Announcer, error) {
		sp, err := bgp.Start(ctx, bgp.Options{BGP: o.BGP, Logger: log, OnPeer: func(p bgp.Peer) {
			if o.OnPeer != nil {
				o.OnPeer(agentPeer(p))
			}
		}})
		if err != nil {
			return nil, err
		}
		return speaker{sp}, nil
	}
}

// speaker is a bgp.Speaker as the agent's Announcer.
type speaker struct{ *bgp.Speaker }

func (s speaker) Peers() []agent.BGPPeer {
	ps := s.Speaker.Peers()
	out := make([]agent.BGPPeer, len(ps))
	for i, p := range ps {
		out[i] = agentPeer(p)
	}
	return out
}

func agentPeer(p bgp.Peer) agent.BGPPeer {
	return agent.BGPPeer{Address: p.Address, ASN: p.ASN, State: p.State, Established: p.Established(), Since: p.Since, Routes: p.Routes, Limited: p.Limited}
}
