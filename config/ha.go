package config

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// HA is the [ha] section: how vipd shares its VIPs with peers so that
// losing a node loses no service.
type HA struct {
	// Mode is "" (no high availability: the node always serves) or
	// "vrrp" (VRRPv3, RFC 5798: one master serves, the backups stand by).
	Mode string
	// Interface is the interface VRRP advertises on.
	Interface string
	// VRID is the virtual router id, 1 to 255, shared by the peers.
	VRID uint8
	// Priority is this node's priority, 1 to 254: the highest serves.
	Priority uint8
	// Interval is the advertisement interval, a multiple of 10 ms from
	// 10 ms to 40.95 s.
	Interval time.Duration
	// Preempt lets this node take over from a master of lower priority,
	// after PreemptDelay.
	Preempt      bool
	PreemptDelay time.Duration
	// Peers, when set, are sent advertisements by unicast instead of
	// multicast, and are the only ones heard.
	Peers []netip.Addr
	// Source is the address advertisements are sent from; unset, the
	// interface's primary address.
	Source netip.Addr
	// TrackInterfaces are interfaces whose loss (down, or no carrier)
	// lowers the priority by TrackPriority each.
	TrackInterfaces []string
	// TrackBackends lowers the priority by TrackPriority while a service
	// has backends but none of them serves.
	TrackBackends bool
	// TrackPriority is what each tracked failure takes off the priority.
	TrackPriority uint8
	// SyncInterface, when set, runs the kernel's IPVS connection
	// synchronization (a master and a backup daemon) on that interface,
	// so that established connections continue on the new master; SyncID
	// tells this virtual router's messages apart (default VRID).
	SyncInterface string
	SyncID        uint8
	// SyncCatchUp is how long a node that comes back (its interface up
	// again, or undrained) serves as a backup before it preempts a peer
	// of lower priority, when connections are synchronized: the
	// connections the peer opened while the node was away, which it could
	// not synchronize to it, end meanwhile on the peer, and those opened
	// since reach the node, so that taking the VIPs back breaks none.
	// Default DefaultSyncCatchUp (at once: 1 s measured no fewer failed
	// requests on the returns of TestHAReturns, and costs a second of
	// every return); at most MaxSyncCatchUp; only with sync_interface.
	SyncCatchUp time.Duration
	// Sloppy lets IPVS take a packet in the middle of a connection it
	// does not know as a new connection (see lb.Spec.Sloppy), so that a
	// node that takes over keeps the connections its peer had not
	// synchronized yet.
	Sloppy bool
	// Addresses are floating addresses that move with the master, as
	// the VIPs do, and serve no service: the gateway of backends that
	// route their replies through the load balancer (NAT).
	Addresses []netip.Addr
	// SNATAddresses, at most one per family, are floating addresses
	// that SNAT traffic comes from instead of the node's own address, so
	// that the backends' replies follow the master.
	SNATAddresses []netip.Addr
}

// Floating returns every floating address: Addresses and SNATAddresses.
func (h HA) Floating() []netip.Addr {
	return slices.Concat(h.Addresses, h.SNATAddresses)
}

// DefaultSyncCatchUp is [ha] sync_catch_up's default, and
// MaxSyncCatchUp its largest value.
const (
	DefaultSyncCatchUp = 0
	MaxSyncCatchUp     = time.Minute
)

// Enabled reports whether the node shares its VIPs with peers.
func (h HA) Enabled() bool { return h.Mode != "" }

// DefaultHAInterval is the default VRRP advertisement interval. With it a
// backup takes over 3 intervals and a skew after the master's last
// advertisement (about 350 ms at priority 100), at the cost of ten small
// packets a second; keepalived's default of 1 s takes over in about 3.6 s.
const DefaultHAInterval = 100 * time.Millisecond

// DefaultHAPriority and DefaultTrackPriority are the default priority and
// the default a tracked failure takes off it.
const (
	DefaultHAPriority    = 100
	DefaultTrackPriority = 50
)

// rawHA is the [ha] section as written.
type rawHA struct {
	Mode            *string   `toml:"mode"`
	Interface       *string   `toml:"interface"`
	VRID            *int64    `toml:"vrid"`
	Priority        *int64    `toml:"priority"`
	Interval        *duration `toml:"advert_interval"`
	Preempt         *bool     `toml:"preempt"`
	PreemptDelay    *duration `toml:"preempt_delay"`
	Peers           []string  `toml:"unicast_peers"`
	Source          *string   `toml:"source"`
	TrackInterfaces []string  `toml:"track_interfaces"`
	TrackBackends   *bool     `toml:"track_backends"`
	TrackPriority   *int64    `toml:"track_priority"`
	SyncInterface   *string   `toml:"sync_interface"`
	SyncID          *int64    `toml:"sync_id"`
	SyncCatchUp     *duration `toml:"sync_catch_up"`
	Sloppy          *bool     `toml:"sloppy"`
	Addresses       []string  `toml:"addresses"`
	SNATAddresses   []string  `toml:"snat_addresses"`
}

