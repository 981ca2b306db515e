// Package systemd speaks the systemd service notification protocol
// (sd_notify): readiness, reloading, stopping, status lines and watchdog
// keep-alives, sent as datagrams to $NOTIFY_SOCKET. The unit files for
// vipd live beside this file.
package systemd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends notifications to the service manager. A Notifier made
// where $NOTIFY_SOCKET is unset is disabled: its methods do nothing, so
// callers need no special case when vipd runs outside systemd.
type Notifier struct {
	addr     *net.UnixAddr
	watchdog time.Duration
}

// FromEnv returns the Notifier for this process's environment.
func FromEnv() *Notifier {
	n := &Notifier{}
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return n
	}
	// An abstract socket starts with '@', which Go's net package also
	// takes to mean the leading NUL, so the name passes through as is.
	n.addr = &net.UnixAddr{Name: sock, Net: "unixgram"}
	n.watchdog = watchdogFromEnv()
	return n
}

// watchdogFromEnv reads $WATCHDOG_USEC, honouring $WATCHDOG_PID when set.
func watchdogFromEnv() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond
}

// Enabled reports whether notifications go anywhere.
func (n *Notifier) Enabled() bool { return n.addr != nil }

// WatchdogInterval returns how often the service manager expects a
// keep-alive, or zero when no watchdog is configured. Send keep-alives at
// half this interval.
func (n *Notifier) WatchdogInterval() time.Duration { return n.watchdog }

// notifyTimeout bounds the send of one notification.
const notifyTimeout = time.Second

// Notify sends one message of newline-separated assignments such as
// "READY=1".
func (n *Notifier) Notify(assignments ...string) error {
	if n.addr == nil {
		return nil
	}
	conn, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer conn.Close()
	// A full socket buffer (a manager that stopped reading) must not
	// wedge the caller's main loop: give up after a while.
	conn.SetWriteDeadline(time.Now().Add(notifyTimeout))
	if _, err := conn.Write([]byte(strings.Join(assignments, "\n"))); err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// Ready reports start-up complete, with a status line.
func (n *Notifier) Ready(status string) error {
	return n.Notify("READY=1", "STATUS="+status)
}

// Reloading reports that a reload began. The timestamp lets systemd (253
// and later, Type=notify-reload) match it to the reload it requested; end
// the reload with Ready.
func (n *Notifier) Reloading() error {
	return n.Notify("RELOADING=1", "MONOTONIC_USEC="+strconv.FormatInt(monotonicUsec(), 10))
}

// Stopping reports that the service is shutting down.
func (n *Notifier) Stopping() error { return n.Notify("STOPPING=1") }

// Status sets the free-form status line `systemctl status` shows.
func (n *Notifier) Status(status string) error { return n.Notify("STATUS=" + status) }

// Watchdog sends a keep-alive.
func (n *Notifier) Watchdog() error { return n.Notify("WATCHDOG=1") }

func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Sec*1e6 + ts.Nsec/1e3
}
