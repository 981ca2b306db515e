package health

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN, CAP_NET_RAW)")
	}
}

func TestDialMark(t *testing.T) {
	needRoot(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	opts := DialOptions{Mark: 0x1234, Device: "lo"}
	if err := NewTCPCheck(up, opts).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("marked probe bound to lo: %v", err)
	}
	// The probe's socket carries the mark.
	conn, err := opts.dialer("tcp").DialContext(probeCtx(t, 5*time.Second), "tcp", up.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		mark, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if mark != 0x1234 {
		t.Errorf("socket mark %#x, want 0x1234", mark)
	}
}

func TestDialDeviceMissing(t *testing.T) {
	needRoot(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	err := NewTCPCheck(up, DialOptions{Device: "vipdnope0"}).Probe(probeCtx(t, 5*time.Second))
	if err == nil {
		t.Fatal("probe bound to a missing device passed")
	}
}
