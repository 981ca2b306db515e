package ipvs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestSyncDaemons starts, lists and stops the kernel's connection
// synchronization daemons, and checks what ipvsadm sees.
func TestSyncDaemons(t *testing.T) {
	tb := newTable(t)
	h, err := netlink.NewHandleAt(tb.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dummy := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "sync0"}}
	if err := h.LinkAdd(dummy); err != nil {
		t.Fatalf("add dummy: %v", err)
	}
	addr, _ := netlink.ParseAddr("10.99.0.1/24")
	if err := h.AddrAdd(dummy, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(dummy); err != nil {
		t.Fatal(err)
	}
	if ds, err := tb.SyncDaemons(); err != nil || len(ds) != 0 {
		t.Fatalf("daemons of a fresh namespace: %v %v", ds, err)
	}
	master := SyncDaemon{State: SyncMaster, Interface: "sync0", SyncID: 7, Group: netip.MustParseAddr("224.0.0.81"), Port: 8848, TTL: 1}
	backup := SyncDaemon{State: SyncBackup, Interface: "sync0", SyncID: 7}
	if err := tb.StartSync(master); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.StopSync(SyncMaster) })
	if err := tb.StartSync(backup); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tb.StopSync(SyncBackup) })
	if err := tb.StartSync(master); !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("a second master: %v, want EEXIST", err)
	}
	ds, err := tb.SyncDaemons()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0].State != SyncMaster || ds[0].Interface != "sync0" || ds[0].SyncID != 7 ||
		ds[1].State != SyncBackup || ds[1].Interface != "sync0" || ds[1].SyncID != 7 {
		t.Errorf("daemons %+v, want the master and the backup on sync0 with id 7", ds)
	}
	listed := tb.run(t, "ipvsadm", "-L", "--daemon")
	for _, want := range []string{"master sync daemon (mcast=sync0, syncid=7", "backup sync daemon (mcast=sync0, syncid=7"} {
		if !strings.Contains(listed, want) {
			t.Errorf("ipvsadm -L --daemon has no %q:\n%s", want, listed)
		}
	}
	if err := tb.StopSync(SyncMaster); err != nil {
		t.Fatal(err)
	}
	if err := tb.StopSync(SyncMaster); !errors.Is(err, unix.ESRCH) {
		t.Errorf("stopping a stopped master: %v, want ESRCH", err)
	}
	if ds, err := tb.SyncDaemons(); err != nil || len(ds) != 1 || ds[0].State != SyncBackup {
		t.Errorf("after stopping the master: %+v %v", ds, err)
	}
	if err := tb.StartSync(SyncDaemon{State: SyncMaster, Interface: "nosuch0"}); err == nil {
		t.Error("a master on a missing interface started")
	}
}
