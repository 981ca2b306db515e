package systemd

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listen makes a fake service manager socket and points the environment
// at it.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", name)
	return conn
}

func read(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotify(t *testing.T) {
	for _, name := range []string{filepath.Join(t.TempDir(), "notify.sock"), "@vipd-test-" + strconv.Itoa(os.Getpid())} {
		t.Run(name, func(t *testing.T) {
			conn := listen(t, name)
			n := FromEnv()
			if !n.Enabled() {
				t.Fatal("notifier disabled with NOTIFY_SOCKET set")
			}
			if err := n.Ready("serving 3 services"); err != nil {
				t.Fatal(err)
			}
			if got := read(t, conn); got != "READY=1\nSTATUS=serving 3 services" {
				t.Errorf("ready = %q", got)
			}
			before := monotonicUsec()
			if err := n.Reloading(); err != nil {
				t.Fatal(err)
			}
			got := read(t, conn)
			lines := strings.Split(got, "\n")
			if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
				t.Fatalf("reloading = %q", got)
			}
			usec, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
			if err != nil || usec < before || usec > before+5e6 {
				t.Errorf("MONOTONIC_USEC = %q, want near %d", lines[1], before)
			}
			for _, c := range []struct {
				f    func() error
				want string
			}{
				{n.Watchdog, "WATCHDOG=1"},
				{n.Stopping, "STOPPING=1"},
				{func() error { return n.Status("reload failed") }, "STATUS=reload failed"},
			} {
				if err := c.f(); err != nil {
					t.Fatal(err)
				}
				if got := read(t, conn); got != c.want {
					t.Errorf("got %q, want %q", got, c.want)
				}
			}
		})
	}
}

func TestDisabled(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := FromEnv()
	if n.Enabled() || n.Ready("x") != nil || n.WatchdogInterval() != 0 {
		t.Fatal("notifier without NOTIFY_SOCKET is not a no-op")
	}
}

func TestWatchdogEnv(t *testing.T) {
	listen(t, filepath.Join(t.TempDir(), "n.sock"))
	t.Setenv("WATCHDOG_USEC", "4000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	if got := FromEnv().WatchdogInterval(); got != 4*time.Second {
		t.Errorf("interval = %v, want 4s", got)
	}
	t.Setenv("WATCHDOG_PID", "1")
	if got := FromEnv().WatchdogInterval(); got != 0 {
		t.Errorf("interval for another pid = %v, want 0", got)
	}
}

func TestUnreachable(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "missing.sock"))
	if err := FromEnv().Ready("x"); err == nil || !strings.Contains(err.Error(), "sd_notify") {
		t.Fatalf("err = %v", err)
	}
}
