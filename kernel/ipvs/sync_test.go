package ipvs

import (
	"net/netip"
	"strings"
	"testing"
)

func TestDaemonAttrRoundTrip(t *testing.T) {
	for _, d := range []SyncDaemon{
		{State: SyncMaster, Interface: "eth0"},
		{State: SyncBackup, Interface: "bond0.100", SyncID: 255, MaxLen: 1400, Group: netip.MustParseAddr("239.1.2.3"), Port: 9000, TTL: 4},
		{State: SyncMaster, Interface: "eth1", SyncID: 1, Group: netip.MustParseAddr("ff02::81"), Port: 8848},
	} {
		b := appendDaemonAttr(nil, d)
		got, err := parseDaemon(b[4:])
		if err != nil || got != d {
			t.Errorf("round trip of %+v: %+v %v", d, got, err)
		}
	}
}

func TestSyncArguments(t *testing.T) {
	var i IPVS // closed: the arguments are checked first
	for _, tc := range []struct {
		d    SyncDaemon
		want string
	}{
		{SyncDaemon{State: 3, Interface: "eth0"}, "neither master nor backup"},
		{SyncDaemon{State: SyncMaster}, "bad interface name"},
		{SyncDaemon{State: SyncMaster, Interface: "a-very-long-interface-name"}, "bad interface name"},
		{SyncDaemon{State: SyncBackup, Interface: "eth0", Group: netip.MustParseAddr("10.0.0.1")}, "not a multicast group"},
		{SyncDaemon{State: SyncBackup, Interface: "eth0"}, "ipvs adapter is closed"},
	} {
		if err := i.StartSync(tc.d); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.d, err, tc.want)
		}
	}
	if s := SyncBackup.String() + SyncMaster.String(); s != "backupmaster" {
		t.Errorf("names %q", s)
	}
}
