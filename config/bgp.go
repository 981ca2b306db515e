package config

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// BGP is the [bgp] section: every node announces its VIPs to the
// network's routers, which spread the flows over the nodes (ECMP).
type BGP struct {
	// Enabled says the section is there.
	Enabled bool
	// ASN is the node's autonomous system number; RouterID its BGP
	// identifier, an IPv4 address.
	ASN      uint32
	RouterID netip.Addr
	// ListenPort is the port vipd takes sessions on; 0 takes none (vipd
	// connects to its peers).
	ListenPort uint16
	// Peers are the routers the VIPs are announced to.
	Peers []BGPPeer
	// Default holds the attributes of every announcement; Services those
	// of the services named, key by key over Default.
	Default  BGPAttrs
	Services map[string]BGPAttrs
	// GracefulShutdown, on a graceful stop or a node drain, first
	// re-announces the VIPs with the GRACEFUL_SHUTDOWN community (RFC
	// 8326) and waits GracefulShutdownWait, so that routers that honour
	// it move the flows away before the routes go.
	GracefulShutdown     bool
	GracefulShutdownWait time.Duration
	// WithdrawWait is how long a stopping node goes on serving after it
	// withdrew its VIPs, while the routers converge.
	WithdrawWait time.Duration
	// TrackInterfaces are the interfaces the node cannot serve without
	// (its uplink to the routers and clients, its link to the
	// backends): while one of them is down, has no carrier or is
	// missing, the node withdraws every route at once, and announces
	// them again when all are up.
	TrackInterfaces []string
	// Program is the path of the speaker program the daemon runs the
	// sessions in; "" means vipd-bgp in the directory of the vipd
	// executable.
	Program string
	// Sloppy lets IPVS take a packet in the middle of a connection it
	// does not know as a new connection (see lb.Spec.Sloppy), so that a
	// node the routers move a flow to keeps the connection.
	Sloppy bool
}

// BGPPeer is one [[bgp.peer]].
type BGPPeer struct {
	Address netip.Addr
	ASN     uint32
	// Port is the peer's port (179).
	Port uint16
	// Source is the local address of the session; unset, the kernel's
	// choice.
	Source netip.Addr
	// Password turns on TCP MD5 signatures (RFC 2385).
	Password string
	// Multihop is the TTL of the session's packets for a peer that is not
	// directly connected; 0 keeps eBGP's TTL of 1.
	Multihop uint8
	// HoldTime and Keepalive are the timers vipd proposes, whole seconds.
	HoldTime, Keepalive time.Duration
	// Passive waits for the peer to connect.
	Passive bool
	// MaxPrefixes is the most routes of one address family the peer may
	// send. vipd imports none of them (it needs no routes), but GoBGP
	// keeps what a peer sent, before its import policy, for as long as
	// the session lasts: the limit bounds that memory. A peer that sends
	// more is sent a Cease (Maximum Number of Prefixes Reached, RFC 4486)
	// and its session stays down for a minute (see ha/bgp).
	MaxPrefixes uint32
	// BFD runs a BFD session (RFC 5880/5881, single hop) with the peer,
	// so that a router that runs BFD sees the node die within
	// BFDMultiplier × BFDInterval instead of its hold time; when the
	// session goes down vipd resets the BGP session (see ha/bgp).
	BFD bool
	// BFDInterval is how often vipd sends BFD packets once the session
	// is up and how often it asks the peer to; BFDMultiplier the number
	// of intervals without a packet after which either side declares
	// the session down.
	BFDInterval   time.Duration
	BFDMultiplier uint8
}

// BGPAttrs are the attributes of an announcement.
type BGPAttrs struct {
	// Communities are RFC 1997 communities, each ASN<<16 | value.
	Communities []uint32
	// LargeCommunities are RFC 8092 communities.
	LargeCommunities []LargeCommunity
	// LocalPref and MED are set when HasLocalPref and HasMED say so.
	LocalPref, MED       uint32
	HasLocalPref, HasMED bool
}

// LargeCommunity is an RFC 8092 community.
type LargeCommunity struct {
	Global, Local1, Local2 uint32
}

