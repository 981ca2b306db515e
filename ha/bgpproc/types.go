package bgpproc

import (
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/vipd/vipd/ha/bfd"
)

// Options configure the speaker: package ha/bgp's Options without its
// logger and callback, which do not cross the process boundary.
type Options struct {
	// ASN is the node's autonomous system number; RouterID its BGP
	// identifier, an IPv4 address.
	ASN      uint32
	RouterID netip.Addr
	// ListenPort is the port the speaker takes sessions on; 0 takes
	// none (it connects to its peers).
	ListenPort uint16
	// Peers are the routers the routes are announced to.
	Peers []PeerOptions
	// GracefulShutdown makes Retire first announce the routes again with
	// the GRACEFUL_SHUTDOWN community (RFC 8326) and wait
	// GracefulShutdownWait.
	GracefulShutdown     bool
	GracefulShutdownWait time.Duration
	// WithdrawWait is how long Stop waits after the withdrawal, while
	// the routers converge, before it ends the sessions.
	WithdrawWait time.Duration
	// ConnectRetry is the wait between attempts to connect to a peer;
	// zero means 5 seconds.
	ConnectRetry time.Duration
	// MaxPrefixesHold is how long a peer that sent more routes than its
	// max_prefixes stays down before the speaker connects again; zero
	// means ha/bgp's DefaultMaxPrefixesHold.
	MaxPrefixesHold time.Duration
	// BFDPort is the UDP port of the BFD sessions; 0 is 3784 (tests
	// use another).
	BFDPort uint16
}

// PeerOptions configure the session with one peer.
type PeerOptions struct {
	Address netip.Addr
	ASN     uint32
	// Port is the peer's port; 0 is 179.
	Port uint16
	// Source is the local address of the session; unset, the kernel's
	// choice.
	Source netip.Addr
	// Password turns on TCP MD5 signatures (RFC 2385).
	Password string
	// Multihop is the TTL of the session's packets for a peer that is
	// not directly connected; 0 keeps eBGP's TTL of 1.
	Multihop uint8
	// HoldTime and Keepalive are the timers proposed, whole seconds.
	HoldTime, Keepalive time.Duration
	// Passive waits for the peer to connect.
	Passive bool
	// MaxPrefixes is the most routes of one family the peer may send;
	// 0 is ha/bgp's DefaultMaxPrefixes.
	MaxPrefixes uint32
	// BFD runs a single-hop BFD session with the peer (package
	// ha/bfd), every BFDInterval once up, declared down after
	// BFDMultiplier intervals without a packet.
	BFD           bool
	BFDInterval   time.Duration
	BFDMultiplier uint8
}

// Attrs are the attributes of an announcement.
type Attrs struct {
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

// Equal reports whether two sets of attributes are the same.
func (a Attrs) Equal(o Attrs) bool {
	return slices.Equal(a.Communities, o.Communities) && slices.Equal(a.LargeCommunities, o.LargeCommunities) &&
		a.LocalPref == o.LocalPref && a.MED == o.MED && a.HasLocalPref == o.HasLocalPref && a.HasMED == o.HasMED
}

// Peer is the state of one session.
type Peer struct {
	Address netip.Addr
	ASN     uint32
	// State is the session's state as RFC 4271 names it: "idle",
	// "connect", "active", "opensent", "openconfirm" or "established".
	State string
	// Since is when the session entered State (zero before any change).
	Since time.Time
	// Routes is the number of routes the speaker announces to the peer
	// while the session is up.
	Routes int
	// Limited is when the peer last sent more routes than its
	// max_prefixes and its session was cut; zero if it never did.
	Limited time.Time
	// BFD is the state of the peer's BFD session ("down", "init", "up",
	// "admindown"), empty without one.
	BFD string
	// BFDStatus is the whole status of the peer's BFD session, nil
	// without one. Peers sets it; the copies OnPeer gets lack it.
	BFDStatus *bfd.Status
}

// Established reports whether the session is up.
func (p Peer) Established() bool { return p.State == "established" }

// String is for the log.
func (p Peer) String() string {
	return p.Address.String() + " AS" + strconv.FormatUint(uint64(p.ASN), 10) + " " + p.State
}
