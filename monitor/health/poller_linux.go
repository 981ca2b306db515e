package health

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// poller runs probes on non-blocking sockets without a goroutine, timer
// or context of their own: one epoll instance watches every socket in
// flight, one goroutine waits on it, and a heap of deadlines, also served
// by that goroutine, times the probes out. The goroutine waits in the Go
// runtime's network poller, which watches the epoll instance (itself
// pollable) with one deadline, the earliest of the heap's, rather than in
// a blocking epoll_wait: a thread blocked in a system call costs the
// runtime a thread hand-off and keeps its monitor waking every 20 µs.
//
// Probes without a socket (half-open ones, see pollOp.owner) are on a
// heap of their own: the loop collects their replies and times them out
// unless a caller drives the poller (drive), as the Manager does, whose
// rounds do it (tend) with no wake-up of the loop's.
//
// A probe (pollOp) is started by its prober on the caller's goroutine,
// which creates the socket and starts connecting (and may end the probe
// there and then, without the poller); once added, the poller's
// goroutine alone handles it, and when it ends (its handler says so, its
// deadline passes, or the poller closes) closes the socket and calls the
// op's done function once.
//
// The sockets the poller watches are closed only by its goroutine, after
// it has handled every event of the epoll_wait that reported them, so a
// descriptor number reused by a new probe cannot receive a stale event
// of an old one. A socket its handler keeps (pollKeeper) leaves the
// epoll instance before its probe's done function runs, and is watched
// again only as a new probe's.
type poller struct {
	epfd int
	// timer is a timerfd in the epoll instance that expires when the
	// loop is to wake on its own: a runtime deadline on file would wake
	// it twice (the runtime waits in whole milliseconds, rounded down,
	// then for the rest) and the runtime's monitor thread with it.
	timer int
	// file is epfd in the runtime's network poller, whose read
	// deadline is the loop's wake-up time.
	file   *os.File
	raw    syscall.RawConn
	t0     time.Time
	exited chan struct{}

	mu  sync.Mutex
	ops map[int32]*pollOp // by descriptor
	// deadlines orders the ops with a socket by deadline, sockOps those
	// without.
	deadlines, sockOps opHeap
	// sleep is when the loop wakes on its own (math.MaxInt64: never),
	// so that add wakes it only for an earlier deadline.
	sleep   int64
	gen     uint32
	closing bool
	// closed says that close began.
	closed bool
	// driven says that the Manager's rounds tend the ops without a
	// socket (see tend), and the loop leaves them alone but when it
	// closes.
	driven atomic.Bool
	// failed says that the loop ended on an error of its own.
	failed atomic.Bool
	// slack (ns) is how late the loop may see a deadline pass, so that
	// it wakes once for the deadlines within it rather than once for
	// each: it wakes for deadlines at most once per slack.
	slack atomic.Int64
}

// pollHandler is what a kind of probe does on its socket's readiness.
type pollHandler interface {
	// event handles the readiness events of op's socket (EPOLLIN,
	// EPOLLOUT, EPOLLERR, EPOLLHUP...) and reports whether the probe
	// has ended, and with what result.
	event(op *pollOp, events uint32) (bool, error)
	// timeout returns the error of op, whose deadline passed.
	timeout(op *pollOp) error
}

// pollOp is one probe in flight on a poller.
type pollOp struct {
	fd       int
	gen      uint32
	deadline int64 // poller time, ns
	index    int   // in the deadline heap, -1 once off it
	handler  pollHandler
	done     func(error)
	// state is the handler's: how far the probe has got.
	state int
	// buf is the handler's.
	buf []byte
	// keep, which the handler sets when it ends the probe, asks the
	// poller to hand the socket back (pollKeeper) rather than close it.
	keep bool
	// reused is the handler's: the socket is a connection kept from
	// an earlier probe.
	reused bool
	// A probe without a socket of its own (fd -1, a half-open check's,
	// whose replies come to a shared raw socket) is on the poller for
	// its deadline alone: owner is its poller, which another goroutine
	// ends it on with finish; seq and port are the handler's.
	owner *poller
	seq   uint32
	port  uint16
}

