// Package bgp announces vipd's VIPs to the network's routers over BGP, so
// that they spread the flows over every node that serves them (ECMP). It
// embeds GoBGP (github.com/osrg/gobgp/v3) as a library and keeps it
// behind a small API: Start, Set (the routes to announce, as a whole),
// Peers, Retire and Stop. No other package of vipd imports GoBGP.
//
// Each IPv4 route goes to the IPv4 peers and each IPv6 route to the IPv6
// peers, with the session's local address as the next hop.
//
// vipd is no router: it needs no route from its peers and passes none on.
// Its import policy takes nothing a peer sends (the spirit of RFC 8212),
// so its RIB holds its own host routes alone; its export policy sends
// only the host routes it announces itself, so that a route of one peer
// never reaches another, even between routers of different ASes. GoBGP
// still keeps what each peer sent, before the import policy, for as long
// as the session lasts (its adj-rib-in): each peer's max_prefixes bounds
// that. A peer that sends more routes of a family is sent a Cease
// (Maximum Number of Prefixes Reached, RFC 4486), what it sent is
// dropped, a warning is logged, and the session stays down for
// Options.MaxPrefixesHold before vipd connects again.
//
// A peer with BFD (PeerOptions.BFD) also gets a single-hop BFD session
// (package ha/bfd), so that a router that runs BFD for the BGP session
// drops a node that dies within BFD's detection time rather than its
// hold time; when that BFD session fails while the BGP session is
// established, the speaker resets the BGP session (see resetOnBFD).
package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"

	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgpproc"
)

// Options configure a Speaker: its settings, which are package
// ha/bgpproc's (the daemon hands them to vipd-bgp), with the logger and
// the callback of the process it runs in.
type Options struct {
	bgpproc.Options
	// Logger receives the speaker's log and GoBGP's; nil discards it.
	Logger *slog.Logger
	// OnPeer is called, from GoBGP's goroutine, on every change of a
	// peer's session state. It must not block.
	OnPeer func(Peer)
}

// The data types are package ha/bgpproc's, which the daemon uses without
// linking GoBGP.
type (
	// PeerOptions configure the session with one peer.
	PeerOptions = bgpproc.PeerOptions
	// Attrs are the attributes of an announcement.
	Attrs = bgpproc.Attrs
	// LargeCommunity is an RFC 8092 community.
	LargeCommunity = bgpproc.LargeCommunity
	// Peer is the state of one session.
	Peer = bgpproc.Peer
)

// Speaker is a BGP speaker that announces a set of host routes.
type Speaker struct {
	opts Options
	log  *slog.Logger
	s    *server.BgpServer

	// mu guards routes and stopped; Set, Retire and Stop hold it for
	// their whole run, waits included, so that they do not interleave.
	mu sync.Mutex
	// routes are the routes announced, with the UUIDs GoBGP gave them.
	routes map[netip.Prefix]route
	// stopped says Stop ran.
	stopped bool
	// n4 and n6 count the IPv4 and IPv6 routes, for Peers, which does
	// not wait for a Retire or a Stop.
	n4, n6 atomic.Int64

	// pmu guards peers, limited and closing.
	pmu   sync.Mutex
	peers map[netip.Addr]*Peer
	// limited are the peers held down for sending too many routes.
	limited map[netip.Addr]bool
	// closing says Stop began: no peer is held down any more. done is
	// closed then, and holds waits for the hold-downs to end.
	closing bool
	done    chan struct{}
	holds   sync.WaitGroup

	// bfd runs the peers' BFD sessions; nil when no peer has one.
	bfd *bfd.Speaker
}

// DefaultMaxPrefixesHold is how long a peer that sent more routes than
// its max_prefixes stays down.
const DefaultMaxPrefixesHold = time.Minute

// DefaultMaxPrefixes is a peer's MaxPrefixes when it has none.
const DefaultMaxPrefixes = 1000

type route struct {
	attrs Attrs
	uuid  []byte
	// gshut says the route carries GRACEFUL_SHUTDOWN (Retire).
	gshut bool
}