// ha validates the [ha] section into cfg.HA.
func (v *validator) ha(h *rawHA, cfg *Config) {
	const ctx = "ha"
	out := HA{Interval: DefaultHAInterval, Priority: DefaultHAPriority, Preempt: true, TrackPriority: DefaultTrackPriority, Sloppy: true}
	if h.Mode == nil {
		if h.Interface != nil || h.VRID != nil || h.Priority != nil || h.Interval != nil || h.Preempt != nil ||
			h.PreemptDelay != nil || h.Peers != nil || h.Source != nil || h.TrackInterfaces != nil || h.TrackBackends != nil ||
			h.TrackPriority != nil || h.SyncInterface != nil || h.SyncID != nil || h.SyncCatchUp != nil || h.Sloppy != nil ||
			h.Addresses != nil || h.SNATAddresses != nil {
			v.errorf("ha", ctx, "[ha] needs mode = \"vrrp\"")
		}
		return
	}
	switch *h.Mode {
	case "vrrp":
		out.Mode = *h.Mode
	case "":
		return
	default:
		v.errorf("ha.mode", ctx, "mode %q must be \"vrrp\" (or \"\" for none)", *h.Mode)
		return
	}
	if h.Interface == nil {
		v.errorf("ha", ctx, "interface is required: the interface VRRP advertises on")
	} else {
		out.Interface = *h.Interface
		if err := validIfName(out.Interface); err != nil {
			v.errorf("ha.interface", ctx, "interface: %v", err)
		}
	}
	if h.VRID == nil {
		v.errorf("ha", ctx, "vrid is required: the virtual router id (1 to 255) the peers share")
	} else if *h.VRID < 1 || *h.VRID > 255 {
		v.errorf("ha.vrid", ctx, "vrid %d is outside 1..255", *h.VRID)
	} else {
		out.VRID = uint8(*h.VRID)
	}
	if h.Priority != nil {
		if *h.Priority < 1 || *h.Priority > 254 {
			v.errorf("ha.priority", ctx, "priority %d is outside 1..254 (255 is an address owner's, which vipd never is)", *h.Priority)
		} else {
			out.Priority = uint8(*h.Priority)
		}
	}
	out.Interval = v.duration(h.Interval, out.Interval, "ha.advert_interval", ctx, "advert_interval")
	if out.Interval < 10*time.Millisecond || out.Interval > 40950*time.Millisecond || out.Interval%(10*time.Millisecond) != 0 {
		v.errorf("ha.advert_interval", ctx, "advert_interval %s must be a multiple of 10ms from 10ms to 40.95s (VRRPv3 counts centiseconds)", out.Interval)
	}
	setBool(&out.Preempt, h.Preempt)
	out.PreemptDelay = v.duration(h.PreemptDelay, 0, "ha.preempt_delay", ctx, "preempt_delay")
	if out.PreemptDelay < 0 || out.PreemptDelay > time.Hour {
		v.errorf("ha.preempt_delay", ctx, "preempt_delay %s is outside 0..1h", out.PreemptDelay)
	}
	for _, p := range h.Peers {
		a, err := netip.ParseAddr(p)
		switch {
		case err != nil:
			v.errorf("ha.unicast_peers", ctx, "unicast_peers: %q is not an IP address", p)
		case slices.Contains(out.Peers, a):
			v.errorf("ha.unicast_peers", ctx, "unicast_peers: %s is listed twice", a)
		default:
			out.Peers = append(out.Peers, a)
		}
	}
	if len(out.Peers) > 1 && slices.ContainsFunc(out.Peers, func(a netip.Addr) bool { return a.Is4() != out.Peers[0].Is4() }) {
		v.errorf("ha.unicast_peers", ctx, "unicast_peers mixes IPv4 and IPv6: a virtual router has one family")
	}
	if h.Source != nil {
		a, err := netip.ParseAddr(*h.Source)
		if err != nil {
			v.errorf("ha.source", ctx, "source %q is not an IP address", *h.Source)
		} else {
			out.Source = a
		}
	}
	for _, name := range h.TrackInterfaces {
		if err := validIfName(name); err != nil {
			v.errorf("ha.track_interfaces", ctx, "track_interfaces: %v", err)
		}
	}
	out.TrackInterfaces = h.TrackInterfaces
	setBool(&out.TrackBackends, h.TrackBackends)
	if h.TrackPriority != nil {
		if *h.TrackPriority < 1 || *h.TrackPriority > 253 {
			v.errorf("ha.track_priority", ctx, "track_priority %d is outside 1..253", *h.TrackPriority)
		} else {
			out.TrackPriority = uint8(*h.TrackPriority)
		}
	}
	if h.SyncInterface != nil {
		out.SyncInterface = *h.SyncInterface
		if err := validIfName(out.SyncInterface); err != nil {
			v.errorf("ha.sync_interface", ctx, "sync_interface: %v", err)
		}
	}
	if h.SyncID != nil {
		if *h.SyncID < 0 || *h.SyncID > 255 {
			v.errorf("ha.sync_id", ctx, "sync_id %d is outside 0..255", *h.SyncID)
		} else {
			out.SyncID = uint8(*h.SyncID)
		}
		if h.SyncInterface == nil {
			v.errorf("ha.sync_id", ctx, "sync_id without sync_interface: connection synchronization is off")
		}
	}
	if out.SyncID == 0 {
		out.SyncID = out.VRID
	}
	if h.SyncCatchUp != nil && h.SyncInterface == nil {
		v.errorf("ha.sync_catch_up", ctx, "sync_catch_up without sync_interface: connection synchronization is off, there is nothing to catch up")
	}
	if h.SyncInterface != nil {
		out.SyncCatchUp = v.duration(h.SyncCatchUp, DefaultSyncCatchUp, "ha.sync_catch_up", ctx, "sync_catch_up")
		if out.SyncCatchUp < 0 || out.SyncCatchUp > MaxSyncCatchUp {
			v.errorf("ha.sync_catch_up", ctx, "sync_catch_up %s is outside 0..%s", out.SyncCatchUp, MaxSyncCatchUp)
		}
	}
	setBool(&out.Sloppy, h.Sloppy)
	seen := map[netip.Addr]string{}
	out.Addresses = v.floating(h.Addresses, "addresses", seen)
	out.SNATAddresses = v.floating(h.SNATAddresses, "snat_addresses", seen)
	for i, a := range out.SNATAddresses {
		if slices.ContainsFunc(out.SNATAddresses[:i], func(b netip.Addr) bool { return b.Is4() == a.Is4() }) {
			v.errorf("ha.snat_addresses", ctx, "snat_addresses: %s is a second address of its family: SNAT traffic comes from one", a)
		}
	}
	if len(out.SNATAddresses) > 0 && !cfg.Spec.Rules.Enabled {
		v.errorf("ha.snat_addresses", ctx, "snat_addresses needs [daemon] manage_iptables = true: vipd's rules do the SNAT")
	}
	cfg.HA = out
	cfg.Spec.Sloppy = out.Sloppy
	cfg.Spec.Floating = out.Floating()
	for _, a := range out.SNATAddresses {
		if a.Is4() {
			cfg.Spec.Rules.SNATSource4 = a
		} else {
			cfg.Spec.Rules.SNATSource6 = a
		}
	}
}

