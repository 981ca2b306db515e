// Package ipvs is the adapter between vipd's core and the kernel's IPVS
// table: it implements lb.IPVS and lb.IPVSBatcher over generic netlink.
// Single service commands go through github.com/moby/ipvs; destinations
// through the adapter's own messages, because moby/ipvs v1.1.0 cannot
// express a destination's tunnel type, port and checksum flags or its
// address family. Batches of operations of any kind, and reading the
// table, use the adapter's own sockets and messages: many requests to a
// datagram, acknowledgements read many to a system call, no allocation
// per attribute.
//
// Everything the adapter writes reads back equal (as the planner compares:
// ignoring connection counts and the kernel's hashed flag), so a restart
// with an unchanged configuration plans no operations.
package ipvs

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// Options configure an IPVS adapter.
type Options struct {
	// NetnsPath is the network namespace whose IPVS table to program,
	// such as /run/netns/lb; empty means the caller's.
	NetnsPath string
	// DumpSockets is how many sockets read destinations at once when the
	// table is read; zero means one (see defaultDumpSockets).
	DumpSockets int
}

// IPVS is the kernel's IPVS table of one network namespace. Its methods
// are safe for concurrent use; calls run one at a time. It must not be
// used after Close.
type IPVS struct {
	mu     sync.Mutex
	h      *mobyipvs.Handle
	genl   genl
	family uint16
	// conns are the adapter's own sockets: conns[0] sends batches and
	// reads services; all of them read destinations.
	conns []transport
	// chunk is how many requests of a batch go in one datagram.
	chunk int
}

var _ lb.IPVS = (*IPVS)(nil)

// socketTimeout bounds each send and receive on the adapter's socket.
const socketTimeout = 30 * time.Second

// New opens the IPVS table. It fails with a clear error when the kernel
// has no IPVS (the ip_vs module is not loaded).
func New(opts Options) (*IPVS, error) {
	// Ask first: moby/ipvs resolves the family once per process and keeps
	// failing if ip_vs was missing the first time.
	fam, err := familyID()
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("ipvs: the kernel has no IPVS (generic netlink family %s not found; load the ip_vs module): %w", ipvsGenlName, err)
		}
		return nil, fmt.Errorf("ipvs: look up generic netlink family %s: %w", ipvsGenlName, err)
	}
	ns := netns.None()
	if opts.NetnsPath != "" {
		if ns, err = netns.GetFromPath(opts.NetnsPath); err != nil {
			return nil, fmt.Errorf("ipvs: open network namespace %s: %w", opts.NetnsPath, err)
		}
		defer ns.Close()
	}
	h, err := mobyipvs.New(opts.NetnsPath)
	if err != nil {
		return nil, fmt.Errorf("ipvs: open netlink handle: %w", err)
	}
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipvs: open netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(socketTimeout.Nanoseconds())
	if err := errors.Join(sock.SetSendTimeout(&tv), sock.SetReceiveTimeout(&tv)); err != nil {
		sock.Close()
		h.Close()
		return nil, fmt.Errorf("ipvs: set socket timeouts: %w", err)
	}
	i := &IPVS{h: h, genl: genl{family: fam, sock: &nl.SocketHandle{Socket: sock}}, family: fam}
	n := opts.DumpSockets
	if n <= 0 {
		n = defaultDumpSockets
	}
	for range n {
		c, err := openConn(ns)
		if err != nil {
			i.Close()
			return nil, fmt.Errorf("ipvs: %w", err)
		}
		if i.conns == nil {
			i.chunk = chunkFor(c.rcvbuf)
		}
		i.conns = append(i.conns, c)
	}
	return i, nil
}

// Close releases the netlink sockets. The IPVS table is left as it is.
func (i *IPVS) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.h != nil {
		i.h.Close()
		i.genl.sock.Close()
		i.h = nil
	}
	for _, c := range i.conns {
		c.close()
	}
	i.conns = nil
	return nil
}

// describe names a service moby reported, for errors about services lb
// cannot represent.
func describe(ms *mobyipvs.Service) string {
	if ms.FWMark != 0 {
		return fmt.Sprintf("fwmark %d (family %d)", ms.FWMark, ms.AddressFamily)
	}
	return fmt.Sprintf("proto %d [%s]:%d (family %d)", ms.Protocol, ms.Address, ms.Port, ms.AddressFamily)
}

// AddService implements lb.IPVS.
func (i *IPVS) AddService(s lb.Service) error {
	return i.service("add", s, (*mobyipvs.Handle).NewService)
}

