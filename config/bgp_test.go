package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestBGPDefaults(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(haService))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BGP.Enabled || cfg.BGP.String() != "none" || cfg.Spec.Sloppy {
		t.Errorf("no [bgp]: %+v, sloppy %v", cfg.BGP, cfg.Spec.Sloppy)
	}
	cfg, err = Parse("t.toml", []byte("[bgp]\nasn = 65001\nrouter_id = \"192.0.2.1\"\n[[bgp.peer]]\naddress = \"192.0.2.254\"\nasn = 65000\n"+haService))
	if err != nil {
		t.Fatal(err)
	}
	want := BGP{Enabled: true, ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.1"),
		Peers: []BGPPeer{{Address: netip.MustParseAddr("192.0.2.254"), ASN: 65000, Port: 179, HoldTime: 90 * time.Second, Keepalive: 30 * time.Second,
			MaxPrefixes: 1000}},
		WithdrawWait: 2 * time.Second, GracefulShutdownWait: 5 * time.Second, Sloppy: true}
	if !cfg.BGP.Equal(want) || !cfg.Spec.Sloppy {
		t.Errorf("defaults %+v, want %+v", cfg.BGP, want)
	}
	if got := cfg.BGP.String(); got != "AS65001 router id 192.0.2.1, 1 peers" {
		t.Errorf("String() = %q", got)
	}
}

func TestBGPSettings(t *testing.T) {
	in := `[bgp]
asn = 4200000001
router_id = "192.0.2.1"
listen_port = 1179
communities = ["65000:100", "no-export", "65000:100"]
large_communities = ["4200000001:1:2"]
local_pref = 200
med = 10
graceful_shutdown = true
graceful_shutdown_wait = "10s"
withdraw_wait = "3s"
sloppy = false
track_interfaces = ["eth0", "eth1"]

[[bgp.peer]]
address = "192.0.2.254"
asn = 65000
password = "s3cret"
multihop = 2
hold_time = "9s"
keepalive = "3s"
source = "192.0.2.1"
max_prefixes = 5

[[bgp.peer]]
address = "2001:db8::fe"
asn = 65000
port = 1790
passive = true
bfd = true
bfd_interval = "100ms"
bfd_multiplier = 4

[bgp.service.web]
communities = ["65000:200"]
med = 20
` + haService
	cfg, err := Parse("t.toml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	def := BGPAttrs{Communities: []uint32{65000<<16 | 100, 0xFFFFFF01}, LargeCommunities: []LargeCommunity{{4200000001, 1, 2}},
		LocalPref: 200, HasLocalPref: true, MED: 10, HasMED: true}
	web := def
	web.Communities, web.MED = []uint32{65000<<16 | 200}, 20
	want := BGP{Enabled: true, ASN: 4200000001, RouterID: netip.MustParseAddr("192.0.2.1"), ListenPort: 1179,
		Peers: []BGPPeer{
			{Address: netip.MustParseAddr("192.0.2.254"), ASN: 65000, Port: 179, Source: netip.MustParseAddr("192.0.2.1"),
				Password: "s3cret", Multihop: 2, HoldTime: 9 * time.Second, Keepalive: 3 * time.Second, MaxPrefixes: 5},
			{Address: netip.MustParseAddr("2001:db8::fe"), ASN: 65000, Port: 1790, HoldTime: 90 * time.Second, Keepalive: 30 * time.Second, Passive: true,
				MaxPrefixes: 1000, BFD: true, BFDInterval: 100 * time.Millisecond, BFDMultiplier: 4},
		},
		Default: def, Services: map[string]BGPAttrs{"web": web},
		GracefulShutdown: true, GracefulShutdownWait: 10 * time.Second, WithdrawWait: 3 * time.Second,
		TrackInterfaces: []string{"eth0", "eth1"}}
	if !cfg.BGP.Equal(want) || cfg.Spec.Sloppy {
		t.Errorf("got %+v\nwant %+v", cfg.BGP, want)
	}
	if got := cfg.BGP.Attrs("web"); !got.Equal(web) {
		t.Errorf("Attrs(web) = %+v", got)
	}
	if got := cfg.BGP.Attrs("other"); !got.Equal(def) {
		t.Errorf("Attrs(other) = %+v", got)
	}
	if got := cfg.BGP.Default.LargeCommunities[0].String(); got != "4200000001:1:2" {
		t.Errorf("large community %q", got)
	}
	// An edit of the attributes changes the settings, but not the
	// sessions: a running node takes it without a restart.
	cfg2, d, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, "med = 20", "med = 21", 1)))
	if err != nil || !d.Full || cfg2.BGP.Attrs("web").MED != 21 || !cfg2.BGP.SessionsEqual(cfg.BGP) || cfg2.BGP.Equal(cfg.BGP) {
		t.Errorf("edit of [bgp.service.web]: %+v %+v %v", cfg2.BGP, d, err)
	}
	cfg3, _, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, "hold_time = \"9s\"", "hold_time = \"12s\"", 1)))
	if err != nil || cfg3.BGP.SessionsEqual(cfg.BGP) {
		t.Errorf("edit of a peer's hold_time: %+v %v", cfg3.BGP, err)
	}
	// So does an edit of the interfaces tracked.
	cfg5, _, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, `track_interfaces = ["eth0", "eth1"]`, `track_interfaces = ["eth0"]`, 1)))
	if err != nil || !cfg5.BGP.SessionsEqual(cfg.BGP) || cfg5.BGP.Equal(cfg.BGP) {
		t.Errorf("edit of track_interfaces: %+v %v", cfg5.BGP, err)
	}
	// A change of BFD's timers changes the sessions.
	cfg6, _, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, `bfd_interval = "100ms"`, `bfd_interval = "300ms"`, 1)))
	if err != nil || cfg6.BGP.SessionsEqual(cfg.BGP) {
		t.Errorf("edit of a peer's bfd_interval: %+v %v", cfg6.BGP, err)
	}
	cfg4, _, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, "max_prefixes = 5", "max_prefixes = 6", 1)))
	if err != nil || cfg4.BGP.SessionsEqual(cfg.BGP) || cfg4.BGP.Peers[0].MaxPrefixes != 6 {
		t.Errorf("edit of a peer's max_prefixes: %+v %v", cfg4.BGP, err)
	}
}