// Start starts a speaker: it runs GoBGP with opts' identity and adds the
// peers, which it connects to (or waits for, passive ones).
func Start(ctx context.Context, opts Options) (*Speaker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ConnectRetry == 0 {
		opts.ConnectRetry = 5 * time.Second
	}
	if opts.MaxPrefixesHold == 0 {
		opts.MaxPrefixesHold = DefaultMaxPrefixesHold
	}
	b := opts
	if !b.RouterID.Is4() {
		return nil, fmt.Errorf("router id %s is not an IPv4 address", b.RouterID)
	}
	sp := &Speaker{opts: opts, log: opts.Logger, routes: map[netip.Prefix]route{}, peers: map[netip.Addr]*Peer{},
		limited: map[netip.Addr]bool{}, done: make(chan struct{})}
	sp.s = server.NewBgpServer(server.LoggerOption(&logger{l: opts.Logger, onLimit: sp.overLimit}))
	go sp.s.Serve()
	port := int32(b.ListenPort)
	if port == 0 {
		port = -1 // GoBGP listens on 179 for 0
	}
	if err := sp.s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: b.ASN, RouterId: b.RouterID.String(), ListenPort: port,
	}}); err != nil {
		sp.s.Stop()
		return nil, fmt.Errorf("start bgp: %w", err)
	}
	// The policies are in place before any peer is added, so that no
	// route is taken or passed on in between.
	if err := sp.policies(ctx); err != nil {
		sp.s.Stop()
		return nil, err
	}
	for _, p := range b.Peers {
		sp.peers[p.Address] = &Peer{Address: p.Address, ASN: p.ASN, State: "idle"}
		if p.BFD {
			sp.peers[p.Address].BFD = bfd.Down.String()
		}
	}
	// The watch is in place before the peers are added, so that no
	// change of state is missed.
	if err := sp.s.WatchEvent(ctx, &api.WatchEventRequest{Peer: &api.WatchEventRequest_Peer{}}, sp.peerEvent); err != nil {
		sp.s.Stop()
		return nil, fmt.Errorf("watch bgp peers: %w", err)
	}
	for _, p := range b.Peers {
		if err := sp.s.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(p, opts.ConnectRetry)}); err != nil {
			sp.s.Stop()
			return nil, fmt.Errorf("bgp peer %s: %w", p.Address, err)
		}
	}
	if err := sp.startBFD(); err != nil {
		sp.s.Stop()
		return nil, err
	}
	sp.log.Info("bgp: started", "asn", b.ASN, "router_id", b.RouterID, "listen_port", b.ListenPort, "peers", len(b.Peers))
	return sp, nil
}

// startBFD starts the BFD sessions of the peers that have one.
func (sp *Speaker) startBFD() error {
	var peers []bfd.PeerOptions
	for _, p := range sp.opts.Peers {
		if p.BFD {
			peers = append(peers, bfd.PeerOptions{Address: p.Address, Source: p.Source,
				Config: bfd.Config{Interval: p.BFDInterval, DetectMult: p.BFDMultiplier}})
		}
	}
	if len(peers) == 0 {
		return nil
	}
	b, err := bfd.Start(bfd.Options{Peers: peers, Port: sp.opts.BFDPort, Logger: sp.log, OnChange: sp.bfdChange})
	if err != nil {
		return err
	}
	sp.bfd = b
	return nil
}

