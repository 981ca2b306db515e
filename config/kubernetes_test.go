package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestKubernetesSection(t *testing.T) {
	in := `[kubernetes]
kubeconfig = "/etc/vipd/kubeconfig"
program = "/usr/libexec/vipd/vipd-kubernetes"
load_balancer_class = "vipd.io/lb"
namespaces = ["web"]
service_selector = "lb=vipd"
backends = "endpoints"
lease_namespace = "vipd"
identity = "lb-a"
lease_duration = "20s"
api_qps = 200
api_burst = 400

[[kubernetes.pool]]
name = "public"
addresses = ["192.0.2.32/27", "2001:db8::/120"]
avoid_network_broadcast = true

[[kubernetes.pool]]
name = "manual"
addresses = ["198.51.100.10-198.51.100.20"]
auto_assign = false
namespaces = ["pay", "shop"]
service_selector = "tier=front"
share_across_namespaces = true
` + haService
	cfg, err := Parse("t.toml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Kubernetes
	if !k.Enabled || k.Kubeconfig != "/etc/vipd/kubeconfig" || k.Program != "/usr/libexec/vipd/vipd-kubernetes" || k.LoadBalancerClass != "vipd.io/lb" || k.DefaultClass ||
		len(k.Namespaces) != 1 || k.ServiceSelector != "lb=vipd" || k.Backends != "endpoints" || len(k.Pools) != 2 ||
		!k.Pools[0].AutoAssign || !k.Pools[0].AvoidNetworkBroadcast || k.Pools[1].AutoAssign || k.Pools[1].Addresses[0] != "198.51.100.10-198.51.100.20" {
		t.Errorf("got %+v", k)
	}
	if p := k.Pools[1]; strings.Join(p.Namespaces, ",") != "pay,shop" || p.ServiceSelector != "tier=front" || !p.ShareAcrossNamespaces ||
		k.Pools[0].Namespaces != nil || k.Pools[0].ServiceSelector != "" || k.Pools[0].ShareAcrossNamespaces {
		t.Errorf("pool tenants %+v", k.Pools)
	}
	if !k.LeaderElection || k.LeaseNamespace != "vipd" || k.LeaseName != "" || k.Identity != "lb-a" || k.LeaseDuration != 20*time.Second {
		t.Errorf("lease %+v", k)
	}
	if k.APIQPS != 200 || k.APIBurst != 400 {
		t.Errorf("rate limit %+v", k)
	}
	if cfg, _ := Parse("t.toml", []byte("[kubernetes]\ndefault_class = true\napi_qps = 7.5\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\"]\n"+haService)); cfg == nil || cfg.Kubernetes.APIQPS != 7.5 || cfg.Kubernetes.APIBurst != 0 {
		t.Errorf("api_qps 7.5: %+v", cfg)
	}
	if k.MetalLBAnnotations {
		t.Errorf("metallb_annotations is on by default")
	}
	if cfg, _ := Parse("t.toml", []byte("[kubernetes]\ndefault_class = true\nmetallb_annotations = true\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\"]\n"+haService)); cfg == nil || !cfg.Kubernetes.MetalLBAnnotations {
		t.Errorf("metallb_annotations = true: %+v", cfg)
	}
	want := KubernetesNodeHealth{Enabled: true, Port: 10256, Path: "/healthz", Local: true, Interval: time.Second,
		Timeout: 500 * time.Millisecond, Rise: 2, Fall: 2}
	if k.NodeHealth != want {
		t.Errorf("node_health defaults %+v, want %+v", k.NodeHealth, want)
	}
	if k.Pools[0].SNAT {
		t.Errorf("pool snat is on by default")
	}
	if cfg, _ := Parse("t.toml", []byte(haService)); cfg.Kubernetes.Enabled {
		t.Error("no [kubernetes], enabled")
	}
	// An edit of the section is a change of settings.
	_, d, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, `"lb=vipd"`, `"lb=other"`, 1)))
	if err != nil || !d.Full {
		t.Errorf("edit: %+v %v", d, err)
	}
}

