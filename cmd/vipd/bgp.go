package main

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgp"
	"github.com/vipd/vipd/monitor/status"
)

// openAnnouncer returns what starts the BGP speaker of a configuration's
// [bgp] section, in vipd's network namespace.
func openAnnouncer(log *slog.Logger) func(context.Context, agent.AnnouncerOptions) (agent.Announcer, error) {
	return func(ctx context.Context, o agent.AnnouncerOptions) (agent.Announcer, error) {
		opts := bgpOptions(o.BGP)
		opts.Logger = log
		opts.OnPeer = func(p bgp.Peer) {
			if o.OnPeer != nil {
				o.OnPeer(agentPeer(p))
			}
		}
		sp, err := bgp.Start(ctx, opts)
		if err != nil {
			return nil, err
		}
		return speaker{sp}, nil
	}
}

// bgpOptions maps the configuration's [bgp] section to the speaker's
// options.
func bgpOptions(b config.BGP) bgp.Options {
	out := bgp.Options{
		ASN: b.ASN, RouterID: b.RouterID, ListenPort: b.ListenPort,
		GracefulShutdown: b.GracefulShutdown, GracefulShutdownWait: b.GracefulShutdownWait, WithdrawWait: b.WithdrawWait,
	}
	for _, p := range b.Peers {
		out.Peers = append(out.Peers, bgp.PeerOptions{
			Address: p.Address, ASN: p.ASN, Port: p.Port, Source: p.Source, Password: p.Password, Multihop: p.Multihop,
			HoldTime: p.HoldTime, Keepalive: p.Keepalive, Passive: p.Passive, MaxPrefixes: p.MaxPrefixes,
			BFD: p.BFD, BFDInterval: p.BFDInterval, BFDMultiplier: p.BFDMultiplier,
		})
	}
	return out
}

// bgpAttrs maps the attributes of an announcement.
func bgpAttrs(a config.BGPAttrs) bgp.Attrs {
	out := bgp.Attrs{Communities: a.Communities, LocalPref: a.LocalPref, MED: a.MED, HasLocalPref: a.HasLocalPref, HasMED: a.HasMED}
	for _, c := range a.LargeCommunities {
		out.LargeCommunities = append(out.LargeCommunities, bgp.LargeCommunity{Global: c.Global, Local1: c.Local1, Local2: c.Local2})
	}
	return out
}

// speaker is a bgp.Speaker as the agent's Announcer.
type speaker struct{ *bgp.Speaker }

func (s speaker) Set(routes map[netip.Prefix]config.BGPAttrs) error {
	out := make(map[netip.Prefix]bgp.Attrs, len(routes))
	for p, a := range routes {
		out[p] = bgpAttrs(a)
	}
	return s.Speaker.Set(out)
}

func (s speaker) Peers() []agent.BGPPeer {
	ps := s.Speaker.Peers()
	out := make([]agent.BGPPeer, len(ps))
	for i, p := range ps {
		out[i] = agentPeer(p)
	}
	return out
}

func agentPeer(p bgp.Peer) agent.BGPPeer {
	return agent.BGPPeer{Address: p.Address, ASN: p.ASN, State: p.State, Established: p.Established(), Since: p.Since, Routes: p.Routes, Limited: p.Limited,
		BFD: bfdStatus(p.BFDStatus)}
}

// bfdStatus maps a BFD session's status to vipd status's; nil without a
// session.
func bfdStatus(st *bfd.Status) *status.BFD {
	if st == nil {
		return nil
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	out := &status.BFD{
		State: st.State.String(), RemoteState: st.RemoteState.String(), Since: st.Since, Downs: st.Downs,
		TxInterval: ms(st.TxInterval), RxInterval: ms(st.RxInterval), DetectMult: st.DetectMult, RemoteDetectMult: st.RemoteDetectMult,
		DetectionTime: ms(st.DetectionTime), Received: st.Packets.Received, Sent: st.Packets.Sent,
		Dropped: status.BFDDropped{TTL: st.Packets.LowTTL, Malformed: st.Packets.Malformed, Discriminator: st.Packets.WrongDisc},
	}
	if st.LastDown != bfd.DiagNone {
		out.LastDown = st.LastDown.String()
	}
	return out
}
