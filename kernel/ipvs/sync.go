package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// The connection-synchronization daemon's commands and attributes
// (include/uapi/linux/ip_vs.h).
const (
	cmdNewDaemon = 9
	cmdDelDaemon = 10
	cmdGetDaemon = 11

	cmdAttrDaemon = 3

	daemonAttrState      = 1
	daemonAttrMcastIfn   = 2
	daemonAttrSyncID     = 3
	daemonAttrSyncMaxLen = 4
	daemonAttrMcastGroup = 5
	daemonAttrMcastGrp6  = 6
	daemonAttrMcastPort  = 7
	daemonAttrMcastTTL   = 8
)

// SyncState is the role of a connection-synchronization daemon: a master
// sends the state of the connections its node handles, a backup receives
// a master's and creates those connections in its own table. A node may
// run one of each.
type SyncState uint32

// The roles, as the kernel numbers them.
const (
	SyncMaster SyncState = 1
	SyncBackup SyncState = 2
)

// String returns the role's name as ipvsadm prints it.
func (s SyncState) String() string {
	switch s {
	case SyncMaster:
		return "master"
	case SyncBackup:
		return "backup"
	}
	return fmt.Sprintf("sync-state(%d)", uint32(s))
}

// SyncDaemon is a kernel connection-synchronization daemon (ipvsadm
// --start-daemon): it sends or receives connection state as multicast
// UDP on an interface.
type SyncDaemon struct {
	State SyncState
	// Interface is the interface the messages go out of or come in on.
	Interface string
	// SyncID tells the virtual router apart: a backup takes only the
	// messages of masters with its id. 0 takes every master's.
	SyncID uint8
	// MaxLen is the largest message's UDP payload; 0 lets the kernel
	// size it from the interface's MTU.
	MaxLen uint16
	// Group is the multicast group (default 224.0.0.81), Port the UDP
	// port (default 8848), TTL the multicast TTL (default 1); zero
	// values take the kernel's defaults.
	Group netip.Addr
	Port  uint16
	TTL   uint8
}

// StartSync starts a synchronization daemon. The kernel runs at most one
// master and one backup per network namespace: starting a role that runs
// fails with EEXIST (see SyncDaemons).
func (i *IPVS) StartSync(d SyncDaemon) error {
	if d.State != SyncMaster && d.State != SyncBackup {
		return fmt.Errorf("start sync daemon: role %s is neither master nor backup", d.State)
	}
	if d.Interface == "" || len(d.Interface) >= unix.IFNAMSIZ {
		return fmt.Errorf("start sync daemon: bad interface name %q", d.Interface)
	}
	if d.Group.IsValid() && !d.Group.IsMulticast() {
		return fmt.Errorf("start sync daemon: %s is not a multicast group", d.Group)
	}
	if err := i.daemonRequest(cmdNewDaemon, appendDaemonAttr(nil, d)); err != nil {
		return fmt.Errorf("start sync daemon %s on %s: %w", d.State, d.Interface, explainSync(err))
	}
	return nil
}

// StopSync stops the synchronization daemon of a role; stopping one that
// does not run fails with ESRCH.
func (i *IPVS) StopSync(state SyncState) error {
	b, start := beginNest(nil, cmdAttrDaemon)
	b = endNest(appendU32(b, daemonAttrState, uint32(state)), start)
	if err := i.daemonRequest(cmdDelDaemon, b); err != nil {
		return fmt.Errorf("stop sync daemon %s: %w", state, explainSync(err))
	}
	return nil
}

// SyncDaemons returns the synchronization daemons that run, masters
// first.
func (i *IPVS) SyncDaemons() ([]SyncDaemon, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.conns == nil {
		return nil, errClosed
	}
	var out []SyncDaemon
	err := dump(i.conns[0], i.family, cmdGetDaemon, nil, func(msg []byte) error {
		v, err := topAttr(msg, cmdAttrDaemon)
		if err != nil {
			return err
		}
		d, err := parseDaemon(v)
		if err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list sync daemons: %w", err)
	}
	slices.SortFunc(out, func(a, b SyncDaemon) int { return int(a.State) - int(b.State) })
	return out, nil
}

// daemonRequest sends one daemon command with attr and waits for its
// acknowledgement.
func (i *IPVS) daemonRequest(cmd uint8, attr []byte) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.conns == nil {
		return errClosed
	}
	buf := appendRequest(nil, i.family, unix.NLM_F_ACK, 0, cmd, rawAttr(attr))
	return exchange(i.conns[0], buf, []request{{start: 0, end: len(buf)}}, 1, make([]error, 1))[0]
}

// appendDaemonAttr appends d as the IPVS_CMD_ATTR_DAEMON attribute.
func appendDaemonAttr(b []byte, d SyncDaemon) []byte {
	b, start := beginNest(b, cmdAttrDaemon)
	b = appendU32(b, daemonAttrState, uint32(d.State))
	b = appendString(b, daemonAttrMcastIfn, d.Interface)
	b = appendU32(b, daemonAttrSyncID, uint32(d.SyncID))
	if d.MaxLen != 0 {
		b = appendU16(b, daemonAttrSyncMaxLen, d.MaxLen)
	}
	switch {
	case d.Group.Is4():
		b = appendAddr(b, daemonAttrMcastGroup, d.Group)
	case d.Group.IsValid():
		b = appendAddr(b, daemonAttrMcastGrp6, d.Group)
	}
	if d.Port != 0 {
		b = appendU16(b, daemonAttrMcastPort, d.Port)
	}
	if d.TTL != 0 {
		b = appendU8(b, daemonAttrMcastTTL, d.TTL)
	}
	return endNest(b, start)
}

// parseDaemon reads the contents of an IPVS_CMD_ATTR_DAEMON attribute.
func parseDaemon(v []byte) (SyncDaemon, error) {
	var d SyncDaemon
	err := forAttrs(v, func(t uint16, a []byte) error {
		switch {
		case t == daemonAttrState && len(a) >= 4:
			d.State = SyncState(binary.NativeEndian.Uint32(a))
		case t == daemonAttrMcastIfn:
			if n := slices.Index(a, 0); n >= 0 {
				a = a[:n]
			}
			d.Interface = string(a)
		case t == daemonAttrSyncID && len(a) >= 4:
			d.SyncID = uint8(binary.NativeEndian.Uint32(a))
		case t == daemonAttrSyncMaxLen && len(a) >= 2:
			d.MaxLen = binary.NativeEndian.Uint16(a)
		case t == daemonAttrMcastGroup && len(a) == 4:
			d.Group = netip.AddrFrom4([4]byte(a))
		case t == daemonAttrMcastGrp6 && len(a) == 16:
			d.Group = netip.AddrFrom16([16]byte(a))
		case t == daemonAttrMcastPort && len(a) >= 2:
			d.Port = binary.NativeEndian.Uint16(a)
		case t == daemonAttrMcastTTL && len(a) >= 1:
			d.TTL = a[0]
		}
		return nil
	})
	if err != nil {
		return d, err
	}
	if d.State == 0 {
		return d, errors.New("sync daemon without a state")
	}
	return d, nil
}

// explainSync adds the usual cause of a daemon command's errno.
func explainSync(err error) error {
	switch {
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%w (a daemon of that role already runs)", err)
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%w (no daemon of that role runs)", err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w (no such interface)", err)
	}
	return err
}
