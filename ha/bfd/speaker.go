package bfd

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Port is the UDP port of single-hop BFD Control packets (RFC 5881 §4).
const Port = 3784

// ttl is the TTL or hop limit single-hop BFD packets are sent with and
// must arrive with (RFC 5881 §5).
const ttl = 255

// PeerOptions configure the session with one peer.
type PeerOptions struct {
	// Address is the peer's address; packets from any other are dropped.
	Address netip.Addr
	// Source is the local address packets are sent from; unset, the
	// kernel's choice.
	Source netip.Addr
	Config
}

// Options configure a Speaker.
type Options struct {
	Peers []PeerOptions
	// Port is the port the speaker listens on and sends to; 0 is Port
	// (tests use another).
	Port uint16
	// Logger receives state changes; nil discards them.
	Logger *slog.Logger
	// OnChange is called, from the speaker's goroutine, on every change
	// of a session's state. It must not block.
	OnChange func(netip.Addr, Change)
}

// Stats count what a speaker received and sent.
type Stats struct {
	Received, Sent uint64
	// Unknown counts packets from an address that is no configured
	// peer, LowTTL those that arrived with a TTL or hop limit below 255,
	// Malformed those Unmarshal refused, and WrongDisc those with a Your
	// Discriminator that is not the session's.
	Unknown, LowTTL, Malformed, WrongDisc uint64
}

// Speaker runs the BFD sessions with a fixed set of peers.
type Speaker struct {
	opts Options
	log  *slog.Logger

	sessions map[netip.Addr]*peer
	conns    []*listener
	in       chan received

	stats struct{ received, sent, unknown, lowTTL, malformed, wrongDisc atomic.Uint64 }

	mu     sync.Mutex // guards the sessions' state for State
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   sync.Once
}

type peer struct {
	PeerOptions
	s    *Session
	conn *net.UDPConn
	// to is the peer's BFD address and port.
	to netip.AddrPort
	// The session's packet counts (Counts).
	received, sent, lowTTL, malformed, wrongDisc atomic.Uint64
}

type received struct {
	src netip.Addr
	ttl int
	b   []byte
	at  time.Time
}

// Start opens the sockets, one to listen per family and one to send per
// peer (from a port in 49152..65535, RFC 5881 §4), and runs the
// sessions until Stop.
func Start(opts Options) (*Speaker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Port == 0 {
		opts.Port = Port
	}
	sp := &Speaker{opts: opts, log: opts.Logger, sessions: map[netip.Addr]*peer{}, in: make(chan received, 64)}
	now := time.Now()
	var has4, has6 bool
	seen := map[netip.Addr]bool{}
	for _, p := range opts.Peers {
		a := p.Address.Unmap()
		if seen[a] || !a.IsValid() {
			return nil, fmt.Errorf("bfd: peer %s is invalid or listed twice", p.Address)
		}
		seen[a] = true
		if p.Interval <= 0 || p.DetectMult == 0 {
			return nil, fmt.Errorf("bfd: peer %s: interval %s and multiplier %d must be positive", a, p.Interval, p.DetectMult)
		}
	}
	for _, p := range opts.Peers {
		a := p.Address.Unmap()
		conn, err := sp.sender(a, p.Source)
		if err != nil {
			sp.close()
			return nil, err
		}
		sp.sessions[a] = &peer{PeerOptions: p, s: NewSession(p.Config, sp.disc(), mrand.Float64, now), conn: conn,
			to: netip.AddrPortFrom(a, opts.Port)}
		has4, has6 = has4 || a.Is4(), has6 || a.Is6()
	}
	for _, fam := range []struct {
		on      bool
		network string
	}{{has4, "udp4"}, {has6, "udp6"}} {
		if !fam.on {
			continue
		}
		c, err := sp.listener(fam.network)
		if err != nil {
			sp.close()
			return nil, err
		}
		sp.conns = append(sp.conns, c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sp.cancel = cancel
	for _, c := range sp.conns {
		sp.wg.Add(1)
		go sp.read(c)
	}
	sp.wg.Add(1)
	go sp.run(ctx)
	return sp, nil
}

// disc returns a random discriminator, non-zero and unique.
func (sp *Speaker) disc() uint32 {
	for {
		var b [4]byte
		rand.Read(b[:])
		d := binary.BigEndian.Uint32(b[:])
		unique := d != 0
		for _, p := range sp.sessions {
			unique = unique && p.s.localDisc != d
		}
		if unique {
			return d
		}
	}
}

// sender returns the socket of the session with a, bound to a source
// port in 49152..65535 (and to src when set), sending with TTL 255. It
// is not connected: a peer without a route yet (its link is down at
// start) is a failed send, retried at the next packet, not a failed
// start.
func (sp *Speaker) sender(a, src netip.Addr) (*net.UDPConn, error) {
	network := "udp4"
	if a.Is6() {
		network = "udp6"
	}
	var err error
	for range 64 {
		var c *net.UDPConn
		port := 49152 + mrand.IntN(65536-49152)
		c, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, uint16(port))))
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			break
		}
		if a.Is4() {
			err = ipv4.NewConn(c).SetTTL(ttl)
		} else {
			err = ipv6.NewConn(c).SetHopLimit(ttl)
		}
		if err != nil {
			c.Close()
			break
		}
		return c, nil
	}
	return nil, fmt.Errorf("bfd: socket to %s: %w", a, err)
}