// String returns the community as written, "global:local1:local2".
func (c LargeCommunity) String() string {
	return fmt.Sprintf("%d:%d:%d", c.Global, c.Local1, c.Local2)
}

// The BGP defaults: the timers of RFC 4271's suggestion, and the waits of
// a graceful stop.
const (
	DefaultBGPPort                 = 179
	DefaultBGPHoldTime             = 90 * time.Second
	DefaultBGPWithdrawWait         = 2 * time.Second
	DefaultBGPGracefulShutdownWait = 5 * time.Second
	// DefaultBGPMaxPrefixes is a peer's max_prefixes: vipd needs no
	// route from its routers, and a router that sends a default route
	// and its fabric's aggregates stays far below it.
	DefaultBGPMaxPrefixes = 1000
	// MaxBGPMaxPrefixes is the largest max_prefixes, about a full
	// Internet table of one family: vipd has no use for more.
	MaxBGPMaxPrefixes = 1_000_000
	// DefaultBFDInterval and DefaultBFDMultiplier detect a dead node in
	// 600 ms; MinBFDInterval is the shortest interval offered: below it
	// a busy node's scheduling delays make false failures likely.
	DefaultBFDInterval   = 200 * time.Millisecond
	DefaultBFDMultiplier = 3
	MinBFDInterval       = 50 * time.Millisecond
	MaxBFDInterval       = 10 * time.Second
)

// Attrs returns the attributes of the announcements of service name.
func (b BGP) Attrs(name string) BGPAttrs {
	if a, ok := b.Services[name]; ok {
		return a
	}
	return b.Default
}

// Equal reports whether two [bgp] sections are the same.
func (b BGP) Equal(o BGP) bool {
	return b.SessionsEqual(o) && b.Default.Equal(o.Default) && maps.EqualFunc(b.Services, o.Services, BGPAttrs.Equal) &&
		slices.Equal(b.TrackInterfaces, o.TrackInterfaces)
}

// SessionsEqual reports whether two [bgp] sections run the same
// sessions: they differ at most in the attributes of announcements and
// the interfaces tracked, which a running node changes without a
// restart.
func (b BGP) SessionsEqual(o BGP) bool {
	return b.Enabled == o.Enabled && b.ASN == o.ASN && b.RouterID == o.RouterID && b.ListenPort == o.ListenPort &&
		slices.Equal(b.Peers, o.Peers) && b.GracefulShutdown == o.GracefulShutdown &&
		b.GracefulShutdownWait == o.GracefulShutdownWait && b.WithdrawWait == o.WithdrawWait && b.Sloppy == o.Sloppy
}

// Equal reports whether two sets of attributes are the same.
func (a BGPAttrs) Equal(o BGPAttrs) bool {
	return slices.Equal(a.Communities, o.Communities) && slices.Equal(a.LargeCommunities, o.LargeCommunities) &&
		a.LocalPref == o.LocalPref && a.MED == o.MED && a.HasLocalPref == o.HasLocalPref && a.HasMED == o.HasMED
}

// String summarises the section for the log.
func (b BGP) String() string {
	if !b.Enabled {
		return "none"
	}
	return fmt.Sprintf("AS%d router id %s, %d peers", b.ASN, b.RouterID, len(b.Peers))
}

// rawBGP is the [bgp] section as written.
type rawBGP struct {
	ASN                  *int64                 `toml:"asn"`
	RouterID             *string                `toml:"router_id"`
	ListenPort           *int64                 `toml:"listen_port"`
	Peer                 []rawBGPPeer           `toml:"peer"`
	Communities          []string               `toml:"communities"`
	LargeCommunities     []string               `toml:"large_communities"`
	LocalPref            *int64                 `toml:"local_pref"`
	MED                  *int64                 `toml:"med"`
	Service              map[string]rawBGPAttrs `toml:"service"`
	GracefulShutdown     *bool                  `toml:"graceful_shutdown"`
	GracefulShutdownWait *duration              `toml:"graceful_shutdown_wait"`
	WithdrawWait         *duration              `toml:"withdraw_wait"`
	Sloppy               *bool                  `toml:"sloppy"`
	TrackInterfaces      []string               `toml:"track_interfaces"`
	Program              *string                `toml:"program"`
}

