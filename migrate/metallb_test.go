package migrate

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/vipd/vipd/config"
)

// metallbFiles are the realistic MetalLB configuration of testdata: a
// multi-document file of pools and an L2Advertisement, and the
// "kubectl get -o yaml" list of the BGP resources.
var metallbFiles = []string{"testdata/metallb/pools.yaml", "testdata/metallb/bgp.yaml"}

// parseMetalLB has vipd's parser, the one vipd check runs, read an
// import as it is printed.
func parseMetalLB(t *testing.T, r Result) *config.Config {
	t.Helper()
	cfg, err := config.Parse("import.toml", r.TOML)
	if err != nil {
		t.Fatalf("the import does not pass vipd check:\n%v\n%s", err, r.TOML)
	}
	if len(cfg.Kubernetes.Pools) != r.Pools {
		t.Fatalf("%d pools parsed, the import says %d", len(cfg.Kubernetes.Pools), r.Pools)
	}
	return cfg
}

// TestMetalLBGolden imports the realistic configuration: it passes vipd's
// parser and matches the checked-in configuration and issues
// (go test -update rewrites them).
func TestMetalLBGolden(t *testing.T) {
	r := MetalLB(metallbFiles, MetalLBOptions{})
	cfg := parseMetalLB(t, r)
	if r.Pools != 3 || !cfg.BGP.Enabled || len(cfg.BGP.Peers) != 2 || cfg.BGP.ASN != 64512 {
		t.Errorf("%d pools, [bgp] %+v; want 3 pools and two peers of AS 64512", r.Pools, cfg.BGP)
	}
	got := string(r.TOML) + "\n# issues:\n" + issues(r)
	golden := filepath.Join("testdata", "golden", "metallb.toml")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test ./migrate -run Golden -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("differs from %s (-update rewrites it):\n%s", golden, got)
	}
}

