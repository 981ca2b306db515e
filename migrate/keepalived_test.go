package migrate

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/vipd/vipd/config"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// samplesDir is where Debian's keepalived package installs its sample
// configurations.
const samplesDir = "/usr/share/doc/keepalived/samples"

// samples returns the paths of keepalived's sample configurations. Without
// them the test skips, or fails when CI is set: CI installs them
// (test/deps.sh).
func samples(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(samplesDir, "keepalived.conf.*"))
	if len(files) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("no keepalived samples in %s (test/deps.sh installs them); CI runs the import tests", samplesDir)
		}
		t.Skipf("no keepalived samples in %s (apt-get install keepalived)", samplesDir)
	}
	return files
}

// parse validates an imported configuration with vipd's own parser, as
// "vipd check" does. Exec checks run as check_user, which the package
// creates; a numeric user stands in for it on a test host.
func parse(t *testing.T, name string, r Result) *config.Config {
	t.Helper()
	cfg, err := config.Parse(name, append([]byte(validPrefix), r.TOML...))
	if err != nil {
		t.Fatalf("%s: the import does not pass vipd check:\n%v\n%s", name, err, r.TOML)
	}
	if len(cfg.Spec.Services) != r.Services {
		t.Fatalf("%s: %d services parsed, the import says %d", name, len(cfg.Spec.Services), r.Services)
	}
	return cfg
}

// TestKeepalivedSamples imports every sample of Debian's keepalived
// package: each one with virtual servers yields services that pass vipd's
// parser, and every issue names a line of the sample.
func TestKeepalivedSamples(t *testing.T) {
	files := samples(t)
	// The directory holds 27 files: 25 configurations and two scripts.
	if len(files) != 25 {
		t.Errorf("%d sample configurations, want Debian's 25", len(files))
	}
	withLVS := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Count(string(data), "\n") + 1
		r := Keepalived(f, KeepalivedOptions{})
		cfg := parse(t, f, r)
		if strings.Contains(string(data), "\nvirtual_server ") {
			withLVS++
			if r.Services == 0 {
				t.Errorf("%s has virtual servers but imports none; issues:\n%s", f, issues(r))
			}
		}
		for _, i := range r.Issues {
			if i.File != f || i.Line < 1 || i.Line > lines {
				t.Errorf("%s: issue outside the file: %s", f, i)
			}
		}
		if strings.Contains(string(data), "vrrp_instance") && cfg.HA.Mode != "vrrp" && !strings.Contains(f, "conditional") {
			t.Errorf("%s: the vrrp_instance did not map to [ha]", f)
		}
	}
	if withLVS != 16 {
		t.Errorf("%d samples with virtual servers, want 16", withLVS)
	}
}

// TestKeepalivedSampleIssues pins what some samples report, by line.
func TestKeepalivedSampleIssues(t *testing.T) {
	samples(t)
	for _, tc := range []struct {
		sample string
		want   []string // "LINE: what" prefixes
	}{
		{"PING_CHECK", []string{"23: PING_CHECK: vipd has no ICMP echo check"}},
		{"SMTP_CHECK", []string{"39: SMTP_CHECK", "58: SMTP_CHECK", "89: SMTP_CHECK"}},
		{"SSL_GET", []string{"14: state MASTER", "19: authentication", "42: url: digest", "44: url /mrtg/", "50: delay_before_retry 3", "69: url /mrtg/"}},
		{"conditional_conf", []string{"3: @high", "4: @low", "6: vrrp_script check_VI_0", "23: use_vmac", "29: track_interface eth2 weight 20"}},
		{"virtual_server_group", []string{"29: real_server 192.168.200.1 1358: the address 192.168.200.1 is the VIP"}},
		{"quorum", []string{"30: omega", "31: quorum 7: below quorum keepalived serves", "33: quorum_up", "34: quorum_down"}},
		{"UDP_CHECK", []string{"23: UDP_CHECK: without require_reply"}},
		{"vrrp", []string{"36: vrrp_instance VI_2: vipd runs one virtual router per daemon", "49: vrrp_instance VI_3", "67: vrrp_instance VI_4"}},
		{"vrrp.lvs_syncd", []string{"3: vrrp_sync_group VG1"}},
		{"track_interface", []string{"7: static_routes", "28: virtual_routes"}},
	} {
		f := filepath.Join(samplesDir, "keepalived.conf."+tc.sample)
		r := Keepalived(f, KeepalivedOptions{})
		got := issues(r)
		for _, w := range tc.want {
			if !strings.Contains(got, f+":"+w) {
				t.Errorf("%s: no issue %q in:\n%s", tc.sample, w, got)
			}
		}
	}
}

