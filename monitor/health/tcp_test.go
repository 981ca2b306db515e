package health

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// listenTCP starts a listener on a loopback address that accepts and
// closes connections until the test ends.
func listenTCP(t *testing.T, network, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// closedTCPPort returns a loopback address on which nothing listens.
func closedTCPPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return addr
}

func TestTCPCheck(t *testing.T) {
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	if err := NewTCPCheck(up, DialOptions{}).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Errorf("listening port: %v", err)
	}
	err := NewTCPCheck(closedTCPPort(t), DialOptions{}).Probe(probeCtx(t, 5*time.Second))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("closed port: %v, want connection refused", err)
	}
}

func TestTCPCheckIPv6(t *testing.T) {
	up := listenTCP(t, "tcp6", "[::1]:0")
	if err := NewTCPCheck(up, DialOptions{}).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Errorf("listening port: %v", err)
	}
}

func TestTCPCheckSource(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	from := make(chan netip.Addr, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		from <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		c.Close()
	}()
	src := netip.MustParseAddr("127.0.0.1")
	if err := NewTCPCheck(ln.Addr().(*net.TCPAddr).AddrPort(), DialOptions{Source: src}).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := <-from; got.Unmap() != src {
		t.Errorf("connection from %s, want %s", got, src)
	}
}
