package status

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// takes is a Take that counts its calls and, while gate is set, waits
// for a value on it before returning.
type takes struct {
	n     atomic.Int64
	gate  chan struct{}
	err   error
	clock *clock
}

func (tk *takes) take() (*Snapshot, error) {
	n := tk.n.Add(1)
	if tk.gate != nil {
		<-tk.gate
	}
	if tk.err != nil {
		return nil, tk.err
	}
	return &Snapshot{Time: tk.clock.now(), Foreign: int(n)}, nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTestCache(tk *takes) *Cache {
	tk.clock = &clock{t: now}
	return NewCache(CacheOptions{Interval: 5 * time.Second, Take: tk.take, Now: tk.clock.now})
}

// TestCacheFlood: 200 concurrent requests while a take is under way share
// it; requests within the interval take nothing; one after it takes once.
func TestCacheFlood(t *testing.T) {
	tk := &takes{gate: make(chan struct{})}
	c := newTestCache(tk)
	var wg sync.WaitGroup
	got := make(chan *Snapshot, 200)
	for range 200 {
		wg.Go(func() {
			s, err := c.Get(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- s
		})
	}
	// Let the requests pile up on the one take, then release it.
	for tk.n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	close(tk.gate)
	wg.Wait()
	close(got)
	for s := range got {
		if s == nil || s.Foreign != 1 {
			t.Fatalf("a request got %+v, want the first take's snapshot", s)
		}
	}
	for range 100 {
		c.Get(context.Background())
	}
	tk.clock.advance(4 * time.Second)
	c.Get(context.Background())
	if n := tk.n.Load(); n != 1 {
		t.Fatalf("%d takes within the interval, want 1", n)
	}
	tk.clock.advance(time.Second)
	if s, _ := c.Get(context.Background()); s.Foreign != 2 {
		t.Fatalf("after the interval got snapshot %d, want a new one", s.Foreign)
	}
	if n := tk.n.Load(); n != 2 {
		t.Fatalf("%d takes, want 2", n)
	}
}

// TestCacheAbandoned: a request whose context has ended starts no take;
// requests that give up waiting leave one take, which serves the next
// request, and nothing after it.
func TestCacheAbandoned(t *testing.T) {
	tk := &takes{gate: make(chan struct{})}
	c := newTestCache(tk)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Get with an ended context = %v", err)
	}
	if n := tk.n.Load(); n != 0 {
		t.Fatalf("an abandoned request took %d snapshots", n)
	}

	ctx, cancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			if _, err := c.Get(ctx); !errors.Is(err, context.Canceled) {
				t.Errorf("abandoned Get = %v", err)
			}
		})
	}
	for tk.n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	cancel()
	wg.Wait()
	close(tk.gate)
	s, err := c.Get(context.Background())
	if err != nil || s.Foreign != 1 {
		t.Fatalf("the next request got %+v %v, want the abandoned requests' take", s, err)
	}
	if n := tk.n.Load(); n != 1 {
		t.Fatalf("40 abandoned requests and one more cost %d takes, want 1", n)
	}
}

// TestCacheInvalidate: a change makes the next request take a snapshot
// within the interval; a request after a change does not get a take that
// began before it.
func TestCacheInvalidate(t *testing.T) {
	tk := &takes{}
	c := newTestCache(tk)
	c.Get(context.Background())
	c.Invalidate()
	if s, _ := c.Get(context.Background()); s.Foreign != 2 {
		t.Fatalf("after Invalidate got snapshot %d, want a new one", s.Foreign)
	}
	c.Get(context.Background())
	if n := tk.n.Load(); n != 2 {
		t.Fatalf("%d takes, want 2", n)
	}

	// A take under way when the change comes is not enough.
	tk.gate = make(chan struct{})
	c.Invalidate()
	first := make(chan *Snapshot)
	go func() {
		s, _ := c.Get(context.Background())
		first <- s
	}()
	for tk.n.Load() == 2 {
		time.Sleep(time.Millisecond)
	}
	c.Invalidate()
	second := make(chan *Snapshot)
	go func() {
		s, _ := c.Get(context.Background())
		second <- s
	}()
	time.Sleep(10 * time.Millisecond)
	tk.gate <- struct{}{}
	if s := <-first; s.Foreign != 3 {
		t.Errorf("the request before the change got snapshot %d, want 3", s.Foreign)
	}
	tk.gate <- struct{}{}
	if s := <-second; s.Foreign != 4 {
		t.Errorf("the request after the change got snapshot %d, want 4 (taken after the change)", s.Foreign)
	}
}

// TestCacheError: a failed take is served, as its error, for the
// interval like a snapshot.
func TestCacheError(t *testing.T) {
	boom := errors.New("boom")
	tk := &takes{err: boom}
	c := newTestCache(tk)
	for range 10 {
		if _, err := c.Get(context.Background()); !errors.Is(err, boom) {
			t.Fatalf("Get = %v, want boom", err)
		}
	}
	if _, err := c.Last(); !errors.Is(err, boom) {
		t.Errorf("Last = %v, want boom", err)
	}
	if n := tk.n.Load(); n != 1 {
		t.Fatalf("%d failed takes within the interval, want 1", n)
	}
	tk.err = nil
	tk.clock.advance(5 * time.Second)
	if s, err := c.Get(context.Background()); err != nil || s == nil {
		t.Fatalf("Get after the interval = %v %v", s, err)
	}
}
