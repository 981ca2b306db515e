package healthbench

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on every
// Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// ProcUsage is a process's CPU time (user and system), the part of it
// spent in the kernel (system), its resident set size, and the context
// switches of its threads alive (voluntary and not): each wake-up of a
// thread that slept is one.
type ProcUsage struct {
	CPU, Sys time.Duration
	RSS      uint64
	Switches uint64
}

// ReadProc reads the CPU time and resident set size of process pid.
func ReadProc(pid int) (ProcUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcUsage{}, err
	}
	user, sys, err := parseStat(string(stat))
	if err != nil {
		return ProcUsage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcUsage{}, err
	}
	rss, err := parseRSS(string(status))
	if err != nil {
		return ProcUsage{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	switches, err := readSwitches(pid)
	if err != nil {
		return ProcUsage{}, err
	}
	return ProcUsage{CPU: user + sys, Sys: sys, RSS: rss, Switches: switches}, nil
}

// readSwitches sums the context switches of process pid's threads.
func readSwitches(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, task := range tasks {
		status, err := os.ReadFile(dir + "/" + task.Name() + "/status")
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread exited
		}
		if err != nil {
			return 0, err
		}
		n, err := parseSwitches(string(status))
		if err != nil {
			return 0, fmt.Errorf("%s/%s/status: %w", dir, task.Name(), err)
		}
		sum += n
	}
	return sum, nil
}

// parseSwitches returns the sum of voluntary_ctxt_switches and
// nonvoluntary_ctxt_switches of a /proc/PID/status file.
func parseSwitches(s string) (uint64, error) {
	var sum uint64
	found := 0
	for line := range strings.Lines(s) {
		for _, key := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
			if rest, ok := strings.CutPrefix(line, key); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse %q: %w", strings.TrimSpace(line), err)
				}
				sum += n
				found++
			}
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("%d context switch lines, want 2", found)
	}
	return sum, nil
}

// ReadProcs sums ReadProc over pids.
func ReadProcs(pids []int) (ProcUsage, error) {
	var sum ProcUsage
	for _, pid := range pids {
		u, err := ReadProc(pid)
		if err != nil {
			return ProcUsage{}, err
		}
		sum.CPU += u.CPU
		sum.Sys += u.Sys
		sum.RSS += u.RSS
		sum.Switches += u.Switches
	}
	return sum, nil
}

// parseStat returns utime and stime of a /proc/PID/stat line. The
// command name, in parentheses, may hold spaces and parentheses: the
// fields that follow are counted from the last ')'.
func parseStat(s string) (user, sys time.Duration, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("no command name in %q", s)
	}
	// After ") ": state is field 3, utime field 14 and stime field 15.
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var ticks [2]uint64
	for x, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cpu time %q: %w", v, err)
		}
		ticks[x] = n
	}
	return time.Duration(ticks[0]) * clockTick, time.Duration(ticks[1]) * clockTick, nil
}

// parseRSS returns the VmRSS of a /proc/PID/status file, in bytes.
func parseRSS(s string) (uint64, error) {
	for line := range strings.Lines(s) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %q: %w", strings.TrimSpace(line), err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// RSSParts returns the resident set of process pid by kind, in bytes:
// anonymous memory (heap, stacks), file-backed pages (the mapped
// executable and libraries), and shared memory, where the pages of files
// on a RAM file system count (the guest's /payload, and its root), from
// the RssAnon, RssFile and RssShmem lines of /proc/PID/status.
func RSSParts(pid int) (anon, file, shmem uint64, err error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	anon, file, shmem, err = parseRSSParts(string(status))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return anon, file, shmem, nil
}

// parseRSSParts returns the RssAnon, RssFile and RssShmem of a
// /proc/PID/status file, in bytes.
func parseRSSParts(s string) (anon, file, shmem uint64, err error) {
	found := 0
	for line := range strings.Lines(s) {
		for key, dst := range map[string]*uint64{"RssAnon:": &anon, "RssFile:": &file, "RssShmem:": &shmem} {
			if rest, ok := strings.CutPrefix(line, key); ok {
				kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return 0, 0, 0, fmt.Errorf("parse %q: %w", strings.TrimSpace(line), err)
				}
				*dst = kb << 10
				found++
			}
		}
	}
	if found != 3 {
		return 0, 0, 0, fmt.Errorf("%d of the RssAnon, RssFile and RssShmem lines", found)
	}
	return anon, file, shmem, nil
}
