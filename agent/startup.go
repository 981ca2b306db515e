package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
)

// The start-up of the daemon before it touches anything: the locks that
// keep a second vipd out and the checks of the state files. A vipd that
// fails here exits having changed nothing.

// stateLockName is the state lock's name in state_dir.
const stateLockName = "vipd.lock"

// kernelLockDir holds the lock of each network namespace. It is root's,
// 0700, in a parent that only root may write (see netnsLockDir): a lock
// file that another user can open is a lock another user can hold (flock
// needs no more than a read-only descriptor), and a directory another
// user can write is one where a link can be planted at the lock's path.
// It is not the control socket's directory, which other users may have to
// enter, and it must outlive the unit's stop: a vipd in another network
// namespace may hold its lock there meanwhile (the unit keeps /run/vipd
// with RuntimeDirectoryPreserve=yes).
const kernelLockDir = "/run/vipd/lock"

// lockDaemon takes the two locks a daemon holds for its life, each an
// exclusive flock that the kernel releases when the process ends however
// it ends:
//
//   - state_dir/vipd.lock: one vipd per state directory (the ledger and the
//     admin drains);
//   - the kernel lock (kernelLock; for the real kernel NetnsLock()): one
//     vipd per IPVS table. Two daemons with different state directories
//     in one namespace would still fight: over the services on a shared
//     dummy interface, over the VIPD-* iptables chains and ipsets, over
//     the sysctls. "" takes none (a fake kernel).
//
// It returns the function that releases both. It then checks the control
// socket's path (ClearStaleSocket), so that a path that vipd cannot
// serve on ends the start before anything is touched.
func lockDaemon(cfg *config.Config, kernelLock string) (release func(), err error) {
	unlock, err := takeLocks(cfg, kernelLock)
	if err != nil {
		return nil, err
	}
	if cfg.Daemon.ControlSocket != "" {
		if err := ClearStaleSocket(cfg.Daemon.ControlSocket); err != nil {
			unlock()
			return nil, fmt.Errorf("%w; this vipd changed nothing", err)
		}
	}
	return unlock, nil
}

// takeLocks takes lockDaemon's locks.
func takeLocks(cfg *config.Config, kernelLock string) (release func(), err error) {
	unlockState, err := lockFile(filepath.Join(cfg.Daemon.StateDir, stateLockName),
		fmt.Sprintf("the lock of state_dir %s", cfg.Daemon.StateDir))
	if err != nil {
		return nil, err
	}
	if kernelLock == "" {
		return unlockState, nil
	}
	if filepath.Dir(kernelLock) == kernelLockDir {
		// vipd's own directory of namespace locks (NetnsLock's); a
		// lock elsewhere is a test's, taken as it is.
		if err := netnsLockDir(kernelLockDir); err != nil {
			unlockState()
			return nil, err
		}
	}
	unlockKernel, err := lockFile(kernelLock, "the lock of this network namespace's IPVS table (one vipd per network namespace)")
	if err != nil {
		unlockState()
		return nil, err
	}
	return func() { unlockKernel(); unlockState() }, nil
}

// ClearStaleSocket readies path for a unix socket's listener, without
// following a link: nothing there is fine; a socket nothing accepts
// connections on (left by a vipd that was killed) is removed; a socket
// something listens on is refused as another vipd's, and anything else (a
// regular file, a directory, a link: control_socket mistyped) is refused
// with an error naming it, and left as it is.
func ClearStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("control socket %s is not a socket but %s: refused, vipd removes only a stale socket there; "+
			"check control_socket, or move it away", path, describeMode(fi.Mode()))
	}
	// A stale socket refuses connections; a listening one accepts them
	// (or, its queue full, has the connect fail otherwise): it is kept.
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("control socket %s: something listens on it: another vipd is running", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("control socket %s: not known to be stale, so kept: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// NetnsLock returns the kernel lock of this process's network namespace,
// /run/vipd/lock/vipd-net-INODE.lock, named by the namespace's inode,
// which is unique on the host (see Options.KernelLock). Taking it
// (lockDaemon, after the configuration's checks) makes the lock's
// directory if it is missing and refuses one that another user could
// write or enter (see netnsLockDir).
func NetnsLock() (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("identify the network namespace for its lock: %w", err)
	}
	return filepath.Join(kernelLockDir, fmt.Sprintf("vipd-net-%d.lock", st.Ino)), nil
}

// netnsLockDir makes sure dir is fit to hold the namespace locks: a
// directory, not a link, owned by the user vipd runs as (root), mode 0700
// exactly; and its parent a directory, not a link, of the same owner, that
// neither its group nor others may write (the parent of a directory is
// where that directory can be swapped for another). Either is made if
// missing (the parent 0755: it is also the control socket's); one that
// exists otherwise is refused, never repaired: a vipd cannot know who
// else has used it.
func netnsLockDir(dir string) error {
	parent := filepath.Dir(dir)
	if err := ensureDir(parent, 0o755, func(perm os.FileMode) bool { return perm&0o022 == 0 },
		"owned by root and not writable by its group or others"); err != nil {
		return err
	}
	return ensureDir(dir, 0o700, func(perm os.FileMode) bool { return perm == 0o700 }, "owned by root, mode 0700")
}

// ensureDir makes dir with mode perm if it is missing, and checks that
// what is there is a directory (not a link to one) owned by this process's
// user whose mode ok accepts. want says what is wanted, for the error.
func ensureDir(dir string, perm os.FileMode, ok func(os.FileMode) bool, want string) error {
	if err := os.Mkdir(dir, perm); err == nil {
		// The umask may have taken bits away; nothing else can have
		// added any.
		if err := os.Chmod(dir, perm); err != nil {
			return fmt.Errorf("lock directory %s: %w", dir, err)
		}
	} else if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("lock directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("lock directory %s: %w", dir, err)
	}
	uid := fi.Sys().(*syscall.Stat_t).Uid
	if !fi.IsDir() || int(uid) != os.Geteuid() || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 || !ok(fi.Mode().Perm()) {
		if euid := os.Geteuid(); euid != 0 {
			want += fmt.Sprintf(" (this vipd runs as uid %d, not root)", euid)
		}
		return fmt.Errorf("lock directory %s is %s owned by uid %d, want a directory %s: "+
			"another user could hold or replace vipd's lock; remove it (vipd makes it) or fix it; this vipd changed nothing",
			dir, describeMode(fi.Mode()), uid, want)
	}
	return nil
}

// describeMode names a file's type and permissions for an error.
func describeMode(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return fmt.Sprintf("a directory of mode %#o", m.Perm()|m&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)>>12)
	case m.IsRegular():
		return fmt.Sprintf("a regular file of mode %#o", m.Perm())
	}
	return fmt.Sprintf("a special file (%s)", m.Type())
}

