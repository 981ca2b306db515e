package health

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// dialControl sets the socket options of o on a probe's socket before it
// connects.
func dialControl(o DialOptions, _, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if o.Mark != 0 {
			if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(o.Mark)); err != nil {
				serr = fmt.Errorf("set mark %#x: %w", o.Mark, err)
				return
			}
		}
		if o.Device != "" {
			if err := syscall.BindToDevice(int(fd), o.Device); err != nil {
				serr = fmt.Errorf("bind to device %s: %w", o.Device, err)
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// runAs runs a command to its end as an exec check's user.
type runAs func(cmd *exec.Cmd) error

// newRunAs returns what runs commands as u: switching to u when vipd is
// not u already, which needs CAP_SETUID, CAP_SETGID and CAP_KILL (see
// CanRunAs).
func newRunAs(u User) (runAs, error) {
	if err := CanRunAs(u); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if !isCurrent(u) {
		cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{u.GID}}
	}
	return func(cmd *exec.Cmd) error { return run(cmd, cred) }, nil
}

// isCurrent reports whether vipd runs as u already.
func isCurrent(u User) bool {
	return uint32(os.Geteuid()) == u.UID && uint32(os.Getegid()) == u.GID
}

// Capabilities that running commands as another user needs: setgroups
// and setgid, setuid, and signalling the process group of another uid at
// the timeout (without CAP_KILL the kill fails, and a hung check is never
// reaped).
const (
	capKill   = 5
	capSetgid = 6
	capSetuid = 7
)

// CanRunAs reports whether vipd can run exec checks as u: it is u (uid and
// gid) already, or it holds CAP_SETUID, CAP_SETGID and CAP_KILL in its
// effective set. Otherwise the error says what is missing and how to fix
// it; vipd never runs a check as another user than u.
func CanRunAs(u User) error {
	if isCurrent(u) {
		return nil
	}
	eff, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("cannot run exec checks as %s: %w", u, err)
	}
	return canSwitch(u, os.Geteuid(), os.Getegid(), eff)
}

// canSwitch reports whether a process of euid and egid with the effective
// capabilities eff can run commands as u.
func canSwitch(u User, euid, egid int, eff uint64) error {
	if uint32(euid) == u.UID && uint32(egid) == u.GID {
		return nil
	}
	var missing []string
	for _, c := range []struct {
		bit  uint
		name string
	}{{capSetuid, "CAP_SETUID"}, {capSetgid, "CAP_SETGID"}, {capKill, "CAP_KILL"}} {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("vipd runs as uid %d, gid %d without %s, so it cannot run exec checks as %s: "+
		"run vipd as root with CAP_SETUID, CAP_SETGID and CAP_KILL (the unit's CapabilityBoundingSet), or set check_user to the user vipd runs as",
		euid, egid, strings.Join(missing, ", "), u)
}

// effectiveCaps returns vipd's effective capability set, from
// /proc/self/status.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("read capabilities: CapEff %q: %w", v, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read capabilities: %w", err)
	}
	return 0, errors.New("read capabilities: no CapEff line in /proc/self/status")
}

// run runs cmd as cred (nil: as vipd) in its own process group, all of
// which its context's end kills, with no_new_privs, SIGKILL when vipd
// dies, and none of vipd's descriptors.
//
// Go offers no_new_privs for exec only per thread: the command is started
// from a goroutine locked to its thread, which sets it, and which ends
// without unlocking, so that the runtime ends the thread (the flag cannot
// be cleared) once the command has been reaped. The locked thread also
// keeps the parent-death signal honest: Linux sends it when the thread that
// forked the child ends, which here is after the child.
func run(cmd *exec.Cmd, cred *syscall.Credential) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	// Go opens its own descriptors close-on-exec; whatever vipd inherited
	// or opened otherwise is marked so too, so that the command gets only
	// its standard input, output and error.
	if err := closeOnExec(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: see above.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- fmt.Errorf("set no_new_privs: %w", err)
			return
		}
		done <- cmd.Run()
	}()
	return <-done
}

// closeOnExec marks every descriptor above standard error close-on-exec.
func closeOnExec() error {
	err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Before Linux 5.11: each descriptor of /proc/self/fd.
	ents, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w (close_range: %w)", rerr, err)
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd) // a descriptor closed meanwhile is no matter
		}
	}
	return nil
}
