package bgpproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vipd/vipd/frame"
	"github.com/vipd/vipd/program"
)

// ClientOptions configure Start.
type ClientOptions struct {
	// Program is the path of vipd-bgp; Args are its arguments (the
	// daemon passes its log level and format).
	Program string
	Args    []string
	// Env is added to the daemon's environment for the program.
	Env []string
	// Options are the speaker's.
	Options Options
	// Logger receives the client's log; the program logs to the
	// daemon's standard error itself.
	Logger *slog.Logger
	// OnPeer is called on every change of a session's state the
	// program reports, and with every session idle when the program
	// exits. It must not block.
	OnPeer func(Peer)
	// RequestTimeout bounds the start, a Set and a Peers request (a
	// Peers request also by PeersTimeout); a program that does not
	// answer in time is taken for hung, killed and started again. Zero
	// means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Restart is the first wait before the program is started again
	// after it ended on its own, doubled after each failed start up to
	// MaxRestart; zero means one second and 30 seconds.
	Restart, MaxRestart time.Duration
}

// DefaultRequestTimeout bounds a request to the program; PeersTimeout a
// request for the sessions' state, which vipd status waits for.
const (
	DefaultRequestTimeout = 10 * time.Second
	PeersTimeout          = 2 * time.Second
)

// stopGrace is how long Stop waits for the program to exit after its
// answer before it kills it.
const stopGrace = 5 * time.Second

// Client is the daemon's end of vipd-bgp: an Announcer whose speaker
// runs in the program. When the program ends on its own (a crash, a
// kill), its sessions end with it; the Client logs why, reports the
// sessions idle, and starts it again with the same options and the
// routes last set, waiting longer after each start that fails.
type Client struct {
	opts ClientOptions
	log  *slog.Logger

	// mu guards the fields below.
	mu sync.Mutex
	// ch is the running program, nil while it is restarting.
	ch *child
	// routes are the routes last set; retired says a Retire came after
	// them.
	routes  map[netip.Prefix]Attrs
	retired bool
	// gen counts the Sets and Retires, so that a restart sees one that
	// came while it started the program.
	gen uint64
	// peers are the sessions' last known state.
	peers map[netip.Addr]Peer
	// stopc is closed when Stop begins (the program is not started
	// again); done when the supervisor ends.
	stopc, done chan struct{}
}

// Start starts the program and its speaker. It fails when the program
// cannot start or refuses the options; after that, the Client keeps it
// running until Stop.
func Start(ctx context.Context, opts ClientOptions) (*Client, error) {
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if opts.Restart <= 0 {
		opts.Restart = time.Second
	}
	if opts.MaxRestart <= 0 {
		opts.MaxRestart = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{opts: opts, log: opts.Logger, peers: map[netip.Addr]Peer{}, stopc: make(chan struct{}), done: make(chan struct{})}
	ch, _, err := c.start(ctx)
	if err != nil {
		return nil, err
	}
	c.ch = ch
	go c.supervise(ch)
	return c, nil
}

// child is one run of the program.
type child struct {
	*program.Child
	// gone is closed when the reader saw the socket end; err is why,
	// set before.
	gone chan struct{}
	err  error

	wmu     sync.Mutex
	pmu     sync.Mutex
	nextID  uint64
	pending map[uint64]chan *message
}

// start starts the program, sends the options and the routes to
// announce, and waits for the program's answers; gen is the generation
// of the routes it sent.
func (c *Client) start(ctx context.Context) (ch *child, gen uint64, err error) {
	pc, err := program.Start(program.Options{Program: c.opts.Program, Args: c.opts.Args, Env: c.opts.Env, Output: os.Stderr})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", c.opts.Program, err)
	}
	ch = &child{Child: pc, gone: make(chan struct{}), pending: map[uint64]chan *message{}}
	go c.readLoop(ch)
	opts := c.opts.Options
	if _, err := ch.call(ctx, &message{Op: opStart, Version: Version, Start: &opts}, c.opts.RequestTimeout); err != nil {
		ch.kill()
		return nil, 0, fmt.Errorf("%s: %w", c.opts.Program, err)
	}
	c.mu.Lock()
	routes, retired, gen := c.routes, c.retired, c.gen
	c.mu.Unlock()
	if routes != nil && !retired {
		if _, err := ch.call(ctx, setMessage(routes), c.opts.RequestTimeout); err != nil {
			ch.kill()
			return nil, 0, fmt.Errorf("%s: announce the routes again: %w", c.opts.Program, err)
		}
	}
	return ch, gen, nil
}

