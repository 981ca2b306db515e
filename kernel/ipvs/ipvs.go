// Package ipvs is the adapter between vipd's core and the kernel's IPVS
// table: it implements lb.IPVS over generic netlink, with one transport,
// the adapter's own sockets and messages. Every change is a batch (a
// single operation is a batch of one): many requests to a datagram,
// acknowledgements read many to a system call, no allocation per
// attribute; reading the table uses the same sockets. Services are
// described with github.com/moby/ipvs's Service type; destinations with
// the adapter's own, because moby/ipvs v1.1.0 cannot express a
// destination's tunnel type, port and checksum flags or its address
// family.
//
// Everything the adapter writes reads back equal (as the planner compares:
// ignoring connection counts and the kernel's hashed flag), so a restart
// with an unchanged configuration plans no operations.
package ipvs

import (
	"errors"
	"fmt"
	"sync"
	"time"

	mobyipvs "github.com/moby/ipvs"
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
	family uint16
	// conns are the adapter's own sockets: conns[0] sends batches and
	// reads services; all of them read destinations.
	conns []transport
	// chunk is how many requests of a batch go in one datagram.
	chunk int
	// scratch is the batch Apply encodes into and res its requests'
	// results, kept from one call to the next so that a cold start's
	// hundred batches do not each allocate their buffers, which would
	// keep the garbage collector running over the plan.
	scratch batch
	res     []error
}

var _ lb.IPVS = (*IPVS)(nil)

// socketTimeout bounds each send and receive on the adapter's socket.
const socketTimeout = 30 * time.Second

// New opens the IPVS table. It fails with a clear error when the kernel
// has no IPVS (the ip_vs module is not loaded).
func New(opts Options) (*IPVS, error) {
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
	i := &IPVS{family: fam}
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
