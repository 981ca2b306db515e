package main

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// connSlots bounds the connections of a TCP server so that no client
// locks the others out by holding connections it does not use (see
// admit):
//
//   - at most max connections are open, and at most perClient from one
//     client (0: no such limit); a client is an IPv4 address or an IPv6
//     /64 (what one host can take);
//   - a connection idle between requests (HTTP keep-alive) or still
//     sending its request's headers holds nothing the server needs: its
//     slot is taken by the next connection that needs one;
//   - a connection whose request is being served is never taken.
//
// A server's listener is wrapped with listener, and its ConnState,
// ConnContext and handler with state, context and serving.
type connSlots struct {
	max, perClient int
	// slowAfter is how long a connection may take to send its
	// request's headers before its slot is taken for another client's
	// (it keeps it until the header timeout while slots are free).
	slowAfter time.Duration

	mu sync.Mutex
	// freed is closed, and replaced, when a slot is freed.
	freed   chan struct{}
	conns   map[*slotConn]struct{}
	clients map[netip.Prefix]int
}

func newConnSlots(max, perClient int, slowAfter time.Duration) *connSlots {
	return &connSlots{max: max, perClient: perClient, slowAfter: slowAfter, freed: make(chan struct{}),
		conns: make(map[*slotConn]struct{}), clients: make(map[netip.Prefix]int)}
}

// slotConn is a connection holding a slot. Its fields but Conn and client
// are guarded by the slots' mu.
type slotConn struct {
	net.Conn
	s      *connSlots
	client netip.Prefix
	// since is when the connection entered its state: accepted, began
	// its request, or went idle.
	since   time.Time
	idle    bool // between requests (keep-alive)
	serving bool // a request in the handler
	gone    bool // the slot is free again
}

// Read notes a request beginning on a connection that was idle: from its
// first byte it is reading a request, which the server may be about to
// serve.
func (c *slotConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.s.mu.Lock()
		if c.idle {
			c.idle, c.since = false, time.Now()
		}
		c.s.mu.Unlock()
	}
	return n, err
}

// Close frees the connection's slot and closes it.
func (c *slotConn) Close() error {
	c.s.release(c)
	return c.Conn.Close()
}

// clientOf returns the client a remote address counts for.
func clientOf(addr net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return netip.Prefix{} // not an IP address: one client
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	return netip.PrefixFrom(a, 64).Masked()
}

// admit gives c a slot, taking it from another connection if need be,
// and reports whether it got one:
//
//   - a client at its limit takes the slot of its own connection idle
//     longest, or failing that of its own that began longest ago and is
//     not being served;
//   - a connection that finds every slot taken takes a slot that is not
//     being served: one idle, or still sending its headers after
//     slowAfter, or held by a client that holds more than one slot more
//     than c's (so that the client holding fewest always gets one); idle
//     ones first, then of the client holding most, then the longest in
//     its state.
//
// A client at its limit is otherwise refused: the caller closes c. A
// connection that finds every slot taken otherwise waits (full): the
// caller tries again when a slot is freed or a connection may have become
// slow. The connection whose slot is taken is closed.
func (s *connSlots) admit(c net.Conn) (_ *slotConn, admitted, full bool) {
	sc := &slotConn{Conn: c, s: s, client: clientOf(c.RemoteAddr()), since: time.Now()}
	s.mu.Lock()
	held := s.clients[sc.client]
	atLimit := s.perClient > 0 && held >= s.perClient
	var victim *slotConn
	switch {
	case atLimit:
		victim = s.victim(func(o *slotConn) bool { return o.client == sc.client })
	case len(s.conns) >= s.max:
		now := time.Now()
		victim = s.victim(func(o *slotConn) bool {
			return o.idle || now.Sub(o.since) >= s.slowAfter || s.clients[o.client] > held+1
		})
	default:
		s.admitLocked(sc)
		s.mu.Unlock()
		return sc, true, false
	}
	if victim == nil {
		s.mu.Unlock()
		return nil, false, !atLimit
	}
	s.drop(victim)
	s.admitLocked(sc)
	s.mu.Unlock()
	victim.Conn.Close()
	return sc, true, false
}

func (s *connSlots) admitLocked(sc *slotConn) {
	s.conns[sc] = struct{}{}
	s.clients[sc.client]++
}