type rawBGPPeer struct {
	Address   *string   `toml:"address"`
	ASN       *int64    `toml:"asn"`
	Port      *int64    `toml:"port"`
	Source    *string   `toml:"source"`
	Password  *string   `toml:"password"`
	Multihop  *int64    `toml:"multihop"`
	HoldTime  *duration `toml:"hold_time"`
	Keepalive *duration `toml:"keepalive"`
	Passive   *bool     `toml:"passive"`
	// MaxPrefixes is max_prefixes.
	MaxPrefixes   *int64    `toml:"max_prefixes"`
	BFD           *bool     `toml:"bfd"`
	BFDInterval   *duration `toml:"bfd_interval"`
	BFDMultiplier *int64    `toml:"bfd_multiplier"`
}

type rawBGPAttrs struct {
	Communities      []string `toml:"communities"`
	LargeCommunities []string `toml:"large_communities"`
	LocalPref        *int64   `toml:"local_pref"`
	MED              *int64   `toml:"med"`
}

// set reports whether the section has any key.
func (b *rawBGP) set() bool {
	return b.ASN != nil || b.RouterID != nil || b.ListenPort != nil || b.Peer != nil || b.Communities != nil ||
		b.LargeCommunities != nil || b.LocalPref != nil || b.MED != nil || b.Service != nil || b.GracefulShutdown != nil ||
		b.GracefulShutdownWait != nil || b.WithdrawWait != nil || b.Sloppy != nil || b.TrackInterfaces != nil || b.Program != nil
}

// wellKnownCommunities are the RFC 1997 and RFC 8326 communities that
// may be written by name.
var wellKnownCommunities = map[string]uint32{
	"no-export":         0xFFFFFF01,
	"no-advertise":      0xFFFFFF02,
	"no-export-subconf": 0xFFFFFF03,
	"graceful-shutdown": 0xFFFF0000,
	"blackhole":         0xFFFF029A,
}

