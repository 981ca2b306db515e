package ipvs

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
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
// /proc/net/ip_vs_conn from r (see Connections). It allocates nothing per
// connection but the states it does not know: a node that takes over
// reads a table of thousands of entries before it announces.
func ReadConnections(r io.Reader, fn func(Connection) bool) error {
	s := bufio.NewScanner(r)
	// The kernel hands the table over a page at a time; a buffer of
	// many pages takes it in as few reads as it can.
	s.Buffer(make([]byte, 0, readBuffer), readBuffer)
	line := 0
	for s.Scan() {
		line++
		b := s.Bytes()
		if len(b) > maxConnectionLine {
			return fmt.Errorf("ipvs connections: line %d: %w", line, bufio.ErrTooLong)
		}
		if line == 1 && bytes.HasPrefix(b, []byte("Pro ")) {
			continue
		}
		c, ok, err := parseConnection(b)
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

// readBuffer is the buffer ReadConnections reads the table into.
const readBuffer = 64 << 10

// parseConnection parses one line of the connection table:
//
//	TCP 0A000302 B0DE 0A00030A 0050 0A000303 0050 ESTABLISHED     899
//
// with IPv6 addresses written in full with colons. ok is false for a
// protocol vipd does not balance (a firewall-mark template lists "IP").
func parseConnection(l []byte) (c Connection, ok bool, err error) {
	var f [9][]byte
	n := 0
	for i := 0; i < len(l); {
		if l[i] == ' ' || l[i] == '\t' {
			i++
			continue
		}
		start := i
		for i < len(l) && l[i] != ' ' && l[i] != '\t' {
			i++
		}
		if n < len(f) {
			f[n] = l[start:i]
		}
		n++
	}
	if n < len(f) {
		return c, false, fmt.Errorf("%d fields, want at least 9: %q", n, l)
	}
	switch string(f[0]) {
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
	c.State = stateName(f[7])
	secs, ok := parseUint(f[8], 10, 32)
	if !ok {
		_, err := strconv.ParseUint(string(f[8]), 10, 32)
		return c, false, fmt.Errorf("expiry %q: %w", f[8], err)
	}
	c.Expires = time.Duration(secs) * time.Second
	return c, true, nil
}

// states are the kernel's names of connection states, so that a line's
// state costs no allocation.
var states = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{"NONE", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT", "TIME_WAIT", "CLOSE", "CLOSE_WAIT",
		"LAST_ACK", "LISTEN", "SYNACK", "UDP", "ICMP", "INIT", "COOKIE_WAIT", "COOKIE_ECHOED", "SHUTDOWN_SENT",
		"SHUTDOWN_RECEIVED", "SHUTDOWN_ACK_SENT", "REJECTED", "ERR", "BUG!"} {
		m[s] = s
	}
	return m
}()

// stateName returns b as a string, the kernel's names without allocating.
func stateName(b []byte) string {
	if s, ok := states[string(b)]; ok {
		return s
	}
	return string(b)
}

// parseUint parses b as a number in base 10 or 16 of at most bits bits,
// and false when it is not one (strconv.ParseUint then says why).
func parseUint(b []byte, base int, bits uint) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n uint64
	for _, ch := range b {
		var d byte
		switch {
		case '0' <= ch && ch <= '9':
			d = ch - '0'
		case base == 16 && 'a' <= ch && ch <= 'f':
			d = ch - 'a' + 10
		case base == 16 && 'A' <= ch && ch <= 'F':
			d = ch - 'A' + 10
		default:
			return 0, false
		}
		n = n*uint64(base) + uint64(d)
		if n >= 1<<bits {
			return 0, false
		}
	}
	return n, true
}

// parseAddrPort parses an address as the connection table writes it
// (eight hexadecimal digits for IPv4, in host order of the number; IPv6
// in full with colons) and a port in four hexadecimal digits.
func parseAddrPort(addr, port []byte) (netip.AddrPort, error) {
	p, ok := parseUint(port, 16, 16)
	if !ok {
		_, err := strconv.ParseUint(string(port), 16, 16)
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, err)
	}
	var a netip.Addr
	if len(addr) == 8 && bytes.IndexByte(addr, ':') < 0 {
		n, ok := parseUint(addr, 16, 32)
		if !ok {
			_, err := strconv.ParseUint(string(addr), 16, 32)
			return netip.AddrPort{}, fmt.Errorf("address %q: %w", addr, err)
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(n))
		a = netip.AddrFrom4(b)
	} else if a, ok = parseAddr6(addr); !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: not an IPv4 or IPv6 address", addr)
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// parseAddr6 parses an IPv6 address.
func parseAddr6(b []byte) (netip.Addr, bool) {
	a, err := netip.ParseAddr(string(b))
	return a, err == nil && a.Is6()
}
