package bench

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// planned is what vipd programs for a TOML fixture, parsed by vipd's own
// configuration code.
func planned(t *testing.T, toml []byte) *lb.State {
	t.Helper()
	cfg, err := config.Parse("bench.toml", toml)
	if err != nil {
		t.Fatal(err)
	}
	return lb.Desired(&cfg.Spec, lb.Host{Dummy: cfg.Daemon.Interface})
}

// parseKeepalived reads the subset of keepalived.conf the fixture writes
// into save lines: virtual_server blocks with lb_algo, lb_kind, protocol
// and real_server blocks with weight.
func parseKeepalived(t *testing.T, conf string) []string {
	t.Helper()
	var out []string
	var vs, sched, rs string
	weight := -1
	var depth int
	var text strings.Builder
	for _, l := range strings.Split(conf, "\n") {
		if i := strings.IndexAny(l, "#!"); i >= 0 {
			l = l[:i] // a comment
		}
		text.WriteString(l + "\n")
	}
	words := strings.Fields(text.String())
	for i := 0; i < len(words); i++ {
		w := words[i]
		next := func() string {
			i++
			if i >= len(words) {
				t.Fatalf("keepalived.conf ends after %q", w)
			}
			return words[i]
		}
		switch {
		case w == "{":
			depth++
		case w == "}":
			depth--
			switch {
			case rs != "" && depth == 1:
				out = append(out, fmt.Sprintf("-a -t %s -r %s -m -w %d", vs, rs, weight))
				rs, weight = "", -1
			case vs != "" && depth == 0:
				out = append(out, fmt.Sprintf("-A -t %s -s %s", vs, sched))
				vs, sched = "", ""
			}
		case w == "virtual_server":
			a, p := next(), next()
			vs = netip.AddrPortFrom(netip.MustParseAddr(a), mustPort(t, p)).String()
		case w == "real_server":
			a, p := next(), next()
			rs = netip.AddrPortFrom(netip.MustParseAddr(a), mustPort(t, p)).String()
		case w == "lb_algo":
			sched = next()
		case w == "lb_kind":
			if k := next(); k != "NAT" {
				t.Fatalf("lb_kind %s", k)
			}
		case w == "protocol":
			if p := next(); p != "TCP" {
				t.Fatalf("protocol %s", p)
			}
		case w == "weight":
			weight, _ = strconv.Atoi(next())
		case w == "global_defs", w == "router_id":
			if w == "router_id" {
				next()
			}
		default:
			t.Fatalf("keepalived.conf: unexpected word %q", w)
		}
	}
	slices.Sort(out)
	return out
}

func mustPort(t *testing.T, s string) uint16 {
	t.Helper()
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return uint16(p)
}

// write renders the three files of f.
func write(t *testing.T, f *Fixture) (toml, restore, keepalived []byte) {
	t.Helper()
	var a, b, c bytes.Buffer
	if err := f.WriteTOML(&a, Daemon{StateDir: "/tmp/vipd-bench", ControlSocket: "/tmp/vipd-bench/vipd.sock"}); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteRestore(&b); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteKeepalived(&c); err != nil {
		t.Fatal(err)
	}
	return a.Bytes(), b.Bytes(), c.Bytes()
}

func sortedLines(b []byte) []string {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	slices.Sort(lines)
	return lines
}

// TestFixturesAgree: vipd's configuration (as vipd plans it), the restore
// file and keepalived.conf describe the same IPVS table, at several sizes
// and with a changed weight.
func TestFixturesAgree(t *testing.T) {
	for _, spec := range []Spec{
		{Services: 1, Backends: 1},
		{Services: 25, Backends: 3, PortsPerVIP: 4},
		{Services: 100, Backends: 10},
		{Services: 1000, Backends: 10, PortsPerVIP: 1, Scheduler: "wlc"},
	} {
		t.Run(fmt.Sprintf("%dx%d", spec.Services, spec.Backends), func(t *testing.T) {
			f, err := New(spec)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []*Fixture{f, f.WithWeight(spec.Services/2, spec.Backends/2, 2)} {
				toml, restore, keep := write(t, f)
				want := f.Table()
				if len(want) != f.Objects() {
					t.Fatalf("%d lines for %d objects", len(want), f.Objects())
				}
				if got := SaveLines(planned(t, toml).Services); !slices.Equal(got, want) {
					t.Errorf("vipd plans a different table:\n%s", firstDiff(got, want))
				}
				if got := sortedLines(restore); !slices.Equal(got, want) {
					t.Errorf("the restore file differs:\n%s", firstDiff(got, want))
				}
				if got := parseKeepalived(t, string(keep)); !slices.Equal(got, want) {
					t.Errorf("keepalived.conf differs:\n%s", firstDiff(got, want))
				}
			}
		})
	}
}

func firstDiff(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("line %d: got %q, want %q (%d and %d lines)", i, g, w, len(got), len(want))
		}
	}
	return "equal"
}

