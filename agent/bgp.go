package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
)

// Announcer announces routes to the node's VIPs to the network's routers
// (BGP: package ha/bgp). With one, every node binds every VIP and serves
// it; the routers spread the flows over the nodes that announce it.
type Announcer interface {
	// Set announces exactly routes, host routes with their attributes,
	// and withdraws the rest (level-triggered).
	Set(routes map[netip.Prefix]config.BGPAttrs) error
	// Retire withdraws every route gracefully (GRACEFUL_SHUTDOWN and
	// its wait first, when configured); a later Set announces again.
	Retire(ctx context.Context) error
	// Stop retires, waits while the routers converge, and ends the
	// sessions.
	Stop(ctx context.Context) error
	// Peers returns the state of the sessions.
	Peers() []BGPPeer
}

// BGPPeer is the state of one session of an Announcer.
type BGPPeer struct {
	Address netip.Addr
	ASN     uint32
	// State is the session's state (RFC 4271); Established when up.
	State       string
	Established bool
	// Since is when the session entered State.
	Since time.Time
	// Routes is the number of routes announced to the peer.
	Routes int
	// Limited is when the peer last sent more routes than its
	// max_prefixes allows and was cut; zero if never.
	Limited time.Time
	// BFD is the peer's BFD session as vipd status shows it, nil
	// without one. OnPeer's peers may lack it.
	BFD *status.BFD
}

// AnnouncerOptions are what the agent gives OpenAnnouncer.
type AnnouncerOptions struct {
	// BGP is the configuration's [bgp] section.
	BGP config.BGP
	// OnPeer is called on every change of a session's state, from any
	// goroutine; it does not block.
	OnPeer func(BGPPeer)
}

// Why a VIP is not announced, for vipd status (withheldLinkDown is
// followed by the interfaces).
const (
	withheldNoBackend = "no backend serves"
	withheldDrained   = "node drained"
	withheldLinkDown  = "interface down: "
)

// bgpState is the agent's side of BGP.
type bgpState struct {
	an  Announcer
	cfg config.BGP
	// drained says an operator took the node out (DrainNode).
	drained bool
	// linksDown are the interfaces of track_interfaces found down or
	// missing at the last look (trackBGPLinks): while there is one, the
	// node announces nothing.
	linksDown []string
	// stopped says the announcer was stopped.
	stopped bool
	// routes are the routes last handed to the announcer, withheld the
	// VIPs left out and why.
	routes   map[netip.Prefix]config.BGPAttrs
	withheld map[netip.Prefix]string
	// basis is what routes were computed from: the configuration, and
	// the number of kernel changes the agent had seen (Agent.changes).
	basis struct {
		cfg     *config.Config
		changes uint64
		valid   bool
	}
}

// openBGP starts the announcer when cfg has a [bgp] section.
func (a *Agent) openBGP(ctx context.Context, cfg *config.Config) error {
	if !cfg.BGP.Enabled {
		return nil
	}
	if a.opts.OpenAnnouncer == nil {
		return fmt.Errorf("%s: [bgp]: this vipd has no BGP speaker", cfg.File)
	}
	b := &bgpState{cfg: cfg.BGP, drained: a.nodeDrained(cfg)}
	m, stats := a.m, a.stats
	for _, p := range cfg.BGP.Peers {
		m.BGPPeer(p.Address.String(), false)
	}
	m.BGPDrained(b.drained)
	an, err := a.opts.OpenAnnouncer(ctx, AnnouncerOptions{BGP: cfg.BGP, OnPeer: func(p BGPPeer) {
		m.BGPPeer(p.Address.String(), p.Established)
		stats.Invalidate()
	}})
	if err != nil {
		return fmt.Errorf("[bgp]: %w", err)
	}
	b.an = an
	a.bgp = b
	if b.drained {
		a.log.Info("bgp: the node is drained and announces nothing (vipd undrain --node puts it back)")
	}
	return nil
}

