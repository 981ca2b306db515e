package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// kernelLockDir holds the lock of each network namespace. It is not the
// control socket's directory: systemd removes that (RuntimeDirectory)
// when the unit stops, and with it a lock file another vipd still holds.
const kernelLockDir = "/run/lock"

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
// It returns the function that releases both.
func lockDaemon(cfg *config.Config, kernelLock string) (release func(), err error) {
	unlockState, err := lockFile(filepath.Join(cfg.Daemon.StateDir, stateLockName),
		fmt.Sprintf("the lock of state_dir %s", cfg.Daemon.StateDir))
	if err != nil {
		return nil, err
	}
	if kernelLock == "" {
		return unlockState, nil
	}
	unlockKernel, err := lockFile(kernelLock, "the lock of this network namespace's IPVS table (one vipd per network namespace)")
	if err != nil {
		unlockState()
		return nil, err
	}
	return func() { unlockKernel(); unlockState() }, nil
}

// NetnsLock returns the kernel lock of this process's network namespace,
// /run/lock/vipd-net-INODE.lock, named by the namespace's inode, which is
// unique on the host (see Options.KernelLock).
func NetnsLock() (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		return "", fmt.Errorf("identify the network namespace for its lock: %w", err)
	}
	return filepath.Join(kernelLockDir, fmt.Sprintf("vipd-net-%d.lock", st.Ino)), nil
}

// lockFile takes an exclusive flock on path without waiting and writes
// this process's pid into the file, so that a vipd refused the lock can
// name the holder. what describes the lock for that error. The file is
// never removed: removing a lock file lets two processes hold locks on
// two different files of one name.
func lockFile(path, what string) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		defer f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := "another vipd"
		if pid := readPid(f); pid > 0 {
			holder = fmt.Sprintf("another vipd (pid %d)", pid)
		}
		return nil, fmt.Errorf("%s holds %s, %s: stop it first; this vipd changed nothing", holder, path, what)
	}
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