// TestAddressPlan: VIPs, ports and backends are distinct and where the
// plan puts them.
func TestAddressPlan(t *testing.T) {
	f, err := New(Spec{Services: 10000, Backends: 10})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.AddrPort]bool{}
	vips := map[netip.Addr]bool{}
	for _, s := range f.Services {
		vips[s.VIP] = true
		vs := netip.AddrPortFrom(s.VIP, s.Port)
		if seen[vs] {
			t.Fatalf("duplicate service %s", vs)
		}
		seen[vs] = true
		for _, b := range s.Backends {
			if seen[b.Addr] || !netip.MustParsePrefix("172.16.0.0/12").Contains(b.Addr.Addr()) {
				t.Fatalf("backend %s duplicate or outside 172.16.0.0/12", b.Addr)
			}
			seen[b.Addr] = true
		}
	}
	if len(vips) != 1000 || f.Services[9999].VIP != netip.MustParseAddr("10.100.3.232") || f.Services[9999].Port != 89 {
		t.Errorf("%d VIPs, last service %s:%d", len(vips), f.Services[9999].VIP, f.Services[9999].Port)
	}
	for _, bad := range []Spec{{}, {Services: 1, Backends: -1}, {Services: 1, PortsPerVIP: 1001}, {Services: 200000, Backends: 10}, {Services: 70000, PortsPerVIP: 1}} {
		if _, err := New(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// TestOneChangeIsOneOperation: the change the benchmark times is one
// update of one backend for vipd's planner, and one line of the table.
func TestOneChangeIsOneOperation(t *testing.T) {
	f, err := New(Spec{Services: 1000, Backends: 10})
	if err != nil {
		t.Fatal(err)
	}
	g := f.WithWeight(500, 5, 2)
	a, _, _ := write(t, f)
	b, _, _ := write(t, g)
	ops := lb.Plan(planned(t, b), planned(t, a), lb.PlanOptions{})
	if len(ops) != 1 || ops[0].Kind != lb.OpUpdateDest || ops[0].Dest.Weight != 2 {
		t.Errorf("plan %v, want one backend update to weight 2", ops)
	}
	var diffs int
	gt := g.Table()
	for i, l := range f.Table() {
		if gt[i] != l {
			diffs++
		}
	}
	if diffs != 1 || f.Services[500].Backends[5].Weight != 1 {
		t.Errorf("%d lines differ (want 1); original changed: %v", diffs, f.Services[500].Backends[5].Weight != 1)
	}
}

// TestKeepalivedAccepts runs `keepalived -t` on a fixture when the host
// has keepalived (test/vm/bench.sh installs it).
func TestKeepalivedAccepts(t *testing.T) {
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		for _, p := range []string{"/usr/sbin/keepalived", "/sbin/keepalived"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no keepalived on this host (test/deps.sh installs it); CI runs this test")
		}
		t.Skip("no keepalived on this host (apt-get install keepalived)")
	}
	f, err := New(Spec{Services: 100, Backends: 10})
	if err != nil {
		t.Fatal(err)
	}
	_, _, keep := write(t, f)
	dir := t.TempDir()
	good := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(good, keep, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-l", "-f", good).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("keepalived -t: %v\n%s", err, out)
	}
	// The check does check: a misspelt keyword fails it.
	bad := filepath.Join(dir, "bad.conf")
	if err := os.WriteFile(bad, bytes.Replace(keep, []byte("weight 1"), []byte("wieght 1"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-l", "-f", bad).CombinedOutput(); err == nil {
		t.Errorf("keepalived -t accepted a misspelt keyword:\n%s", out)
	}
}

// TestSplitLayout: the split layout's files hold, in the lexical order in
// which vipd includes them, exactly the single file's services, byte for
// byte; the main file is the single file's preamble with the include line
// before the [daemon] table; each file is [[service]] blocks alone.
func TestSplitLayout(t *testing.T) {
	d := Daemon{StateDir: "/tmp/vipd-bench", ControlSocket: "/tmp/vipd-bench/vipd.sock"}
	for _, c := range []struct {
		spec    Spec
		perFile int
		files   int
		last    string
	}{
		{Spec{Services: 1, Backends: 1}, 0, 1, "services.d/0000.toml"},
		{Spec{Services: 250, Backends: 3}, 100, 3, "services.d/0002.toml"},
		{Spec{Services: 25, Backends: 2}, 1, 25, "services.d/0024.toml"},
		{Spec{Services: 10000, Backends: 10}, 0, 100, "services.d/0099.toml"},
	} {
		t.Run(fmt.Sprintf("%dx%d/%d", c.spec.Services, c.spec.Backends, c.perFile), func(t *testing.T) {
			f, err := New(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			// A file left from a larger fixture must not survive.
			if err := os.MkdirAll(filepath.Join(dir, IncludeDir), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, IncludeDir, "9999.toml"), []byte("# stale\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			parts, err := f.WriteSplit(dir, d, c.perFile)
			if err != nil {
				t.Fatal(err)
			}
			if len(parts) != c.files || parts[len(parts)-1].Name != c.last {
				t.Fatalf("%d files, the last %q; want %d, %q", len(parts), parts[len(parts)-1].Name, c.files, c.last)
			}
			perFile := c.perFile
			if perFile == 0 {
				perFile = PerFile
			}
			files, err := filepath.Glob(filepath.Join(dir, IncludeDir, "*.toml"))
			if err != nil {
				t.Fatal(err)
			}
			if len(files) != len(parts) {
				t.Fatalf("%d files in %s, want %d", len(files), IncludeDir, len(parts))
			}
			var services []byte
			for i, p := range parts {
				if want := (Part{Name: p.Name, From: i * perFile, To: min((i+1)*perFile, c.spec.Services)}); p != want {
					t.Fatalf("part %d is %+v, want %+v", i, p, want)
				}
				if files[i] != filepath.Join(dir, p.Name) {
					t.Fatalf("file %d in lexical order is %s, want %s", i, files[i], p.Name)
				}
				data, err := os.ReadFile(files[i])
				if err != nil {
					t.Fatal(err)
				}
				services = append(services, data...)
			}
			main, err := os.ReadFile(filepath.Join(dir, "vipd.toml"))
			if err != nil {
				t.Fatal(err)
			}
			header, rest, _ := bytes.Cut(main, []byte("\n"))
			include, daemon, _ := bytes.Cut(rest, []byte("\n"))
			if string(include) != `include = ["services.d/*.toml"]` || !bytes.HasPrefix(daemon, []byte("[daemon]\n")) {
				t.Fatalf("main file:\n%s\nwant the include line after the comment, then [daemon]", main)
			}
			preamble := slices.Concat(header, []byte("\n"), daemon)
			var single bytes.Buffer
			if err := f.WriteTOML(&single, d); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(slices.Concat(preamble, services), single.Bytes()) {
				t.Errorf("the main file without its include line, then the included files, differ from the single file")
			}
			// Each file is [[service]] blocks alone: after the preamble,
			// vipd's parser finds exactly its services.
			for _, p := range parts {
				data, err := os.ReadFile(filepath.Join(dir, p.Name))
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(bytes.ReplaceAll(data, []byte("[[service]]"), nil), []byte("\n[")) {
					t.Fatalf("%s holds a table other than [[service]]", p.Name)
				}
				cfg, err := config.Parse(p.Name, slices.Concat(preamble, data))
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, s := range cfg.Spec.Services {
					names = append(names, s.Name)
				}
				var want []string
				for _, s := range f.Services[p.From:p.To] {
					want = append(want, s.Name)
				}
				if !slices.Equal(names, want) {
					t.Fatalf("%s: services %v, want %v", p.Name, names, want)
				}
			}
		})
	}
}

// TestSplitChangeIsOneFile: the one-backend change rewrites one file of
// the split layout, and that file is about the same size at 100 and at
// 10,000 services.
func TestSplitChangeIsOneFile(t *testing.T) {
	var sizes []int
	for _, n := range []int{100, 10000} {
		f, err := New(Spec{Services: n, Backends: 10})
		if err != nil {
			t.Fatal(err)
		}
		g := f.WithWeight(n/2, 5, 2)
		var changed []string
		for _, p := range f.Parts(0) {
			var a, b bytes.Buffer
			if err := f.WriteServices(&a, p); err != nil {
				t.Fatal(err)
			}
			if err := g.WriteServices(&b, p); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				changed = append(changed, p.Name)
				sizes = append(sizes, b.Len())
			}
		}
		want := fmt.Sprintf("services.d/%04d.toml", n/2/PerFile)
		if len(changed) != 1 || changed[0] != want {
			t.Fatalf("%d services: the change rewrites %v, want [%s]", n, changed, want)
		}
	}
	if lo, hi := slices.Min(sizes), slices.Max(sizes); float64(hi) > 1.05*float64(lo) {
		t.Errorf("the changed file is %d bytes at 100 services and %d at 10,000: want within 5%%", sizes[0], sizes[1])
	}
}

// TestPartNames: file numbers get a fifth digit when they need one, so
// that lexical order stays numeric order.
func TestPartNames(t *testing.T) {
	f, err := New(Spec{Services: 10001, Backends: 0})
	if err != nil {
		t.Fatal(err)
	}
	parts := f.Parts(1)
	if len(parts) != 10001 || parts[0].Name != "services.d/00000.toml" || parts[10000].Name != "services.d/10000.toml" {
		t.Fatalf("%d parts, first %q, last %q", len(parts), parts[0].Name, parts[len(parts)-1].Name)
	}
	if !slices.IsSortedFunc(parts, func(a, b Part) int { return strings.Compare(a.Name, b.Name) }) {
		t.Error("names not in lexical order")
	}
}