// listener is the socket that receives every peer's packets of one
// family; p4 or p6 reads them with their TTL or hop limit.
type listener struct {
	c  *net.UDPConn
	p4 *ipv4.PacketConn
	p6 *ipv6.PacketConn
}

func (l *listener) Close() error { return l.c.Close() }

// listener opens the listening socket of a family.
func (sp *Speaker) listener(network string) (*listener, error) {
	c, err := net.ListenUDP(network, &net.UDPAddr{Port: int(sp.opts.Port)})
	if err != nil {
		return nil, fmt.Errorf("bfd: listen on %s port %d: %w", network, sp.opts.Port, err)
	}
	l := &listener{c: c}
	if network == "udp4" {
		l.p4 = ipv4.NewPacketConn(c)
		err = l.p4.SetControlMessage(ipv4.FlagTTL, true)
	} else {
		l.p6 = ipv6.NewPacketConn(c)
		err = l.p6.SetControlMessage(ipv6.FlagHopLimit, true)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bfd: %s: ask for the received TTL: %w", network, err)
	}
	return l, nil
}

// read hands the packets of one listening socket to the loop.
func (sp *Speaker) read(l *listener) {
	defer sp.wg.Done()
	v4, p4, p6 := l.p4 != nil, l.p4, l.p6
	buf := make([]byte, 1500)
	for {
		var (
			n    int
			from net.Addr
			hops = -1
			err  error
		)
		if v4 {
			var cm *ipv4.ControlMessage
			n, cm, from, err = p4.ReadFrom(buf)
			if cm != nil {
				hops = cm.TTL
			}
		} else {
			var cm *ipv6.ControlMessage
			n, cm, from, err = p6.ReadFrom(buf)
			if cm != nil {
				hops = cm.HopLimit
			}
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		src, _ := netip.AddrFromSlice(ua.IP)
		sp.in <- received{src: src.Unmap(), ttl: hops, b: append([]byte(nil), buf[:n]...), at: time.Now()}
	}
}

// run is the speaker's loop: packets received, timers, packets sent.
func (sp *Speaker) run(ctx context.Context) {
	defer sp.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-sp.in:
			sp.receive(r)
		case <-timer.C:
		}
		now := time.Now()
		next := now.Add(time.Hour)
		for a, p := range sp.sessions {
			sp.mu.Lock()
			out, ch, changed := p.s.Tick(now)
			at, ok := p.s.Deadline()
			sp.mu.Unlock()
			if changed {
				sp.changed(a, p, ch)
			}
			if out != nil {
				sp.send(p, out)
			}
			if ok && at.Before(next) {
				next = at
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(time.Until(next), 0))
	}
}