// bfdChange is called, from the BFD speaker's goroutine, on every change
// of a BFD session's state; when resetOnBFD says so, the BGP session
// with that peer is reset at once.
func (sp *Speaker) bfdChange(addr netip.Addr, ch bfd.Change) {
	sp.pmu.Lock()
	p, ok := sp.peers[addr]
	if !ok {
		sp.pmu.Unlock()
		return
	}
	p.BFD = ch.To.String()
	cp := sp.peerCopy(p)
	reset := resetOnBFD(*p, ch) && !sp.closing
	if reset {
		sp.holds.Add(1)
	}
	sp.pmu.Unlock()
	if sp.opts.OnPeer != nil {
		sp.opts.OnPeer(cp)
	}
	if !reset {
		return
	}
	go func() {
		defer sp.holds.Done()
		sp.log.Warn("bgp: BFD session down; resetting the BGP session", "peer", addr, "diag", ch.Diag)
		if err := sp.s.ResetPeer(context.Background(), &api.ResetPeerRequest{Address: addr.String(),
			Communication: "BFD session down: " + ch.Diag.String()}); err != nil {
			sp.log.Warn("bgp: reset the session after BFD went down", "peer", addr, "err", err)
		}
	}()
}

// resetOnBFD reports whether a change of the BFD session with peer p
// resets p's BGP session: when the BFD session failed (silence, or the
// peer saw it fail; not when the peer took it down on purpose, RFC 5882
// §3.2) while the BGP session is established.
//
// A router that runs BFD for its BGP session has dropped the session and
// the node's routes when BFD fails (that is what it runs BFD for), so
// vipd's side of the session is dead too: a reset lets the two connect
// again as soon as the path is back, instead of after the hold time (90
// s by default; vipd may not listen, and then only it can connect), and
// vipd status says what the router sees. A BGP session that is not
// established is left alone: a router such as bird starts a new BFD
// session with each BGP session and drops the old one, which vipd then
// sees fail; resetting the BGP session being set up then would only
// delay it, again and again.
func resetOnBFD(p Peer, ch bfd.Change) bool {
	return ch.Failed() && p.Established()
}

// The names of the policy vipd gives GoBGP and of its defined sets.
const (
	ownPolicy = "vipd-own-host-routes"
	hostSet4  = "vipd-host-routes-v4"
	hostSet6  = "vipd-host-routes-v6"
)

// policies installs the import and export policies: both accept the
// host routes vipd announces itself (GoBGP puts those through the global
// import policy too) and reject every other route.
func (sp *Speaker) policies(ctx context.Context) error {
	for _, ds := range []*api.DefinedSet{
		{DefinedType: api.DefinedType_PREFIX, Name: hostSet4, Prefixes: []*api.Prefix{{IpPrefix: "0.0.0.0/0", MaskLengthMin: 32, MaskLengthMax: 32}}},
		{DefinedType: api.DefinedType_PREFIX, Name: hostSet6, Prefixes: []*api.Prefix{{IpPrefix: "::/0", MaskLengthMin: 128, MaskLengthMax: 128}}},
	} {
		if err := sp.s.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds}); err != nil {
			return fmt.Errorf("bgp policy: defined set %s: %w", ds.Name, err)
		}
	}
	var stmts []*api.Statement
	for _, set := range []string{hostSet4, hostSet6} {
		stmts = append(stmts, &api.Statement{
			Name: ownPolicy + "-" + set[len(set)-2:],
			Conditions: &api.Conditions{
				RouteType: api.Conditions_ROUTE_TYPE_LOCAL,
				PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set},
			},
			Actions: &api.Actions{RouteAction: api.RouteAction_ACCEPT},
		})
	}
	if err := sp.s.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{Name: ownPolicy, Statements: stmts}}); err != nil {
		return fmt.Errorf("bgp policy %s: %w", ownPolicy, err)
	}
	for _, dir := range []api.PolicyDirection{api.PolicyDirection_IMPORT, api.PolicyDirection_EXPORT} {
		if err := sp.s.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Name: "global", Direction: dir, Policies: []*api.Policy{{Name: ownPolicy}}, DefaultAction: api.RouteAction_REJECT,
		}}); err != nil {
			return fmt.Errorf("bgp policy: assign %s: %w", dir, err)
		}
	}
	return nil
}