// readLoop reads the program's messages until the socket ends: replies
// go to their requests, events to OnPeer.
func (c *Client) readLoop(ch *child) {
	var err error
	for {
		var m *message
		m, err = read(ch.Conn)
		if err != nil {
			break
		}
		switch m.Op {
		case opReply:
			ch.pmu.Lock()
			r := ch.pending[m.ID]
			delete(ch.pending, m.ID)
			ch.pmu.Unlock()
			if r != nil {
				r <- m
			}
		case opPeer:
			c.peer(m.Peers[0])
		default:
			err = fmt.Errorf("the program sent a %s message", m.Op)
		}
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("the program closed its socket")
	}
	ch.err = err
	ch.Conn.Close()
	close(ch.gone)
}

// peer records a session's state and passes it on.
func (c *Client) peer(p Peer) {
	c.mu.Lock()
	c.peers[p.Address] = p
	c.mu.Unlock()
	if c.opts.OnPeer != nil {
		c.opts.OnPeer(p)
	}
}

// call sends m and waits for its reply, at most timeout (none if zero)
// or until ctx ends or the program goes.
func (ch *child) call(ctx context.Context, m *message, timeout time.Duration) (*message, error) {
	r := make(chan *message, 1)
	ch.pmu.Lock()
	ch.nextID++
	m.ID = ch.nextID
	ch.pending[m.ID] = r
	ch.pmu.Unlock()
	defer func() {
		ch.pmu.Lock()
		delete(ch.pending, m.ID)
		ch.pmu.Unlock()
	}()
	ch.wmu.Lock()
	err := frame.Write(ch.Conn, m, MaxFrame)
	ch.wmu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.Op, err)
	}
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	answer := func(rep *message) (*message, error) {
		if rep.Error != "" {
			return nil, fmt.Errorf("%s: %s", m.Op, rep.Error)
		}
		return rep, nil
	}
	select {
	case rep := <-r:
		return answer(rep)
	case <-ch.gone:
		// The reader may have passed the answer on before it saw the
		// end (a program that answered Stop and exited).
		select {
		case rep := <-r:
			return answer(rep)
		default:
		}
		return nil, fmt.Errorf("%s: %w", m.Op, ch.err)
	case <-expired:
		// A program that does not answer in time is taken for hung:
		// killed, the supervisor starts it again.
		ch.Cmd.Process.Kill()
		return nil, fmt.Errorf("%s: no answer in %s: the program is taken for hung and killed", m.Op, timeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", m.Op, ctx.Err())
	}
}

// wait waits for the program to exit, which it does once it answered a
// stop or its socket ended, and kills it after stopGrace or when ctx
// ends.
func (ch *child) wait(ctx context.Context) {
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-ch.Exited():
		return
	case <-ctx.Done():
	case <-t.C:
	}
	ch.Cmd.Process.Kill()
	<-ch.Exited()
}

// stopped reports whether Stop began; c.mu is held, which orders it
// with the closing of stopc.
func (c *Client) stopped() bool {
	select {
	case <-c.stopc:
		return true
	default:
		return false
	}
}

// kill ends the program and waits for it.
func (ch *child) kill() {
	ch.Conn.Close()
	ch.Cmd.Process.Kill()
	<-ch.Exited()
}

