package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgpproc"
	"github.com/vipd/vipd/monitor/status"
)

// bgpProgram is the name of the BGP speaker program, found beside the
// vipd executable unless [bgp] program says where.
const bgpProgram = "vipd-bgp"

// openAnnouncer returns what starts the BGP speaker of a configuration's
// [bgp] section: the program vipd-bgp, in vipd's network namespace,
// logging to vipd's standard error at vipd's level in its format.
func openAnnouncer(log *slog.Logger, logFormat string) func(context.Context, agent.AnnouncerOptions) (agent.Announcer, error) {
	return func(ctx context.Context, o agent.AnnouncerOptions) (agent.Announcer, error) {
		path := o.BGP.Program
		if path == "" {
			exe, err := os.Executable()
			if err != nil {
				return nil, fmt.Errorf("bgp: the speaker program: set [bgp] program: %w", err)
			}
			path = filepath.Join(filepath.Dir(exe), bgpProgram)
		}
		c, err := bgpproc.Start(ctx, bgpproc.ClientOptions{
			Program: path,
			Args:    []string{"--log-level", leastLevel(log).String(), "--log-format", logFormat},
			Options: bgpOptions(o.BGP),
			Logger:  log,
			OnPeer: func(p bgpproc.Peer) {
				if o.OnPeer != nil {
					o.OnPeer(agentPeer(p))
				}
			},
		})
		if err != nil {
			where := "(the default beside vipd; [bgp] program names another)"
			if o.BGP.Program != "" {
				where = "([bgp] program)"
			}
			return nil, fmt.Errorf("bgp: the speaker program %s %s: %w", path, where, err)
		}
		return speaker{c}, nil
	}
}

// bgpOptions maps the configuration's [bgp] section to the speaker's
// options.
func bgpOptions(b config.BGP) bgpproc.Options {
	out := bgpproc.Options{
		ASN: b.ASN, RouterID: b.RouterID, ListenPort: b.ListenPort,
		GracefulShutdown: b.GracefulShutdown, GracefulShutdownWait: b.GracefulShutdownWait, WithdrawWait: b.WithdrawWait,
	}
	for _, p := range b.Peers {
		out.Peers = append(out.Peers, bgpproc.PeerOptions{
			Address: p.Address, ASN: p.ASN, Port: p.Port, Source: p.Source, Password: p.Password, Multihop: p.Multihop,
			HoldTime: p.HoldTime, Keepalive: p.Keepalive, Passive: p.Passive, MaxPrefixes: p.MaxPrefixes,
			BFD: p.BFD, BFDInterval: p.BFDInterval, BFDMultiplier: p.BFDMultiplier,
		})
	}
	return out
}

// bgpAttrs maps the attributes of an announcement.
func bgpAttrs(a config.BGPAttrs) bgpproc.Attrs {
	out := bgpproc.Attrs{Communities: a.Communities, LocalPref: a.LocalPref, MED: a.MED, HasLocalPref: a.HasLocalPref, HasMED: a.HasMED}
	for _, c := range a.LargeCommunities {
		out.LargeCommunities = append(out.LargeCommunities, bgpproc.LargeCommunity{Global: c.Global, Local1: c.Local1, Local2: c.Local2})
	}
	return out
}

// speaker is the speaker program's client as the agent's Announcer.
type speaker struct{ *bgpproc.Client }

func (s speaker) Set(routes map[netip.Prefix]config.BGPAttrs) error {
	out := make(map[netip.Prefix]bgpproc.Attrs, len(routes))
	for p, a := range routes {
		out[p] = bgpAttrs(a)
	}
	return s.Client.Set(out)
}

func (s speaker) Peers() []agent.BGPPeer {
	ps := s.Client.Peers()
	out := make([]agent.BGPPeer, len(ps))
	for i, p := range ps {
		out[i] = agentPeer(p)
	}
	return out
}

func agentPeer(p bgpproc.Peer) agent.BGPPeer {
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