// apiPeer returns GoBGP's form of a configured peer.
func apiPeer(p PeerOptions, retry time.Duration) *api.Peer {
	family := &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	if p.Address.Is6() {
		family.Afi = api.Family_AFI_IP6
	}
	out := &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, AuthPassword: p.Password},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime: uint64(p.HoldTime / time.Second), KeepaliveInterval: uint64(p.Keepalive / time.Second),
			ConnectRetry: uint64(max(retry/time.Second, 1)),
			// After a reset (a BFD session down) vipd connects again
			// as soon as it would after a failed attempt, not after
			// GoBGP's 30 s.
			IdleHoldTimeAfterReset: uint64(max(retry/time.Second, 1)),
		}},
		Transport: &api.Transport{PassiveMode: p.Passive, RemotePort: uint32(p.Port)},
		AfiSafis: []*api.AfiSafi{{
			Config:       &api.AfiSafiConfig{Family: family, Enabled: true},
			PrefixLimits: &api.PrefixLimit{Family: family, MaxPrefixes: maxPrefixes(p), ShutdownThresholdPct: limitWarnPct},
		}},
	}
	if p.Source.IsValid() {
		out.Transport.LocalAddress = p.Source.String()
	}
	if p.Multihop > 0 {
		out.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.Multihop)}
	}
	return out
}

// limitWarnPct is the share of max_prefixes past which GoBGP warns.
const limitWarnPct = 80

// maxPrefixes returns p's max_prefixes, the default if unset: never
// GoBGP's 0, no limit.
func maxPrefixes(p PeerOptions) uint32 {
	if p.MaxPrefixes == 0 {
		return DefaultMaxPrefixes
	}
	return p.MaxPrefixes
}

// overLimit is called, from GoBGP's goroutine, when GoBGP logs that a
// peer sent more routes of family than its limit allows (crossed) or
// more than limitWarnPct of it. When crossed GoBGP has sent the Cease,
// ends the session and keeps the peer down (its state "prefix count",
// until the peer is enabled again); overLimit logs it and enables the
// peer after MaxPrefixesHold.
func (sp *Speaker) overLimit(key, family string, crossed bool) {
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return
	}
	addr = addr.Unmap()
	var cfg PeerOptions
	for _, p := range sp.opts.Peers {
		if p.Address == addr {
			cfg = p
		}
	}
	if !cfg.Address.IsValid() {
		return
	}
	if !crossed {
		sp.log.Warn("bgp: peer sent more than "+strconv.Itoa(limitWarnPct)+"% of max_prefixes", "peer", addr, "asn", cfg.ASN,
			"max_prefixes", maxPrefixes(cfg), "family", family)
		return
	}
	sp.pmu.Lock()
	defer sp.pmu.Unlock()
	if sp.closing || sp.limited[addr] {
		return
	}
	sp.limited[addr] = true
	if p := sp.peers[addr]; p != nil {
		p.Limited = time.Now()
	}
	sp.log.Warn("bgp: peer sent more routes than max_prefixes; session closed", "peer", addr, "asn", cfg.ASN,
		"max_prefixes", maxPrefixes(cfg), "family", family, "hold", sp.opts.MaxPrefixesHold)
	sp.holds.Add(1)
	go sp.holdDown(addr)
}

// holdDown lets a peer that sent too many routes connect again after
// MaxPrefixesHold (not after Stop): GoBGP keeps it down until then.
func (sp *Speaker) holdDown(addr netip.Addr) {
	defer sp.holds.Done()
	defer func() {
		sp.pmu.Lock()
		delete(sp.limited, addr)
		sp.pmu.Unlock()
	}()
	t := time.NewTimer(sp.opts.MaxPrefixesHold)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sp.done:
		return
	}
	if err := sp.s.EnablePeer(context.Background(), &api.EnablePeerRequest{Address: addr.String()}); err != nil {
		sp.log.Warn("bgp: enable a peer after its max_prefixes hold-down", "peer", addr, "err", err)
		return
	}
	sp.log.Info("bgp: peer's max_prefixes hold-down over; connecting again", "peer", addr)
}

