package status

import (
	"context"
	"sync"
	"time"
)

// CacheOptions configure a Cache.
type CacheOptions struct {
	// Interval is how long a snapshot is served before a request takes
	// a new one; it must be above zero.
	Interval time.Duration
	// Take takes a snapshot: it reads the kernel and joins what it read
	// with the daemon's state. The Cache calls it from a goroutine of its
	// own, never twice at a time.
	Take func() (*Snapshot, error)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Cache holds the last Snapshot and takes a new one only when a request
// finds it older than the interval, or taken before the last Invalidate.
// Concurrent requests share one take, so a flood of requests costs one
// read of the kernel per interval; a request whose context has ended
// starts nothing, and one that gives up waiting leaves the take it waited
// for to finish and serve the next request. Its methods are safe for
// concurrent use.
type Cache struct {
	opts CacheOptions

	mu   sync.Mutex
	snap *Snapshot
	err  error
	// taken is when the last take ended; takenGen is gen when it began.
	taken    time.Time
	takenGen uint64
	has      bool
	// gen counts Invalidate calls.
	gen uint64
	// running is closed when the take in progress ends; nil when none
	// runs.
	running chan struct{}
	// takes counts the takes that ended.
	takes uint64
}

// NewCache returns an empty Cache.
func NewCache(opts CacheOptions) *Cache {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Cache{opts: opts}
}

// Get returns a snapshot (or the error taking it returned) no older than
// the interval and taken after the last Invalidate, taking one if there
// is none. If a take is under way it waits for that take, unless the take
// began before the last Invalidate, in which case it waits for the next.
// It returns ctx's error if ctx ends first, having started nothing if ctx
// had ended already.
func (c *Cache) Get(ctx context.Context) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want, seen := c.gen, c.takes
	for {
		fresh := c.has && c.takenGen == c.gen && c.opts.Now().Sub(c.taken) < c.opts.Interval
		// A take that ended since the request came and began after the
		// last Invalidate before it is the one the request waited for.
		waited := c.takes > seen && c.takenGen >= want
		if fresh || waited {
			return c.snap, c.err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if c.running == nil {
			c.start()
		}
		done := c.running
		c.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		c.mu.Lock()
	}
}

// start begins a take. The caller holds c.mu.
func (c *Cache) start() {
	done := make(chan struct{})
	c.running = done
	gen := c.gen
	go func() {
		snap, err := c.opts.Take()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.snap, c.err, c.has = snap, err, true
		c.taken, c.takenGen = c.opts.Now(), gen
		c.running = nil
		c.takes++
		close(done)
	}()
}

// Last returns the last snapshot taken (or the error taking it returned)
// without taking one; nil and nil before the first take.
func (c *Cache) Last() (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap, c.err
}

// SetInterval changes the interval (a reload that changes it).
func (c *Cache) SetInterval(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opts.Interval = d
}

// Invalidate makes the next Get take a new snapshot: what a snapshot
// shows changed (the configuration, a drain, the kernel).
func (c *Cache) Invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
}
