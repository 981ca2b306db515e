package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// namespace is a network namespace of its own for one tool's run: its own
// IPVS table, and its own list of deleted destinations (see flush).
type namespace struct {
	name string
	h    netns.NsHandle
}

// newNamespace creates a network namespace with lo up (IPVS refuses IPv4
// real servers until the namespace has a local routing table).
func newNamespace(name string) (*namespace, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // left locked if the thread cannot go back
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		h, err := netns.New()
		if err != nil {
			ch <- result{err: err}
			return
		}
		err = func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(lo)
		}()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			h.Close()
		}
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("create network namespace %s: %w", name, r.err)
	}
	return &namespace{name: name, h: r.h}, nil
}

// path names the namespace for ipvs.Options.NetnsPath.
func (n *namespace) path() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(n.h)) }

// start starts cmd in the namespace: it forks from a thread inside it.
func (n *namespace) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.h); err != nil {
			errc <- err
			return
		}
		err = cmd.Start()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// run runs a command in the namespace and returns its output.
func (n *namespace) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := n.start(cmd); err != nil {
		return "", err
	}
	err := cmd.Wait()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), err
}

func (n *namespace) close() { n.h.Close() }

// cpuIdle reads the aggregate idle and total jiffies of /proc/stat.
func cpuIdle() (idle, total uint64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	for i, s := range f[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total
}

// quiesce waits until the guest's CPUs have been at least 90% idle for
// half a second (background work of the previous run, such as the kernel
// freeing a namespace, must not count against the next), for at most max.
// It returns how long it waited.
func quiesce(max time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < max {
		i0, t0 := cpuIdle()
		time.Sleep(500 * time.Millisecond)
		i1, t1 := cpuIdle()
		if t1 > t0 && float64(i1-i0)/float64(t1-t0) >= 0.9 {
			break
		}
	}
	return time.Since(start)
}

// procStats are a process's peak and current resident memory and its
// CPU time so far.
type procStats struct {
	HWMKiB, RSSKiB int64
	CPU            time.Duration
}

func readProc(pid int) (procStats, error) {
	var ps procStats
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, err
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmHWM":
			ps.HWMKiB = n
		case "VmRSS":
			ps.RSSKiB = n
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ps, err
	}
	// Fields after the command name, which may hold spaces: state is
	// field 3, utime 14 and stime 15.
	_, rest, _ := strings.Cut(string(stat), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return ps, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	ps.CPU = time.Duration(ut+st) * time.Second / clockTicks
	return ps, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// Linux's supported architectures.
const clockTicks = 100

// proc is a started process of a tool, in a process group of its own.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startIn starts cmd in ns, in a process group of its own.
func startIn(ns *namespace, cmd *exec.Cmd) (*proc, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := ns.start(cmd); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop ends the process: SIGTERM, then SIGKILL of its process group after
// grace. Stopping a stopped process does nothing.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	p.kill()
}

// kill kills the process and everything in its process group at once.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = unix.Kill(-p.pid(), unix.SIGKILL)
	<-p.done
}

// writeAtomic writes data to path through a new file renamed over it, as
// editors and configuration managers do; it returns CLOCK_MONOTONIC, in
// nanoseconds, read right before the rename, the moment the new content
// is put in place.
func writeAtomic(path string, data []byte) (int64, error) {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return 0, err
	}
	t := monoNow()
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	return t, nil
}

// kernelRelease returns uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// clocksource returns the kernel's current clock source, or "" when it
// cannot be read.
func clocksource() string {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