// peerEvent records a change of a peer's state.
func (sp *Speaker) peerEvent(r *api.WatchEventResponse) {
	ev := r.GetPeer()
	if ev == nil || ev.Type != api.WatchEventResponse_PeerEvent_STATE || ev.Peer == nil || ev.Peer.State == nil {
		return
	}
	addr, err := netip.ParseAddr(ev.Peer.State.NeighborAddress)
	if err != nil {
		return
	}
	if ev.Peer.State.AdminState == api.PeerState_PFX_CT {
		// The peer's state says it crossed its limit, whether or not
		// GoBGP's log line (overLimit's usual caller) said so first:
		// the hold-down must not hang on a log message's wording.
		sp.overLimit(addr.Unmap().String(), "", true)
	}
	state := sessionState(ev.Peer.State.SessionState)
	sp.pmu.Lock()
	p, ok := sp.peers[addr.Unmap()]
	if !ok || p.State == state {
		sp.pmu.Unlock()
		return
	}
	from := p.State
	p.State, p.Since = state, time.Now()
	cp := sp.peerCopy(p)
	sp.pmu.Unlock()
	level := slog.LevelDebug
	if from == "established" || state == "established" {
		level = slog.LevelInfo
	}
	sp.log.Log(context.Background(), level, "bgp: session state", "peer", addr, "asn", p.ASN, "from", from, "to", state)
	if sp.opts.OnPeer != nil {
		sp.opts.OnPeer(cp)
	}
}

// sessionState names GoBGP's session states as RFC 4271 does.
func sessionState(s api.PeerState_SessionState) string {
	switch s {
	case api.PeerState_IDLE:
		return "idle"
	case api.PeerState_CONNECT:
		return "connect"
	case api.PeerState_ACTIVE:
		return "active"
	case api.PeerState_OPENSENT:
		return "opensent"
	case api.PeerState_OPENCONFIRM:
		return "openconfirm"
	case api.PeerState_ESTABLISHED:
		return "established"
	}
	return "unknown"
}

// Peers returns the state of every peer, in address order.
func (sp *Speaker) Peers() []Peer {
	// The BFD sessions' status first: the BFD speaker calls bfdChange,
	// which takes pmu, and Session takes the BFD speaker's lock.
	bfds := map[netip.Addr]bfd.Status{}
	if sp.bfd != nil {
		for _, st := range sp.bfd.Sessions() {
			bfds[st.Peer] = st
		}
	}
	sp.pmu.Lock()
	defer sp.pmu.Unlock()
	out := make([]Peer, 0, len(sp.peers))
	for _, a := range slices.SortedFunc(maps.Keys(sp.peers), netip.Addr.Compare) {
		p := sp.peerCopy(sp.peers[a])
		if st, ok := bfds[a.Unmap()]; ok {
			p.BFDStatus = &st
		}
		out = append(out, p)
	}
	return out
}

// peerCopy returns a copy of p with its route count.
func (sp *Speaker) peerCopy(p *Peer) Peer {
	out := *p
	out.Routes = 0
	if p.Established() {
		n := sp.n6.Load()
		if p.Address.Is4() {
			n = sp.n4.Load()
		}
		out.Routes = int(n)
	}
	return out
}

// count adds d to the count of pfx's family.
func (sp *Speaker) count(pfx netip.Prefix, d int64) {
	if pfx.Addr().Is4() {
		sp.n4.Add(d)
	} else {
		sp.n6.Add(d)
	}
}

// Set announces exactly routes, host routes (/32 and /128) with their
// attributes: it announces the new and changed ones and withdraws those
// no longer there. It is level-triggered: a Set with what is announced
// already sends nothing. A Set after Retire announces again.
func (sp *Speaker) Set(routes map[netip.Prefix]Attrs) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.stopped {
		return errors.New("bgp: the speaker is stopped")
	}
	var errs []error
	for _, pfx := range slices.SortedFunc(maps.Keys(sp.routes), netip.Prefix.Compare) {
		if _, ok := routes[pfx]; !ok {
			errs = append(errs, sp.withdrawLocked(pfx))
		}
	}
	for _, pfx := range slices.SortedFunc(maps.Keys(routes), netip.Prefix.Compare) {
		attrs := routes[pfx]
		if r, ok := sp.routes[pfx]; ok && !r.gshut && r.attrs.Equal(attrs) {
			continue
		}
		errs = append(errs, sp.announceLocked(pfx, attrs, false))
	}
	return errors.Join(errs...)
}