// TestMetalLBMapping checks what each resource maps to, and that every
// field vipd has no equivalent for is an issue at its file and line.
func TestMetalLBMapping(t *testing.T) {
	r := MetalLB(metallbFiles, MetalLBOptions{})
	cfg := parseMetalLB(t, r)
	pools := map[string]config.KubernetesPool{}
	for _, p := range cfg.Kubernetes.Pools {
		pools[p.Name] = p
	}
	prod, staging, internal := pools["production"], pools["staging"], pools["internal"]
	if !slices.Equal(prod.Addresses, []string{"192.0.2.0/24", "2001:db8:10::/120"}) || !prod.AutoAssign || !prod.AvoidNetworkBroadcast ||
		!slices.Equal(prod.Namespaces, []string{"shop", "payments"}) || prod.ServiceSelector != "tier=frontend,exposure in (public,partner)" {
		t.Errorf("production: %+v", prod)
	}
	if !slices.Equal(staging.Addresses, []string{"198.51.100.10-198.51.100.40"}) || staging.AutoAssign || !slices.Equal(staging.Namespaces, []string{"staging"}) {
		t.Errorf("staging: %+v", staging)
	}
	if internal.ServiceSelector != "internal" {
		t.Errorf("internal: %+v", internal)
	}
	if _, ok := pools["team-selected"]; ok {
		t.Errorf("team-selected, restricted by namespaceSelectors only, was imported open to every namespace")
	}
	if !cfg.Kubernetes.DefaultClass {
		t.Errorf("default_class is not set: the Services MetalLB served would not be served")
	}
	if !cfg.Kubernetes.MetalLBAnnotations {
		t.Errorf("metallb_annotations is not set: Services annotated for MetalLB would not keep what they ask for")
	}
	b := cfg.BGP
	if b.RouterID.String() != "10.0.0.11" || !slices.Equal(b.Default.Communities, []uint32{64512<<16 | 100}) {
		t.Errorf("[bgp]: %+v", b)
	}
	if len(b.Default.LargeCommunities) != 1 || b.Default.LargeCommunities[0].String() != "64512:1:2" || !b.Default.HasLocalPref || b.Default.LocalPref != 200 {
		t.Errorf("[bgp] attributes: %+v", b.Default)
	}
	a, bb := b.Peers[0], b.Peers[1]
	if a.Address.String() != "10.0.0.1" || a.ASN != 64500 || a.Port != 179 || a.Password != "s3cret" || a.Source.String() != "10.0.0.11" ||
		a.HoldTime != 90*time.Second || a.Keepalive != 30*time.Second || a.Multihop != 0 {
		t.Errorf("peer tor-a: %+v", a)
	}
	if bb.Address.String() != "10.0.1.1" || bb.ASN != 64501 || bb.Multihop != 255 || bb.Password != "" {
		t.Errorf("peer tor-b: %+v", bb)
	}
	got := issues(r)
	for _, w := range []string{
		"testdata/metallb/pools.yaml:11: IPAddressPool production: avoidBuggyIPs: vipd keeps out",
		"testdata/metallb/pools.yaml:13: IPAddressPool production: serviceAllocation.priority:",
		"testdata/metallb/pools.yaml:36: IPAddressPool staging: serviceAllocation.namespaceSelectors: vipd restricts a pool to namespaces by name only: the pool is restricted to the namespaces listed",
		"testdata/metallb/pools.yaml:49: IPAddressPool team-selected: serviceAllocation.namespaceSelectors:",
		"pool not imported",
		"testdata/metallb/pools.yaml:65: IPAddressPool internal: serviceAllocation.serviceSelectors: vipd's pool has one service_selector",
		"testdata/metallb/pools.yaml:53: IPAddressPool internal: in no BGPAdvertisement",
		"testdata/metallb/pools.yaml:68: L2Advertisement lan: vipd announces every address one way",
		"testdata/metallb/pools.yaml:78: L2Advertisement lan: nodeSelectors:",
		"testdata/metallb/bgp.yaml:22: BGPPeer tor-a: bfdProfile: vipd has no BFD",
		"testdata/metallb/bgp.yaml:33: BGPPeer tor-b: passwordSecret: vipd import reads no Secret",
		"testdata/metallb/bgp.yaml:36: BGPPeer tor-b: nodeSelectors:",
		"testdata/metallb/bgp.yaml:72: BGPAdvertisement aggregate: aggregationLength: vipd announces each address as a host route (/32)",
		"testdata/metallb/bgp.yaml:64: BGPAdvertisement aggregate: vipd gives every Kubernetes address the same communities",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no issue %q in:\n%s", w, got)
		}
	}
	for _, i := range r.Issues {
		if i.Line < 1 {
			t.Errorf("issue without a line: %s", i)
		}
	}
}

// TestMetalLBL2 imports an L2 configuration: the L2Advertisements'
// interfaces become [daemon] uplinks, and one without interfaces (every
// interface, for MetalLB) is an issue.
func TestMetalLBL2(t *testing.T) {
	fsys := fstest.MapFS{"l2.yaml": {Data: []byte(`apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: lan}
spec:
  addresses: [192.0.2.64/26]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: a}
spec:
  interfaces: [eth0, bond0]
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: b}
---
apiVersion: metallb.io/v1beta1
kind: BGPAdvertisement
metadata: {name: c}
`)}}
	r := MetalLB([]string{"l2.yaml"}, MetalLBOptions{FS: fsys})
	cfg := parseMetalLB(t, r)
	if !slices.Equal(cfg.Daemon.Uplinks, []string{"eth0", "bond0"}) || cfg.BGP.Enabled || r.Pools != 1 {
		t.Errorf("uplinks %v, bgp %v, %d pools; want [eth0 bond0], no bgp, 1 pool\n%s", cfg.Daemon.Uplinks, cfg.BGP.Enabled, r.Pools, r.TOML)
	}
	got := issues(r)
	for _, w := range []string{"l2.yaml:13: L2Advertisement b: MetalLB answers on every interface", "l2.yaml:17: BGPAdvertisement c: no BGPPeer"} {
		if !strings.Contains(got, w) {
			t.Errorf("no issue %q in:\n%s", w, got)
		}
	}
}

