// Package arch checks vipd's import graph against the rules written down
// in docs/architecture.md: which room (package) may import which. It has
// only tests.
package arch

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

// module is vipd's module path; rules name packages relative to it.
const module = "github.com/vipd/vipd"

// rule says what the packages that match Room may import. Room and the
// entries of May are package paths relative to the module, where a
// trailing "/..." matches the path and everything below it.
type rule struct {
	// Room is the package (or packages) the rule is for.
	Room string
	// May lists the vipd packages the room may import; "*" allows every
	// one.
	May []string
	// Never lists packages outside vipd (standard library or third
	// party) the room may not import, with the same "/..." form.
	Never []string
}

// noSystem is what a pure room may not import: no sockets, no netlink, no
// processes, no user database, no raw system calls. (Files it may read
// through io/fs, handed in by its caller.)
var noSystem = []string{"net", "syscall", "os/exec", "os/user", "golang.org/x/sys/...", "github.com/vishvananda/...", "github.com/mdlayher/...", "github.com/moby/..."}

// rules is the table of docs/architecture.md. The first rule whose Room
// matches a package applies; every vipd package must match one, so a new
// room needs a rule.
var rules = []rule{
	// The core: what the kernel should hold, and the plan to get there.
	{Room: "lb", May: nil, Never: noSystem},
	{Room: "lb/lbtest/...", May: []string{"lb"}},
	// The description of a health check, shared by config and health.
	{Room: "monitor/check", May: []string{"lb"}, Never: append([]string{"os"}, noSystem...)},
	// The configuration: files in (opened with syscall's O_NONBLOCK), the
	// user database for check_user (os/user), typed values out; no
	// netlink, raw system calls or processes (net only for its parsers).
	{Room: "config", May: []string{"lb", "monitor/check"}, Never: []string{"os/exec", "golang.org/x/sys/...", "github.com/vishvananda/...", "github.com/mdlayher/...", "github.com/moby/..."}},
	// Monitoring: the checker, the status, its renderers.
	{Room: "monitor/health", May: []string{"lb", "monitor/check"}},
	{Room: "monitor/status", May: []string{"lb", "monitor/health"}},
	{Room: "monitor/metrics", May: []string{"lb", "monitor/health", "monitor/status"}},
	{Room: "monitor/statuspage", May: []string{"monitor/status"}},
	// Kernel adapters implement lb's interfaces.
	{Room: "kernel/conntrack", May: []string{"lb", "kernel/ipvs"}},
	{Room: "kernel/...", May: []string{"lb"}},
	// High availability stands alone: the agent maps its options.
	{Room: "ha/vrrp", May: nil},
	{Room: "ha/bgp", May: []string{"ha/bfd", "ha/bgpproc"}},
	// The daemon's side of the BGP speaker in a program of its own, its
	// wire and the program's loop: no GoBGP (see
	// TestDaemonLinksNoKubernetesClientNorBGP).
	{Room: "ha/bgpproc", May: []string{"ha/bfd", "frame", "program"}, Never: []string{"github.com/osrg/gobgp/...", "google.golang.org/grpc/..."}},
	{Room: "ha/bfd", May: nil},
	// Sources turn the world into services.
	{Room: "source", May: []string{"config", "lb"}},
	{Room: "source/kubernetes/...", May: []string{"config", "lb", "source", "monitor/check"}},
	// The daemon's side of a source in a program of its own, and its
	// wire: no Kubernetes client (see TestDaemonLinksNoKubernetesClientNorBGP).
	{Room: "source/process", May: []string{"config", "lb", "source", "monitor/check", "frame", "program"}, Never: []string{"k8s.io/client-go/...", "k8s.io/api/..."}},
	// What the daemon and the programs it runs share: the frames of
	// their wire, and starting a program and its privileges.
	{Room: "frame", May: nil},
	{Room: "program", May: nil},
	{Room: "migrate", May: []string{"config", "lb"}},
	{Room: "systemd", May: nil},
	// The agent wires the rooms together; main wires the agent.
	{Room: "agent/ledger", May: []string{"lb"}},
	{Room: "agent", May: []string{"agent/ledger", "config", "lb", "monitor/...", "source/...", "kernel/...", "ha/..."}},
	// The control API: the daemon's socket server, its wire and client.
	{Room: "control", May: []string{"agent", "lb", "monitor/metrics", "monitor/status"}},
	{Room: "cmd/...", May: []string{"*"}},
	// Test rigs and benchmark tools build whole daemons.
	{Room: "test/...", May: []string{"*"}},
}

