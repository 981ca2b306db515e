package ipvs

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/lb"
)

// Connection is one entry of the kernel's IPVS connection table: a
// client's connection to a virtual service and the backend it was given.
type Connection struct {
	Proto lb.Proto
	// Client, Virtual and Backend are the client's address and port, the
	// virtual service's (the VIP) and the backend's.
	Client, Virtual, Backend netip.AddrPort
	// State is the kernel's name of the connection's state
	// ("ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", ...; "NONE" for a
	// persistence template).
	State string
	// Expires is the time left before the kernel forgets the connection.
	Expires time.Duration
}

// ConnectionTable is the file the kernel lists its IPVS connections in,
// for the network namespace of the process that opens it.
const ConnectionTable = "/proc/net/ip_vs_conn"

// maxConnectionLine bounds a line of the connection table: the longest the
// kernel writes (three IPv6 addresses, a persistence engine's data) is
// well under it.
const maxConnectionLine = 512

// Connections reads the kernel's IPVS connection table and calls fn for
// each connection of a protocol vipd balances, in the order the kernel
// lists them, until fn returns false.
func Connections(fn func(Connection) bool) error {
	f, err := os.Open(ConnectionTable)
	if err != nil {
		return fmt.Errorf("ipvs connections: %w", err)
	}
	defer f.Close()
	return ReadConnections(f, fn)
}

// ReadConnections reads a connection table in the format of
// /proc/net/ip_vs_conn from r (see Connections).
func ReadConnections(r io.Reader, fn func(Connection) bool) error {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, maxConnectionLine), maxConnectionLine)
	line := 0
	for s.Scan() {
		line++
		if line == 1 && strings.HasPrefix(s.Text(), "Pro ") {
			continue
		}
		c, ok, err := parseConnection(s.Text())
		if err != nil {
			return fmt.Errorf("ipvs connections: line %d: %w", line, err)
		}
		if ok && !fn(c) {
			return nil
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("ipvs connections: line %d: %w", line+1, err)
	}
	return nil
}

// parseConnection parses one line of the connection table:
//
//	TCP 0A000302 B0DE 0A00030A 0050 0A000303 0050 ESTABLISHED     899
//
// with IPv6 addresses written in full with colons. ok is false for a
// protocol vipd does not balance (a firewall-mark template lists "IP").
func parseConnection(l string) (c Connection, ok bool, err error) {
	f := strings.Fields(l)
	if len(f) < 9 {
		return c, false, fmt.Errorf("%d fields, want at least 9: %q", len(f), l)
	}
	switch f[0] {
	case "TCP":
		c.Proto = lb.TCP
	case "UDP":
		c.Proto = lb.UDP
	case "SCTP":
		c.Proto = lb.SCTP
	default:
		return c, false, nil
	}
	for i, dst := range []*netip.AddrPort{&c.Client, &c.Virtual, &c.Backend} {
		if *dst, err = parseAddrPort(f[1+2*i], f[2+2*i]); err != nil {
			return c, false, err
		}
	}
	c.State = f[7]
	secs, err := strconv.ParseUint(f[8], 10, 32)
	if err != nil {
		return c, false, fmt.Errorf("expiry %q: %w", f[8], err)
	}
	c.Expires = time.Duration(secs) * time.Second
	return c, true, nil
}

// parseAddrPort parses an address as the connection table writes it
// (eight hexadecimal digits for IPv4, in host order of the number; IPv6
// in full with colons) and a port in four hexadecimal digits.
func parseAddrPort(addr, port string) (netip.AddrPort, error) {
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, err)
	}
	var a netip.Addr
	if len(addr) == 8 && !strings.Contains(addr, ":") {
		n, err := strconv.ParseUint(addr, 16, 32)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %w", addr, err)
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(n))
		a = netip.AddrFrom4(b)
	} else if a, err = netip.ParseAddr(addr); err != nil || !a.Is6() {
		return netip.AddrPort{}, fmt.Errorf("address %q: not an IPv4 or IPv6 address", addr)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}