// TestMetalLBRefused: what vipd's parser refuses in what the import
// made (a bad address, a duplicate community, a bad hold time, a peer
// without routerID anywhere) is left out with an issue at its line, and
// the rest still passes.
func TestMetalLBRefused(t *testing.T) {
	fsys := fstest.MapFS{"x.yaml": {Data: []byte(`apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: bad}
spec: {addresses: [192.0.2.300/24]}
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: good}
spec: {addresses: [192.0.2.0/28]}
---
apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: p}
spec: {myASN: 64512, peerASN: 64512, peerAddress: 10.0.0.1, holdTime: 1ms}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: config, namespace: metallb-system}
---
kind: IPAddressPool
apiVersion: metallb.io/v1beta1
spec: {addresses: [192.0.2.128/28]}
`)}}
	r := MetalLB([]string{"x.yaml"}, MetalLBOptions{FS: fsys})
	cfg := parseMetalLB(t, r)
	if len(cfg.Kubernetes.Pools) != 1 || cfg.Kubernetes.Pools[0].Name != "good" || cfg.BGP.Enabled {
		t.Errorf("pools %+v, bgp %v; want the good pool only and [bgp] commented out\n%s", cfg.Kubernetes.Pools, cfg.BGP.Enabled, r.TOML)
	}
	got := issues(r)
	for _, w := range []string{
		"x.yaml:1: IPAddressPool bad: vipd refuses what it maps to (",
		"x.yaml:11: BGPPeer p: no routerID: vipd needs [bgp] router_id",
		"x.yaml:16: ConfigMap config: MetalLB's configuration before 0.13 was a ConfigMap",
		"x.yaml:20: IPAddressPool: no metadata.name",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("no issue %q in:\n%s", w, got)
		}
	}
	if !strings.Contains(string(r.TOML), "# [[bgp.peer]]\n# address = \"10.0.0.1\"") {
		t.Errorf("the [bgp] section without router_id is not printed as comments:\n%s", r.TOML)
	}
}

// metallbWithin imports files from the operating system's files, failing
// the test if that takes more than a few seconds (a read that blocks, an
// expansion), and returns what it allocated.
func metallbWithin(t *testing.T, opts MetalLBOptions, files ...string) (Result, uint64) {
	t.Helper()
	done := make(chan Result, 1)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	go func() { done <- MetalLB(files, opts) }()
	select {
	case r := <-done:
		runtime.ReadMemStats(&after)
		parseMetalLB(t, r)
		return r, after.TotalAlloc - before.TotalAlloc
	case <-time.After(10 * time.Second):
		t.Fatalf("MetalLB(%v) ran for 10 s", files)
		return Result{}, 0
	}
}