// bgp validates the [bgp] section into cfg.BGP; the [ha] section is
// validated already.
func (v *validator) bgp(b *rawBGP, cfg *Config) {
	if !b.set() {
		return
	}
	const ctx = "bgp"
	out := BGP{Enabled: true, WithdrawWait: DefaultBGPWithdrawWait, GracefulShutdownWait: DefaultBGPGracefulShutdownWait, Sloppy: true}
	if cfg.HA.Enabled() {
		v.errorf("bgp", ctx, "[bgp] and [ha] mode = %q exclude each other: BGP has every node announce and serve the VIPs, "+
			"VRRP has one elected node serve them and its peers stand by", cfg.HA.Mode)
	}
	if len(cfg.Daemon.Uplinks) > 0 {
		v.errorf("bgp", ctx, "[bgp] and [daemon] uplinks exclude each other: with BGP the routers route the VIPs to the node's "+
			"own address, and no node may announce or answer ARP and neighbour solicitations for them")
	}
	if b.ASN == nil {
		v.errorf("bgp", ctx, "asn is required: the node's autonomous system number")
	} else {
		out.ASN = v.asn(*b.ASN, "bgp.asn", ctx, "asn")
	}
	if b.RouterID == nil {
		v.errorf("bgp", ctx, "router_id is required: an IPv4 address that identifies the node to its peers")
	} else if a, err := netip.ParseAddr(*b.RouterID); err != nil || !a.Is4() || a.IsUnspecified() {
		v.errorf("bgp.router_id", ctx, "router_id %q is not a non-zero IPv4 address", *b.RouterID)
	} else {
		out.RouterID = a
	}
	if b.Program != nil {
		out.Program = *b.Program
		if out.Program == "" || out.Program[0] != '/' {
			v.errorf("bgp.program", ctx, "program %q must be an absolute path (or left out for vipd-bgp beside vipd)", out.Program)
		}
	}
	if b.ListenPort != nil {
		if *b.ListenPort < 0 || *b.ListenPort > 65535 {
			v.errorf("bgp.listen_port", ctx, "listen_port %d is outside 0..65535 (0: take no sessions, connect to the peers)", *b.ListenPort)
		} else {
			out.ListenPort = uint16(*b.ListenPort)
		}
	}
	if len(b.Peer) == 0 {
		v.errorf("bgp", ctx, "no peers: add a [[bgp.peer]] with the address and asn of a router")
	}
	for i, p := range b.Peer {
		path := fmt.Sprintf("bgp.peer.%d", i)
		pctx := fmt.Sprintf("bgp.peer %d", i+1)
		peer, ok := v.bgpPeer(&p, path, pctx)
		if !ok {
			continue
		}
		if slices.ContainsFunc(out.Peers, func(q BGPPeer) bool { return q.Address == peer.Address }) {
			v.errorf(path+".address", pctx, "peer %s is listed twice", peer.Address)
			continue
		}
		if peer.Passive && out.ListenPort == 0 {
			v.errorf(path+".passive", pctx, "a passive peer needs listen_port: vipd would neither connect nor listen")
		}
		out.Peers = append(out.Peers, peer)
	}
	out.Default = v.bgpAttrs(&rawBGPAttrs{Communities: b.Communities, LargeCommunities: b.LargeCommunities, LocalPref: b.LocalPref, MED: b.MED},
		BGPAttrs{}, "bgp", ctx)
	for _, name := range slices.Sorted(maps.Keys(b.Service)) {
		r := b.Service[name]
		if out.Services == nil {
			out.Services = map[string]BGPAttrs{}
		}
		out.Services[name] = v.bgpAttrs(&r, out.Default, "bgp.service."+name, fmt.Sprintf("bgp.service %q", name))
	}
	setBool(&out.GracefulShutdown, b.GracefulShutdown)
	out.GracefulShutdownWait = v.duration(b.GracefulShutdownWait, out.GracefulShutdownWait, "bgp.graceful_shutdown_wait", ctx, "graceful_shutdown_wait")
	if out.GracefulShutdownWait < 0 || out.GracefulShutdownWait > 10*time.Minute {
		v.errorf("bgp.graceful_shutdown_wait", ctx, "graceful_shutdown_wait %s is outside 0..10m", out.GracefulShutdownWait)
	}
	if b.GracefulShutdownWait != nil && !out.GracefulShutdown {
		v.errorf("bgp.graceful_shutdown_wait", ctx, "graceful_shutdown_wait without graceful_shutdown = true: no GRACEFUL_SHUTDOWN community is sent")
	}
	out.WithdrawWait = v.duration(b.WithdrawWait, out.WithdrawWait, "bgp.withdraw_wait", ctx, "withdraw_wait")
	if out.WithdrawWait < 0 || out.WithdrawWait > 10*time.Minute {
		v.errorf("bgp.withdraw_wait", ctx, "withdraw_wait %s is outside 0..10m", out.WithdrawWait)
	}
	setBool(&out.Sloppy, b.Sloppy)
	for _, name := range b.TrackInterfaces {
		if err := validIfName(name); err != nil {
			v.errorf("bgp.track_interfaces", ctx, "track_interfaces: %v", err)
		}
	}
	out.TrackInterfaces = b.TrackInterfaces
	cfg.BGP = out
	cfg.Spec.Sloppy = cfg.Spec.Sloppy || out.Sloppy
}

// asn validates an autonomous system number (4 octets, RFC 6793; 0 and
// AS_TRANS are reserved).
func (v *validator) asn(n int64, path, ctx, name string) uint32 {
	if n < 1 || n > math.MaxUint32 || n == 23456 {
		v.errorf(path, ctx, "%s %d is not an AS number (1..4294967295, not 23456)", name, n)
		return 0
	}
	return uint32(n)
}