// pollReleaser is the handler of probes without a socket: the poller
// calls release, after taking such a probe off its heap at its deadline
// or when closing and before calling its done function, in place of
// closing a socket.
type pollReleaser interface {
	release(op *pollOp)
}

// pollKeeper is the handler of probes whose socket may outlive them (an
// http check's kept-alive connection): when such a probe ends with
// op.keep set, the poller stops watching the socket and calls kept, on
// its goroutine and before the op's done function, in place of closing
// it; the socket is the handler's from then on. A poller that is
// closing, or cannot stop watching the socket, closes it.
type pollKeeper interface {
	kept(fd int)
}

// errPollerClosed ends the probes in flight when a poller closes.
var errPollerClosed = errors.New("health checks stopped")

// newPoller opens a poller and starts its goroutine.
func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("create epoll instance: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("create epoll instance: %w", err)
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("create timer: %w", os.NewSyscallError("timerfd_create", err))
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(tfd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, tfd, &ev); err != nil {
		unix.Close(tfd)
		unix.Close(epfd)
		return nil, fmt.Errorf("watch timer: %w", err)
	}
	// Non-blocking, the descriptor joins the runtime's poller.
	file := os.NewFile(uintptr(epfd), "epoll")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		unix.Close(tfd)
		return nil, fmt.Errorf("create epoll instance: %w", err)
	}
	p := &poller{
		epfd:   epfd,
		timer:  tfd,
		file:   file,
		raw:    raw,
		t0:     time.Now(),
		exited: make(chan struct{}),
		ops:    map[int32]*pollOp{},
		sleep:  math.MaxInt64,
	}
	go p.loop()
	return p, nil
}

// usable reports whether p (which may be nil) takes probes: it is open
// and its loop runs.
func (p *poller) usable() bool { return p != nil && !p.failed.Load() }

// now returns the poller's time: nanoseconds on the monotonic clock.
func (p *poller) now() int64 { return int64(time.Since(p.t0)) }

// at returns the poller time of t.
func (p *poller) at(t time.Time) int64 { return int64(t.Sub(p.t0)) }

// add hands op, whose socket op.fd is connecting, to the poller, to be
// watched for events until op.deadline. On an error op is not added and
// its socket is left to the caller.
//
// An op whose fd is -1 has no socket: the poller only times it out
// (calling its handler's timeout and release), unless finish ends it
// first.
func (p *poller) add(op *pollOp, events uint32) error {
	op.index = -1
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return errPollerClosed
	}
	p.gen++
	op.gen = p.gen
	wake := op.deadline
	if op.fd >= 0 {
		p.ops[int32(op.fd)] = op
		heap.Push(&p.deadlines, op)
	} else {
		heap.Push(&p.sockOps, op)
		// Its reply is to be collected within a slack.
		wake = p.now() + p.collectEvery()
		if p.driven.Load() {
			wake = math.MaxInt64 // the Manager's rounds do
		}
	}
	if wake < p.sleep {
		p.sleep = wake
		p.setWake()
	}
	p.mu.Unlock()
	if op.fd < 0 {
		return nil
	}
	ev := unix.EpollEvent{Events: events, Fd: int32(op.fd), Pad: int32(op.gen)}
	if err := rawEpollCtl(p.epfd, unix.EPOLL_CTL_ADD, op.fd, &ev); err != nil {
		p.mu.Lock()
		delete(p.ops, int32(op.fd))
		p.remove(op)
		p.mu.Unlock()
		return fmt.Errorf("watch socket: %w", err)
	}
	return nil
}

// finish ends op, a probe without a socket that add took, with err,
// unless it has ended already (timed out, or the poller closed): it
// calls op's done function, on the caller's goroutine, at most once
// between them. It does not call the handler's release.
func (p *poller) finish(op *pollOp, err error) {
	p.mu.Lock()
	if op.index < 0 {
		p.mu.Unlock()
		return
	}
	heap.Remove(&p.sockOps, op.index)
	// The loop may wake for the deadline of op, find nothing due and
	// plan again: cheaper than waking it now.
	p.mu.Unlock()
	op.done(err)
}

