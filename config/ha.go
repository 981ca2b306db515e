package config

import (
	"net/netip"
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
}

// Enabled reports whether the node shares its VIPs with peers.
func (h HA) Enabled() bool { return h.Mode != "" }