// announce hands the announcer the routes the desired state asks for,
// when what they depend on changed since the last call: the
// configuration, a pass that changed the kernel, or a drain of the node.
// A VIP is announced while a service on it has a backend that serves
// (weight above 0 once health and drains are applied), with the
// attributes of the first such service in configuration order.
func (a *Agent) announce() {
	b := a.bgp
	if b == nil || b.stopped || b.basis.valid && b.basis.cfg == a.cfg && b.basis.changes == a.changes {
		return
	}
	if b.basis.cfg != a.cfg {
		// A reload may have changed track_interfaces.
		a.bgpLinksDown()
	}
	b.basis.cfg, b.basis.changes, b.basis.valid = a.cfg, a.changes, true
	routes, withheld := bgpRoutes(a.planned(a.cfg), a.cfg.BGP, b.drained, b.linksDown)
	a.setRoutes(routes, withheld, "")
}

// trackBGPLinks looks at the interfaces of [bgp] track_interfaces, at
// every link message and every second: when one goes down (or missing),
// the node withdraws every route at once, without GRACEFUL_SHUTDOWN (it
// can no longer serve them); when all are up again, it announces them
// again. The withdrawal, as every change of the routes, is made by the
// next announce.
func (a *Agent) trackBGPLinks() {
	b := a.bgp
	if b == nil || b.stopped {
		return
	}
	if a.bgpLinksDown() {
		b.basis.valid = false
	}
}

// bgpLinksDown looks at the interfaces of [bgp] track_interfaces and
// records those down or missing; it reports whether they changed.
func (a *Agent) bgpLinksDown() bool {
	b := a.bgp
	if a.opts.LinkUp == nil {
		return false
	}
	var down []string
	for _, name := range a.cfg.BGP.TrackInterfaces {
		if up, err := a.opts.LinkUp(name); err != nil || !up {
			down = append(down, name)
		}
	}
	if slices.Equal(down, b.linksDown) {
		return false
	}
	if len(down) > 0 {
		a.log.Warn("bgp: tracked interface down; withdrawing every route", "interfaces", down)
	} else {
		a.log.Info("bgp: tracked interfaces up; announcing the routes again")
	}
	b.linksDown = down
	return true
}

// setRoutes hands routes to the announcer and records what changed; a
// route withdrawn for why, when why is set, counts with that reason.
func (a *Agent) setRoutes(routes map[netip.Prefix]config.BGPAttrs, withheld map[netip.Prefix]string, why string) {
	b := a.bgp
	announced := 0
	for p, attrs := range routes {
		if old, ok := b.routes[p]; !ok || !old.Equal(attrs) {
			announced++
		}
	}
	withdrawn := map[string]int{}
	for p := range b.routes {
		if _, ok := routes[p]; ok {
			continue
		}
		reason := why
		switch {
		case reason != "":
		case withheld[p] == withheldDrained:
			reason = metrics.WithdrawDrained
		case withheld[p] == withheldNoBackend:
			reason = metrics.WithdrawNoBackend
		case strings.HasPrefix(withheld[p], withheldLinkDown):
			reason = metrics.WithdrawInterfaceDown
		default:
			reason = metrics.WithdrawRemoved
		}
		withdrawn[reason]++
		a.log.Info("bgp: route withdrawn", "route", p, "reason", reason)
	}
	for p := range routes {
		if _, ok := b.routes[p]; !ok {
			a.log.Info("bgp: route announced", "route", p)
		}
	}
	if err := b.an.Set(routes); err != nil {
		a.log.Error("bgp: announcing the routes failed; the next change tries again", "err", err)
		b.basis.valid = false
	}
	if announced > 0 || len(withdrawn) > 0 || !maps.Equal(withheld, b.withheld) {
		a.stats.Invalidate()
	}
	b.routes, b.withheld = routes, withheld
	a.m.BGPRoutes(len(routes), announced, withdrawn)
}

