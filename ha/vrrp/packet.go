package vrrp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Protocol is VRRP's IP protocol number.
const Protocol = 112

const (
	version    = 3
	typeAdvert = 1
	headerLen  = 8
	// MaxInterval is the largest advertisement interval the 12-bit field
	// carries, in centiseconds.
	MaxInterval = 0x0fff
)

// Errors of Parse that the receive rules of RFC 5798 section 7.1 name.
var (
	ErrShort    = errors.New("short packet")
	ErrVersion  = errors.New("not VRRP version 3")
	ErrType     = errors.New("not an advertisement")
	ErrChecksum = errors.New("bad checksum")
	ErrFamily   = errors.New("address family mismatch")
)

// Packet is a VRRPv3 advertisement (RFC 5798 section 5.2) without its IP
// header.
type Packet struct {
	VRID     uint8
	Priority uint8
	// Interval is the Max Advertise Interval in centiseconds (12 bits).
	Interval uint16
	// Addrs are the virtual router's addresses, all of one family.
	Addrs []netip.Addr
}

// Marshal encodes p with its checksum over the pseudo-header of src and
// dst, the addresses of the IP packet that carries it. Every address must
// be of the family of src and dst.
func (p Packet) Marshal(src, dst netip.Addr) ([]byte, error) {
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("marshal: source %v and destination %v: %w", src, dst, ErrFamily)
	}
	if p.Interval > MaxInterval {
		return nil, fmt.Errorf("marshal: interval %d cs exceeds %d", p.Interval, MaxInterval)
	}
	if len(p.Addrs) > 255 {
		return nil, fmt.Errorf("marshal: %d addresses exceed 255", len(p.Addrs))
	}
	alen := 4
	if !src.Is4() {
		alen = 16
	}
	b := make([]byte, headerLen, headerLen+alen*len(p.Addrs))
	b[0] = version<<4 | typeAdvert
	b[1] = p.VRID
	b[2] = p.Priority
	b[3] = uint8(len(p.Addrs))
	binary.BigEndian.PutUint16(b[4:], p.Interval)
	for _, a := range p.Addrs {
		if a.Is4() != src.Is4() || a.Is4In6() {
			return nil, fmt.Errorf("marshal: address %v with source %v: %w", a, src, ErrFamily)
		}
		b = append(b, a.AsSlice()...)
	}
	binary.BigEndian.PutUint16(b[6:], checksum(b, src, dst))
	return b, nil
}

// Parse decodes an advertisement received from src for dst and checks
// what RFC 5798 section 7.1 asks of the packet itself: the version, the
// type, the length and the checksum. The TTL and the VRID are the
// receiver's to check.
func Parse(b []byte, src, dst netip.Addr) (Packet, error) {
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return Packet{}, fmt.Errorf("parse: source %v and destination %v: %w", src, dst, ErrFamily)
	}
	if len(b) < headerLen {
		return Packet{}, fmt.Errorf("parse: %d bytes: %w", len(b), ErrShort)
	}
	if v := b[0] >> 4; v != version {
		return Packet{}, fmt.Errorf("parse: version %d: %w", v, ErrVersion)
	}
	if t := b[0] & 0x0f; t != typeAdvert {
		return Packet{}, fmt.Errorf("parse: type %d: %w", t, ErrType)
	}
	alen := 4
	if !src.Is4() {
		alen = 16
	}
	n := int(b[3])
	if len(b) < headerLen+n*alen {
		return Packet{}, fmt.Errorf("parse: %d bytes for %d addresses: %w", len(b), n, ErrShort)
	}
	// The checksum covers the whole VRRP message, anything after the
	// addresses included, as the sender computed it over what it sent.
	if checksum(b, src, dst) != 0 {
		return Packet{}, fmt.Errorf("parse: from %v: %w", src, ErrChecksum)
	}
	p := Packet{
		VRID:     b[1],
		Priority: b[2],
		Interval: binary.BigEndian.Uint16(b[4:]) & MaxInterval,
		Addrs:    make([]netip.Addr, 0, n),
	}
	for i := range n {
		o := headerLen + i*alen
		a, _ := netip.AddrFromSlice(b[o : o+alen])
		p.Addrs = append(p.Addrs, a)
	}
	return p, nil
}

// checksum is the Internet checksum of b behind the pseudo-header of src
// and dst (RFC 5798 section 5.2.8): it is zero over a message whose
// checksum field is right.
func checksum(b []byte, src, dst netip.Addr) uint16 {
	var sum uint32
	add := func(s []byte) {
		for len(s) >= 2 {
			sum += uint32(s[0])<<8 | uint32(s[1])
			s = s[2:]
		}
		if len(s) == 1 {
			sum += uint32(s[0]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	// Upper-layer length and the next header (protocol) number: the IPv4
	// pseudo-header's 16-bit length and the IPv6 one's 32-bit length sum
	// to the same.
	sum += uint32(len(b)) + Protocol
	add(b)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
