package config

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

func TestMinimalDefaults(t *testing.T) {
	cfg, err := Parse("min.toml", []byte(`
[[service]]
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.11" }, { address = "10.0.0.12" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Daemon
	if d.Interface != "vipd0" || !d.StrictARP || !d.ManageSysctls || !d.ManageIPTables || d.OnStop != StopKeep ||
		d.ResyncInterval != 30*time.Second || !d.Removal.Drain || d.GARP.Count != 3 || d.MetricsListen != DefaultMetricsListen {
		t.Errorf("daemon defaults = %+v", d)
	}
	if len(cfg.Spec.Services) != 1 {
		t.Fatalf("services = %d", len(cfg.Spec.Services))
	}
	vs := cfg.Spec.Services[0]
	wantKey := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("192.0.2.10"), Port: 80}
	if vs.Service.Key != wantKey || vs.Service.Scheduler != "wlc" || !vs.Announce || vs.SNAT || vs.Name != "tcp-192.0.2.10-80" {
		t.Errorf("service = %+v", vs)
	}
	want := []lb.Destination{
		{Addr: netip.MustParseAddrPort("10.0.0.11:80"), Weight: 1, Forward: lb.Masq},
		{Addr: netip.MustParseAddrPort("10.0.0.12:80"), Weight: 1, Forward: lb.Masq},
	}
	if len(vs.Backends) != 2 || vs.Backends[0] != want[0] || vs.Backends[1] != want[1] {
		t.Errorf("backends = %+v, want %+v", vs.Backends, want)
	}
	if cfg.Spec.Rules != (lb.RulePolicy{Enabled: true, SNATMark: DefaultSNATMark, FilterVIPs: true}) {
		t.Errorf("rules = %+v", cfg.Spec.Rules)
	}
}

func TestValidSettings(t *testing.T) {
	cfg, err := Parse("ok.toml", []byte(`
[daemon]
interface = "lb0"
uplinks = ["eth0", "eth1"]
strict_arp = false
on_stop = "clean"
resync_interval = 10
stats_interval = "2s"
drain_timeout = "1m30s"
drain_grace = "3s"
manage_iptables = false

[[service]]
name = "sh"
vip = "2001:db8::1"
port = 443
scheduler = "sh"
scheduler_flags = ["sh-port", "sh-fallback"]
persistence = "5m"
persistence_netmask = 64
backend = [{ address = "[fd00::1]:8443", weight = 0, upper_threshold = 10, lower_threshold = 5 }]

[[service]]
name = "tun"
vip = "192.0.2.1"
port = 80
forward = "tunnel"
tunnel = "gue"
tunnel_port = 5555
tunnel_checksum = "remcsum"
[[service.backend]]
address = "2001:db8::9"
[[service.backend]]
address = "10.0.0.2"
forward = "droute"

[[service]]
name = "fw"
fwmark = 7
family = "ipv6"
one_packet = true
backend = [{ address = "fd00::7" }]

[[service]]
name = "udp-all"
vip = "192.0.2.2"
port = 0
protocol = "udp"
persistence = 60
backend = [{ address = "10.0.0.3", port = 0 }]
`))
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Daemon
	if d.Interface != "lb0" || d.StrictARP || d.OnStop != StopClean || d.ResyncInterval != 10*time.Second || d.Removal.DrainTimeout != 90*time.Second || d.Removal.Grace != 3*time.Second || d.StatsInterval != 2*time.Second {
		t.Errorf("daemon = %+v", d)
	}
	if cfg.Spec.Rules.Enabled {
		t.Errorf("rules enabled with manage_iptables = false")
	}
	sh := cfg.Spec.Services[0]
	if sh.Service.Flags != lb.SHPort|lb.SHFallback || sh.Service.Persistent != 300 || sh.Service.Netmask != 64 || sh.Service.Key.Family != lb.IPv6 {
		t.Errorf("sh service = %+v", sh.Service)
	}
	if b := sh.Backends[0]; b.Weight != 0 || b.Upper != 10 || b.Lower != 5 || b.Addr != netip.MustParseAddrPort("[fd00::1]:8443") {
		t.Errorf("sh backend = %+v", b)
	}
	tun := cfg.Spec.Services[1]
	if b := tun.Backends[0]; b.Forward != lb.Tunnel || b.Tunnel != lb.GUE || b.TunnelPort != 5555 || b.TunnelCsum != lb.RemCsum {
		t.Errorf("gue backend = %+v", b)
	}
	if b := tun.Backends[1]; b.Forward != lb.DirectRoute || b.Tunnel != 0 || b.TunnelPort != 0 {
		t.Errorf("droute override = %+v", b)
	}
	fw := cfg.Spec.Services[2]
	if fw.Service.Key != (lb.ServiceKey{Family: lb.IPv6, FWMark: 7}) || !fw.Service.OnePacket || fw.Announce {
		t.Errorf("fwmark service = %+v", fw)
	}
	all := cfg.Spec.Services[3]
	if all.Service.Key.Port != 0 || all.Service.Persistent != 60 || all.Service.Netmask != 32 || all.Backends[0].Addr.Port() != 0 {
		t.Errorf("all-ports service = %+v", all)
	}
}

// errorTests cover every validation rule: each case lists the complete
// error output, so positions and wording are checked too.
var errorTests = func() []struct {
	name string
	in   string
	want []string
} {
	const svc = "[[service]]\nvip = \"192.0.2.10\"\nport = 80\n"
	return []struct {
		name string
		in   string
		want []string
	}{
		{"syntax", "[[service]\nvip = 1", []string{"t.toml:2: expected end of table array name"}},
		{"type", "[[service]]\nvip = \"192.0.2.1\"\nport = \"80\"\n", []string{`t.toml:3: service.port: incompatible types: TOML value has type string; destination has type integer`}},
		{"unknown key", svc + "wieght = 3\nbackend = [{ address = \"10.0.0.1\" }]\n", []string{`t.toml:4: unknown key "service.wieght"`}},
		{"unknown backend key", svc + "[[service.backend]]\naddress = \"10.0.0.1\"\nwieght = 1\n", []string{`t.toml:6: unknown key "service.backend.wieght"`}},
		{"unknown daemon key", "[daemon]\nuplink = \"eth0\"\n", []string{`t.toml:2: unknown key "daemon.uplink"`}},
		{"unknown tables", "[daemon]\nfoo.bar = 1\n[x]\na = 1\nb = { c = 1 }\n[[y]]\nz = 1\n[[y]]\n",
			[]string{`t.toml:2: unknown key "daemon.foo.bar"`, `t.toml:3: unknown key "x"`, `t.toml:6: unknown key "y"`, `t.toml:8: unknown key "y"`}},
		{"negative weight", svc + "[[service.backend]]\naddress = \"10.0.0.1\"\nweight = -1\n",
			[]string{`t.toml:6: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": weight -1 is negative`}},
		{"weight too big", svc + "backend = [{ address = \"10.0.0.1\", weight = 70000 }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": weight 70000 is above 65535`}},
		{"inline multiline positions", svc + "backend = [\n  { address = \"10.0.0.1\" },\n  { address = \"10.0.0.2\",\n    weight = -2 },\n]\n",
			[]string{`t.toml:7: service "tcp-192.0.2.10-80": backend "10.0.0.2:80": weight -2 is negative`}},
		{"bad vip", "[[service]]\nname = \"x\"\nvip = \"192.0.2.300\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: "192.0.2.300" is not an IP address`}},
		{"loopback vip", "[[service]]\nname = \"x\"\nvip = \"127.0.0.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 127.0.0.1 is not a unicast address vipd can bind`}},
		{"port range", "[[service]]\nname = \"x\"\nvip = \"192.0.2.1\"\nport = 70000\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "x": port 70000 is outside 0..65535`}},
		{"missing vip", "[[service]]\nname = \"x\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:1: service "x": vip is missing (or set nodeport = true, or fwmark)`}},
		{"missing port", "[[service]]\nname = \"x\"\nvip = \"192.0.2.1\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:1: service "x": port is missing`}},
		{"no backends", "[[service]]\nname = \"x\"\nvip = \"192.0.2.1\"\nport = 80\n",
			[]string{`t.toml:1: service "x": no backends (add [[service.backend]] tables)`}},
		{"protocol", svc + "protocol = \"icmp\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service 1: protocol: unknown protocol "icmp" (want tcp, udp or sctp)`}},
		{"scheduler", svc + "scheduler = \"random\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": unknown scheduler "random" (want one of rr wrr lc wlc lblc lblcr dh sh sed nq fo ovf mh twos)`}},
		{"flag for other scheduler", svc + "scheduler = \"rr\"\nscheduler_flags = [\"sh-port\"]\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": scheduler flag "sh-port" needs scheduler "sh", not "rr"`}},
		{"unknown flag", svc + "scheduler = \"mh\"\nscheduler_flags = [\"mh-foo\"]\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": unknown scheduler flag "mh-foo" (want sh-fallback, sh-port, mh-fallback or mh-port)`}},
		{"family mismatch", svc + "backend = [{ address = \"fd00::1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "[fd00::1]:80": ipv6 backend on an ipv4 service (only tunnel forwarding mixes families)`}},
		{"dr port change", svc + "forward = \"droute\"\nbackend = [{ address = \"10.0.0.1\", port = 8080 }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": backend "10.0.0.1:8080": droute forwarding cannot change the port (80 to 8080): the backend sees the VIP's packet unchanged`}},
		{"tunnel port change via address", svc + "forward = \"tunnel\"\nbackend = [{ address = \"10.0.0.1:81\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": backend "10.0.0.1:81": tunnel forwarding cannot change the port (80 to 81): the backend sees the VIP's packet unchanged`}},
		{"bad forward", svc + "forward = \"fullnat\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": forward "fullnat" must be masq, droute or tunnel`}},
		{"gue without port", svc + "forward = \"tunnel\"\ntunnel = \"gue\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": a gue tunnel needs tunnel_port (the backends' FOU port)`}},
		{"tunnel settings without tunnel", svc + "tunnel = \"gre\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": tunnel settings need forward = "tunnel"`}},
		{"ipip csum", svc + "forward = \"tunnel\"\ntunnel_checksum = \"csum\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": tunnel_checksum applies to gue and gre tunnels only`}},
		{"netmask without persistence", svc + "persistence_netmask = 24\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": persistence_netmask needs persistence`}},
		{"netmask range", svc + "persistence = \"1m\"\npersistence_netmask = 33\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": persistence_netmask /33 is outside /1../32 for ipv4`}},
		{"bad persistence", svc + "persistence = \"forever\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": persistence: "forever" is not a duration (like "30s" or "5m")`}},
		{"fractional persistence", svc + "persistence = \"1.5s\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": persistence 1.5s is not a whole number of seconds`}},
		{"port 0 without persistence", "[[service]]\nname = \"x\"\nvip = \"192.0.2.1\"\nport = 0\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "x": port 0 (all ports) needs persistence, as in IPVS`}},
		{"one packet on tcp", svc + "one_packet = true\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": one_packet applies to udp only, not tcp`}},
		{"one packet with persistence", svc + "protocol = \"udp\"\none_packet = true\npersistence = 30\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "udp-192.0.2.10-80": one_packet schedules every packet and cannot be combined with persistence`}},
		{"fwmark with port", "[[service]]\nname = \"f\"\nfwmark = 3\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "f": port is not used by a fwmark service (the mark selects the traffic)`}},
		{"fwmark with protocol", "[[service]]\nname = \"f\"\nfwmark = 3\nprotocol = \"udp\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "f": protocol is not used by a fwmark service (the mark selects the traffic)`}},
		{"fwmark snat", "[[service]]\nname = \"f\"\nfwmark = 3\nsnat = true\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "f": snat is not supported for fwmark services; masquerade with your own mark rules`}},
		{"snat all ports", "[[service]]\nname = \"x\"\nvip = \"192.0.2.1\"\nport = 0\npersistence = 60\nsnat = true\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:6: service "x": snat is not supported for all-ports (port 0) services`}},
		{"snat with droute", svc + "forward = \"droute\"\nsnat = true\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": snat needs forward = "masq", not "droute"`}},
		{"snat without iptables", "[daemon]\nmanage_iptables = false\n" + svc + "snat = true\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:6: service "tcp-192.0.2.10-80": snat needs daemon.manage_iptables = true`}},
		{"nodeport with vip", "[[service]]\nname = \"n\"\nnodeport = true\nvip = \"192.0.2.1\"\nport = 30080\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "n": a nodeport service listens on the host's addresses and has no vip`}},
		{"nodeport droute", "[[service]]\nname = \"n\"\nnodeport = true\nport = 30080\nforward = \"droute\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{
				`t.toml:5: service "n": a nodeport service forwards with masq, not droute`,
			}},
		{"interfaces without nodeport", svc + "interfaces = [\"eth0\"]\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": interfaces only applies to nodeport services`}},
		{"duplicate service", svc + "backend = [{ address = \"10.0.0.1\" }]\n" + svc + "name = \"b\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:5: service "b": tcp 192.0.2.10:80 is also used by service "tcp-192.0.2.10-80"`}},
		{"duplicate name", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 81\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:7: service "a": name already used by service 1`}},
		{"duplicate nodeport", "[[service]]\nname = \"a\"\nnodeport = true\nport = 30000\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"b\"\nnodeport = true\nport = 30000\nbackend = [{ address = \"10.0.0.2\" }]\n",
			[]string{`t.toml:9: service "b": nodeport tcp 30000 is also used by service "a"`}},
		{"duplicate backend", svc + "backend = [{ address = \"10.0.0.1\" }, { address = \"10.0.0.1:80\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend 10.0.0.1:80 is listed twice (also backend 1)`}},
		{"announce conflict", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"b\"\nvip = \"192.0.2.1\"\nport = 81\nannounce = false\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:10: service "b": announce = false conflicts with another service on VIP 192.0.2.1`}},
		{"thresholds", svc + "backend = [{ address = \"10.0.0.1\", upper_threshold = 5, lower_threshold = 9 }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": lower_threshold 9 is above upper_threshold 5`}},
		{"lower without upper", svc + "backend = [{ address = \"10.0.0.1\", lower_threshold = 9 }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": lower_threshold needs upper_threshold`}},
		{"threshold range", svc + "backend = [{ address = \"10.0.0.1\", upper_threshold = 3000000000 }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": upper_threshold 3000000000 is outside 0..2147483647`}},
		{"backend address", svc + "[[service.backend]]\naddress = \"backend1\"\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": backend 1: address "backend1" is not an IP address or address:port`}},
		{"backend port twice", svc + "backend = [{ address = \"10.0.0.1:80\", port = 80 }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": port is given twice (address "10.0.0.1:80" has one)`}},
		{"daemon values", "[daemon]\ninterface = \"this-name-is-too-long\"\nuplinks = [\"vipd0\"]\non_stop = \"flush\"\nresync_interval = \"10ms\"\nsnat_mark = 0\nmetrics_listen = \"9100\"\ncontrol_socket = \"vipd.sock\"\ngarp_count = 1000\ngarp_refresh = \"x\"\ndrain_grace = \"11m\"\n",
			[]string{
				`t.toml:2: daemon: interface: "this-name-is-too-long" is not a valid interface name`,
				`t.toml:4: daemon: on_stop "flush" must be "keep" or "clean"`,
				`t.toml:5: daemon: resync_interval 10ms is below 1s`,
				`t.toml:6: daemon: snat_mark 0x0 must be a nonzero 32-bit mark`,
				`t.toml:7: daemon: metrics_listen "9100" is not host:port (use "" to disable)`,
				`t.toml:8: daemon: control_socket "vipd.sock" must be an absolute path`,
				`t.toml:9: daemon: garp_count 1000 is outside 0..100`,
				`t.toml:10: daemon: garp_refresh: "x" is not a duration (like "30s" or "5m")`,
				`t.toml:11: daemon: drain_grace 11m0s is above 10m`,
			}},
		{"stats_interval too short", "[daemon]\nstats_interval = \"500ms\"\n",
			[]string{`t.toml:2: daemon: stats_interval 500ms is outside 1s..10m`}},
		{"stats_interval too long", "[daemon]\nstats_interval = \"1h\"\n",
			[]string{`t.toml:2: daemon: stats_interval 1h0m0s is outside 1s..10m`}},
		{"uplink is dummy", "[daemon]\nuplinks = [\"vipd0\"]\n",
			[]string{`t.toml:2: daemon: uplinks: "vipd0" is vipd's dummy interface; announce on a real uplink`}},
		{"all errors at once", svc + "scheduler = \"x\"\n[[service.backend]]\naddress = \"10.0.0.1\"\nweight = -1\n[[service.backend]]\naddress = \"fd00::1\"\n",
			[]string{
				`t.toml:4: service "tcp-192.0.2.10-80": unknown scheduler "x" (want one of rr wrr lc wlc lblc lblcr dh sh sed nq fo ovf mh twos)`,
				`t.toml:7: service "tcp-192.0.2.10-80": backend "10.0.0.1:80": weight -1 is negative`,
				`t.toml:9: service "tcp-192.0.2.10-80": backend "[fd00::1]:80": ipv6 backend on an ipv4 service (only tunnel forwarding mixes families)`,
			}},
		{"broadcast vip", "[[service]]\nname = \"x\"\nvip = \"255.255.255.255\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 255.255.255.255 is not a unicast address vipd can bind (limited broadcast)`}},
		{"class e vip", "[[service]]\nname = \"x\"\nvip = \"240.0.0.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 240.0.0.1 is not a unicast address vipd can bind (class E, reserved)`}},
		{"class e vip top", "[[service]]\nname = \"x\"\nvip = \"255.255.255.254\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 255.255.255.254 is not a unicast address vipd can bind (class E, reserved)`}},
		{"this network vip", "[[service]]\nname = \"x\"\nvip = \"0.1.2.3\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 0.1.2.3 is not a unicast address vipd can bind ("this network", 0.0.0.0/8)`}},
		{"unspecified vip", "[[service]]\nname = \"x\"\nvip = \"0.0.0.0\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 0.0.0.0 is not a unicast address vipd can bind (unspecified)`}},
		{"unspecified vip6", "[[service]]\nname = \"x\"\nvip = \"::\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: :: is not a unicast address vipd can bind (unspecified)`}},
		{"mapped broadcast vip", "[[service]]\nname = \"x\"\nvip = \"::ffff:255.255.255.255\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 255.255.255.255 is not a unicast address vipd can bind (limited broadcast)`}},
		{"loopback vip6", "[[service]]\nname = \"x\"\nvip = \"::1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: ::1 is not a unicast address vipd can bind (loopback)`}},
		{"loopback vip 127/8", "[[service]]\nname = \"x\"\nvip = \"127.1.2.3\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 127.1.2.3 is not a unicast address vipd can bind (loopback)`}},
		{"multicast vip", "[[service]]\nname = \"x\"\nvip = \"224.0.0.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 224.0.0.1 is not a unicast address vipd can bind (multicast)`}},
		{"multicast vip top", "[[service]]\nname = \"x\"\nvip = \"239.255.255.255\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 239.255.255.255 is not a unicast address vipd can bind (multicast)`}},
		{"multicast vip6", "[[service]]\nname = \"x\"\nvip = \"ff05::2\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: ff05::2 is not a unicast address vipd can bind (multicast)`}},
		{"link-local vip", "[[service]]\nname = \"x\"\nvip = \"169.254.1.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: 169.254.1.1 is not a unicast address vipd can bind (link-local)`}},
		{"link-local vip6", "[[service]]\nname = \"x\"\nvip = \"fe80::1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:3: service "x": vip: fe80::1 is not a unicast address vipd can bind (link-local)`}},
		{"broadcast backend", svc + "backend = [{ address = \"255.255.255.255\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "255.255.255.255:80": 255.255.255.255 is not a unicast address (limited broadcast)`}},
		{"class e backend", svc + "backend = [{ address = \"250.0.0.1:8080\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "250.0.0.1:8080": 250.0.0.1 is not a unicast address (class E, reserved)`}},
		{"this network backend", svc + "backend = [{ address = \"0.0.0.1\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "0.0.0.1:80": 0.0.0.1 is not a unicast address ("this network", 0.0.0.0/8)`}},
		{"multicast backend", svc + "backend = [{ address = \"224.0.0.5:80\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "224.0.0.5:80": 224.0.0.5 is not a unicast address (multicast)`}},
		{"backend on own vip", svc + "backend = [{ address = \"10.0.0.1\" }, { address = \"192.0.2.10:8080\" }]\n",
			[]string{`t.toml:4: service "tcp-192.0.2.10-80": backend "192.0.2.10:8080": address 192.0.2.10 is the vip of service "tcp-192.0.2.10-80"`}},
		{"backend on own vip mapped", svc + "[[service.backend]]\naddress = \"[::ffff:192.0.2.10]:80\"\n",
			[]string{`t.toml:5: service "tcp-192.0.2.10-80": backend "192.0.2.10:80": address 192.0.2.10 is the vip of service "tcp-192.0.2.10-80"`}},
		{"backend on earlier vip", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"b\"\nvip = \"192.0.2.2\"\nport = 53\nprotocol = \"udp\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n[[service.backend]]\naddress = \"192.0.2.1\"\n",
			[]string{`t.toml:14: service "b": backend "192.0.2.1:53": address 192.0.2.1 is the vip of service "a"`}},
		{"vip on earlier backend", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"b\"\nvip = \"10.0.0.1\"\nport = 80\nbackend = [{ address = \"10.0.0.2\" }]\n",
			[]string{`t.toml:8: service "b": vip 10.0.0.1 is the address of backend "10.0.0.1:80" of service "a"`}},
		{"vip on earlier backend once", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"b\"\nvip = \"10.0.0.1\"\nport = 80\nbackend = [{ address = \"10.0.0.2\" }]\n" +
			"[[service]]\nname = \"c\"\nvip = \"10.0.0.1\"\nport = 81\nbackend = [{ address = \"10.0.0.2\" }]\n",
			[]string{`t.toml:8: service "b": vip 10.0.0.1 is the address of backend "10.0.0.1:80" of service "a"`}},
		{"fwmark backend on vip", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"f\"\nfwmark = 7\nbackend = [{ address = \"192.0.2.1\" }]\n",
			[]string{`t.toml:9: service "f": backend "192.0.2.1:0": address 192.0.2.1 is the vip of service "a"`}},
		{"nodeport backend on vip", "[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
			"[[service]]\nname = \"n\"\nnodeport = true\nport = 30080\nbackend = [{ address = \"192.0.2.1:80\" }]\n",
			[]string{`t.toml:10: service "n": backend "192.0.2.1:80": address 192.0.2.1 is the vip of service "a"`}},
		{"name with nul", svc + "name = \"a\\u0000b\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "a\x00b": name "a\x00b" holds '\x00': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name with newline", svc + "name = \"web\\nt.toml:1: forged\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "web\nt.toml:1: forged": name "web\nt.toml:1: forged" holds '\n': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name is drain wildcard", svc + "name = \"*\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "*": name "*" holds '*': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name with space", svc + "name = \"web tier\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "web tier": name "web tier" holds ' ': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name with slash", svc + "name = \"../web\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "../web": name "../web" holds '/': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name not ascii", svc + "name = \"wéb\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "wéb": name "wéb" holds 'é': use ASCII letters, digits, '-', '_', '.' and ':'`}},
		{"name too long", svc + "name = \"" + strings.Repeat("a", 65) + "\"\nbackend = [{ address = \"10.0.0.1\" }]\n",
			[]string{`t.toml:4: service "` + strings.Repeat("a", 65) + `": name "aaaaaaaaaaaaaaaaaaaa"... is longer than 64 bytes`}},
	}
}()

// TestErrors checks every validation rule (see errorTests).
func TestErrors(t *testing.T) {
	for _, tt := range errorTests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("t.toml", []byte(tt.in))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", cfg)
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("error %T is not Errors: %v", err, err)
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors:\n%s\nwant %d:\n%s", len(got), err, len(tt.want), strings.Join(tt.want, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d:\n got %s\nwant %s", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestExamples parses every example and checks that it plans.
func TestExamples(t *testing.T) {
	files, err := exampleFiles()
	if err != nil || len(files) < 6 {
		t.Fatalf("examples: %v %v", files, err)
	}
	host := lb.Host{Addrs: map[string][]netip.Addr{"eth0": {netip.MustParseAddr("198.51.100.1")}}}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			ops := lb.Plan(lb.Desired(&cfg.Spec, host), lb.NewState(), lb.PlanOptions{})
			if len(ops) == 0 {
				t.Fatal("example plans nothing")
			}
			// Applying the plan and re-planning must converge.
			desired := lb.Desired(&cfg.Spec, host)
			if again := lb.Plan(desired, desired.Clone(), lb.PlanOptions{}); len(again) != 0 {
				t.Errorf("desired state does not plan zero operations against itself: %v", again)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v", err)
	}
}

func FuzzParse(f *testing.F) {
	files, _ := exampleFiles()
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" },\n{ weight = -1 }]\n"))
	f.Add([]byte("[a.b]\n[[a.b.c]]\nx = [[1], {y = 2}]\n"))
	f.Add([]byte("[[service]]\nname = \"a\"\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n\n[[service]]\nname = \"b\"\nvip = \"192.0.2.1\"\nport = 81\nbackend = [{ address = \"10.0.0.2\" }]\n"))
	// Deep nesting and long keys, past the limits and at them: these
	// made each parse take seconds and gigabytes before the limits.
	for _, n := range []int{MaxKeyParts, 200} {
		f.Add([]byte(strings.Repeat("a.", n) + "a = 1\n"))
		f.Add([]byte("[" + strings.Repeat("a.", n) + "a]\nb = 1\n"))
		f.Add([]byte("[[service]]\nbackend = [{ address = \"10.0.0.1\", check = " + strings.Repeat("{a = ", n) + "1" + strings.Repeat("}", n) + " }]\n"))
	}
	for _, n := range []int{MaxNesting, 200} {
		f.Add([]byte("x = " + strings.Repeat("[", n) + strings.Repeat("]", n) + "\n"))
		f.Add([]byte("[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = " + strings.Repeat("[", n) + "{ address = \"10.0.0.1\" }" + strings.Repeat("]", n) + "\n"))
	}
	f.Add([]byte(strings.Repeat("k", MaxKeyLen+1) + " = 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.toml", data)
		// The block parser must agree with the whole-file parser, and a
		// parse from this file with the one of an edit of it (see also
		// FuzzIncremental).
		checkParse(t, nil, data, cfg, err)
		if err == nil {
			n := len(data)
			checkParse(t, cfg, slices.Concat(data[:n/2], data[n/4:]), nil, nil)
			checkParse(t, cfg, slices.Concat(data[:n/3], []byte("1"), data[min(n, n/3+1):]), nil, nil)
		}
		if err == nil {
			if cfg == nil {
				t.Fatal("nil config without error")
			}
			lb.Plan(lb.Desired(&cfg.Spec, lb.Host{}), lb.NewState(), lb.PlanOptions{})
			return
		}
		var errs Errors
		if !errors.As(err, &errs) || len(errs) == 0 {
			t.Fatalf("error is not a non-empty Errors: %v", err)
		}
	})
}

// BenchmarkParseBackendTables parses 1,000 services written with a
// [[service.backend]] table per backend.
func BenchmarkParseBackendTables(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString("[[service]]\nvip = \"10.1." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + "\"\nport = 80\nscheduler = \"wrr\"\n")
		for j := range 10 {
			sb.WriteString("[[service.backend]]\naddress = \"10.2." + strconv.Itoa(i%250) + "." + strconv.Itoa(j+1) + "\"\nweight = 5\n")
		}
	}
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse("bench.toml", data); err != nil {
			b.Fatal(err)
		}
	}
}

func TestHealthConfig(t *testing.T) {
	cfg, err := Parse("h.toml", []byte(`
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
on_failure = "remove"
quorum = 1
sorry = "10.0.0.99:8080"

[service.check]
type = "http"
path = "/healthz"
status = "200-299"
interval = "1s"
rise = 2
fall = 2

[[service.backend]]
address = "10.0.0.1"

[[service.backend]]
address = "10.0.0.2"
check = { type = "tcp", port = 8081, initial = "up" }

[[service.backend]]
address = "10.0.0.3"
check = { type = "none" }
`))
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.Health["web"]
	if h.Policy.Action != check.Remove || h.Policy.Quorum != 1 || h.Policy.Sorry.Addr != netip.MustParseAddrPort("10.0.0.99:8080") {
		t.Errorf("policy = %+v", h.Policy)
	}
	if len(h.Checks) != 2 {
		t.Fatalf("checks = %+v", h.Checks)
	}
	c1 := h.Checks[netip.MustParseAddrPort("10.0.0.1:80")]
	if c1.Kind != check.KindHTTP || c1.HTTP.Path != "/healthz" || c1.Interval != time.Second || c1.Rise != 2 {
		t.Errorf("service check = %+v", c1)
	}
	c2 := h.Checks[netip.MustParseAddrPort("10.0.0.2:80")]
	if c2.Kind != check.KindTCP || c2.Port != 8081 || c2.Initial != check.Up {
		t.Errorf("backend override = %+v", c2)
	}
	if targets := cfg.Targets(); len(targets) != 2 {
		t.Errorf("targets = %+v", targets)
	}
}

// TestHalfOpenConfig: half_open in a service's and a backend's check
// table sets TCPOptions.HalfOpen, with source, and an annotation may set
// it.
func TestHalfOpenConfig(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`[[service]]
name = "s"
vip = "192.0.2.10"
port = 80
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2", check = { type = "tcp", half_open = true, source = "10.0.0.100" } }]
[service.check]
type = "tcp"
half_open = true
`))
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.Health["s"]
	c1 := h.Checks[netip.MustParseAddrPort("10.0.0.1:80")]
	if c1.Kind != check.KindTCP || !c1.TCP.HalfOpen {
		t.Errorf("service check = %+v", c1)
	}
	c2 := h.Checks[netip.MustParseAddrPort("10.0.0.2:80")]
	if !c2.TCP.HalfOpen || c2.Dial.Source != netip.MustParseAddr("10.0.0.100") {
		t.Errorf("backend check = %+v", c2)
	}
	if v4, v6 := cfg.HalfOpen(); !v4 || v6 {
		t.Errorf("HalfOpen() = %v, %v, want IPv4 alone", v4, v6)
	}
	s, err := ParseCheck(`{ type = "tcp", half_open = true }`)
	if err != nil || !s.TCP.HalfOpen {
		t.Errorf("annotation: %+v, %v", s, err)
	}
}

// healthErrorTests are health-checking errors, each with the error it
// must contain.
var healthErrorTests = func() []struct{ name, in, want string } {
	const svc = "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n"
	return []struct{ name, in, want string }{
		{"type", svc + "[service.check]\ntype = \"icmp\"\n", `t.toml:7: service "s": check: type "icmp" must be tcp, http, https, udp, dns, exec or none`},
		{"options of another kind", svc + "[service.check]\ntype = \"tcp\"\npath = \"/x\"\n", `t.toml:6: service "s": check: http options do not apply to tcp checks`},
		{"interval", svc + "[service.check]\ntype = \"tcp\"\ninterval = \"1ms\"\n", `t.toml:6: service "s": check: interval 1ms is shorter than 10ms`},
		{"quorum without checks", "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 80\nquorum = 1\nbackend = [{ address = \"10.0.0.1\" }]\n", `t.toml:1: service "s": quorum and sorry need health checks`},
		{"on_failure", svc + "on_failure = \"panic\"\n", `t.toml:6: service "s": on_failure "panic" must be "quiesce" or "remove"`},
		{"sorry", svc + "sorry = \"nowhere\"\n", `t.toml:6: service "s": sorry: "nowhere" is not an IP address or address:port`},
		{"exec without command", svc + "[service.check]\ntype = \"exec\"\n", `t.toml:6: service "s": check: exec command is missing`},
		{"half_open of http", svc + "[service.check]\ntype = \"http\"\nhalf_open = true\n", `t.toml:8: service "s": check: half_open applies to tcp checks only, not http`},
		{"half_open with mark", svc + "[service.check]\ntype = \"tcp\"\nhalf_open = true\nmark = 7\n", `t.toml:9: service "s": check: mark cannot be used with half_open: a half-open check's SYNs leave from one raw socket that all checks share, which cannot carry one check's mark`},
		{"half_open with device", svc + "[service.check]\ntype = \"tcp\"\ndevice = \"eth1\"\nhalf_open = true\n", `t.toml:8: service "s": check: device cannot be used with half_open`},
		{"backend half_open with mark", "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\", check = { type = \"tcp\", half_open = true, mark = 1 } }]\n",
			`t.toml:5: service "s": backend "10.0.0.1:80": check: mark cannot be used with half_open`},
		{"keep_alive of tcp", svc + "[service.check]\ntype = \"tcp\"\ninterval = \"1s\"\nkeep_alive = true\n", `t.toml:9: service "s": check: keep_alive applies to http and https checks only, not tcp`},
		{"keep_alive of exec", svc + "[service.check]\ntype = \"exec\"\nkeep_alive = true\ncommand = \"/bin/true\"\n", `t.toml:8: service "s": check: keep_alive applies to http and https checks only, not exec`},
		{"backend keep_alive of dns", "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 53\nprotocol = \"udp\"\nbackend = [\n{ address = \"10.0.0.1\" },\n{ address = \"10.0.0.2\", check = { type = \"dns\", name = \"x.example\", keep_alive = true } }]\n",
			`t.toml:8: service "s": backend "10.0.0.2:53": check: keep_alive applies to http and https checks only, not dns`},
		{"keep_alive false of udp", svc + "[service.check]\ntype = \"udp\"\nkeep_alive = false\nhost = \"x\"\n", `t.toml:6: service "s": check: http options do not apply to udp checks`},
	}
}()

// TestKeepAliveConfig: keep_alive in a service's and a backend's http or
// https check table sets HTTPOptions.KeepAlive, and an annotation may set
// it; on other kinds it is refused (healthErrorTests), in annotations
// too.
func TestKeepAliveConfig(t *testing.T) {
	cfg, err := Parse("k.toml", []byte(`[[service]]
name = "s"
vip = "192.0.2.10"
port = 443
backend = [{ address = "10.0.0.1" }, { address = "10.0.0.2", check = { type = "http", keep_alive = true, path = "/h" } }, { address = "10.0.0.3", check = { type = "http" } }]
[service.check]
type = "https"
insecure = true
keep_alive = true
`))
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.Health["s"]
	for addr, want := range map[string]struct {
		kind check.Kind
		keep bool
	}{"10.0.0.1:443": {check.KindHTTPS, true}, "10.0.0.2:443": {check.KindHTTP, true}, "10.0.0.3:443": {check.KindHTTP, false}} {
		s := h.Checks[netip.MustParseAddrPort(addr)]
		if s.Kind != want.kind || s.HTTP.KeepAlive != want.keep {
			t.Errorf("%s: %s check, keep_alive %v; want %s, %v", addr, s.Kind, s.HTTP.KeepAlive, want.kind, want.keep)
		}
	}
	s, err := ParseCheck(`{ type = "http", keep_alive = true }`)
	if err != nil || !s.HTTP.KeepAlive {
		t.Errorf("annotation: %+v, %v", s, err)
	}
	for _, text := range []string{`{ type = "tcp", keep_alive = true }`, `{ type = "udp", keep_alive = true }`} {
		if _, err := ParseCheck(text); err == nil || !strings.Contains(err.Error(), "keep_alive applies to http and https checks only") {
			t.Errorf("annotation %s: %v, want keep_alive refused", text, err)
		}
	}
}

func TestHealthErrors(t *testing.T) {
	for _, tt := range healthErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}

// exampleFiles returns the example configurations: examples/*.toml and
// examples/kubernetes/vipd.toml.
func exampleFiles() ([]string, error) {
	files, err := filepath.Glob("../examples/*.toml")
	return append(files, "../examples/kubernetes/vipd.toml"), err
}