// Routes returns the routes announced.
func (sp *Speaker) Routes() map[netip.Prefix]Attrs {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	out := make(map[netip.Prefix]Attrs, len(sp.routes))
	for p, r := range sp.routes {
		out[p] = r.attrs
	}
	return out
}

// gshutCommunity is GRACEFUL_SHUTDOWN (RFC 8326), 65535:0.
const gshutCommunity = 0xFFFF0000

func (sp *Speaker) announceLocked(pfx netip.Prefix, attrs Attrs, gshut bool) error {
	if !pfx.IsSingleIP() || pfx.Addr().Zone() != "" {
		return fmt.Errorf("bgp: %s is not a host route", pfx)
	}
	path, err := apiPath(pfx, attrs, gshut)
	if err != nil {
		return fmt.Errorf("bgp: announce %s: %w", pfx, err)
	}
	res, err := sp.s.AddPath(context.Background(), &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
	if err != nil {
		return fmt.Errorf("bgp: announce %s: %w", pfx, err)
	}
	if _, ok := sp.routes[pfx]; !ok {
		sp.count(pfx, 1)
	}
	sp.routes[pfx] = route{attrs: attrs, uuid: res.Uuid, gshut: gshut}
	return nil
}

func (sp *Speaker) withdrawLocked(pfx netip.Prefix) error {
	r := sp.routes[pfx]
	delete(sp.routes, pfx)
	sp.count(pfx, -1)
	if err := sp.s.DeletePath(context.Background(), &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Uuid: r.uuid}); err != nil {
		return fmt.Errorf("bgp: withdraw %s: %w", pfx, err)
	}
	return nil
}

// apiPath returns GoBGP's form of an announcement of pfx: origin IGP and
// an unspecified next hop, which GoBGP replaces with the session's local
// address.
func apiPath(pfx netip.Prefix, a Attrs, gshut bool) (*api.Path, error) {
	addr := pfx.Addr()
	var nlri bgp.AddrPrefixInterface
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	if addr.Is4() {
		nlri = bgp.NewIPAddrPrefix(32, addr.String())
		attrs = append(attrs, bgp.NewPathAttributeNextHop("0.0.0.0"))
	} else {
		nlri = bgp.NewIPv6AddrPrefix(128, addr.String())
		attrs = append(attrs, bgp.NewPathAttributeMpReachNLRI("::", []bgp.AddrPrefixInterface{nlri}))
	}
	if a.HasMED {
		attrs = append(attrs, bgp.NewPathAttributeMultiExitDisc(a.MED))
	}
	if a.HasLocalPref {
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(a.LocalPref))
	}
	communities := slices.Clone(a.Communities)
	if gshut && !slices.Contains(communities, gshutCommunity) {
		communities = append(communities, gshutCommunity)
	}
	slices.Sort(communities)
	if len(communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(communities))
	}
	if len(a.LargeCommunities) > 0 {
		lc := make([]*bgp.LargeCommunity, len(a.LargeCommunities))
		for i, c := range a.LargeCommunities {
			lc[i] = bgp.NewLargeCommunity(c.Global, c.Local1, c.Local2)
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(lc))
	}
	return apiutil.NewPath(nlri, false, attrs, time.Now())
}

// Retire takes the node's routes away gracefully: with graceful_shutdown
// it first announces them again with GRACEFUL_SHUTDOWN and waits
// graceful_shutdown_wait (or until ctx ends), then withdraws every
// route. A later Set announces again.
func (sp *Speaker) Retire(ctx context.Context) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.stopped {
		return nil
	}
	return sp.retireLocked(ctx)
}

