package health

import (
	"context"
	"testing"
	"time"
)

// TestTimerSleeper checks the timerfd sleeper the scheduler uses on the
// real clock: it sleeps until the instant asked, not before; a wake ends
// a sleep in progress, and one that came before the sleep ends it at
// once; a sleep without a deadline lasts until a wake; and a wake from
// ctx's end (as Run arranges) ends it.
func TestTimerSleeper(t *testing.T) {
	s, ok := newSleeper(SystemClock{}).(*timerSleeper)
	if !ok {
		t.Fatal("the real clock's sleeper is not on a timerfd")
	}
	defer s.close()
	ctx := context.Background()

	// within runs f and checks how long it took.
	within := func(what string, least, most time.Duration, f func()) {
		t.Helper()
		start := time.Now()
		f()
		if d := time.Since(start); d < least || d > most {
			t.Errorf("%s took %v, want %v..%v", what, d, least, most)
		}
	}
	for range 3 {
		within("a sleep of 30 ms", 30*time.Millisecond, time.Second, func() { s.sleep(ctx, time.Now().Add(30*time.Millisecond)) })
	}
	within("a sleep until a past instant", 0, 100*time.Millisecond, func() { s.sleep(ctx, time.Now().Add(-time.Second)) })

	go func() {
		time.Sleep(30 * time.Millisecond)
		s.wake()
	}()
	within("a sleep of an hour woken after 30 ms", 30*time.Millisecond, time.Second, func() { s.sleep(ctx, time.Now().Add(time.Hour)) })

	s.wake()
	within("a sleep after a wake", 0, 100*time.Millisecond, func() { s.sleep(ctx, time.Now().Add(time.Hour)) })
	// That wake is spent: the next sleep lasts.
	within("the sleep after", 30*time.Millisecond, time.Second, func() { s.sleep(ctx, time.Now().Add(30*time.Millisecond)) })

	go func() {
		time.Sleep(30 * time.Millisecond)
		s.wake()
	}()
	within("a sleep without a deadline woken after 30 ms", 30*time.Millisecond, time.Second, func() { s.sleep(ctx, time.Time{}) })

	cctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(cctx, s.wake)()
	go func() {
		time.Sleep(30 * time.Millisecond)
		cancel()
	}()
	within("a sleep whose context ends after 30 ms", 30*time.Millisecond, time.Second, func() { s.sleep(cctx, time.Time{}) })
	within("a sleep whose context ended", 0, 100*time.Millisecond, func() { s.sleep(cctx, time.Now().Add(time.Hour)) })
}
