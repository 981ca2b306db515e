package bgpproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"

	"github.com/vipd/vipd/frame"
)

// Speaker is what Serve drives: ha/bgp's Speaker.
type Speaker interface {
	Set(routes map[netip.Prefix]Attrs) error
	Retire(ctx context.Context) error
	Stop(ctx context.Context) error
	Peers() []Peer
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Conn is the socket to the daemon.
	Conn io.ReadWriter
	// Start starts the speaker of the daemon's options; onPeer, called
	// on every change of a session's state, must not block and does not.
	Start func(ctx context.Context, o Options, onPeer func(Peer)) (Speaker, error)
}

// Serve is the program's end: it starts the speaker of the daemon's
// first message and answers its requests until the daemon asks it to
// stop (nil) or closes the socket (nil: the speaker ends with the
// program). Each request but the first runs on its own, so that the
// state of the sessions is answered while a Retire waits.
func Serve(ctx context.Context, opts ServeOptions) error {
	m, err := read(opts.Conn)
	if err != nil {
		return fmt.Errorf("read the options: %w", err)
	}
	var wmu sync.Mutex
	send := func(m *message) error {
		wmu.Lock()
		defer wmu.Unlock()
		return frame.Write(opts.Conn, m, MaxFrame)
	}
	reply := func(id uint64, err error) error {
		r := &message{ID: id, Op: opReply}
		if err != nil {
			r.Error = err.Error()
		}
		return send(r)
	}
	if m.Op != opStart {
		err := fmt.Errorf("the first message is %s, want %s", m.Op, opStart)
		reply(m.ID, err)
		return err
	}
	if m.Version != Version {
		err := fmt.Errorf("wire version %d, want %d (vipd and vipd-bgp of different versions?)", m.Version, Version)
		reply(m.ID, err)
		return err
	}
	// Events wait here for the writer, which never blocks GoBGP: when
	// the daemon reads too slowly, an event is dropped, and the next
	// one or a peers request tells the state anyway.
	events := make(chan Peer, 256)
	onPeer := func(p Peer) {
		select {
		case events <- p:
		default:
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sp, err := opts.Start(ctx, *m.Start, onPeer)
	if rerr := reply(m.ID, err); err != nil || rerr != nil {
		return errors.Join(err, rerr)
	}
	go func() {
		for {
			select {
			case p := <-events:
				p.BFDStatus = nil
				if send(&message{Op: opPeer, Peers: []Peer{p}}) != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		m, err := read(opts.Conn)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		switch m.Op {
		case opStop:
			wg.Wait()
			err := sp.Stop(ctx)
			reply(m.ID, err)
			return err
		case opStart:
			reply(m.ID, errors.New("started already"))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch m.Op {
			case opSet:
				routes := make(map[netip.Prefix]Attrs, len(m.Routes))
				for _, r := range m.Routes {
					routes[r.Prefix] = r.Attrs
				}
				reply(m.ID, sp.Set(routes))
			case opRetire:
				reply(m.ID, sp.Retire(ctx))
			case opPeers:
				send(&message{ID: m.ID, Op: opReply, Peers: sp.Peers()})
			default:
				reply(m.ID, fmt.Errorf("%s is no request", m.Op))
			}
		}()
	}
}
