package health

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"
)

// udpServer answers every datagram on a loopback port with reply(payload)
// until the test ends; a nil reply drops the datagram.
func udpServer(t *testing.T, network, addr string, reply func([]byte) []byte) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket(network, addr)
	if err != nil {
		t.Fatalf("listen %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := reply(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func closedUDPPort(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	return addr
}

func TestUDPCheck(t *testing.T) {
	echo := udpServer(t, "udp4", "127.0.0.1:0", func(p []byte) []byte {
		return append([]byte("pong:"), p...)
	})
	silent := udpServer(t, "udp4", "127.0.0.1:0", func([]byte) []byte { return nil })

	tests := []struct {
		name string
		addr netip.AddrPort
		opts UDPOptions
		err  string
	}{
		{"reply", echo, UDPOptions{Payload: []byte("ping")}, ""},
		{"matching reply", echo, UDPOptions{Payload: []byte("ping"), Expect: []byte("pong:ping")}, ""},
		{"empty payload", echo, UDPOptions{Expect: []byte("pong:")}, ""},
		{"wrong reply", echo, UDPOptions{Payload: []byte("ping"), Expect: []byte("hello")}, "does not contain"},
		{"no reply", silent, UDPOptions{Payload: []byte("ping")}, "no reply from"},
		{"closed port", closedUDPPort(t), UDPOptions{Payload: []byte("ping")}, "port unreachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := NewUDPCheck(tt.addr, tt.opts, DialOptions{}).Probe(probeCtx(t, 300*time.Millisecond))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("probe: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("probe: %v, want error containing %q", err, tt.err)
			}
		})
	}
	err := NewUDPCheck(closedUDPPort(t), UDPOptions{}, DialOptions{}).Probe(probeCtx(t, 5*time.Second))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("closed port error %v does not wrap ECONNREFUSED", err)
	}
}

func TestUDPCheckIPv6(t *testing.T) {
	echo := udpServer(t, "udp6", "[::1]:0", bytes.ToUpper)
	opts := UDPOptions{Payload: []byte("ping"), Expect: []byte("PING")}
	if err := NewUDPCheck(echo, opts, DialOptions{}).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