// lockFile takes an exclusive flock on path without waiting and writes
// this process's pid into the file, so that a vipd refused the lock can
// name the holder. what describes the lock for that error. The file is
// never removed: removing a lock file lets two processes hold locks on
// two different files of one name.
//
// The lock is opened without following a link and refused unless it is
// a regular file with one link, owned by this process's user: a link
// planted at its path would have root truncate and write its target. It
// is made 0600 (an older vipd made it 0644): a lock file another user can
// open is one another user can hold.
func lockFile(path, what string) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// O_NONBLOCK: a FIFO planted at the path must not block the open;
	// it is refused below.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("lock %s is a symbolic link: refused (vipd never follows a link to its locks); "+
			"remove it; this vipd changed nothing", path)
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w; this vipd changed nothing", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || int(st.Uid) != os.Geteuid() || st.Nlink != 1 {
		f.Close()
		return nil, fmt.Errorf("lock %s is %s owned by uid %d with %d links, want a regular file owned by root with one link: "+
			"refused, as a file another user made or links to; remove it (vipd makes it); this vipd changed nothing",
			path, describeMode(fi.Mode()), st.Uid, st.Nlink)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
		if err := unix.Fchmod(fd, 0o600); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		defer f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := "another vipd"
		if pid := readPid(f); pid > 0 {
			holder = fmt.Sprintf("another vipd (pid %d)", pid)
		}
		return nil, fmt.Errorf("%s holds %s, %s: stop it first; this vipd changed nothing", holder, path, what)
	}
	// Truncated only now that it is held, and known to be the lock.
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		f.WriteAt(pid, 0)
	}
	return func() { f.Close() }, nil
}

// readPid reads the pid a lock's holder wrote, or 0. The holder may not
// have written it yet.
func readPid(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		return 0
	}
	return pid
}

// loadState reads and checks the state files and returns the admin
// drains. A file that exists but cannot be trusted ends the start: the
// error names it and says what moving it away costs. (Rebuilding the
// ledger from what vipd can prove it owns, its VIPs and its
// configuration, would silently forget the firewall-mark and NodePort
// services it created that the configuration no longer lists.)
func loadState(cfg *config.Config) (map[status.Ref]struct{}, error) {
	path := ledger.Path(cfg.Daemon.StateDir)
	if _, err := ledger.New(path).Load(); err != nil {
		return nil, stateError(err, path, "It lists the IPVS services vipd owns. "+
			"Moved away, vipd adopts the services on its VIPs and those its configuration lists and re-creates the rest; "+
			"a firewall-mark or NodePort service it created that the configuration no longer lists is then left alone: remove it with ipvsadm -D")
	}
	path = drainsPath(cfg)
	drained, err := loadDrains(path)
	if err != nil {
		return nil, stateError(err, path, "It lists the backends drained with vipd drain. "+
			"Moved away, vipd starts with no admin drains: drain those backends again")
	}
	return drained, nil
}

// stateError explains a state file that cannot be read: what it holds,
// and for a corrupt file the command that lets vipd start.
func stateError(err error, path, holds string) error {
	var ce *ledger.CorruptError
	if !errors.As(err, &ce) {
		return fmt.Errorf("state file: %w; vipd changed nothing", err)
	}
	return fmt.Errorf("state file %w; vipd changed nothing. %s. To start, move it away: mv %s %s.corrupt",
		err, holds, path, path)
}

// firstPass runs the start's pass. A pass that cannot read the kernel
// (a netlink dump that failed, say) is tried again, twice, after a wait
// that doubles; if it still fails the start fails, before READY: a vipd
// that reported ready must manage the kernel.
func (a *Agent) firstPass(ctx context.Context, spec *lb.Spec) (*lb.Result, error) {
	const attempts = 3
	wait := a.opts.StartRetry
	if wait <= 0 {
		wait = time.Second
	}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		res, err := a.r.Reconcile(ctx, spec)
		a.m.Pass("start", res, time.Since(start))
		if err == nil {
			logResult(a.log, "start", res, time.Since(start))
			return res, nil
		}
		if attempt == attempts {
			return nil, fmt.Errorf("first pass: cannot read the kernel (%d attempts): %w; not ready", attempts, err)
		}
		a.log.Warn("first pass cannot read the kernel; trying again", "attempt", attempt, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("first pass: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait *= 2
	}
}