// bgpPeer validates one [[bgp.peer]].
func (v *validator) bgpPeer(p *rawBGPPeer, path, ctx string) (BGPPeer, bool) {
	out := BGPPeer{Port: DefaultBGPPort, HoldTime: DefaultBGPHoldTime, MaxPrefixes: DefaultBGPMaxPrefixes}
	ok := true
	if p.Address == nil {
		v.errorf(path, ctx, "address is required")
		ok = false
	} else if a, err := netip.ParseAddr(*p.Address); err != nil || a.Zone() != "" || a.IsUnspecified() {
		v.errorf(path+".address", ctx, "address %q is not an IP address", *p.Address)
		ok = false
	} else {
		out.Address = a
	}
	if p.ASN == nil {
		v.errorf(path, ctx, "asn is required: the peer's autonomous system number")
	} else {
		out.ASN = v.asn(*p.ASN, path+".asn", ctx, "asn")
	}
	if p.Port != nil {
		if *p.Port < 1 || *p.Port > 65535 {
			v.errorf(path+".port", ctx, "port %d is outside 1..65535", *p.Port)
		} else {
			out.Port = uint16(*p.Port)
		}
	}
	if p.Source != nil {
		if a, err := netip.ParseAddr(*p.Source); err != nil || a.Zone() != "" {
			v.errorf(path+".source", ctx, "source %q is not an IP address", *p.Source)
		} else if out.Address.IsValid() && a.Is4() != out.Address.Is4() {
			v.errorf(path+".source", ctx, "source %s and address %s are of different families", a, out.Address)
		} else {
			out.Source = a
		}
	}
	if p.Password != nil {
		out.Password = *p.Password
		if len(out.Password) == 0 || len(out.Password) > 80 {
			v.errorf(path+".password", ctx, "password must be 1 to 80 bytes (a TCP MD5 key)")
		}
	}
	if p.Multihop != nil {
		if *p.Multihop < 1 || *p.Multihop > 255 {
			v.errorf(path+".multihop", ctx, "multihop %d is outside 1..255 (the TTL of the session's packets)", *p.Multihop)
		} else {
			out.Multihop = uint8(*p.Multihop)
		}
	}
	if p.MaxPrefixes != nil {
		if *p.MaxPrefixes < 1 || *p.MaxPrefixes > MaxBGPMaxPrefixes {
			v.errorf(path+".max_prefixes", ctx, "max_prefixes %d is outside 1..%d (vipd imports no route; the limit bounds what a peer may "+
				"make it hold, and no limit is not offered)", *p.MaxPrefixes, MaxBGPMaxPrefixes)
		} else {
			out.MaxPrefixes = uint32(*p.MaxPrefixes)
		}
	}
	out.HoldTime = v.duration(p.HoldTime, out.HoldTime, path+".hold_time", ctx, "hold_time")
	if out.HoldTime < 3*time.Second || out.HoldTime > 65535*time.Second || out.HoldTime%time.Second != 0 {
		v.errorf(path+".hold_time", ctx, "hold_time %s must be whole seconds from 3s to 65535s (RFC 4271's 0, no keepalives, is not offered)", out.HoldTime)
		return out, false
	}
	out.Keepalive = v.duration(p.Keepalive, (out.HoldTime / 3).Truncate(time.Second), path+".keepalive", ctx, "keepalive")
	if out.Keepalive < time.Second || out.Keepalive >= out.HoldTime || out.Keepalive%time.Second != 0 {
		v.errorf(path+".keepalive", ctx, "keepalive %s must be whole seconds, at least 1s and less than hold_time %s", out.Keepalive, out.HoldTime)
	}
	setBool(&out.Passive, p.Passive)
	v.bfd(p, &out, path, ctx)
	return out, ok
}