// UpdateService implements lb.IPVS.
func (i *IPVS) UpdateService(s lb.Service) error {
	return i.service("update", s, (*mobyipvs.Handle).UpdateService)
}

func (i *IPVS) service(verb string, s lb.Service, call func(*mobyipvs.Handle, *mobyipvs.Service) error) error {
	ms, err := toKernelService(s)
	if err != nil {
		return fmt.Errorf("%s service %s: %w", verb, s.Key, err)
	}
	i.mu.Lock()
	err = call(i.h, ms)
	i.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s service %s: %w", verb, s.Key, explainService(err, s.Scheduler))
	}
	return nil
}

// explainService names the usual causes of a failed service command.
func explainService(err error, sched string) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		// The only lookup a service command does by name.
		return fmt.Errorf("scheduler %q is not supported by this kernel (no ip_vs_%s module): %w", sched, sched, err)
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("no such service: %w", err)
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("service exists: %w", err)
	}
	return err
}

// DeleteService implements lb.IPVS. Its destinations go with it.
func (i *IPVS) DeleteService(key lb.ServiceKey) error {
	k, err := toKernelKey(key)
	if err != nil {
		return fmt.Errorf("delete service %s: %w", key, err)
	}
	ms := &mobyipvs.Service{AddressFamily: k.family, Protocol: k.proto, Port: k.port, FWMark: k.fwmark}
	if k.addr.IsValid() {
		ms.Address = ipOf(k.addr)
	}
	i.mu.Lock()
	err = i.h.DelService(ms)
	i.mu.Unlock()
	if err != nil {
		return fmt.Errorf("delete service %s: %w", key, explainService(err, ""))
	}
	return nil
}

// AddDest implements lb.IPVS.
func (i *IPVS) AddDest(key lb.ServiceKey, d lb.Destination) error {
	return i.dest("add", cmdNewDest, key, d, true)
}

// UpdateDest implements lb.IPVS.
func (i *IPVS) UpdateDest(key lb.ServiceKey, d lb.Destination) error {
	return i.dest("update", cmdSetDest, key, d, true)
}

// DeleteDest implements lb.IPVS.
func (i *IPVS) DeleteDest(key lb.ServiceKey, addr netip.AddrPort) error {
	// Only the address matters; any forwarding method converts.
	return i.dest("delete", cmdDelDest, key, lb.Destination{Addr: addr, Forward: lb.Masq}, false)
}

func (i *IPVS) dest(verb string, cmd uint8, key lb.ServiceKey, d lb.Destination, full bool) error {
	k, err := toKernelKey(key)
	if err == nil {
		var kd kernelDest
		if kd, err = toKernelDest(d); err == nil {
			i.mu.Lock()
			err = i.genl.do(cmd, keyAttr(k), destAttr(kd, full))
			i.mu.Unlock()
			err = explainDest(err)
		}
	}
	if err != nil {
		return fmt.Errorf("%s backend %s -> %s: %w", verb, key, d.Addr, err)
	}
	return nil
}

// explainDest names the usual causes of a failed destination command.
func explainDest(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("no such service: %w", err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("no such backend: %w", err)
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("backend exists: %w", err)
	}
	return err
}

// Timeouts are IPVS's connection timeouts (ipvsadm --set).
type Timeouts struct {
	// TCP is the idle timeout of established TCP connections.
	TCP time.Duration
	// TCPFin is the timeout of TCP connections after a FIN.
	TCPFin time.Duration
	// UDP is the idle timeout of UDP flows.
	UDP time.Duration
}

// Timeouts returns the connection timeouts.
func (i *IPVS) Timeouts() (Timeouts, error) {
	i.mu.Lock()
	c, err := i.h.GetConfig()
	i.mu.Unlock()
	if err != nil {
		return Timeouts{}, fmt.Errorf("get ipvs timeouts: %w", err)
	}
	return Timeouts{TCP: c.TimeoutTCP, TCPFin: c.TimeoutTCPFin, UDP: c.TimeoutUDP}, nil
}

// SetTimeouts sets the connection timeouts. A zero timeout is left as it
// is; the others must be whole seconds.
func (i *IPVS) SetTimeouts(t Timeouts) error {
	for _, d := range []time.Duration{t.TCP, t.TCPFin, t.UDP} {
		if d < 0 || d%time.Second != 0 || d/time.Second > math.MaxUint32 {
			return fmt.Errorf("set ipvs timeouts: %s is not a whole number of seconds", d)
		}
	}
	i.mu.Lock()
	err := i.h.SetConfig(&mobyipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP})
	i.mu.Unlock()
	if err != nil {
		return fmt.Errorf("set ipvs timeouts: %w", err)
	}
	return nil
}
