package config

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

const haService = `
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }]
`

func TestHADefaults(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(haService))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HA.Enabled() || cfg.HA.String() != "none" {
		t.Errorf("no [ha]: %+v", cfg.HA)
	}
	cfg, err = Parse("t.toml", []byte("[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 51\n"+haService))
	if err != nil {
		t.Fatal(err)
	}
	want := HA{Mode: "vrrp", Interface: "eth0", VRID: 51, Priority: 100, Interval: 100 * time.Millisecond,
		Preempt: true, TrackPriority: 50, SyncID: 51, Sloppy: true}
	if !cfg.HA.Equal(want) || !cfg.Spec.Sloppy {
		t.Errorf("defaults %+v, want %+v", cfg.HA, want)
	}
	// With connection synchronization, a returning node preempts at once
	// unless told to let the synchronization catch up.
	cfg, err = Parse("t.toml", []byte("[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 51\nsync_interface = \"eth0\"\n"+haService))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HA.SyncCatchUp != DefaultSyncCatchUp || DefaultSyncCatchUp != 0 {
		t.Errorf("sync_catch_up %v with sync_interface, want %v", cfg.HA.SyncCatchUp, DefaultSyncCatchUp)
	}
}

func TestHASettings(t *testing.T) {
	in := `[ha]
mode = "vrrp"
interface = "bond0"
vrid = 7
priority = 200
advert_interval = "250ms"
preempt = false
preempt_delay = "30s"
unicast_peers = ["192.0.2.2", "192.0.2.3"]
source = "192.0.2.1"
track_interfaces = ["eth1", "eth2"]
track_backends = true
track_priority = 60
sync_interface = "eth3"
sync_id = 9
sync_catch_up = "2s"
sloppy = false
` + haService
	cfg, err := Parse("t.toml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := HA{Mode: "vrrp", Interface: "bond0", VRID: 7, Priority: 200, Interval: 250 * time.Millisecond,
		PreemptDelay: 30 * time.Second, Peers: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")},
		Source: netip.MustParseAddr("192.0.2.1"), TrackInterfaces: []string{"eth1", "eth2"}, TrackBackends: true,
		TrackPriority: 60, SyncInterface: "eth3", SyncID: 9, SyncCatchUp: 2 * time.Second}
	if !cfg.HA.Equal(want) {
		t.Errorf("got %+v\nwant %+v", cfg.HA, want)
	}
	// Floating addresses are bound on every node and SNAT comes from
	// the SNAT address of its family.
	cfg, err = Parse("t.toml", []byte(strings.Replace(in, "sloppy = false", `sloppy = false
addresses = ["10.0.2.254", "fd00:2::fe"]
snat_addresses = ["192.0.2.99"]`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(cfg.HA.Floating(), cfg.Spec.Floating, cfg.Spec.Rules.SNATSource4, cfg.Spec.Rules.SNATSource6.IsValid()); got != "[10.0.2.254 fd00:2::fe 192.0.2.99] [10.0.2.254 fd00:2::fe 192.0.2.99] 192.0.2.99 false" {
		t.Errorf("floating addresses: %s", got)
	}
	// An edit of the [ha] section is a change of settings: a full delta.
	cfg2, d, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, "priority = 200", "priority = 201", 1)))
	if err != nil || !d.Full || cfg2.HA.Priority != 201 {
		t.Errorf("edit of [ha]: %+v %+v %v", cfg2.HA, d, err)
	}
}

func TestHAErrors(t *testing.T) {
	for _, tt := range []struct {
		name, in, want string
	}{
		{"no mode", "[ha]\ninterface = \"eth0\"\n", `t.toml:1: ha: [ha] needs mode = "vrrp"`},
		{"bad mode", "[ha]\nmode = \"carp\"\n", `t.toml:2: ha: mode "carp" must be "vrrp"`},
		{"no interface", "[ha]\nmode = \"vrrp\"\nvrid = 1\n", `t.toml:1: ha: interface is required`},
		{"no vrid", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\n", `t.toml:1: ha: vrid is required`},
		{"vrid", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 256\n", `t.toml:4: ha: vrid 256 is outside 1..255`},
		{"priority owner", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\npriority = 255\n", `t.toml:5: ha: priority 255 is outside 1..254`},
		{"interval not cs", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nadvert_interval = \"15ms\"\n", `t.toml:5: ha: advert_interval 15ms must be a multiple of 10ms`},
		{"interval too long", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nadvert_interval = \"41s\"\n", `t.toml:5: ha: advert_interval 41s must be a multiple of 10ms from 10ms to 40.95s`},
		{"peer", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nunicast_peers = [\"nope\"]\n", `t.toml:5: ha: unicast_peers: "nope" is not an IP address`},
		{"peers mixed", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nunicast_peers = [\"192.0.2.1\", \"2001:db8::1\"]\n", `t.toml:5: ha: unicast_peers mixes IPv4 and IPv6`},
		{"sync catch-up alone", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsync_catch_up = \"1s\"\n", `t.toml:5: ha: sync_catch_up without sync_interface`},
		{"sync catch-up too long", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsync_interface = \"eth0\"\nsync_catch_up = \"2m\"\n", `t.toml:6: ha: sync_catch_up 2m0s is outside 0..1m0s`},
		{"sync catch-up negative", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsync_interface = \"eth0\"\nsync_catch_up = \"-1s\"\n", `t.toml:6: ha: sync_catch_up: -1s is negative`},
		{"sync id alone", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsync_id = 3\n", `t.toml:5: ha: sync_id without sync_interface`},
		{"address", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\naddresses = [\"10.0.0.0/24\"]\n", `t.toml:5: ha: addresses: "10.0.0.0/24" is not an IP address`},
		{"address multicast", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\naddresses = [\"224.0.0.18\"]\n", `t.toml:5: ha: addresses: 224.0.0.18 is not a unicast address`},
		{"address twice", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\naddresses = [\"10.0.2.254\"]\nsnat_addresses = [\"10.0.2.254\"]\n", `t.toml:6: ha: snat_addresses: 10.0.2.254 is listed in addresses already`},
		{"snat family twice", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsnat_addresses = [\"10.0.2.98\", \"10.0.2.99\"]\n", `t.toml:5: ha: snat_addresses: 10.0.2.99 is a second address of its family`},
		{"snat without rules", "[daemon]\nmanage_iptables = false\n[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsnat_addresses = [\"10.0.2.99\"]\n", `t.toml:7: ha: snat_addresses needs [daemon] manage_iptables = true`},
		{"unknown key", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nvirtual_router = 3\n", `t.toml:5: `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in+haService))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}