// bfd validates a peer's BFD keys.
func (v *validator) bfd(p *rawBGPPeer, out *BGPPeer, path, ctx string) {
	setBool(&out.BFD, p.BFD)
	if !out.BFD {
		if p.BFDInterval != nil {
			v.errorf(path+".bfd_interval", ctx, "bfd_interval without bfd = true: no BFD session runs")
		}
		if p.BFDMultiplier != nil {
			v.errorf(path+".bfd_multiplier", ctx, "bfd_multiplier without bfd = true: no BFD session runs")
		}
		return
	}
	if out.Multihop > 0 {
		v.errorf(path+".bfd", ctx, "bfd with multihop: vipd runs single-hop BFD (RFC 5881, TTL 255), for a directly connected peer only")
	}
	out.BFDInterval = v.duration(p.BFDInterval, DefaultBFDInterval, path+".bfd_interval", ctx, "bfd_interval")
	if out.BFDInterval < MinBFDInterval || out.BFDInterval > MaxBFDInterval || out.BFDInterval%time.Millisecond != 0 {
		v.errorf(path+".bfd_interval", ctx, "bfd_interval %s must be whole milliseconds from %s to %s", out.BFDInterval, MinBFDInterval, MaxBFDInterval)
	}
	out.BFDMultiplier = DefaultBFDMultiplier
	if p.BFDMultiplier != nil {
		if *p.BFDMultiplier < 2 || *p.BFDMultiplier > 255 {
			v.errorf(path+".bfd_multiplier", ctx, "bfd_multiplier %d is outside 2..255 (1 would declare the node dead on one lost packet)", *p.BFDMultiplier)
		} else {
			out.BFDMultiplier = uint8(*p.BFDMultiplier)
		}
	}
}

// bgpAttrs validates announcement attributes; the keys r leaves unset are
// def's.
func (v *validator) bgpAttrs(r *rawBGPAttrs, def BGPAttrs, path, ctx string) BGPAttrs {
	out := def
	if r.Communities != nil {
		out.Communities = nil
		for _, s := range r.Communities {
			c, err := parseCommunity(s)
			if err != nil {
				v.errorf(path+".communities", ctx, "communities: %v", err)
				continue
			}
			if !slices.Contains(out.Communities, c) {
				out.Communities = append(out.Communities, c)
			}
		}
	}
	if r.LargeCommunities != nil {
		out.LargeCommunities = nil
		for _, s := range r.LargeCommunities {
			c, err := parseLargeCommunity(s)
			if err != nil {
				v.errorf(path+".large_communities", ctx, "large_communities: %v", err)
				continue
			}
			if !slices.Contains(out.LargeCommunities, c) {
				out.LargeCommunities = append(out.LargeCommunities, c)
			}
		}
	}
	if r.LocalPref != nil {
		if *r.LocalPref < 0 || *r.LocalPref > math.MaxUint32 {
			v.errorf(path+".local_pref", ctx, "local_pref %d is outside 0..4294967295", *r.LocalPref)
		} else {
			out.LocalPref, out.HasLocalPref = uint32(*r.LocalPref), true
		}
	}
	if r.MED != nil {
		if *r.MED < 0 || *r.MED > math.MaxUint32 {
			v.errorf(path+".med", ctx, "med %d is outside 0..4294967295", *r.MED)
		} else {
			out.MED, out.HasMED = uint32(*r.MED), true
		}
	}
	return out
}

// parseCommunity parses "ASN:value" (each 0..65535) or a well-known name.
func parseCommunity(s string) (uint32, error) {
	if c, ok := wellKnownCommunities[s]; ok {
		return c, nil
	}
	a, b, ok := strings.Cut(s, ":")
	x, err1 := strconv.ParseUint(a, 10, 16)
	y, err2 := strconv.ParseUint(b, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q is not a community: \"ASN:value\" with each 0..65535, or one of %s", s,
			strings.Join(slices.Sorted(maps.Keys(wellKnownCommunities)), ", "))
	}
	return uint32(x)<<16 | uint32(y), nil
}

// parseLargeCommunity parses "global:local1:local2" (each 0..4294967295).
func parseLargeCommunity(s string) (LargeCommunity, error) {
	parts := strings.Split(s, ":")
	var n [3]uint32
	for i, p := range parts {
		x, err := strconv.ParseUint(p, 10, 32)
		if err != nil || len(parts) != 3 {
			return LargeCommunity{}, fmt.Errorf("%q is not a large community: \"global:local1:local2\" with each 0..4294967295", s)
		}
		n[i] = uint32(x)
	}
	return LargeCommunity{n[0], n[1], n[2]}, nil
}