// receive checks a packet and hands it to its session.
func (sp *Speaker) receive(r received) {
	sp.stats.received.Add(1)
	p, ok := sp.sessions[r.src]
	if !ok {
		sp.stats.unknown.Add(1)
		sp.log.Debug("bfd: packet from an address that is no peer dropped", "from", r.src)
		return
	}
	p.received.Add(1)
	if r.ttl != ttl {
		p.lowTTL.Add(1)
		sp.stats.lowTTL.Add(1)
		sp.log.Debug("bfd: packet with a TTL below 255 dropped (not from the link)", "from", r.src, "ttl", r.ttl)
		return
	}
	pkt, err := Unmarshal(r.b)
	if err != nil {
		p.malformed.Add(1)
		sp.stats.malformed.Add(1)
		sp.log.Debug("bfd: malformed packet dropped", "from", r.src, "err", err)
		return
	}
	sp.mu.Lock()
	taken, ch, changed := p.s.Receive(&pkt, r.at)
	sp.mu.Unlock()
	if !taken {
		p.wrongDisc.Add(1)
		sp.stats.wrongDisc.Add(1)
		sp.log.Debug("bfd: packet for another session dropped", "from", r.src, "your_discriminator", pkt.YourDisc)
		return
	}
	if changed {
		sp.changed(r.src, p, ch)
	}
}

func (sp *Speaker) changed(a netip.Addr, p *peer, ch Change) {
	level := slog.LevelInfo
	if ch.To == Down && ch.From == Up {
		level = slog.LevelWarn
	}
	sp.log.Log(context.Background(), level, "bfd: session state", "peer", a, "from", ch.From, "to", ch.To, "diag", ch.Diag,
		"detection_time", p.s.DetectionTime())
	if sp.opts.OnChange != nil {
		sp.opts.OnChange(a, ch)
	}
}

func (sp *Speaker) send(p *peer, pkt *Packet) {
	if _, err := p.conn.WriteToUDPAddrPort(pkt.Marshal(), p.to); err != nil {
		sp.log.Debug("bfd: send", "peer", p.Address, "err", err)
		return
	}
	p.sent.Add(1)
	sp.stats.sent.Add(1)
}

// State returns the state of the session with peer a; ok is false for
// an address that is no peer.
func (sp *Speaker) State(a netip.Addr) (s State, ok bool) {
	p, ok := sp.sessions[a.Unmap()]
	if !ok {
		return 0, false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return p.s.State(), true
}

// Session returns the status of the session with peer a; ok is false
// for an address that is no peer.
func (sp *Speaker) Session(a netip.Addr) (st Status, ok bool) {
	p, ok := sp.sessions[a.Unmap()]
	if !ok {
		return st, false
	}
	return sp.status(a.Unmap(), p), true
}

// Sessions returns the status of every session, in address order.
func (sp *Speaker) Sessions() []Status {
	out := make([]Status, 0, len(sp.sessions))
	for _, a := range slices.SortedFunc(maps.Keys(sp.sessions), netip.Addr.Compare) {
		out = append(out, sp.status(a, sp.sessions[a]))
	}
	return out
}

// status returns the status of the session with a.
func (sp *Speaker) status(a netip.Addr, p *peer) Status {
	sp.mu.Lock()
	st := p.s.Status()
	sp.mu.Unlock()
	st.Peer = a
	st.Packets = Counts{Received: p.received.Load(), Sent: p.sent.Load(), LowTTL: p.lowTTL.Load(),
		Malformed: p.malformed.Load(), WrongDisc: p.wrongDisc.Load()}
	return st
}

// Stats returns the speaker's counters.
func (sp *Speaker) Stats() Stats {
	return Stats{
		Received: sp.stats.received.Load(), Sent: sp.stats.sent.Load(), Unknown: sp.stats.unknown.Load(),
		LowTTL: sp.stats.lowTTL.Load(), Malformed: sp.stats.malformed.Load(), WrongDisc: sp.stats.wrongDisc.Load(),
	}
}

// Stop tells every peer the sessions go AdminDown (RFC 5882 §3.2: the
// peer does not take that as a failure of the path) and closes the
// sockets.
func (sp *Speaker) Stop() { sp.stop.Do(sp.doStop) }

func (sp *Speaker) doStop() {
	sp.cancel()
	for _, c := range sp.conns {
		c.Close()
	}
	// Unblock a reader waiting to hand in a packet.
	go func() {
		for range sp.in {
		}
	}()
	sp.wg.Wait()
	close(sp.in)
	for _, p := range sp.sessions {
		sp.mu.Lock()
		pkt := p.s.AdminDown()
		sp.mu.Unlock()
		sp.send(p, pkt)
	}
	sp.close()
}

// close closes the peers' sockets and the listeners.
func (sp *Speaker) close() {
	for _, p := range sp.sessions {
		p.conn.Close()
	}
	for _, c := range sp.conns {
		c.Close()
	}
}