// TestKubernetesNodeHealth: the [kubernetes.node_health] table and a
// pool's snat, as written and with what each key refuses.
func TestKubernetesNodeHealth(t *testing.T) {
	const pool = "\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\"]\n"
	in := `[daemon]
manage_iptables = true

[kubernetes]
default_class = true

[kubernetes.node_health]
port = 0
path = "/livez"
local = false
interval = "300ms"
timeout = "200ms"
rise = 1
fall = 3
` + pool + "snat = true\n" + haService
	cfg, err := Parse("t.toml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := KubernetesNodeHealth{Enabled: true, Port: 0, Path: "/livez", Local: false, Interval: 300 * time.Millisecond,
		Timeout: 200 * time.Millisecond, Rise: 1, Fall: 3}
	if got := cfg.Kubernetes.NodeHealth; got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if !cfg.Kubernetes.Pools[0].SNAT {
		t.Errorf("pool snat = true: %+v", cfg.Kubernetes.Pools[0])
	}
	off, err := Parse("t.toml", []byte("[kubernetes]\ndefault_class = true\n[kubernetes.node_health]\nenabled = false\n"+pool+haService))
	if err != nil || off.Kubernetes.NodeHealth.Enabled {
		t.Errorf("enabled = false: %+v %v", off, err)
	}
	// A change of the probes is a change of the section's settings (a
	// restart of the source), not of its pools.
	edited, _, err := ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, `"/livez"`, `"/readyz"`, 1)))
	if err != nil || cfg.Kubernetes.EqualBesidesPools(edited.Kubernetes) {
		t.Errorf("path edited: equal besides pools (%v)", err)
	}
	edited, _, err = ParseFrom(cfg, "t.toml", []byte(strings.Replace(in, "snat = true", "snat = false", 1)))
	if err != nil || !cfg.Kubernetes.EqualBesidesPools(edited.Kubernetes) || cfg.Kubernetes.Equal(edited.Kubernetes) {
		t.Errorf("pool snat edited: not a change of pools only (%v)", err)
	}

	head := "[daemon]\nmanage_iptables = true\n[kubernetes]\ndefault_class = true\n[kubernetes.node_health]\n"
	for _, tt := range []struct{ name, in, want string }{
		{"port", head + "port = 70000\n" + pool, `t.toml:6: kubernetes.node_health: port 70000 is outside 0..65535`},
		{"path relative", head + "path = \"healthz\"\n" + pool, `t.toml:6: kubernetes.node_health: path "healthz" must start with /`},
		{"path space", head + "path = \"/a b\"\n" + pool, `t.toml:6: kubernetes.node_health: path "/a b" must start with /`},
		{"interval", head + "interval = \"1ms\"\ntimeout = \"1ms\"\n" + pool, `t.toml:6: kubernetes.node_health: interval 1ms is outside 10ms..1h`},
		{"interval text", head + "interval = \"soon\"\n" + pool, `t.toml:6: kubernetes.node_health: interval: `},
		{"timeout above interval", head + "timeout = \"2s\"\n" + pool, `t.toml:6: kubernetes.node_health: timeout 2s must be above 0 and at most the interval (1s)`},
		{"timeout zero", head + "timeout = \"0s\"\n" + pool, `t.toml:6: kubernetes.node_health: timeout 0s must be above 0`},
		{"rise", head + "rise = 0\n" + pool, `t.toml:6: kubernetes.node_health: rise 0 is outside 1..1000`},
		{"fall", head + "\nfall = 5000\n" + pool, `t.toml:7: kubernetes.node_health: fall 5000 is outside 1..1000`},
		{"unknown key", head + "ports = 1\n" + pool, `t.toml:6: `},
		{"snat without rules", "[daemon]\nmanage_iptables = false\n[kubernetes]\ndefault_class = true\n" + pool + "snat = true\n", `t.toml:9: kubernetes.pool 1: pool "p": snat needs [daemon] manage_iptables = true`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in+haService))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestKubernetesErrors(t *testing.T) {
	pool := "\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\"]\n"
	for _, tt := range []struct{ name, in, want string }{
		{"no class", "[kubernetes]\nkubeconfig = \"/k\"\n" + pool, `t.toml:1: kubernetes: serves no Service`},
		{"relative kubeconfig", "[kubernetes]\ndefault_class = true\nkubeconfig = \"k\"\n" + pool, `t.toml:3: kubernetes: kubeconfig "k" must be an absolute path`},
		{"relative program", "[kubernetes]\ndefault_class = true\nprogram = \"vipd-kubernetes\"\n" + pool, `t.toml:3: kubernetes: program "vipd-kubernetes" must be an absolute path`},
		{"empty program", "[kubernetes]\ndefault_class = true\nprogram = \"\"\n" + pool, `t.toml:3: kubernetes: program "" must be an absolute path`},
		{"backends", "[kubernetes]\ndefault_class = true\nbackends = \"pods\"\n" + pool, `t.toml:3: kubernetes: backends "pods" must be "nodeport" or "endpoints"`},
		{"no pool", "[kubernetes]\ndefault_class = true\n", `t.toml:1: kubernetes: no pools`},
		{"pool without name", "[kubernetes]\ndefault_class = true\n[[kubernetes.pool]]\naddresses = [\"192.0.2.32/28\"]\n", `kubernetes.pool 1: name is required`},
		{"pool namespace", "[kubernetes]\ndefault_class = true\n" + pool + "namespaces = [\"ok\", \"\"]\n", `t.toml:7: kubernetes.pool 1: namespaces: "" is not a namespace name`},
		{"pool twice", "[kubernetes]\ndefault_class = true\n" + pool + pool, `kubernetes.pool 2: pool "p" is defined twice`},
		{"pool overlaps itself", "[kubernetes]\ndefault_class = true\n[[kubernetes.pool]]\nname = \"p\"\naddresses = [\"192.0.2.32/28\", \"192.0.2.40-192.0.2.50\"]\n", `t.toml:5: kubernetes.pool 1: pool "p": 192.0.2.40-192.0.2.50 overlaps 192.0.2.32/28`},
		{"pools overlap", "[kubernetes]\ndefault_class = true\n" + pool + "[[kubernetes.pool]]\nname = \"q\"\naddresses = [\"fd00::/120\", \"192.0.2.47\"]\n", `t.toml:9: kubernetes.pool 2: pool "q": 192.0.2.47 overlaps pool "p"'s 192.0.2.32/28`},
		{"selector", "[kubernetes]\ndefault_class = true\nservice_selector = \"app in (a\"\n" + pool, `t.toml:3: kubernetes: service_selector "app in (a" is not a label selector`},
		{"pool selector", "[kubernetes]\ndefault_class = true\n" + pool + "service_selector = \"tier notin\"\n", `t.toml:7: kubernetes.pool 1: pool "p": service_selector "tier notin" is not a label selector`},
		{"unknown key", "[kubernetes]\ndefault_class = true\nclass = \"x\"\n" + pool, `t.toml:3: `},
		{"lease seconds", "[kubernetes]\ndefault_class = true\nlease_duration = \"2500ms\"\n" + pool, `t.toml:3: kubernetes: lease_duration 2.5s must be whole seconds`},
		{"lease name", "[kubernetes]\ndefault_class = true\nlease_name = \"a b\"\n" + pool, `t.toml:3: kubernetes: lease_name "a b" is not a name Kubernetes takes`},
		{"qps zero", "[kubernetes]\ndefault_class = true\napi_qps = 0\n" + pool, `t.toml:3: kubernetes: api_qps 0 must be above 0 and at most 100000`},
		{"qps negative", "[kubernetes]\ndefault_class = true\n\napi_qps = -5\n" + pool, `t.toml:4: kubernetes: api_qps -5 must be above 0`},
		{"qps not a number", "[kubernetes]\ndefault_class = true\napi_qps = \"fast\"\n" + pool, `t.toml:3: `},
		{"burst zero", "[kubernetes]\ndefault_class = true\napi_burst = 0\n" + pool, `t.toml:3: kubernetes: api_burst 0 must be between 1 and 100000`},
		{"burst huge", "[kubernetes]\ndefault_class = true\napi_qps = 10\napi_burst = 1000000\n" + pool, `t.toml:4: kubernetes: api_burst 1000000 must be between 1 and 100000`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in+haService))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v\nwant %s", err, tt.want)
			}
		})
	}
}

