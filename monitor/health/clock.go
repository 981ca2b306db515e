package health

import (
	"context"
	"time"
)

// Clock is the Manager's source of time, replaceable in tests. Probe
// timeouts always run on the real clock.
type Clock interface {
	Now() time.Time
	// NewTimer returns a stopped timer.
	NewTimer() Timer
}

// Timer is a single-shot timer set to an instant rather than a duration,
// so that a fake clock advanced between reading the time and arming the
// timer cannot make it fire late.
type Timer interface {
	C() <-chan time.Time
	// Reset discards a pending firing and makes the timer fire once when
	// the clock reaches t, at once if it already has.
	Reset(t time.Time)
	// Stop discards a pending firing and disarms the timer.
	Stop()
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// NewTimer returns a stopped timer on the real clock.
func (SystemClock) NewTimer() Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return systemTimer{t}
}

type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Reset(at time.Time)  { t.t.Reset(time.Until(at)) }
func (t systemTimer) Stop()               { t.t.Stop() }

// A sleeper is where the scheduler waits between its rounds.
type sleeper interface {
	// sleep returns once the clock reaches until (never, if until is
	// zero), after a wake (one before the sleep included), or once ctx
	// ends.
	sleep(ctx context.Context, until time.Time)
	// wake ends the sleep in progress, or the next one.
	wake()
	// close releases the sleeper.
	close()
}

// chanSleeper sleeps on a Clock's Timer.
type chanSleeper struct {
	timer Timer
	woken chan struct{}
}

func newChanSleeper(c Clock) *chanSleeper {
	return &chanSleeper{timer: c.NewTimer(), woken: make(chan struct{}, 1)}
}

func (s *chanSleeper) sleep(ctx context.Context, until time.Time) {
	if until.IsZero() {
		s.timer.Stop()
	} else {
		s.timer.Reset(until)
	}
	select {
	case <-ctx.Done():
	case <-s.timer.C():
	case <-s.woken:
	}
}

func (s *chanSleeper) wake() {
	select {
	case s.woken <- struct{}{}:
	default:
	}
}

func (s *chanSleeper) close() { s.timer.Stop() }
