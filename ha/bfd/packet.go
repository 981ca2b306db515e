// Package bfd is a Bidirectional Forwarding Detection speaker (RFC 5880)
// for single-hop sessions over IPv4 and IPv6 (RFC 5881), in asynchronous
// mode, without authentication, echo or demand mode. It lets a router
// that runs BFD against the node (bird's `bfd on`, a switch's BFD for
// BGP) see the node die within a fraction of a second, where BGP's hold
// timer takes seconds.
//
// A Session is the pure state machine of RFC 5880 §6.8: it is given the
// packets received and the time, and says what to send and when. A
// Speaker runs sessions over UDP port 3784 with the configured peers
// only: a packet from any other address, with a TTL or hop limit below
// 255 (RFC 5881 §5, so that nothing off-link can bring a session up or
// down), or malformed is dropped and counted.
package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// State is a session's state (RFC 5880 §4.1).
type State uint8

// The states of a session.
const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

// String returns the state's name as RFC 5880 writes it, in lower case.
func (s State) String() string {
	switch s {
	case AdminDown:
		return "admindown"
	case Down:
		return "down"
	case Init:
		return "init"
	case Up:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Diag is the reason of a session's last change to Down (RFC 5880
// §4.1).
type Diag uint8

// The diagnostics of RFC 5880 §4.1 a speaker may see.
const (
	DiagNone         Diag = 0
	DiagTimeExpired  Diag = 1
	DiagEchoFailed   Diag = 2
	DiagNeighborDown Diag = 3
	DiagForwarding   Diag = 4
	DiagPathDown     Diag = 5
	DiagAdminDown    Diag = 7
)

// String names the diagnostic.
func (d Diag) String() string {
	switch d {
	case DiagNone:
		return "none"
	case DiagTimeExpired:
		return "control detection time expired"
	case DiagEchoFailed:
		return "echo function failed"
	case DiagNeighborDown:
		return "neighbor signaled session down"
	case DiagForwarding:
		return "forwarding plane reset"
	case DiagPathDown:
		return "path down"
	case DiagAdminDown:
		return "administratively down"
	}
	return fmt.Sprintf("diag(%d)", uint8(d))
}

// Packet is a BFD Control packet without authentication.
type Packet struct {
	Diag  Diag
	State State
	// Poll and Final are the P and F bits of a Poll Sequence.
	Poll, Final bool
	// Demand is the D bit; the speaker never sets it.
	Demand bool
	// DetectMult is the sender's detection time multiplier.
	DetectMult uint8
	// MyDisc and YourDisc are the sender's and the receiver's
	// discriminators.
	MyDisc, YourDisc uint32
	// DesiredMinTx, RequiredMinRx and RequiredMinEchoRx are the
	// sender's intervals, whole microseconds on the wire.
	DesiredMinTx, RequiredMinRx, RequiredMinEchoRx time.Duration
}

// packetLen is the length of a Control packet without authentication.
const packetLen = 24

// version is BFD's version.
const version = 1

// Marshal returns the packet's wire form.
func (p *Packet) Marshal() []byte {
	b := make([]byte, packetLen)
	b[0] = version<<5 | byte(p.Diag)&0x1f
	b[1] = byte(p.State&3) << 6
	if p.Poll {
		b[1] |= 0x20
	}
	if p.Final {
		b[1] |= 0x10
	}
	if p.Demand {
		b[1] |= 0x02
	}
	b[2] = p.DetectMult
	b[3] = packetLen
	binary.BigEndian.PutUint32(b[4:], p.MyDisc)
	binary.BigEndian.PutUint32(b[8:], p.YourDisc)
	binary.BigEndian.PutUint32(b[12:], micros(p.DesiredMinTx))
	binary.BigEndian.PutUint32(b[16:], micros(p.RequiredMinRx))
	binary.BigEndian.PutUint32(b[20:], micros(p.RequiredMinEchoRx))
	return b
}

// micros returns d in whole microseconds, at most what 32 bits hold.
func micros(d time.Duration) uint32 {
	us := d / time.Microsecond
	if us > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(max(us, 0))
}

// Errors of Unmarshal; every one drops the packet.
var (
	ErrShort       = errors.New("bfd: packet shorter than 24 bytes or than its length field")
	ErrVersion     = errors.New("bfd: version is not 1")
	ErrAuth        = errors.New("bfd: authentication present, none configured")
	ErrMultipoint  = errors.New("bfd: multipoint bit set")
	ErrDetectMult  = errors.New("bfd: detect multiplier 0")
	ErrMyDisc      = errors.New("bfd: my discriminator 0")
	ErrYourDisc    = errors.New("bfd: your discriminator 0 in state up or init")
	ErrPollFinal   = errors.New("bfd: poll and final bits both set")
	ErrLengthField = errors.New("bfd: length field below 24")
)

// Unmarshal parses a Control packet and applies the checks of RFC 5880
// §6.8.6 that need no session: version 1, a length of at least 24 bytes
// within the datagram, no authentication (none is configured, so a
// packet with the A bit is discarded), no multipoint bit, a non-zero
// detect multiplier and My Discriminator, a non-zero Your
// Discriminator unless the sender is Down or AdminDown, and not both P
// and F (§6.5).
func Unmarshal(b []byte) (Packet, error) {
	var p Packet
	if len(b) < packetLen {
		return p, ErrShort
	}
	if b[0]>>5 != version {
		return p, ErrVersion
	}
	n := int(b[3])
	if n < packetLen {
		return p, ErrLengthField
	}
	if n > len(b) {
		return p, ErrShort
	}
	if b[1]&0x04 != 0 {
		return p, ErrAuth
	}
	if b[1]&0x01 != 0 {
		return p, ErrMultipoint
	}
	p.Diag = Diag(b[0] & 0x1f)
	p.State = State(b[1] >> 6)
	p.Poll, p.Final, p.Demand = b[1]&0x20 != 0, b[1]&0x10 != 0, b[1]&0x02 != 0
	p.DetectMult = b[2]
	p.MyDisc = binary.BigEndian.Uint32(b[4:])
	p.YourDisc = binary.BigEndian.Uint32(b[8:])
	p.DesiredMinTx = time.Duration(binary.BigEndian.Uint32(b[12:])) * time.Microsecond
	p.RequiredMinRx = time.Duration(binary.BigEndian.Uint32(b[16:])) * time.Microsecond
	p.RequiredMinEchoRx = time.Duration(binary.BigEndian.Uint32(b[20:])) * time.Microsecond
	switch {
	case p.DetectMult == 0:
		return p, ErrDetectMult
	case p.MyDisc == 0:
		return p, ErrMyDisc
	case p.YourDisc == 0 && (p.State == Up || p.State == Init):
		return p, ErrYourDisc
	case p.Poll && p.Final:
		return p, ErrPollFinal
	}
	return p, nil
}