// setWake makes the loop wake at p.sleep. Called with mu held, so that
// the last wake-up time set is the one for the whole heap.
func (p *poller) setWake() {
	// Fails only once closed.
	_ = armTimerfd(p.timer, time.Duration(p.sleep-p.now()), p.sleep == math.MaxInt64)
}

// setSlack makes d (none if not positive) the slack of p's deadlines (p
// may be nil): the Manager's, whose probes end at most d after their
// deadlines.
func (p *poller) setSlack(d time.Duration) {
	if p != nil {
		p.slack.Store(int64(max(d, 0)))
	}
}

// flush sends what the probes started on p since the last flush have
// queued (half-open probes' SYNs, sent together).
func (p *poller) flush() { flushSYNs() }

// close ends the probes in flight, with errPollerClosed, and the poller's
// goroutine, and waits for them.
func (p *poller) close() {
	flushSYNs()
	p.mu.Lock()
	if p.closed {
		// Closed already: its descriptors' numbers may be others' now.
		p.mu.Unlock()
		<-p.exited
		return
	}
	p.closed, p.closing = true, true
	p.sleep = 0
	p.setWake()
	p.mu.Unlock()
	<-p.exited
	p.file.Close()
	unix.Close(p.timer)
}

// readyOp is a probe with the events epoll_wait reported for it.
type readyOp struct {
	op     *pollOp
	events uint32
}

// ended is a probe the loop ends, with its result.
type ended struct {
	op  *pollOp
	err error
}

// loop waits for events and deadlines, and ends probes, until close.
func (p *poller) loop() {
	defer close(p.exited)
	events := make([]unix.EpollEvent, 256)
	var ready []readyOp
	var done []ended
	var n int
	var werr error
	wait := func(uintptr) bool {
		n, werr = rawEpollWait(p.epfd, events)
		return n != 0 || (werr != nil && werr != unix.EINTR)
	}
	for {
		err := p.raw.Read(wait)
		if err == nil && werr == nil {
			// The timer, if it expired, is read so that it stops
			// waking the loop; plan arms it again.
			n = p.dropTimer(events[:n])
		}
		p.mu.Lock()
		collect := len(p.sockOps) > 0 && !p.driven.Load()
		p.mu.Unlock()
		if collect {
			// Before the deadlines: a reply that came in time ends
			// its probe, which does not time out.
			collectSYNs()
		}
		switch {
		case err == nil && werr == nil:
		default:
			// Only a bad descriptor or buffer fails epoll_wait, not
			// something waiting fixes: end everything rather than
			// spin, and let the probes run elsewhere.
			n = 0
			p.failed.Store(true)
			p.mu.Lock()
			p.closing = true
			p.mu.Unlock()
		}
		ready = ready[:0]
		p.mu.Lock()
		for _, ev := range events[:n] {
			if op := p.ops[ev.Fd]; op != nil && op.gen == uint32(ev.Pad) {
				ready = append(ready, readyOp{op, ev.Events})
			}
		}
		p.mu.Unlock()
		done = done[:0]
		for _, r := range ready {
			if end, err := r.op.handler.event(r.op, r.events); end {
				done = append(done, ended{r.op, err})
			}
		}
		now := p.now()
		p.mu.Lock()
		for _, d := range done {
			p.remove(d.op)
		}
		done = p.expire(&p.deadlines, now, done)
		if !p.driven.Load() {
			done = p.expire(&p.sockOps, now, done)
		}
		closing := p.closing
		if closing {
			// Every op is on a heap.
			for _, h := range []*opHeap{&p.deadlines, &p.sockOps} {
				for len(*h) > 0 {
					op := (*h)[0]
					p.remove(op)
					done = append(done, ended{op, errPollerClosed})
				}
			}
		}
		p.plan(now)
		p.mu.Unlock()
		for _, d := range done {
			if d.op.fd >= 0 {
				p.closeOrKeep(d.op, closing)
			} else {
				d.op.handler.(pollReleaser).release(d.op)
			}
			d.op.done(d.err)
		}
		if closing {
			return
		}
	}
}