// supervise waits for the program to end and, unless Stop ended it,
// starts it again.
func (c *Client) supervise(ch *child) {
	defer close(c.done)
	wait := c.opts.Restart
	for {
		// The program's socket ends when it exits (it holds the only
		// other end), after what it sent: the reader sees everything
		// first. A program whose socket ended otherwise (a frame
		// refused) is killed.
		<-ch.gone
		ch.Conn.Close()
		ch.wait(context.Background())
		c.mu.Lock()
		c.ch = nil
		stopping := c.stopped()
		var idle []Peer
		for a, p := range c.peers {
			if p.State != "idle" {
				p.State, p.Since, p.BFD, p.BFDStatus = "idle", time.Now(), "", nil
				c.peers[a] = p
				idle = append(idle, p)
			}
		}
		c.mu.Unlock()
		if stopping {
			return
		}
		c.log.Error("the BGP speaker program ended; its sessions are down", "program", c.opts.Program, "exit", exitStatus(ch.Err()), "reason", ch.err)
		for _, p := range idle {
			if c.opts.OnPeer != nil {
				c.opts.OnPeer(p)
			}
		}
		for {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-c.stopc:
				t.Stop()
				return
			}
			next, sent, err := c.start(context.Background())
			if err == nil {
				c.mu.Lock()
				if c.stopped() {
					c.mu.Unlock()
					next.kill()
					return
				}
				c.ch = next
				gen, routes, retired := c.gen, c.routes, c.retired
				c.mu.Unlock()
				c.log.Info("the BGP speaker program started again", "program", c.opts.Program)
				if gen != sent {
					// A Set or Retire came while the program started,
					// and failed: this one is its.
					m := setMessage(routes)
					if retired {
						m = &message{Op: opRetire}
					}
					if _, err := next.call(context.Background(), m, c.opts.RequestTimeout); err != nil {
						c.log.Error("the BGP speaker program did not take the routes set while it started", "err", err)
					}
				}
				ch, wait = next, c.opts.Restart
				break
			}
			wait = min(2*wait, c.opts.MaxRestart)
			c.log.Error("the BGP speaker program failed to start again", "err", err, "retry_in", wait)
		}
	}
}

// exitStatus is a program's exit for the log.
func exitStatus(err error) string {
	if err == nil {
		return "exited"
	}
	return err.Error()
}

// running returns the running program, or an error while there is none.
func (c *Client) running() (*child, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		if c.stopped() {
			return nil, errors.New("bgp: the speaker is stopped")
		}
		return nil, errors.New("bgp: the speaker program is restarting")
	}
	return c.ch, nil
}

// setMessage is the request to announce routes.
func setMessage(routes map[netip.Prefix]Attrs) *message {
	m := &message{Op: opSet, Routes: make([]Route, 0, len(routes))}
	for _, p := range slices.SortedFunc(maps.Keys(routes), netip.Prefix.Compare) {
		m.Routes = append(m.Routes, Route{Prefix: p, Attrs: routes[p]})
	}
	return m
}

// Set announces exactly routes and withdraws the rest. While the program
// restarts it fails, and the program announces routes when it is back.
func (c *Client) Set(routes map[netip.Prefix]Attrs) error {
	c.mu.Lock()
	c.routes, c.retired = maps.Clone(routes), false
	c.gen++
	if c.routes == nil {
		c.routes = map[netip.Prefix]Attrs{}
	}
	c.mu.Unlock()
	ch, err := c.running()
	if err != nil {
		return err
	}
	_, err = ch.call(context.Background(), setMessage(routes), c.opts.RequestTimeout)
	return err
}

// Retire withdraws every route, gracefully when the options say so.
func (c *Client) Retire(ctx context.Context) error {
	c.mu.Lock()
	c.retired = true
	c.gen++
	c.mu.Unlock()
	ch, err := c.running()
	if err != nil {
		return err
	}
	_, err = ch.call(ctx, &message{Op: opRetire}, 0)
	return err
}

// Stop retires, waits while the routers converge, ends the sessions and
// the program. When ctx ends first, the program is killed.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.stopped() {
		close(c.stopc)
	}
	ch := c.ch
	c.mu.Unlock()
	var err error
	if ch != nil {
		_, err = ch.call(ctx, &message{Op: opStop}, 0)
		ch.wait(ctx)
	}
	<-c.done
	return err
}

// Peers returns the state of the sessions: the program's answer, or,
// when it gives none in time, the last state it reported.
func (c *Client) Peers() []Peer {
	if ch, err := c.running(); err == nil {
		if rep, err := ch.call(context.Background(), &message{Op: opPeers}, min(c.opts.RequestTimeout, PeersTimeout)); err == nil {
			return rep.Peers
		} else {
			c.log.Warn("the BGP speaker program did not tell its sessions' state", "err", err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.SortedFunc(maps.Values(c.peers), func(a, b Peer) int { return a.Address.Compare(b.Address) })
}
