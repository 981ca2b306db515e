package arp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ndp"
)

// fakeLinks are interfaces and connections in memory. Connections record
// what is written to them; tests inject what they read.
type fakeLinks struct {
	mu     sync.Mutex
	ifaces map[string]*net.Interface
	arps   map[string]*fakeARP
	ndps   map[string]*fakeNDP
	opened int
	// lookups counts the calls of Interface.
	lookups int
	// wire is every packet sent on any uplink, in the order sent.
	wire *wireLog
}

// wireLog records the packets sent on every uplink of a fakeLinks, one
// line each ("eth0 request 198.51.100.10"), in the order sent.
type wireLog struct {
	mu    sync.Mutex
	lines []string
}

func (w *wireLog) add(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, line)
}

// take returns the lines so far and forgets them.
func (w *wireLog) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.lines
	w.lines = nil
	return l
}

func newFakeLinks(names ...string) *fakeLinks {
	f := &fakeLinks{ifaces: map[string]*net.Interface{}, arps: map[string]*fakeARP{}, ndps: map[string]*fakeNDP{}, wire: &wireLog{}}
	for _, n := range names {
		f.add(n)
	}
	return f
}

// add creates an interface that is up, with a MAC derived from its index.
func (f *fakeLinks) add(name string) *net.Interface {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := len(f.ifaces) + 10 + f.opened
	ifi := &net.Interface{Index: idx, Name: name, MTU: 1500, Flags: net.FlagUp | net.FlagBroadcast,
		HardwareAddr: net.HardwareAddr{0x02, 0, 0, 0, 0, byte(idx)}}
	f.ifaces[name] = ifi
	return ifi
}

func (f *fakeLinks) remove(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ifaces, name)
}

func (f *fakeLinks) setUp(name string, up bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ifi := *f.ifaces[name]
	if up {
		ifi.Flags |= net.FlagUp
	} else {
		ifi.Flags &^= net.FlagUp
	}
	f.ifaces[name] = &ifi
}

func (f *fakeLinks) Interface(name string) (*net.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	ifi, ok := f.ifaces[name]
	if !ok {
		return nil, fmt.Errorf("route ip+net: no such network interface")
	}
	c := *ifi
	return &c, nil
}

func (f *fakeLinks) ListenARP(ifi *net.Interface) (Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened++
	c := &fakeARP{name: ifi.Name, wire: f.wire, in: make(chan inARP, 16), fail: make(chan error, 1), closed: make(chan struct{})}
	f.arps[ifi.Name] = c
	return c, nil
}

func (f *fakeLinks) ListenNDP(ifi *net.Interface) (NDPConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened++
	c := &fakeNDP{name: ifi.Name, wire: f.wire, in: make(chan inNDP, 16), closed: make(chan struct{}), groups: map[netip.Addr]bool{}}
	f.ndps[ifi.Name] = c
	return c, nil
}

// arp returns the ARP connection last opened on name.
func (f *fakeLinks) arp(t *testing.T, name string) *fakeARP {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.arps[name]
	if c == nil {
		t.Fatalf("no arp connection on %s", name)
	}
	return c
}

func (f *fakeLinks) ndp(t *testing.T, name string) *fakeNDP {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.ndps[name]
	if c == nil {
		t.Fatalf("no ndp connection on %s", name)
	}
	return c
}

type inARP struct {
	p   *arp.Packet
	dst net.HardwareAddr
}

type sentARP struct {
	p   *arp.Packet
	dst net.HardwareAddr
	at  time.Time
}

type fakeARP struct {
	name   string
	wire   *wireLog
	in     chan inARP
	fail   chan error
	closed chan struct{}
	once   sync.Once

	mu   sync.Mutex
	sent []sentARP
}

func (c *fakeARP) ReadFrom() (*arp.Packet, net.HardwareAddr, error) {
	select {
	case p := <-c.in:
		return p.p, p.dst, nil
	case err := <-c.fail:
		return nil, nil, err
	case <-c.closed:
		return nil, nil, net.ErrClosed
	}
}

func (c *fakeARP) WriteTo(p *arp.Packet, dst net.HardwareAddr) error {
	select {
	case <-c.closed:
		return net.ErrClosed
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, sentARP{p, dst, time.Now()})
	op := "reply"
	if p.Operation == arp.OperationRequest {
		op = "request"
	}
	c.wire.add(fmt.Sprintf("%s %s %s", c.name, op, p.SenderIP))
	return nil
}

func (c *fakeARP) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fakeARP) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// take returns the packets sent so far and forgets them.
func (c *fakeARP) take() []sentARP {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sent
	c.sent = nil
	return s
}

func (c *fakeARP) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

type inNDP struct {
	m   ndp.Message
	src netip.Addr
}

type sentNDP struct {
	m   ndp.Message
	dst netip.Addr
}

type fakeNDP struct {
	name   string
	wire   *wireLog
	in     chan inNDP
	closed chan struct{}
	once   sync.Once

	mu     sync.Mutex
	sent   []sentNDP
	groups map[netip.Addr]bool
}

func (c *fakeNDP) ReadFrom() (ndp.Message, netip.Addr, error) {
	select {
	case m := <-c.in:
		return m.m, m.src, nil
	case <-c.closed:
		return nil, netip.Addr{}, net.ErrClosed
	}
}

func (c *fakeNDP) WriteTo(m ndp.Message, dst netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, sentNDP{m, dst})
	if na, ok := m.(*ndp.NeighborAdvertisement); ok {
		c.wire.add(fmt.Sprintf("%s advertisement %s", c.name, na.TargetAddress))
	}
	return nil
}

func (c *fakeNDP) JoinGroup(g netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.groups[g] {
		return errors.New("joined twice")
	}
	c.groups[g] = true
	return nil
}

func (c *fakeNDP) LeaveGroup(g netip.Addr) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.groups[g] {
		return errors.New("not joined")
	}
	delete(c.groups, g)
	return nil
}

func (c *fakeNDP) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fakeNDP) take() []sentNDP {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sent
	c.sent = nil
	return s
}

func (c *fakeNDP) joined(g netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.groups[g]
}

// eventually waits up to two seconds for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