// bgpRoutes returns the host routes of spec's VIPs that a service can
// serve, with their attributes, and why the others are left out: none
// while the node is drained or a tracked interface is down (linksDown).
func bgpRoutes(spec *lb.Spec, cfg config.BGP, drained bool, linksDown []string) (map[netip.Prefix]config.BGPAttrs, map[netip.Prefix]string) {
	routes := map[netip.Prefix]config.BGPAttrs{}
	withheld := map[netip.Prefix]string{}
	for i := range spec.Services {
		vs := &spec.Services[i]
		if !vs.VIP.IsValid() || vs.NodePort {
			continue
		}
		p := netip.PrefixFrom(vs.VIP, vs.VIP.BitLen())
		if _, ok := routes[p]; ok {
			continue
		}
		switch {
		case drained:
			withheld[p] = withheldDrained
		case len(linksDown) > 0:
			withheld[p] = withheldLinkDown + strings.Join(linksDown, ", ")
		case slices.ContainsFunc(vs.Backends, func(d lb.Destination) bool { return d.Weight > 0 }):
			routes[p] = cfg.Attrs(vs.Name)
			delete(withheld, p)
		default:
			withheld[p] = withheldNoBackend
		}
	}
	return routes, withheld
}

// stopBGP withdraws the node's routes and ends its sessions, as a
// graceful stop does: GRACEFUL_SHUTDOWN and its wait when configured,
// the withdrawal, withdraw_wait, then the sessions' end.
func (a *Agent) stopBGP() {
	b := a.bgp
	if b == nil || b.stopped {
		return
	}
	b.stopped = true
	wait := b.cfg.WithdrawWait + 5*time.Second
	if b.cfg.GracefulShutdown {
		wait += b.cfg.GracefulShutdownWait
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	n := len(b.routes)
	start := time.Now()
	if err := b.an.Stop(ctx); err != nil {
		a.log.Warn("bgp: stop", "err", err)
	}
	a.m.BGPRoutes(0, 0, map[string]int{metrics.WithdrawStopping: n})
	b.routes = nil
	a.log.Info("bgp: routes withdrawn and sessions ended", "routes", n, "took", time.Since(start).Round(time.Millisecond))
}

// drainBGP drains or undrains a node that announces its VIPs over BGP.
func (a *Agent) drainBGP(ctx context.Context, on bool) error {
	b := a.bgp
	if on == b.drained {
		if on {
			return errors.New("the node is drained already")
		}
		return errors.New("the node is not drained")
	}
	path := filepath.Join(a.cfg.Daemon.StateDir, drainedFile)
	if on {
		if err := ledger.WriteFile(path, []byte("drained by vipd drain --node\n"), 0o640); err != nil {
			return fmt.Errorf("drain the node: %w", err)
		}
		// The graceful part (GRACEFUL_SHUTDOWN and its wait) first; the
		// Set below records the withdrawal.
		if err := b.an.Retire(ctx); err != nil {
			a.log.Warn("bgp: retire", "err", err)
		}
		b.drained = true
		a.log.Info("bgp: node drained; it announces no VIP")
	} else {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("undrain the node: %w", err)
		}
		b.drained = false
		a.log.Info("bgp: node undrained; it announces its VIPs again")
	}
	a.m.BGPDrained(b.drained)
	b.basis.valid = false
	a.announce()
	return nil
}

// bgpStatus is the node's announcements for vipd status.
func (a *Agent) bgpStatus() *status.BGP {
	b := a.bgp
	if b == nil {
		return nil
	}
	out := &status.BGP{ASN: b.cfg.ASN, RouterID: b.cfg.RouterID.String(), Drained: b.drained, Announced: []string{}}
	for _, p := range b.an.Peers() {
		out.Peers = append(out.Peers, status.BGPPeer{Address: p.Address.String(), ASN: p.ASN, State: p.State, Since: p.Since, Routes: p.Routes, Limited: p.Limited, BFD: p.BFD})
	}
	for _, p := range slices.SortedFunc(maps.Keys(b.routes), netip.Prefix.Compare) {
		out.Announced = append(out.Announced, p.String())
	}
	for _, p := range slices.SortedFunc(maps.Keys(b.withheld), netip.Prefix.Compare) {
		out.Withheld = append(out.Withheld, status.BGPWithheld{Route: p.String(), Reason: b.withheld[p]})
	}
	return out
}
