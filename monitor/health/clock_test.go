package health

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer() Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t
}

// Advance moves the clock on by d and fires the timers due by then.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if t.armed && !t.at.After(c.now) {
			t.armed = false
			t.fire(c.now)
		}
	}
}

// armed returns the times the armed timers are set to.
func (c *fakeClock) armed() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, t := range c.timers {
		if t.armed {
			out = append(out, t.at)
		}
	}
	return out
}

type fakeTimer struct {
	c     *fakeClock
	ch    chan time.Time
	at    time.Time
	armed bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(at time.Time) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.drain()
	if !at.After(t.c.now) {
		t.armed = false
		t.fire(t.c.now)
		return
	}
	t.at, t.armed = at, true
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.armed = false
	t.drain()
}

func (t *fakeTimer) fire(now time.Time) {
	select {
	case t.ch <- now:
	default:
	}
}

func (t *fakeTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

func TestFakeClockTimer(t *testing.T) {
	c := newFakeClock()
	tm := c.NewTimer()
	tm.Reset(c.Now().Add(time.Second))
	c.Advance(999 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("timer fired early")
	default:
	}
	c.Advance(time.Millisecond)
	select {
	case <-tm.C():
	default:
		t.Fatal("timer did not fire")
	}
	tm.Reset(c.Now().Add(-time.Second))
	select {
	case <-tm.C():
	default:
		t.Fatal("timer set in the past did not fire at once")
	}
}

func TestSystemClockTimer(t *testing.T) {
	tm := SystemClock{}.NewTimer()
	select {
	case <-tm.C():
		t.Fatal("new timer is not stopped")
	case <-time.After(10 * time.Millisecond):
	}
	tm.Reset(time.Now().Add(5 * time.Millisecond))
	select {
	case <-tm.C():
	case <-time.After(5 * time.Second):
		t.Fatal("timer did not fire")
	}
}

// TestChanSleeper checks the sleeper of other clocks the same way, on a
// fake clock.
func TestChanSleeper(t *testing.T) {
	c := newFakeClock()
	s := newSleeper(c)
	defer s.close()
	ctx := context.Background()
	done := make(chan struct{})
	until := c.Now().Add(time.Second)
	go func() {
		s.sleep(ctx, until)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("the sleep ended before the clock moved")
	case <-time.After(30 * time.Millisecond):
	}
	c.Advance(time.Second)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the sleep did not end when the clock reached its end")
	}
	s.wake()
	s.sleep(ctx, time.Time{}) // ended by the wake before it
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	s.sleep(cctx, time.Time{}) // ended by ctx
}