func issues(r Result) string {
	var b strings.Builder
	for _, i := range r.Issues {
		b.WriteString(i.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// TestKeepalivedGolden compares the import of a few samples with the
// checked-in configurations and issues (go test -update rewrites them).
func TestKeepalivedGolden(t *testing.T) {
	samples(t)
	for _, name := range []string{"sample", "virtual_server_group", "quorum", "fwmark", "misc_check_arg", "SSL_GET", "vrrp.lvs_syncd", "IPv6"} {
		f := filepath.Join(samplesDir, "keepalived.conf."+name)
		r := Keepalived(f, KeepalivedOptions{})
		parse(t, f, r)
		got := strings.ReplaceAll(string(r.TOML)+"\n# issues:\n"+issues(r), samplesDir, "SAMPLES")
		golden := filepath.Join("testdata", "golden", name+".toml")
		if *update {
			if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(golden)
		if err != nil {
			t.Fatalf("%v (go test ./migrate -run Golden -update writes it)", err)
		}
		if got != string(want) {
			t.Errorf("%s differs from %s (-update rewrites it):\n%s", name, golden, got)
		}
	}
}

// TestKeepalivedMapping covers the settings the samples do not use.
func TestKeepalivedMapping(t *testing.T) {
	fsys := fstest.MapFS{
		"etc/k/keepalived.conf": {Data: []byte(`
include conf.d/*.conf   # relative to this file
vrrp_instance VI_1 {   ! after the include: positions stay this file's
    interface eth1
    virtual_router_id 7
    priority 150
    advert_int 0.5
    version 3
    nopreempt
    preempt_delay 10
    unicast_src_ip 10.1.0.1
    unicast_peer {
        10.1.0.2
    }
    lvs_sync_daemon_interface eth2
    virtual_ipaddress {
        192.0.2.10
    }
}
`)},
		"etc/k/conf.d/web.conf": {Data: []byte(`
virtual_server 192.0.2.10 443 {
    delay_loop 2
    lb_algo sh
    sh-port
    lb_kind DR
    persistence_timeout 600
    persistence_granularity 255.255.255.0
    protocol TCP
    quorum 2
    hysteresis 1
    virtualhost www.example.com
    sorry_server 10.0.0.99 443
    real_server 10.0.0.1 443 {
        weight 3
        uthreshold 100
        lthreshold 50
        inhibit_on_failure
        SSL_GET {
            url {
                path "/health check"
                status_code 200-299 301
            }
            connect_timeout 1
            retry 2
        }
    }
    real_server 10.0.0.2 443 {
        weight 3
        inhibit_on_failure
        SSL_GET {
            url {
                path "/health check"
                status_code 200-299 301
            }
            connect_timeout 1
            retry 2
        }
    }
}
virtual_server 192.0.2.11 53 {
    lb_algo rr
    lb_kind TUN type gue port 6080 csum
    protocol UDP
    ops
    real_server 10.0.0.3 53 {
        DNS_CHECK {
            type A
            name example.com
        }
    }
    real_server 10.0.0.4 53 {
        UDP_CHECK {
            payload 70696e67
            require_reply 706f6e67
        }
    }
}
`)},
	}
	r := Keepalived("/etc/k/keepalived.conf", KeepalivedOptions{FS: fsys})
	cfg := parse(t, "import.toml", r)
	// The only issue: quorum's semantics differ.
	if got := issues(r); !strings.HasPrefix(got, "/etc/k/conf.d/web.conf:10: quorum 2: below quorum keepalived serves") || strings.Count(got, "\n") != 1 {
		t.Errorf("issues:\n%s", got)
	}
	h := cfg.HA
	if h.Interface != "eth1" || h.VRID != 7 || h.Priority != 150 || h.Interval.Milliseconds() != 500 || h.Preempt || h.PreemptDelay.Seconds() != 10 ||
		h.Source.String() != "10.1.0.1" || len(h.Peers) != 1 || h.SyncInterface != "eth2" || h.Sloppy {
		t.Errorf("ha: %+v", h)
	}
	if len(cfg.Spec.Services) != 2 {
		t.Fatalf("%d services", len(cfg.Spec.Services))
	}
	web := cfg.Spec.Services[0]
	if s := web.Service.String(); s != "tcp 192.0.2.10:443 scheduler=sh flags=sh-port persistent=600s netmask=/24" {
		t.Errorf("web: %s", s)
	}
	if b := web.Backends[0]; b.Weight != 3 || b.Upper != 100 || b.Lower != 50 || b.Forward.String() != "droute" {
		t.Errorf("web backend: %+v", b)
	}
	wh := cfg.Health[web.Name]
	if wh.Policy.Quorum != 1 || wh.Policy.Hysteresis != 1 || wh.Policy.Sorry.Addr.String() != "10.0.0.99:443" || wh.Policy.Action.String() != "quiesce" {
		t.Errorf("web policy: %+v", wh.Policy)
	}
	for _, b := range web.Backends {
		c := wh.Checks[b.Addr]
		if c.Kind.String() != "https" || c.HTTP.Path != "/health check" || c.HTTP.Host != "www.example.com" || !c.HTTP.InsecureSkipVerify ||
			c.Fall != 3 || c.Rise != 1 || c.Interval.Seconds() != 2 || c.Timeout.Seconds() != 1 || len(c.HTTP.Status) != 2 {
			t.Errorf("web check of %s: %+v", b.Addr, c)
		}
	}
	dns := cfg.Spec.Services[1]
	if s := dns.Service.String(); s != "udp 192.0.2.11:53 scheduler=rr one-packet" {
		t.Errorf("dns: %s", s)
	}
	if b := dns.Backends[0]; b.Forward.String() != "tunnel" || b.TunnelPort != 6080 {
		t.Errorf("dns backend: %+v", b)
	}
	dh := cfg.Health[dns.Name]
	if c := dh.Checks[dns.Backends[0].Addr]; c.Kind.String() != "dns" || c.DNS.Type != "A" || c.DNS.Name != "example.com" {
		t.Errorf("dns check: %+v", c)
	}
	if c := dh.Checks[dns.Backends[1].Addr]; c.Kind.String() != "udp" || string(c.UDP.Payload) != "ping" || string(c.UDP.Expect) != "pong" {
		t.Errorf("udp check: %+v", c)
	}
	if !strings.Contains(string(r.TOML), "# from /etc/k/conf.d/web.conf:2\n") || !strings.Contains(string(r.TOML), "# from /etc/k/keepalived.conf:3\n[ha]") {
		t.Errorf("no origin comment of the included file:\n%s", r.TOML)
	}
}

// TestKeepalivedHostile: include loops, include bombs, deep nesting, huge
// files and broken syntax end in issues, within the limits.
func TestKeepalivedHostile(t *testing.T) {
	deep := strings.Repeat("a {\n", 10000) + strings.Repeat("}\n", 10000)
	fsys := fstest.MapFS{
		"loop.conf":   {Data: []byte("include loop.conf\ninclude other.conf\n")},
		"other.conf":  {Data: []byte("include loop.conf\nvirtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n }\n}\n")},
		"deep.conf":   {Data: []byte(deep)},
		"huge.conf":   {Data: []byte(strings.Repeat("x", 2<<20))},
		"broken.conf": {Data: []byte("virtual_server 192.0.2.1 80 {\n real_server \"10.0.0.1 80 {\n}\n}\n}\n{\n")},
		"range.conf":  {Data: []byte("virtual_server_group g {\n 10.0.0.1-255 80\n 10.0.1.1-255 80\n}\nvirtual_server group g {\n real_server 10.9.0.1 80 {\n }\n}\n")},
	}
	// An include bomb: each file includes the next one twice.
	for i := range 8 {
		fsys[fmt.Sprintf("bomb%d.conf", i)] = &fstest.MapFile{Data: []byte(strings.Repeat(fmt.Sprintf("include bomb%d.conf\n", i+1), 2))}
	}
	fsys["words.conf"] = &fstest.MapFile{Data: []byte(strings.Repeat("a b c d\n", 1000))}
	lim := Limits{Bytes: 1 << 20, Files: 100, IncludeDepth: 8, Depth: 16, Services: 300, Words: 2000}
	for _, tc := range []struct {
		file, want string
		services   int
	}{
		{"loop.conf", "include loop: the file includes itself", 1},
		{"deep.conf", "blocks nest deeper than 16", 0},
		{"huge.conf", "exceed 1048576 bytes", 0},
		{"broken.conf", "closes no block", 0},
		{"bomb0.conf", "more than 100 files", 0},
		{"range.conf", "expands to more than the 45 services allowed", 255},
		{"words.conf", "more than 2000 words: reading stopped", 0},
	} {
		r := Keepalived(tc.file, KeepalivedOptions{FS: fsys, Limits: lim})
		if !strings.Contains(issues(r), tc.want) {
			t.Errorf("%s: no issue %q in:\n%s", tc.file, tc.want, issues(r))
		}
		if r.Services != tc.services {
			t.Errorf("%s: %d services, want %d", tc.file, r.Services, tc.services)
		}
		parse(t, tc.file, r)
	}
}

// FuzzKeepalived: whatever the input, the import ends within the limits
// and its output passes vipd's parser.
func FuzzKeepalived(f *testing.F) {
	f.Add([]byte("virtual_server 192.0.2.1 80 {\n lb_algo rr\n real_server 10.0.0.1 80 {\n weight 2\n TCP_CHECK {\n connect_port 81\n }\n }\n}\n"))
	f.Add([]byte("include main.conf\nvirtual_server_group g {\n 10.0.0.1-3 80\n fwmark 7\n}\nvirtual_server group g {\n real_server 10.1.0.1 80\n}\n"))
	f.Add([]byte("vrrp_instance v {\n interface eth0\n virtual_router_id 1\n advert_int 0.01\n}\n"))
	if files, _ := filepath.Glob(filepath.Join(samplesDir, "keepalived.conf.*")); len(files) > 0 {
		for _, p := range files {
			if data, err := os.ReadFile(p); err == nil {
				f.Add(data)
			}
		}
	}
	lim := Limits{Bytes: 1 << 20, Files: 16, IncludeDepth: 4, Depth: 16, Services: 1000, Words: 1 << 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		fsys := fstest.MapFS{"main.conf": {Data: data}, "x.conf": {Data: data}}
		r := Keepalived("main.conf", KeepalivedOptions{FS: fsys, Limits: lim})
		if r.Services > lim.Services+bytesServices(data) {
			t.Fatalf("%d services from %d bytes", r.Services, len(data))
		}
		parse(t, "fuzz.toml", r)
		if !slices.IsSortedFunc(r.Issues, func(a, b Issue) int {
			if a.File != b.File {
				return 0
			}
			return a.Line - b.Line
		}) {
			t.Fatalf("issues out of order:\n%s", issues(r))
		}
	})
}

// bytesServices bounds the services that plain virtual_server blocks of
// data can hold, up to 16 files of it.
func bytesServices(data []byte) int { return 16 * len(data) }

// TestKeepalivedRefused: what vipd's parser refuses and the mapping let
// through is left out and reported at its line, never printed.
func TestKeepalivedRefused(t *testing.T) {
	fsys := fstest.MapFS{"k.conf": {Data: []byte("vrrp_instance v {\n interface a/b\n virtual_router_id 1\n version 3\n}\n" +
		"virtual_server 192.0.2.1 80 {\n real_server 10.0.0.1 80 {\n  MISC_CHECK {\n   misc_path /bin/\x00x\n  }\n }\n}\n" +
		"virtual_server 192.0.2.2 80 {\n real_server 10.0.0.2 80 {\n }\n}\n")}}
	r := Keepalived("k.conf", KeepalivedOptions{FS: fsys})
	got := issues(r)
	for _, w := range []string{
		`k.conf:1: vrrp_instance: vipd refuses the [ha] section made from it (ha: interface: "a/b" is not a valid interface name): not imported`,
		`k.conf:6: tcp 192.0.2.1:80: vipd refuses the service made from it (`,
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no issue %q in:\n%s", w, got)
		}
	}
	cfg := parse(t, "refused.toml", r)
	if r.Services != 1 || cfg.Spec.Services[0].Name != "tcp-192.0.2.2-80" || cfg.HA.Enabled() {
		t.Errorf("want only tcp-192.0.2.2-80 and no [ha]:\n%s", r.TOML)
	}
}

// TestKeepalivedUnicastTTL: vipd takes advertisements only with TTL
// (hop limit) 255, which keepalived sends to IPv6 unicast peers only
// with unicast_ttl 255; the import says so when a switch-over would
// otherwise leave vipd deaf to its keepalived peer.
func TestKeepalivedUnicastTTL(t *testing.T) {
	const head = "vrrp_instance v {\n interface eth0\n virtual_router_id 1\n version 3\n"
	for _, c := range []struct {
		name, conf, want string
	}{
		{"ipv6 peers", head + " unicast_peer {\n  fd00::2\n }\n}\n", `k.conf:1: vrrp_instance v: keepalived sends IPv6 unicast advertisements with hop limit 64`},
		{"low ttl", head + " unicast_ttl 64\n unicast_peer {\n  10.0.0.2\n }\n}\n", `k.conf:5: unicast_ttl 64: vipd accepts advertisements only with TTL (hop limit) 255`},
		{"ipv6 with 255", head + " unicast_ttl 255\n unicast_peer {\n  fd00::2\n }\n}\n", ""},
		{"ipv4 peers", head + " unicast_peer {\n  10.0.0.2\n }\n}\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Keepalived("k.conf", KeepalivedOptions{FS: fstest.MapFS{"k.conf": {Data: []byte(c.conf)}}})
			got := issues(r)
			if c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("no issue %q in:\n%s", c.want, got)
			}
			if c.want == "" && (strings.Contains(got, "unicast_ttl") || strings.Contains(got, "hop limit")) {
				t.Errorf("an issue about the TTL in:\n%s", got)
			}
		})
	}
}