// victim chooses the connection whose slot to take among those that may
// lose it, not being served nor idle for less than idleSettle: idle ones
// first, then of the client with most connections, then the longest in
// its state. nil if none.
func (s *connSlots) victim(may func(*slotConn) bool) *slotConn {
	var best *slotConn
	better := func(c *slotConn) bool {
		switch {
		case best == nil:
			return true
		case c.idle != best.idle:
			return c.idle
		case s.clients[c.client] != s.clients[best.client]:
			return s.clients[c.client] > s.clients[best.client]
		}
		return c.since.Before(best.since)
	}
	now := time.Now()
	for c := range s.conns {
		if c.serving || c.idle && now.Sub(c.since) < idleSettle || !may(c) {
			continue
		}
		if better(c) {
			best = c
		}
	}
	return best
}

// idleSettle is how long a connection must have been idle before its slot
// may be taken: the response it just sent may still be on its way, and
// closing a connection whose client sent more resets it, losing that
// response.
const idleSettle = 100 * time.Millisecond

// drop frees c's slot. The caller holds mu.
func (s *connSlots) drop(c *slotConn) {
	if c.gone {
		return
	}
	c.gone = true
	delete(s.conns, c)
	if s.clients[c.client]--; s.clients[c.client] <= 0 {
		delete(s.clients, c.client)
	}
	close(s.freed)
	s.freed = make(chan struct{})
}

// waitFreed returns what is closed when a slot is next freed.
func (s *connSlots) waitFreed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freed
}

func (s *connSlots) release(c *slotConn) {
	s.mu.Lock()
	s.drop(c)
	s.mu.Unlock()
}

// state is the server's ConnState: it notes when a connection goes idle
// and when it begins a request.
func (s *connSlots) state(c net.Conn, st http.ConnState) {
	sc, ok := c.(*slotConn)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateIdle:
		sc.idle, sc.since = true, time.Now()
	case http.StateClosed, http.StateHijacked:
		s.drop(sc)
	}
}

// slotKey is the context key of a request's slotConn.
type slotKey struct{}

// context is the server's ConnContext: it gives each request its
// connection.
func (s *connSlots) context(ctx context.Context, c net.Conn) context.Context {
	if sc, ok := c.(*slotConn); ok {
		return context.WithValue(ctx, slotKey{}, sc)
	}
	return ctx
}

// serving wraps h so that a connection whose request is in it keeps its
// slot.
func (s *connSlots) serving(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, _ := r.Context().Value(slotKey{}).(*slotConn)
		if sc != nil {
			s.mu.Lock()
			sc.serving = true
			s.mu.Unlock()
			defer func() {
				s.mu.Lock()
				sc.serving, sc.since = false, time.Now()
				s.mu.Unlock()
			}()
		}
		h.ServeHTTP(w, r)
	})
}

// listener returns ln with its connections bound by s: Accept returns
// only connections admitted, closing those refused at once. A connection
// that finds every slot taken waits for one (see admit), without holding
// up the connections that come after it; at most parkMax wait, and more
// are closed.
func (s *connSlots) listener(ln net.Listener) net.Listener {
	return &slotListener{Listener: ln, s: s, parkMax: 4 * s.max,
		ready: make(chan *slotConn), errc: make(chan error, 1), done: make(chan struct{})}
}

type slotListener struct {
	net.Listener
	s       *connSlots
	parkMax int
	parked  atomic.Int64
	ready   chan *slotConn // admitted connections, for Accept
	errc    chan error     // the listener's Accept failed
	done    chan struct{}  // closed by Close
	start   sync.Once
	stop    sync.Once
}

func (l *slotListener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	select {
	case sc := <-l.ready:
		return sc, nil
	case err := <-l.errc:
		return nil, err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// acceptLoop accepts connections until the listener fails, admitting,
// refusing or parking each.
func (l *slotListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			l.errc <- err
			return
		}
		sc, admitted, full := l.s.admit(c)
		switch {
		case admitted:
			l.hand(sc)
		case full && l.parked.Add(1) <= int64(l.parkMax):
			go l.park(c)
		default:
			if full {
				l.parked.Add(-1)
			}
			c.Close()
		}
	}
}

// park waits until c is admitted (or refused: its client has since taken
// its share), trying again when a slot is freed and as connections may
// become slow.
func (l *slotListener) park(c net.Conn) {
	defer l.parked.Add(-1)
	for {
		freed := l.s.waitFreed()
		select {
		case <-freed:
		case <-time.After(l.s.slowAfter / 4):
		case <-l.done:
			c.Close()
			return
		}
		sc, admitted, full := l.s.admit(c)
		if admitted {
			l.hand(sc)
			return
		}
		if !full {
			c.Close()
			return
		}
	}
}

// hand gives Accept an admitted connection.
func (l *slotListener) hand(sc *slotConn) {
	select {
	case l.ready <- sc:
	case <-l.done:
		sc.Close()
	}
}

func (l *slotListener) Close() error {
	l.stop.Do(func() { close(l.done) })
	return l.Listener.Close()
}
