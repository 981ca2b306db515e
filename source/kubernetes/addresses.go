package kubernetes

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/lb"
	corev1 "k8s.io/api/core/v1"
)

// statusAddrs returns the addresses of svc's status.
func statusAddrs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// assign gives each served Service (oldest first) the addresses it asks
// for, and warns of what it cannot get. An address that a Service lets go
// of while it keeps others (a change of its ipFamilyPolicy, its pool or
// its request) goes to an older Service that waits for one in a second
// pass; a Service deleted lets go of its addresses before the first.
func (c *controller) assign(served []*corev1.Service) {
	errs := make([]error, len(served))
	for pass := 0; pass < 2; pass++ {
		waiting, released := false, false
		for i, svc := range served {
			key := keyOf(svc)
			before := c.alloc.Held(key)
			w, err := wantOf(c.asked(svc))
			if err == nil {
				_, err = c.alloc.Assign(key, w)
			}
			errs[i] = err
			after := c.alloc.Held(key)
			released = released || waiting && slices.ContainsFunc(before, func(a netip.Addr) bool { return !slices.Contains(after, a) })
			waiting = waiting || err != nil
		}
		if !released {
			break
		}
	}
	for i, svc := range served {
		c.warn(svc, "address", errs[i])
	}
}

// restore takes the addresses of the served Services (oldest first) back
// from their statuses into a new allocator: status is the record. The
// leader does so at the start of each term, before it hands out
// anything, and keeps the addresses that still fit what each Service
// asks for. A follower does so at every sync, and keeps every address of
// a status that is in a pool and not held by an older Service, so that
// it serves what the leader wrote.
func (c *controller) restore(served []*corev1.Service, leading bool) error {
	alloc, err := NewAllocator(c.s.pools)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	c.alloc = alloc
	for _, svc := range served {
		addrs := statusAddrs(svc)
		if len(addrs) == 0 {
			continue
		}
		c.written[keyOf(svc)] = true
		w, err := wantOf(c.asked(svc))
		lenient := Want{Families: []lb.Family{lb.IPv4, lb.IPv6}, Addrs: addrs, Labels: svc.Labels}
		switch {
		case !leading:
			// A follower serves what the leader wrote.
			lenient.SharingKey, lenient.Ports, lenient.Unchecked = w.SharingKey, w.Ports, true
			w = lenient
		case err != nil:
			// A bad request keeps what the Service holds, from
			// whichever pool is for it.
			w = lenient
		}
		kept := c.alloc.Restore(keyOf(svc), w, addrs)
		if leading {
			c.s.log.Info("kubernetes: restored", "service", keyOf(svc), "status", joinAddrs(addrs), "kept", joinAddrs(kept))
		}
	}
	return nil
}

// reallocate moves the leader's allocation to new pools (SetPools): each
// served Service, oldest first, keeps what it holds where it still fits
// what it asks for; an address that no longer does is let go of, with an
// Event, and assign then finds the Service another or has it wait.
func (c *controller) reallocate(served []*corev1.Service) error {
	alloc, err := NewAllocator(c.s.pools)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	prev := c.alloc
	c.alloc = alloc
	for _, svc := range served {
		key := keyOf(svc)
		held := prev.Held(key)
		if len(held) == 0 {
			continue
		}
		w, err := wantOf(c.asked(svc))
		if err != nil {
			w = Want{Families: []lb.Family{lb.IPv4, lb.IPv6}, Addrs: held, Labels: svc.Labels}
		}
		kept := alloc.Restore(key, w, held)
		var lost []netip.Addr
		for _, a := range held {
			if !slices.Contains(kept, a) {
				lost = append(lost, a)
			}
		}
		if len(lost) == 0 {
			continue
		}
		msg := fmt.Sprintf("%s left the pools for this Service (a reload changed [[kubernetes.pool]]): allocating again", joinAddrs(lost))
		c.s.log.Warn("kubernetes: "+msg, "service", key, "reason", ReasonAddressRemoved)
		c.event(svc, corev1.EventTypeWarning, ReasonAddressRemoved, msg)
	}
	return nil
}

func sameAddrs(a, b []netip.Addr) bool { return slices.Equal(a, b) }