// TestPoolHoldsFileVIP: a [[kubernetes.pool]] must hold no VIP of the
// file's services, or a Kubernetes Service could take that VIP on
// another port and open that port through the filter. The error names
// both: the service at its vip line, the pool with the line of its
// addresses. It holds for Load, for the edit of the main file (the
// pool grows) and for the edit of an included file (a service moves
// into the pool), and for a pool range written three ways.
func TestPoolHoldsFileVIP(t *testing.T) {
	const k8s = `include = ["conf.d/*.toml"]

[kubernetes]
default_class = true

[[kubernetes.pool]]
name = "tenants"
addresses = ["198.51.100.0/24", %s]
`
	const svc = `
[[service]]
name = "%s"
vip = "%s"
port = 443
backend = [{ address = "10.0.0.1" }]
`
	for _, pool := range []string{`"192.0.2.0/28"`, `"192.0.2.5-192.0.2.6"`, `"192.0.2.5"`} {
		dir := t.TempDir()
		main := filepath.Join(dir, "vipd.toml")
		writeFile(t, main, fmt.Sprintf(k8s, pool)+fmt.Sprintf(svc, "web", "192.0.2.100"))
		writeFile(t, filepath.Join(dir, "conf.d", "a.toml"), "# tenants\n"+fmt.Sprintf(svc, "api", "192.0.2.5"))
		_, err := Load(main)
		want := fmt.Sprintf(`%s:5: service "api": vip 192.0.2.5 is in [[kubernetes.pool]] "tenants" (%s:8): a Kubernetes Service could take it on another port, and vipd would open that port through the filter; take it out of the pool`,
			filepath.Join(dir, "conf.d", "a.toml"), main)
		if err == nil || err.Error() != want {
			t.Errorf("pool %s: Load: %v\nwant %s", pool, err, want)
		}
	}

	// From a valid configuration, by an edit of each file.
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	inc := filepath.Join(dir, "conf.d", "a.toml")
	good := fmt.Sprintf(k8s, `"203.0.113.0/28"`) + fmt.Sprintf(svc, "web", "192.0.2.100")
	writeFile(t, main, good)
	writeFile(t, inc, fmt.Sprintf(svc, "api", "192.0.2.5"))
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ParseFrom(base, main, []byte(fmt.Sprintf(k8s, `"192.0.2.0/24"`)+fmt.Sprintf(svc, "web", "192.0.2.100")))
	if err == nil || !strings.Contains(err.Error(), `vip 192.0.2.5 is in [[kubernetes.pool]] "tenants" (`+main+`:8)`) ||
		!strings.Contains(err.Error(), `vip 192.0.2.100 is in [[kubernetes.pool]] "tenants" (`+main+`:8)`) {
		t.Errorf("main file edit: %v", err)
	}
	_, _, err = ParseFrom(base, inc, []byte(fmt.Sprintf(svc, "api", "203.0.113.7")))
	if want := inc + `:4: service "api": vip 203.0.113.7 is in [[kubernetes.pool]] "tenants" (` + main + `:8)`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("included file edit: %v\nwant %s...", err, want)
	}
	// A new included file.
	_, _, err = ParseFrom(base, filepath.Join(dir, "conf.d", "b.toml"), []byte(fmt.Sprintf(svc, "db", "203.0.113.1")))
	if err == nil || !strings.Contains(err.Error(), `vip 203.0.113.1 is in [[kubernetes.pool]] "tenants"`) {
		t.Errorf("new included file: %v", err)
	}
	// An [ha] floating address is the load balancer's own too.
	ha := "[ha]\nmode = \"vrrp\"\ninterface = \"eth0\"\nvrid = 1\nsnat_addresses = [\"203.0.113.9\"]\n\n"
	_, _, err = ParseFrom(base, main, []byte(strings.Replace(good, "\n\n[kubernetes]", "\n\n"+ha+"[kubernetes]", 1)))
	if want := main + `:14: kubernetes.pool 1: pool "tenants" holds 203.0.113.9, a floating address of [ha]: a Kubernetes Service could take it; take it out of the pool`; err == nil || err.Error() != want {
		t.Errorf("ha address: %v\nwant %s", err, want)
	}
	// A bad pool address is refused at its line, as the source would.
	_, _, err = ParseFrom(base, main, []byte(fmt.Sprintf(k8s, `"192.0.2.1/24"`)+fmt.Sprintf(svc, "web", "192.0.2.100")))
	if want := main + `:8: kubernetes.pool 1: pool "tenants": CIDR "192.0.2.1/24" has host bits set (did you mean 192.0.2.0/24?)`; err == nil || err.Error() != want {
		t.Errorf("bad address: %v\nwant %s", err, want)
	}
}