// dropTimer takes the timer's event, if any, out of events, reading the
// timer, and returns how many events are left.
func (p *poller) dropTimer(events []unix.EpollEvent) int {
	for i, ev := range events {
		if ev.Fd == int32(p.timer) {
			var buf [8]byte
			_, _, _ = unix.RawSyscall(unix.SYS_READ, uintptr(p.timer), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
			events[i] = events[len(events)-1]
			return len(events) - 1
		}
	}
	return len(events)
}

// closeOrKeep closes the socket of op, which has ended, or hands it to
// op's handler if it asked to keep it.
func (p *poller) closeOrKeep(op *pollOp, closing bool) {
	if op.keep && !closing {
		if k, ok := op.handler.(pollKeeper); ok && rawEpollCtl(p.epfd, unix.EPOLL_CTL_DEL, op.fd, nil) == nil {
			k.kept(op.fd)
			return
		}
	}
	rawClose(op.fd)
}

// remove takes op off the poller's table and heap. Called with mu held.
func (p *poller) remove(op *pollOp) {
	if op.fd >= 0 {
		delete(p.ops, int32(op.fd))
	}
	if op.index >= 0 {
		if op.fd >= 0 {
			heap.Remove(&p.deadlines, op.index)
		} else {
			heap.Remove(&p.sockOps, op.index)
		}
	}
}

// expire takes the ops of h whose deadline is at or before now off the
// poller, and appends them to done with their timeouts. Called with mu
// held.
func (p *poller) expire(h *opHeap, now int64, done []ended) []ended {
	for len(*h) > 0 && (*h)[0].deadline <= now {
		op := (*h)[0]
		p.remove(op)
		done = append(done, ended{op, op.handler.timeout(op)})
	}
	return done
}

// drive makes the caller's rounds, rather than p's loop, tend the
// probes without a socket (p may be nil): they call tend at least once
// per collectEvery while pending says that some are in flight.
func (p *poller) drive() {
	if p != nil {
		p.driven.Store(true)
	}
}

// pending reports whether probes without a socket are in flight on p
// (which may be nil).
func (p *poller) pending() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sockOps) > 0
}

// tend collects the replies of the probes without a socket (half-open
// ones), which ends them, and times out those whose deadline has
// passed, on the caller's goroutine: the Manager's round does it, where
// the loop's own wake-up would cost a second one per round. p may be
// nil.
func (p *poller) tend() {
	if !p.pending() {
		return
	}
	collectSYNs()
	p.mu.Lock()
	done := p.expire(&p.sockOps, p.now(), nil)
	p.mu.Unlock()
	for _, d := range done {
		d.op.handler.(pollReleaser).release(d.op)
		d.op.done(d.err)
	}
}

// plan makes the loop, which woke at now, wake on its own at the first
// deadline, or, if that is sooner, at the end of the slack: with probes
// in flight all the time, it wakes once per slack for the deadlines of
// the probes started since, most of which replies have ended before.
// With half-open probes in flight, it wakes within collectEvery to
// collect their replies. Called with mu held.
func (p *poller) plan(now int64) {
	p.sleep = math.MaxInt64
	if len(p.deadlines) > 0 {
		p.sleep = max(p.deadlines[0].deadline, now+p.slack.Load())
	}
	if len(p.sockOps) > 0 && !p.driven.Load() {
		p.sleep = min(p.sleep, now+p.collectEvery())
	}
	p.setWake()
}

// collectEvery is how long the replies of half-open probes may wait to
// be collected: the slack, at least minCollect.
func (p *poller) collectEvery() int64 { return int64(collectWait(time.Duration(p.slack.Load()))) }

// collectWait is how long the replies of half-open probes may wait to
// be collected with slack: slack, at least minCollect.
func collectWait(slack time.Duration) time.Duration { return max(slack, minCollect) }

// minCollect is the shortest wait of a reply with no slack.
const minCollect = time.Millisecond

// opHeap orders ops by deadline.
type opHeap []*pollOp

func (h opHeap) Len() int           { return len(h) }
func (h opHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h opHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *opHeap) Push(x any) {
	op := x.(*pollOp)
	op.index = len(*h)
	*h = append(*h, op)
}

func (h *opHeap) Pop() any {
	old := *h
	op := old[len(old)-1]
	old[len(old)-1] = nil
	op.index = -1
	*h = old[:len(old)-1]
	return op
}