func (sp *Speaker) retireLocked(ctx context.Context) error {
	b := sp.opts
	var errs []error
	if b.GracefulShutdown && len(sp.routes) > 0 {
		for _, pfx := range slices.SortedFunc(maps.Keys(sp.routes), netip.Prefix.Compare) {
			errs = append(errs, sp.announceLocked(pfx, sp.routes[pfx].attrs, true))
		}
		sp.log.Info("bgp: routes announced with GRACEFUL_SHUTDOWN", "routes", len(sp.routes), "wait", b.GracefulShutdownWait)
		sleep(ctx, b.GracefulShutdownWait)
	}
	n := len(sp.routes)
	for _, pfx := range slices.SortedFunc(maps.Keys(sp.routes), netip.Prefix.Compare) {
		errs = append(errs, sp.withdrawLocked(pfx))
	}
	if n > 0 {
		sp.log.Info("bgp: routes withdrawn", "routes", n)
	}
	return errors.Join(errs...)
}

// Stop stops the speaker gracefully: Retire, then withdraw_wait (or
// until ctx ends) while the routers converge, then the sessions end with
// a Cease notification. A speaker announcing nothing skips the wait.
func (sp *Speaker) Stop(ctx context.Context) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.stopped {
		return nil
	}
	n := len(sp.routes)
	err := sp.retireLocked(ctx)
	if n > 0 {
		sleep(ctx, sp.opts.WithdrawWait)
	}
	sp.stopped = true
	sp.pmu.Lock()
	sp.closing = true
	close(sp.done)
	sp.pmu.Unlock()
	sp.holds.Wait()
	if sp.bfd != nil {
		// AdminDown first: the routers do not take the end of the
		// sessions for a failure (RFC 5882 §3.2); the Cease follows.
		sp.bfd.Stop()
	}
	sp.s.Stop()
	sp.log.Info("bgp: stopped")
	return err
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

type (
	gobgpFields = gobgplog.Fields
	gobgpLevel  = gobgplog.LogLevel
)

// logger hands GoBGP's log to slog, one level down: GoBGP logs a peer's
// every reconnection attempt at info. GoBGP tells of a peer over its
// prefix limit only in its log: logger hands that to onLimit.
type logger struct {
	l       *slog.Logger
	onLimit func(peer, family string, crossed bool)
}

// limitMsg is GoBGP's (v3) message for a peer over its prefix limit,
// with the fields Key (the peer), Family and, below the limit but over
// its warning threshold, Pct.
const limitMsg = "prefix limit reached"

func (g *logger) log(level slog.Level, msg string, fields map[string]any) {
	if !g.l.Enabled(context.Background(), level) {
		return
	}
	args := make([]any, 0, 2*len(fields)+2)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		args = append(args, k, fields[k])
	}
	g.l.Log(context.Background(), level, "gobgp: "+msg, args...)
}

func (g *logger) Panic(msg string, f gobgpFields) { g.log(slog.LevelError, msg, f); panic(msg) }
func (g *logger) Fatal(msg string, f gobgpFields) { g.log(slog.LevelError, msg, f) }
func (g *logger) Error(msg string, f gobgpFields) { g.log(slog.LevelWarn, msg, f) }

func (g *logger) Warn(msg string, f gobgpFields) {
	if msg == limitMsg && g.onLimit != nil {
		_, pct := f["Pct"]
		g.onLimit(fmt.Sprint(f["Key"]), fmt.Sprint(f["Family"]), !pct)
	}
	g.log(slog.LevelInfo, msg, f)
}
func (g *logger) Info(msg string, f gobgpFields) { g.log(slog.LevelDebug, msg, f) }
func (g *logger) Debug(string, gobgpFields)      {}
func (g *logger) SetLevel(gobgpLevel)            {}
func (g *logger) GetLevel() gobgpLevel           { return gobgplog.InfoLevel }