// match reports whether pkg (relative) matches pattern.
func match(pattern, pkg string) bool {
	if pattern == "*" {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// violations checks graph (package path to its imports, full paths)
// against rules and returns one line per offending edge, or per package no
// rule covers.
func violations(graph map[string][]string, rules []rule) []string {
	var out []string
	for pkg, imports := range graph {
		rel, ok := strings.CutPrefix(pkg, module+"/")
		if !ok {
			continue
		}
		i := slices.IndexFunc(rules, func(r rule) bool { return match(r.Room, rel) })
		if i < 0 {
			out = append(out, fmt.Sprintf("%s: no rule says what it may import (add one to the table and to docs/architecture.md)", rel))
			continue
		}
		r := rules[i]
		for _, imp := range imports {
			if dep, ok := strings.CutPrefix(imp, module+"/"); ok {
				if !slices.ContainsFunc(r.May, func(p string) bool { return match(p, dep) }) {
					out = append(out, fmt.Sprintf("%s imports %s: room %s may import only %v", rel, dep, r.Room, r.May))
				}
				continue
			}
			if slices.ContainsFunc(r.Never, func(p string) bool { return match(p, imp) }) {
				out = append(out, fmt.Sprintf("%s imports %s: room %s may not import %v", rel, imp, r.Room, r.Never))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestImportRules lists vipd's packages with go list and checks their
// imports (not their tests') against rules.
func TestImportRules(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the import graph: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	graph := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			graph[f[0]] = f[1:]
		}
	}
	for _, must := range []string{"lb", "config", "agent", "cmd/vipd"} {
		if _, ok := graph[path.Join(module, must)]; !ok {
			t.Fatalf("go list did not list %s; listed %d packages", must, len(graph))
		}
	}
	for _, v := range violations(graph, rules) {
		t.Error(v)
	}
}

// TestViolations: the checker names an edge a room may not have, an
// import a pure room may not make, and a package no rule covers, and
// passes a graph that keeps the rules.
func TestViolations(t *testing.T) {
	rules := []rule{
		{Room: "lb", Never: []string{"net", "golang.org/x/sys/..."}},
		{Room: "config", May: []string{"lb", "monitor/check"}},
		{Room: "monitor/...", May: []string{"lb", "monitor/check"}},
	}
	graph := map[string][]string{
		module + "/lb":             {"net/netip", "golang.org/x/sys/unix"},
		module + "/config":         {"os", module + "/lb", module + "/monitor/health"},
		module + "/monitor/health": {module + "/monitor/check", module + "/lb"},
		module + "/monitor/check":  {module + "/lb"},
		module + "/ha/bgp":         {module + "/config"},
		"example.com/other":        {module + "/agent"},
	}
	want := []string{
		"config imports monitor/health: room config may import only [lb monitor/check]",
		"ha/bgp: no rule says what it may import (add one to the table and to docs/architecture.md)",
		"lb imports golang.org/x/sys/unix: room lb may not import [net golang.org/x/sys/...]",
	}
	if got := violations(graph, rules); !slices.Equal(got, want) {
		t.Errorf("violations =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	delete(graph, module+"/ha/bgp")
	graph[module+"/config"] = []string{module + "/lb"}
	graph[module+"/lb"] = []string{"net/netip"}
	if got := violations(graph, rules); len(got) != 0 {
		t.Errorf("a graph that keeps the rules: violations %q", got)
	}
}

// daemonNever lists what vipd's daemon (cmd/vipd) may not link, directly
// or not: the Kubernetes client, whose package initialisers cost every
// vipd its memory, runs in vipd-kubernetes (see source/process).
//
// Nor GoBGP, gRPC and what they link: the BGP speaker, which parses what
// peers send, runs in vipd-bgp (see ha/bgpproc).
var daemonNever = []string{"k8s.io/client-go/...", "k8s.io/api/...", module + "/source/kubernetes/...",
	"github.com/osrg/gobgp/...", "google.golang.org/grpc/...", module + "/ha/bgp"}

// TestDaemonLinksNoKubernetesClientNorBGP lists every package cmd/vipd
// links and refuses those of daemonNever; cmd/vipd-kubernetes and
// cmd/vipd-bgp link them.
func TestDaemonLinksNoKubernetesClientNorBGP(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the dependencies: %v", err)
	}
	deps := func(pkg string) []string {
		out, err := exec.Command(goTool, "list", "-deps", module+"/"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	never := func(pkgs []string) []string {
		var bad []string
		for _, p := range pkgs {
			if slices.ContainsFunc(daemonNever, func(n string) bool { return match(n, p) }) {
				bad = append(bad, p)
			}
		}
		return bad
	}
	if bad := never(deps("cmd/vipd")); len(bad) > 0 {
		t.Errorf("cmd/vipd links %d packages it may not (%v), such as %s", len(bad), daemonNever, strings.Join(bad[:min(5, len(bad))], ", "))
	}
	// The check sees what it looks for: the provider links them all.
	if bad := never(deps("cmd/vipd-kubernetes")); !slices.Contains(bad, "k8s.io/client-go/kubernetes") ||
		!slices.Contains(bad, module+"/source/kubernetes") {
		t.Errorf("cmd/vipd-kubernetes: the check found %v, not client-go and source/kubernetes", bad)
	}
	if bad := never(deps("cmd/vipd-bgp")); !slices.Contains(bad, "github.com/osrg/gobgp/v3/pkg/server") ||
		!slices.Contains(bad, module+"/ha/bgp") {
		t.Errorf("cmd/vipd-bgp: the check found %v, not GoBGP's server and ha/bgp", bad)
	}
}
