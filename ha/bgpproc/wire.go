// Package bgpproc runs vipd's BGP speaker (package ha/bgp, which embeds
// GoBGP) in a program of its own, vipd-bgp: the daemon starts it, hands
// it the speaker's options and the routes to announce over a socket it
// inherits, and reads back the state of its sessions. What a BGP peer
// sends is parsed there, in a process that holds no capability but
// CAP_NET_BIND_SERVICE, not in the daemon that programs the kernel; and
// the daemon, which links no GoBGP, is smaller by the speaker's code and
// memory when [bgp] is not configured.
//
// The data types (Options, PeerOptions, Attrs, Peer) are ha/bgp's; this
// package links no GoBGP. Client is the daemon's end, Serve the
// program's.
package bgpproc

import (
	"fmt"
	"io"
	"net/netip"

	"github.com/vipd/vipd/frame"
)

// Version is the version of the wire: the daemon sends it with the
// options, and the program refuses another.
const Version = 1

// MaxFrame bounds a frame either way: the routes of tens of thousands of
// VIPs with their attributes, or the state of every session.
const MaxFrame = 16 << 20

// The operations of a message.
const (
	opStart  = "start"  // the daemon's first request: Options
	opSet    = "set"    // announce exactly Routes
	opRetire = "retire" // withdraw every route
	opStop   = "stop"   // retire, wait, end the sessions; the program exits
	opPeers  = "peers"  // the sessions' state
	opReply  = "reply"  // the program's answer to a request of the same ID
	opPeer   = "peer"   // the program's event: a session changed state
)

// message is one frame between the daemon and the program.
type message struct {
	// ID pairs a request and its reply; an event has none.
	ID uint64 `json:"id,omitempty"`
	Op string `json:"op"`
	// Version and Start come with opStart.
	Version int      `json:"version,omitempty"`
	Start   *Options `json:"start,omitempty"`
	// Routes come with opSet.
	Routes []Route `json:"routes,omitempty"`
	// Error is a reply's: the request failed.
	Error string `json:"error,omitempty"`
	// Peers come with the reply to opPeers, and one with opPeer.
	Peers []Peer `json:"peers,omitempty"`
}

// Route is one route to announce and its attributes.
type Route struct {
	Prefix netip.Prefix
	Attrs  Attrs
}

// check refuses a message that is not one the wire has.
func (m *message) check() error {
	switch m.Op {
	case opStart:
		if m.Start == nil {
			return fmt.Errorf("a %s message without options", m.Op)
		}
	case opSet, opRetire, opStop, opPeers, opReply:
	case opPeer:
		if len(m.Peers) != 1 {
			return fmt.Errorf("a %s message with %d peers, want 1", m.Op, len(m.Peers))
		}
		return nil
	default:
		return fmt.Errorf("unknown operation %q", m.Op)
	}
	if m.ID == 0 {
		return fmt.Errorf("a %s message without an id", m.Op)
	}
	for _, r := range m.Routes {
		if !r.Prefix.IsValid() {
			return fmt.Errorf("a %s message with an invalid prefix", m.Op)
		}
	}
	return nil
}

// read reads the next message from r and checks it.
func read(r io.Reader) (*message, error) {
	m := &message{}
	if err := frame.Read(r, m, MaxFrame); err != nil {
		return nil, err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return m, nil
}
