package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestAllow parses a service's allow list: prefixes and plain addresses
// (each standing for itself alone), of the service's family, on VIP and
// nodeport services.
func TestAllow(t *testing.T) {
	cfg, err := Parse("allow.toml", []byte(`
[[service]]
name = "web"
vip = "192.0.2.10"
port = 80
allow = ["10.0.0.0/8", "198.51.100.7", "0.0.0.0/0"]
backend = [{ address = "10.1.0.1" }]

[[service]]
name = "web6"
vip = "2001:db8::10"
port = 80
allow = ["2001:db8:1::/48", "2001:db8:2::7"]
backend = [{ address = "2001:db8:9::1" }]

[[service]]
name = "np"
nodeport = true
port = 30080
allow = ["192.0.2.0/24"]
backend = [{ address = "10.1.0.1", port = 8080 }]

[[service]]
name = "open"
vip = "192.0.2.10"
port = 81
backend = [{ address = "10.1.0.1" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]netip.Prefix{
		"web":  {netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("198.51.100.7/32"), netip.MustParsePrefix("0.0.0.0/0")},
		"web6": {netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("2001:db8:2::7/128")},
		"np":   {netip.MustParsePrefix("192.0.2.0/24")},
		"open": nil,
	}
	for _, vs := range cfg.Spec.Services {
		if w, ok := want[vs.Name]; !ok || !slices.Equal(vs.Allow, w) {
			t.Errorf("service %s: allow = %v, want %v", vs.Name, vs.Allow, w)
		}
	}
}

// TestAllowErrors proves each refusal of an allow list, with the file,
// the line of the key and the service named.
func TestAllowErrors(t *testing.T) {
	long := make([]string, MaxAllow+1)
	for i := range long {
		long[i] = fmt.Sprintf("%q", netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}).String()+"/24")
	}
	tests := []struct {
		name, svc, daemon, want string
	}{
		{"not a prefix", `vip = "192.0.2.10"
port = 80
allow = ["10.0.0.0/33"]`, "", `allow[0]: "10.0.0.0/33" is not a prefix`},
		{"garbage", `vip = "192.0.2.10"
port = 80
allow = ["example.com"]`, "", `allow[0]: "example.com" is not a prefix`},
		{"host bits", `vip = "192.0.2.10"
port = 80
allow = ["10.0.0.1/8"]`, "", "allow[0]: 10.0.0.1/8 has host bits set (the prefix is 10.0.0.0/8)"},
		{"mapped", `vip = "192.0.2.10"
port = 80
allow = ["::ffff:10.0.0.1"]`, "", `allow[0]: "::ffff:10.0.0.1" is not a prefix`},
		{"zone", `vip = "2001:db8::10"
port = 80
allow = ["fe80::1%eth0"]`, "", `allow[0]: "fe80::1%eth0" is not a prefix`},
		{"family", `vip = "192.0.2.10"
port = 80
allow = ["10.0.0.0/8", "2001:db8::/32"]`, "", "allow[1]: 2001:db8::/32 is ipv6, the service is ipv4"},
		{"family of a nodeport service", `nodeport = true
family = "ipv6"
port = 30080
allow = ["10.0.0.0/8"]`, "", "allow[0]: 10.0.0.0/8 is ipv4, the service is ipv6"},
		{"duplicate", `vip = "192.0.2.10"
port = 80
allow = ["10.0.0.0/8", "10.0.0.0/8"]`, "", "allow[1]: 10.0.0.0/8 is listed already (allow[0])"},
		{"empty", `vip = "192.0.2.10"
port = 80
allow = []`, "", "allow is empty, which would admit no source"},
		{"too many", `vip = "192.0.2.10"
port = 80
allow = [` + strings.Join(long, ", ") + `]`, "", fmt.Sprintf("allow has %d entries, more than %d", MaxAllow+1, MaxAllow)},
		{"fwmark", `fwmark = 7
allow = ["10.0.0.0/8"]`, "", "allow is not supported for fwmark services"},
		{"all ports", `vip = "192.0.2.10"
port = 0
persistence = 60
allow = ["10.0.0.0/8"]`, "", "allow is not supported for all-ports (port 0) services"},
		{"no rules", `vip = "192.0.2.10"
port = 80
allow = ["10.0.0.0/8"]`, "[daemon]\nmanage_iptables = false\n", "allow needs daemon.manage_iptables = true"},
		{"not strings", `vip = "192.0.2.10"
port = 80
allow = [10]`, "", "allow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.daemon + "\n[[service]]\nname = \"web\"\n" + tt.svc + "\nbackend = [{ address = \"10.1.0.1\" }]\n"
			_, err := Parse("allow.toml", []byte(src))
			if err == nil {
				t.Fatalf("no error for\n%s", src)
			}
			msg := err.Error()
			line := 0
			for i, l := range strings.Split(src, "\n") {
				if strings.HasPrefix(l, "allow") {
					line = i + 1
				}
			}
			if !strings.Contains(msg, tt.want) || !strings.Contains(msg, fmt.Sprintf("allow.toml:%d:", line)) {
				t.Errorf("error %q, want %q at allow.toml:%d", msg, tt.want, line)
			}
			if tt.name != "not strings" && !strings.Contains(msg, `service "web"`) {
				t.Errorf("error %q does not name the service", msg)
			}
		})
	}
}
