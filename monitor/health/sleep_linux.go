package health

import (
	"context"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newSleeper returns the scheduler's sleeper on c: on the real clock, one
// on a timerfd, if one can be had.
func newSleeper(c Clock) sleeper {
	if _, ok := c.(SystemClock); ok {
		if s, err := newTimerSleeper(); err == nil {
			return s
		}
	}
	return newChanSleeper(c)
}

// timerSleeper sleeps on a timerfd that the goroutine reads through the
// runtime's network poller, which waits for it without a deadline: the
// thread wakes once, at the instant asked. A runtime timer wakes it twice
// (the poller waits in whole milliseconds, rounded down, then once more
// for the rest), and the runtime's monitor thread with it. Its system
// calls are raw, as the probes' are (rawsys_linux.go): one the scheduler
// is told of wakes the monitor from its sleep.
type timerSleeper struct {
	f   *os.File
	raw syscall.RawConn
	// woken says that a wake came since the last sleep began.
	woken atomic.Bool
	buf   [8]byte
}

func newTimerSleeper() (*timerSleeper, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	f := os.NewFile(uintptr(fd), "timerfd")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &timerSleeper{f: f, raw: raw}, nil
}

// arm makes the timer fire after d (at once if d is not positive), or
// disarms it if off. Arming discards an expiry not yet read.
func (s *timerSleeper) arm(d time.Duration, off bool) error {
	var err error
	if cerr := s.raw.Control(func(fd uintptr) { err = armTimerfd(int(fd), d, off) }); cerr != nil {
		return cerr
	}
	return err
}

// armTimerfd makes timerfd fd expire after d (at once if d is not
// positive), or disarms it if off, with a raw system call: one the
// scheduler is told of wakes the runtime's monitor thread from its sleep.
// Arming discards an expiry not yet read.
func armTimerfd(fd int, d time.Duration, off bool) error {
	var spec unix.ItimerSpec
	if !off {
		// A zero value would disarm the timer.
		spec.Value = unix.NsecToTimespec(max(d.Nanoseconds(), 1))
	}
	_, _, e := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, uintptr(fd), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	if e != 0 {
		return os.NewSyscallError("timerfd_settime", e)
	}
	return nil
}

// wait reads the timer's expiry, waiting for it in the runtime's poller.
func (s *timerSleeper) wait() error {
	var err error
	if rerr := s.raw.Read(func(fd uintptr) bool {
		_, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&s.buf[0])), uintptr(len(s.buf)))
		if e == unix.EAGAIN {
			return false
		}
		if e != 0 {
			err = os.NewSyscallError("read", e)
		}
		return true
	}); rerr != nil {
		return rerr
	}
	return err
}

func (s *timerSleeper) sleep(ctx context.Context, until time.Time) {
	err := s.arm(time.Until(until), until.IsZero())
	// After arming: a wake from now on arms the timer at once, and one
	// before it is seen here.
	if s.woken.Swap(false) || ctx.Err() != nil {
		return
	}
	if err == nil {
		err = s.wait()
	}
	if err != nil {
		// Never seen: sleep on the runtime's timer, briefly, so that
		// a wake is late by at most that.
		d := 10 * time.Millisecond
		if !until.IsZero() {
			d = min(d, time.Until(until))
		}
		time.Sleep(d)
	}
	s.woken.Store(false)
}

func (s *timerSleeper) wake() {
	s.woken.Store(true)
	s.arm(0, false)
}

func (s *timerSleeper) close() { s.f.Close() }