// floating validates a list of floating addresses of key, each listed
// once in seen (by key) across the lists.
func (v *validator) floating(list []string, key string, seen map[netip.Addr]string) []netip.Addr {
	var out []netip.Addr
	for _, s := range list {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || a.Zone() != "" || a.Is4In6():
			v.errorf("ha."+key, "ha", "%s: %q is not an IP address", key, s)
		case !a.IsGlobalUnicast() && !a.IsPrivate():
			v.errorf("ha."+key, "ha", "%s: %s is not a unicast address a host can hold", key, a)
		case seen[a] != "":
			v.errorf("ha."+key, "ha", "%s: %s is listed in %s already", key, a, seen[a])
		default:
			seen[a] = key
			out = append(out, a)
		}
	}
	return out
}

// Equal reports whether two [ha] sections are the same.
func (h HA) Equal(o HA) bool {
	return h.Mode == o.Mode && h.Interface == o.Interface && h.VRID == o.VRID && h.Priority == o.Priority &&
		h.Interval == o.Interval && h.Preempt == o.Preempt && h.PreemptDelay == o.PreemptDelay &&
		slices.Equal(h.Peers, o.Peers) && h.Source == o.Source && slices.Equal(h.TrackInterfaces, o.TrackInterfaces) &&
		h.TrackBackends == o.TrackBackends && h.TrackPriority == o.TrackPriority &&
		h.SyncInterface == o.SyncInterface && h.SyncID == o.SyncID && h.SyncCatchUp == o.SyncCatchUp && h.Sloppy == o.Sloppy &&
		slices.Equal(h.Addresses, o.Addresses) && slices.Equal(h.SNATAddresses, o.SNATAddresses)
}

// String summarises the section for the log.
func (h HA) String() string {
	if !h.Enabled() {
		return "none"
	}
	return fmt.Sprintf("%s on %s vrid %d priority %d interval %s", h.Mode, h.Interface, h.VRID, h.Priority, h.Interval)
}