// TestBGPBFDDefaults: bfd = true alone runs BFD at 200 ms × 3.
func TestBGPBFDDefaults(t *testing.T) {
	cfg, err := Parse("t.toml", []byte("[bgp]\nasn = 65001\nrouter_id = \"192.0.2.1\"\n[[bgp.peer]]\naddress = \"192.0.2.254\"\nasn = 65000\nbfd = true\n"+haService))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.BGP.Peers[0]
	if !p.BFD || p.BFDInterval != 200*time.Millisecond || p.BFDMultiplier != 3 {
		t.Errorf("bfd = true: %+v, want 200ms × 3", p)
	}
}

func TestBGPErrors(t *testing.T) {
	const head = "[bgp]\nasn = 65001\nrouter_id = \"192.0.2.1\"\n"
	const peer = "[[bgp.peer]]\naddress = \"192.0.2.254\"\nasn = 65000\n"
	for _, tt := range []struct {
		name, in, want string
	}{
		{"with vrrp", "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\n" + head + peer, `t.toml:5: bgp: [bgp] and [ha] mode = "vrrp" exclude each other: BGP has every node announce`},
		{"with uplinks", "[daemon]\nuplinks = [\"eth0\"]\n" + head + peer, `t.toml:3: bgp: [bgp] and [daemon] uplinks exclude each other`},
		{"no asn", "[bgp]\nrouter_id = \"192.0.2.1\"\n" + peer, `t.toml:1: bgp: asn is required`},
		{"asn trans", "[bgp]\nasn = 23456\nrouter_id = \"192.0.2.1\"\n" + peer, `t.toml:2: bgp: asn 23456 is not an AS number`},
		{"asn big", "[bgp]\nasn = 4294967296\nrouter_id = \"192.0.2.1\"\n" + peer, `t.toml:2: bgp: asn 4294967296 is not an AS number`},
		{"no router id", "[bgp]\nasn = 65001\n" + peer, `t.toml:1: bgp: router_id is required`},
		{"router id v6", "[bgp]\nasn = 65001\nrouter_id = \"2001:db8::1\"\n" + peer, `t.toml:3: bgp: router_id "2001:db8::1" is not a non-zero IPv4 address`},
		{"listen port", head + "listen_port = 70000\n" + peer, `t.toml:4: bgp: listen_port 70000 is outside 0..65535`},
		{"track interface", head + "track_interfaces = [\"eth0\", \"a/b\"]\n" + peer, `t.toml:4: bgp: track_interfaces: "a/b" is not a valid interface name`},
		{"no peers", head, `t.toml:1: bgp: no peers`},
		{"peer address", head + "[[bgp.peer]]\naddress = \"router\"\nasn = 65000\n", `t.toml:5: bgp.peer 1: address "router" is not an IP address`},
		{"peer no address", head + "[[bgp.peer]]\nasn = 65000\n", `t.toml:4: bgp.peer 1: address is required`},
		{"peer no asn", head + "[[bgp.peer]]\naddress = \"192.0.2.254\"\n", `t.toml:4: bgp.peer 1: asn is required`},
		{"peer twice", head + peer + peer, `t.toml:8: bgp.peer 2: peer 192.0.2.254 is listed twice`},
		{"peer port", head + peer + "port = 0\n", `t.toml:7: bgp.peer 1: port 0 is outside 1..65535`},
		{"source family", head + peer + "source = \"2001:db8::1\"\n", `t.toml:7: bgp.peer 1: source 2001:db8::1 and address 192.0.2.254 are of different families`},
		{"password long", head + peer + "password = \"" + strings.Repeat("x", 81) + "\"\n", `t.toml:7: bgp.peer 1: password must be 1 to 80 bytes`},
		{"multihop", head + peer + "multihop = 256\n", `t.toml:7: bgp.peer 1: multihop 256 is outside 1..255`},
		{"hold short", head + peer + "hold_time = \"2s\"\n", `t.toml:7: bgp.peer 1: hold_time 2s must be whole seconds from 3s to 65535s`},
		{"hold fraction", head + peer + "hold_time = \"3500ms\"\n", `t.toml:7: bgp.peer 1: hold_time 3.5s must be whole seconds`},
		{"keepalive", head + peer + "hold_time = \"9s\"\nkeepalive = \"9s\"\n", `t.toml:8: bgp.peer 1: keepalive 9s must be whole seconds, at least 1s and less than hold_time 9s`},
		{"hold zero", head + peer + "hold_time = \"0s\"\n", `t.toml:7: bgp.peer 1: hold_time 0s must be whole seconds from 3s`},
		{"keepalive fraction", head + peer + "keepalive = \"1500ms\"\n", `t.toml:7: bgp.peer 1: keepalive 1.5s must be whole seconds`},
		{"max prefixes zero", head + peer + "max_prefixes = 0\n", `t.toml:7: bgp.peer 1: max_prefixes 0 is outside 1..1000000 (vipd imports no route`},
		{"max prefixes big", head + peer + "max_prefixes = 1000001\n", `t.toml:7: bgp.peer 1: max_prefixes 1000001 is outside 1..1000000`},
		{"max prefixes type", head + peer + "max_prefixes = \"100\"\n", `t.toml:7: `},
		{"passive no listen", head + peer + "passive = true\n", `t.toml:7: bgp.peer 1: a passive peer needs listen_port`},
		{"community", head + "communities = [\"65536:1\"]\n" + peer, `t.toml:4: bgp: communities: "65536:1" is not a community`},
		{"community name", head + "communities = [\"no-such\"]\n" + peer, `t.toml:4: bgp: communities: "no-such" is not a community: "ASN:value" with each 0..65535, or one of blackhole, graceful-shutdown, no-advertise, no-export, no-export-subconf`},
		{"large community", head + "large_communities = [\"1:2\"]\n" + peer, `t.toml:4: bgp: large_communities: "1:2" is not a large community`},
		{"large community 4", head + "large_communities = [\"1:2:3:4\"]\n" + peer, `t.toml:4: bgp: large_communities: "1:2:3:4" is not a large community`},
		{"local pref", head + "local_pref = -1\n" + peer, `t.toml:4: bgp: local_pref -1 is outside 0..4294967295`},
		{"service med", head + peer + "[bgp.service.web]\nmed = 4294967296\n", `t.toml:8: bgp.service "web": med 4294967296 is outside 0..4294967295`},
		{"gshut wait alone", head + "graceful_shutdown_wait = \"1s\"\n" + peer, `t.toml:4: bgp: graceful_shutdown_wait without graceful_shutdown = true`},
		{"withdraw wait", head + "withdraw_wait = \"11m\"\n" + peer, `t.toml:4: bgp: withdraw_wait 11m0s is outside 0..10m`},
		{"unknown key", head + peer + "ttl = 3\n", `t.toml:7: `},
		{"bfd interval alone", head + peer + "bfd_interval = \"100ms\"\n", `t.toml:7: bgp.peer 1: bfd_interval without bfd = true`},
		{"bfd multiplier alone", head + peer + "bfd_multiplier = 3\n", `t.toml:7: bgp.peer 1: bfd_multiplier without bfd = true`},
		{"bfd multihop", head + peer + "multihop = 2\nbfd = true\n", `t.toml:8: bgp.peer 1: bfd with multihop: vipd runs single-hop BFD`},
		{"bfd interval short", head + peer + "bfd = true\nbfd_interval = \"10ms\"\n", `t.toml:8: bgp.peer 1: bfd_interval 10ms must be whole milliseconds from 50ms to 10s`},
		{"bfd interval long", head + peer + "bfd = true\nbfd_interval = \"11s\"\n", `t.toml:8: bgp.peer 1: bfd_interval 11s must be whole milliseconds`},
		{"bfd interval fraction", head + peer + "bfd = true\nbfd_interval = \"100500us\"\n", `t.toml:8: bgp.peer 1: bfd_interval 100.5ms must be whole milliseconds`},
		{"bfd interval syntax", head + peer + "bfd = true\nbfd_interval = \"fast\"\n", `t.toml:8: bgp.peer 1: bfd_interval: `},
		{"bfd multiplier 1", head + peer + "bfd = true\nbfd_multiplier = 1\n", `t.toml:8: bgp.peer 1: bfd_multiplier 1 is outside 2..255`},
		{"bfd multiplier big", head + peer + "bfd = true\nbfd_multiplier = 256\n", `t.toml:8: bgp.peer 1: bfd_multiplier 256 is outside 2..255`},
		{"bfd type", head + peer + "bfd = \"yes\"\n", `t.toml:7: `},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in+haService))
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}