// TestMetalLBHostile: special files, a file over 16 MiB, a file of more
// YAML nodes than the bound, deep nesting, a great many documents and
// YAML aliases that would expand to billions of nodes are each refused
// quickly, with bounded memory, and the good file beside them imported.
func TestMetalLBHostile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec: {addresses: [192.0.2.0/24]}\n")
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	var laughs strings.Builder
	laughs.WriteString("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: lol}\nx0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&laughs, "x%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	laughs.WriteString("spec:\n  addresses: *a9\n  serviceAllocation: {namespaces: *a9, serviceSelectors: [{matchLabels: *a9}]}\n")
	for _, tc := range []struct {
		name, data, want string
		alloc            uint64
	}{
		{"huge.yaml", strings.Repeat("# "+strings.Repeat("x", 77)+"\n", (17<<20)/80), "exceed 16777216 bytes (16 MiB)", 1 << 20},
		{"nodes.yaml", "[" + strings.Repeat("a,", 4<<20) + "a]\n", "may hold more than 262144 YAML nodes", 1 << 20},
		{"documents.yaml", strings.Repeat("---\n", 4<<20), "may hold more than 262144 YAML nodes", 1 << 20},
		{"deep.yaml", strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + "\n", "nested more than 32 deep", 16 << 20},
		{"deeper.yaml", strings.Repeat("- ", 20000) + "a\n", "exceeded max depth", 64 << 20},
		{"laughs.yaml", laughs.String(), "IPAddressPool lol: addresses: not a string", 16 << 20},
	} {
		p := write(tc.name, tc.data)
		r, alloc := metallbWithin(t, MetalLBOptions{}, p, good)
		t.Logf("%s: %d bytes, %d bytes allocated", tc.name, len(tc.data), alloc)
		if !strings.Contains(issues(r), tc.want) {
			t.Errorf("%s: no issue %q in:\n%.2000s", tc.name, tc.want, issues(r))
		}
		if r.Pools != 1 && tc.name != "huge.yaml" && tc.name != "nodes.yaml" && tc.name != "documents.yaml" {
			t.Errorf("%s: %d pools imported, want the good file's", tc.name, r.Pools)
		}
		if alloc > tc.alloc+uint64(len(tc.data))*3 {
			t.Errorf("%s: %d bytes allocated for %d bytes", tc.name, alloc, len(tc.data))
		}
		os.Remove(p)
	}
	for _, special := range []struct{ path, want string }{{fifo, "not a regular file (a FIFO)"}, {"/dev/zero", "not a regular file (a character device)"}, {dir, "not a regular file (a directory)"}} {
		r, _ := metallbWithin(t, MetalLBOptions{}, special.path, good)
		if !strings.Contains(issues(r), special.path+":0: read "+special.path+": "+special.want) || r.Pools != 1 {
			t.Errorf("%s: %d pools, issues:\n%s", special.path, r.Pools, issues(r))
		}
	}
}

// FuzzMetalLB: whatever the input, the import ends within the limits and
// its output passes vipd's parser.
func FuzzMetalLB(f *testing.F) {
	for _, p := range metallbFiles {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte("a: &x [*x]\n---\nkind: List\nitems: [{apiVersion: metallb.io/v1beta1, kind: L2Advertisement, metadata: {name: a}, spec: {interfaces: [e]}}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fsys := fstest.MapFS{"a.yaml": {Data: data}}
		r := MetalLB([]string{"a.yaml", "a.yaml"}, MetalLBOptions{FS: fsys, Limits: Limits{Bytes: 1 << 20, Depth: 32}, Nodes: 1 << 14})
		cfg, err := config.Parse("fuzz.toml", r.TOML)
		if err != nil {
			t.Fatalf("the import does not pass vipd check:\n%v\n%s", err, r.TOML)
		}
		if len(cfg.Kubernetes.Pools) != r.Pools || len(r.Issues) > MaxIssues {
			t.Fatalf("%d pools parsed, %d said; %d issues", len(cfg.Kubernetes.Pools), r.Pools, len(r.Issues))
		}
	})
}

// TestMetalLBYAMLError: a file that is not YAML is an issue at the line
// the parser names, which quotes none of the file's text, and the files
// after it are still imported.
func TestMetalLBYAMLError(t *testing.T) {
	fsys := fstest.MapFS{
		"bad.yaml":    {Data: []byte("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p}\nspec:\n  addresses: *hunter2secret\n")},
		"good.yaml":   {Data: []byte("apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: q}\nspec: {addresses: [192.0.2.0/24]}\n")},
		"syntax.yaml": {Data: []byte("kind: List\nitems:\n- a: b\n c: 'secret\n")},
	}
	r := MetalLB([]string{"bad.yaml", "syntax.yaml", "good.yaml"}, MetalLBOptions{FS: fsys})
	parseMetalLB(t, r)
	got := issues(r)
	if !strings.Contains(got, "bad.yaml:0: YAML: unknown anchor '...' referenced") || !strings.Contains(got, "syntax.yaml:3: YAML: did not find expected key") || strings.Contains(got, "hunter2") || strings.Contains(got, "secret") || r.Pools != 1 {
		t.Errorf("%d pools, issues:\n%s", r.Pools, got)
	}
}
