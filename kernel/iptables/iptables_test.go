package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb/lbtest/nstest"

	"github.com/vipd/vipd/lb"
)

var (
	testPolicy = lb.RulePolicy{Enabled: true, SNATMark: 0x4000000, FilterVIPs: true}
	families   = []lb.Family{lb.IPv4, lb.IPv6}
)

// backends lists the iptables backends installed here.
func backends(t *testing.T) []string {
	var out []string
	for _, b := range []string{BackendLegacy, BackendNFT} {
		if _, err := exec.LookPath("iptables-" + b + "-restore"); err == nil {
			out = append(out, b)
		} else {
			t.Logf("iptables backend %s not installed", b)
		}
	}
	if len(out) == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("no iptables backend installed (test/deps.sh installs them); CI runs these tests")
		}
		t.Skip("no iptables backend installed")
	}
	return out
}

// forEachBackend runs f as a subtest for each backend, with Tables whose
// chains and sets are removed afterwards.
func forEachBackend(t *testing.T, f func(t *testing.T, b string, tb *Tables)) {
	nstest.Need(t)
	for _, b := range backends(t) {
		t.Run(b, func(t *testing.T) {
			tb := newTables(t, Options{Backend: b, NoIPVSMatch: true})
			f(t, b, tb)
		})
	}
}

func newTables(t *testing.T, opts Options) *Tables {
	t.Helper()
	tb, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tb.RemoveChains(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		tb.Close()
	})
	return tb
}

// sh runs a command and returns its output, failing t on error.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ipt runs the iptables command of backend b and family f.
func ipt(t *testing.T, b string, f lb.Family, args ...string) string {
	t.Helper()
	name := "iptables"
	if f == lb.IPv6 {
		name = "ip6tables"
	}
	return sh(t, name+"-"+b, args...)
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// saved returns iptables-save's text of one table, without comments and
// with counters zeroed.
func saved(t *testing.T, b string, f lb.Family, tableName string) string {
	t.Helper()
	name := "iptables"
	if f == lb.IPv6 {
		name = "ip6tables"
	}
	out := sh(t, name+"-"+b+"-save", "-t", tableName)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lines = append(lines, counters.ReplaceAllString(l, "[0:0]"))
	}
	return strings.Join(lines, "\n") + "\n"
}

const goldenNAT4 = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:VIPD-MARK-SNAT - [0:0]
:VIPD-POSTROUTING - [0:0]
-A PREROUTING -m comment --comment "vipd mark traffic to snat services" -j VIPD-MARK-SNAT
-A OUTPUT -m comment --comment "vipd mark traffic to snat services" -j VIPD-MARK-SNAT
-A POSTROUTING -m comment --comment "vipd masquerade marked ipvs traffic" -j VIPD-POSTROUTING
-A VIPD-MARK-SNAT -m set --match-set vipd-snat-4 dst,dst -j MARK --set-xmark 0x4000000/0x4000000
-A VIPD-POSTROUTING -m mark ! --mark 0x4000000/0x4000000 -m comment --comment "vipd policy snat-mark=0x4000000 filter-vips=true" -j RETURN
-A VIPD-POSTROUTING -j MARK --set-xmark 0x0/0x4000000
-A VIPD-POSTROUTING -m comment --comment "vipd masquerade ipvs traffic to snat services" -j MASQUERADE --random-fully
COMMIT
`

const goldenFilter4 = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:VIPD-FILTER - [0:0]
-A INPUT -m comment --comment "vipd filter traffic to vips" -j VIPD-FILTER
-A VIPD-FILTER -m conntrack --ctstate NEW -m set --match-set vipd-restricted-4 dst,dst -m set ! --match-set vipd-allowed-4 dst,dst,src -m comment --comment "vipd drop sources a service does not allow" -j DROP
-A VIPD-FILTER -m set ! --match-set vipd-vips-4 dst -j RETURN
-A VIPD-FILTER -m set --match-set vipd-served-4 dst,dst -j RETURN
-A VIPD-FILTER -p icmp -j RETURN
-A VIPD-FILTER -m conntrack --ctstate NEW -m comment --comment "vipd drop vip ports no service serves" -j DROP
COMMIT
`

const goldenFilter6 = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:VIPD-FILTER - [0:0]
-A INPUT -m comment --comment "vipd filter traffic to vips" -j VIPD-FILTER
-A VIPD-FILTER -m conntrack --ctstate NEW -m set --match-set vipd-restricted-6 dst,dst -m set ! --match-set vipd-allowed-6 dst,dst,src -m comment --comment "vipd drop sources a service does not allow" -j DROP
-A VIPD-FILTER -m set ! --match-set vipd-vips-6 dst -j RETURN
-A VIPD-FILTER -m set --match-set vipd-served-6 dst,dst -j RETURN
-A VIPD-FILTER -p ipv6-icmp -j RETURN
-A VIPD-FILTER -m conntrack --ctstate NEW -m comment --comment "vipd drop vip ports no service serves" -j DROP
COMMIT
`

// allowFilter is the filter table of a policy without the VIP filter or
// a floating SNAT source: the allow lists' rule alone.
func allowFilter(f lb.Family) string {
	return fmt.Sprintf(`*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:VIPD-FILTER - [0:0]
-A INPUT -m comment --comment "vipd filter traffic to vips" -j VIPD-FILTER
-A VIPD-FILTER -m conntrack --ctstate NEW -m set --match-set vipd-restricted-%[1]d dst,dst -m set ! --match-set vipd-allowed-%[1]d dst,dst,src -m comment --comment "vipd drop sources a service does not allow" -j DROP
COMMIT
`, f)
}

const emptyFilter = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
COMMIT
`

const emptyNAT = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
COMMIT
`

func checkSaved(t *testing.T, b string, f lb.Family, tableName, want string) {
	t.Helper()
	if got := saved(t, b, f, tableName); got != want {
		t.Errorf("%s %s table:\n got:\n%s\nwant:\n%s", f, tableName, got, want)
	}
}

func TestSyncChainsGolden(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, tb *Tables) {
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		checkSaved(t, b, lb.IPv4, "nat", goldenNAT4)
		checkSaved(t, b, lb.IPv4, "filter", goldenFilter4)
		checkSaved(t, b, lb.IPv6, "nat", strings.ReplaceAll(goldenNAT4, "vipd-snat-4", "vipd-snat-6"))
		checkSaved(t, b, lb.IPv6, "filter", goldenFilter6)

		// Idempotence: a second sync changes nothing.
		before := saved(t, b, lb.IPv4, "nat") + saved(t, b, lb.IPv4, "filter") + saved(t, b, lb.IPv6, "nat") + saved(t, b, lb.IPv6, "filter")
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		after := saved(t, b, lb.IPv4, "nat") + saved(t, b, lb.IPv4, "filter") + saved(t, b, lb.IPv6, "nat") + saved(t, b, lb.IPv6, "filter")
		if before != after {
			t.Errorf("second sync changed the tables:\nbefore:\n%s\nafter:\n%s", before, after)
		}

		// Turning the filter off leaves the allow lists' rule alone.
		off := testPolicy
		off.FilterVIPs = false
		if err := tb.SyncChains(off); err != nil {
			t.Fatal(err)
		}
		checkSaved(t, b, lb.IPv4, "filter", allowFilter(lb.IPv4))
		checkSaved(t, b, lb.IPv6, "filter", allowFilter(lb.IPv6))
		checkSaved(t, b, lb.IPv4, "nat", strings.ReplaceAll(goldenNAT4, "filter-vips=true", "filter-vips=false"))

		if err := tb.RemoveChains(); err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			checkSaved(t, b, f, "nat", emptyNAT)
			checkSaved(t, b, f, "filter", emptyFilter)
		}
		if out := sh(t, "ipset", "list", "-n"); strings.Contains(out, "vipd-") {
			t.Errorf("sets left after RemoveChains:\n%s", out)
		}
	})
}

// TestSyncChainsIPVSMatch checks the masquerade rule with the ipvs match,
// where the kernel has xt_ipvs (the qemu guest); elsewhere it skips.
func TestSyncChainsIPVSMatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, _ *Tables) {
		tb := newTables(t, Options{Backend: b})
		if err := tb.SyncChains(testPolicy); err != nil {
			if strings.Contains(err.Error(), "Extension ipvs") {
				t.Skipf("kernel lacks the ipvs match: %v", err)
			}
			t.Fatal(err)
		}
		want := strings.Replace(goldenNAT4, "-A VIPD-POSTROUTING -m comment", "-A VIPD-POSTROUTING -m ipvs --ipvs -m comment", 1)
		checkSaved(t, b, lb.IPv4, "nat", want)
		rules, err := tb.Observe()
		if err != nil {
			t.Fatal(err)
		}
		if rules.Policy != testPolicy {
			t.Errorf("Observe policy = %s, want %s", rules.Policy, testPolicy)
		}
	})
}

// ruleLines returns the rules of one chain as iptables -S prints them.
func ruleLines(t *testing.T, b string, f lb.Family, tableName, chain string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(ipt(t, b, f, "-t", tableName, "-S", chain)), "\n") {
		if strings.HasPrefix(l, "-A ") {
			out = append(out, l)
		}
	}
	return out
}

func TestForeignRulesSurvive(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, tb *Tables) {
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		type place struct {
			table, chain, before, after string
		}
		places := []place{
			{"filter", "INPUT", "-A INPUT -s 203.0.113.1/32 -m comment --comment before -j ACCEPT", "-A INPUT -s 203.0.113.2/32 -m comment --comment after -j DROP"},
			{"nat", "PREROUTING", "-A PREROUTING -s 203.0.113.1/32 -m comment --comment before -j RETURN", "-A PREROUTING -s 203.0.113.2/32 -m comment --comment after -j RETURN"},
		}
		for _, f := range families {
			for _, p := range places {
				before, after := p.before, p.after
				if f == lb.IPv6 {
					before = strings.Replace(before, "203.0.113.1/32", "2001:db8::1/128", 1)
					after = strings.Replace(after, "203.0.113.2/32", "2001:db8::2/128", 1)
				}
				ipt(t, b, f, append([]string{"-t", p.table, "-I", p.chain, "1"}, strings.Fields(strings.TrimPrefix(before, "-A "+p.chain))...)...)
				ipt(t, b, f, append([]string{"-t", p.table}, strings.Fields(after)...)...)
			}
		}
		// A foreign chain of its own, too.
		ipt(t, b, lb.IPv4, "-t", "filter", "-N", "FOREIGN")
		ipt(t, b, lb.IPv4, "-t", "filter", "-A", "FOREIGN", "-j", "RETURN")
		t.Cleanup(func() {
			for _, f := range families {
				ipt(t, b, f, "-t", "filter", "-F", "INPUT")
				ipt(t, b, f, "-t", "nat", "-F", "PREROUTING")
			}
			ipt(t, b, lb.IPv4, "-t", "filter", "-F", "FOREIGN")
			ipt(t, b, lb.IPv4, "-t", "filter", "-X", "FOREIGN")
		})

		check := func(stage string, withJump bool) {
			t.Helper()
			for _, f := range families {
				for _, p := range places {
					lines := ruleLines(t, b, f, p.table, p.chain)
					var foreign []string
					jumps := 0
					for _, l := range lines {
						if strings.Contains(l, "-j VIPD-") {
							jumps++
						} else {
							foreign = append(foreign, l)
						}
					}
					if len(foreign) != 2 || !strings.Contains(foreign[0], "before") || !strings.Contains(foreign[1], "after") {
						t.Errorf("%s: %s %s %s foreign rules = %q", stage, f, p.table, p.chain, foreign)
					}
					if want := map[bool]int{true: 1, false: 0}[withJump]; jumps != want {
						t.Errorf("%s: %s %s %s has %d vipd jumps, want %d:\n%s", stage, f, p.table, p.chain, jumps, want, strings.Join(lines, "\n"))
					}
				}
			}
			if got := ruleLines(t, b, lb.IPv4, "filter", "FOREIGN"); !slices.Equal(got, []string{"-A FOREIGN -j RETURN"}) {
				t.Errorf("%s: foreign chain = %q", stage, got)
			}
		}
		check("after first sync", true)
		// The jump stays between the foreign rules; a sync of a
		// different policy rewrites vipd's chains only.
		other := lb.RulePolicy{Enabled: true, SNATMark: 0x8000, FilterVIPs: true}
		if err := tb.SyncChains(other); err != nil {
			t.Fatal(err)
		}
		check("after sync of another policy", true)
		if l := ruleLines(t, b, lb.IPv4, "filter", "INPUT"); !strings.Contains(l[1], "-j VIPD-FILTER") {
			t.Errorf("vipd's jump moved: %q", l)
		}
		if err := tb.RemoveChains(); err != nil {
			t.Fatal(err)
		}
		check("after RemoveChains", false)
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		check("after re-sync", true)
		if l := ruleLines(t, b, lb.IPv4, "filter", "INPUT"); !strings.Contains(l[0], "-j VIPD-FILTER") {
			t.Errorf("re-inserted jump is not at the top: %q", l)
		}
		rules, err := tb.Observe()
		if err != nil {
			t.Fatal(err)
		}
		if rules.Policy != testPolicy {
			t.Errorf("Observe with foreign rules = %s, want %s", rules.Policy, testPolicy)
		}
	})
}

func TestObserveDrift(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, tb *Tables) {
		observe := func() lb.RulePolicy {
			t.Helper()
			r, err := tb.Observe()
			if err != nil {
				t.Fatal(err)
			}
			return r.Policy
		}
		if p := observe(); p != (lb.RulePolicy{}) {
			t.Fatalf("Observe before sync = %s, want none", p)
		}
		floating := lb.RulePolicy{Enabled: true, SNATMark: 0x1, SNATSource4: netip.MustParseAddr("10.0.3.99"), SNATSource6: netip.MustParseAddr("fd00:3::99")}
		floatingFiltered := floating
		floatingFiltered.FilterVIPs = true
		for _, p := range []lb.RulePolicy{testPolicy, {Enabled: true, SNATMark: 0x1, FilterVIPs: false}, floating, floatingFiltered, testPolicy} {
			if err := tb.SyncChains(p); err != nil {
				t.Fatal(err)
			}
			if got := observe(); got != p {
				t.Fatalf("Observe after sync = %s, want %s", got, p)
			}
		}

		drifts := []struct {
			name string
			f    lb.Family
			args []string
		}{
			{"deleted masquerade rule", lb.IPv4, []string{"-t", "nat", "-D", "VIPD-POSTROUTING", "3"}},
			{"deleted v6 mark rule", lb.IPv6, []string{"-t", "nat", "-D", "VIPD-MARK-SNAT", "1"}},
			{"deleted filter jump", lb.IPv4, []string{"-t", "filter", "-D", "INPUT", "1"}},
			// What a vipd before allow lists left: its filter chain
			// without their rule, which comes first.
			{"an older vipd's filter chain", lb.IPv6, []string{"-t", "filter", "-D", "VIPD-FILTER", "1"}},
			{"deleted v6 OUTPUT jump", lb.IPv6, []string{"-t", "nat", "-D", "OUTPUT", "1"}},
			{"extra rule in vipd chain", lb.IPv4, []string{"-t", "filter", "-A", "VIPD-FILTER", "-j", "ACCEPT"}},
			{"duplicate jump", lb.IPv4, []string{"-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "vipd mark traffic to snat services", "-j", "VIPD-MARK-SNAT"}},
			{"changed mark", lb.IPv4, []string{"-t", "nat", "-R", "VIPD-POSTROUTING", "2", "-j", "MARK", "--set-xmark", "0x0/0x1"}},
		}
		for _, d := range drifts {
			if err := tb.SyncChains(testPolicy); err != nil {
				t.Fatal(err)
			}
			ipt(t, b, d.f, d.args...)
			if got := observe(); got != (lb.RulePolicy{}) {
				t.Errorf("%s: Observe = %s, want none", d.name, got)
			}
			if err := tb.SyncChains(testPolicy); err != nil {
				t.Fatal(err)
			}
			if got := observe(); got != testPolicy {
				t.Errorf("%s: Observe after repair = %s, want %s", d.name, got, testPolicy)
			}
		}
		// A leftover rule of the VIP filter makes a no-filter policy
		// differ.
		off := testPolicy
		off.FilterVIPs = false
		if err := tb.SyncChains(off); err != nil {
			t.Fatal(err)
		}
		ipt(t, b, lb.IPv4, "-t", "filter", "-A", "VIPD-FILTER", "-p", "icmp", "-j", "RETURN")
		if got := observe(); got != (lb.RulePolicy{}) {
			t.Errorf("leftover filter rule: Observe = %s, want none", got)
		}
		if err := tb.SyncChains(off); err != nil {
			t.Fatal(err)
		}
		if got := observe(); got != off {
			t.Errorf("after repair: Observe = %s, want %s", got, off)
		}
		checkSaved(t, b, lb.IPv4, "filter", allowFilter(lb.IPv4))
	})
}

func TestSetEntries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, tb *Tables) {
		entries := []lb.SetEntry{
			{Set: lb.SetVIPs, Addr: netip.MustParseAddr("192.0.2.10")},
			{Set: lb.SetVIPs, Addr: netip.MustParseAddr("2001:db8::10")},
			{Set: lb.SetServed, Addr: netip.MustParseAddr("192.0.2.10"), Proto: lb.TCP, Port: 80},
			{Set: lb.SetServed, Addr: netip.MustParseAddr("192.0.2.10"), Proto: lb.UDP, Port: 53},
			{Set: lb.SetServed, Addr: netip.MustParseAddr("2001:db8::10"), Proto: lb.SCTP, Port: 9},
			{Set: lb.SetSNAT, Addr: netip.MustParseAddr("192.0.2.11"), Proto: lb.TCP, Port: 443},
			{Set: lb.SetSNAT, Addr: netip.MustParseAddr("2001:db8::11"), Proto: lb.UDP, Port: 0},
			{Set: lb.SetRestricted, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443, Net: netip.MustParsePrefix("10.0.0.0/8")},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443, Net: netip.MustParsePrefix("198.51.100.7/32")},
			{Set: lb.SetRestricted, Addr: netip.MustParseAddr("2001:db8::12"), Proto: lb.UDP, Port: 53},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("2001:db8::12"), Proto: lb.UDP, Port: 53, Net: netip.MustParsePrefix("2001:db8:1::/48")},
		}
		want := map[lb.SetEntry]struct{}{}
		observe := func(stage string) {
			t.Helper()
			r, err := tb.Observe()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(r.Entries, want) {
				t.Errorf("%s: entries = %v, want %v", stage, slices.Collect(maps.Keys(r.Entries)), slices.Collect(maps.Keys(want)))
			}
		}
		observe("no sets")
		// Adding before any sync creates the set.
		if err := tb.AddEntry(entries[0]); err != nil {
			t.Fatal(err)
		}
		want[entries[0]] = struct{}{}
		observe("first entry")
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		observe("after sync")
		for _, e := range entries {
			for range 2 { // adding twice is no error
				if err := tb.AddEntry(e); err != nil {
					t.Fatal(err)
				}
			}
			want[e] = struct{}{}
		}
		observe("all added")
		if out := sh(t, "ipset", "list", "vipd-allowed-4"); !strings.Contains(out, "192.0.2.12,tcp:443,10.0.0.0/8") || !strings.Contains(out, "Type: hash:ip,port,net") {
			t.Errorf("ipset list vipd-allowed-4:\n%s", out)
		}
		// Entries that cannot be: a source prefix outside the allowed
		// set, none or /0 in it, another family's.
		for _, e := range []lb.SetEntry{
			{Set: lb.SetRestricted, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443, Net: netip.MustParsePrefix("10.0.0.0/8")},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443, Net: netip.MustParsePrefix("0.0.0.0/0")},
			{Set: lb.SetAllowed, Addr: netip.MustParseAddr("192.0.2.12"), Proto: lb.TCP, Port: 443, Net: netip.MustParsePrefix("2001:db8::/32")},
		} {
			if err := tb.AddEntry(e); err == nil {
				t.Errorf("AddEntry(%s) succeeded", e)
			}
		}
		if out := sh(t, "ipset", "list", "vipd-served-4"); !strings.Contains(out, "192.0.2.10,tcp:80") || !strings.Contains(out, "192.0.2.10,udp:53") {
			t.Errorf("ipset list vipd-served-4:\n%s", out)
		}
		for _, e := range entries[2:5] {
			for range 2 { // deleting twice is no error
				if err := tb.DelEntry(e); err != nil {
					t.Fatal(err)
				}
			}
			delete(want, e)
		}
		observe("some deleted")
		// Set changes leave the chains alone.
		if r, _ := tb.Observe(); r.Policy != testPolicy {
			t.Errorf("policy after set changes = %s", r.Policy)
		}
		if err := tb.RemoveChains(); err != nil {
			t.Fatal(err)
		}
		clear(want)
		observe("after RemoveChains")
		if err := tb.DelEntry(entries[0]); err != nil {
			t.Errorf("delete from a missing set: %v", err)
		}
		for _, bad := range []lb.SetEntry{
			{Set: lb.SetVIPs, Addr: netip.MustParseAddr("192.0.2.1"), Proto: lb.TCP, Port: 1},
			{Set: lb.SetServed, Addr: netip.MustParseAddr("192.0.2.1")},
			{Set: lb.SetSNAT},
		} {
			if err := tb.AddEntry(bad); err == nil {
				t.Errorf("AddEntry(%s) succeeded", bad)
			}
		}
	})
}

func TestRestoreErrorNamesCommand(t *testing.T) {
	nstest.Need(t)
	b := backends(t)[0]
	tb := newTables(t, Options{Backend: b, NoIPVSMatch: true})
	// A rule referencing a set that does not exist fails to load.
	err := tb.write(lb.IPv4, []table{{name: "filter", chains: []string{"VIPD-X"}, rules: []string{"-A VIPD-X -m set --match-set no-such-set dst -j DROP"}}})
	if err == nil {
		t.Fatal("restore of a bad script succeeded")
	}
	for _, want := range []string{"iptables-" + b + "-restore -w 5 --noflush", "no-such-set", "line 3: -A VIPD-X"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestSystemBackend(t *testing.T) {
	nstest.Need(t)
	tb := newTables(t, Options{NoIPVSMatch: true})
	if got := tb.command(lb.IPv6, "restore"); got != "ip6tables-restore" {
		t.Errorf("system restore command = %s", got)
	}
	if err := tb.SyncChains(testPolicy); err != nil {
		t.Fatal(err)
	}
	r, err := tb.Observe()
	if err != nil {
		t.Fatal(err)
	}
	if r.Policy != testPolicy {
		t.Errorf("Observe = %s, want %s", r.Policy, testPolicy)
	}
	if _, err := New(Options{Backend: "ebpf"}); err == nil {
		t.Error("New accepted an unknown backend")
	}
}

func TestIPv4Only(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b string, _ *Tables) {
		tb := newTables(t, Options{Backend: b, NoIPVSMatch: true, IPv4Only: true})
		if err := tb.SyncChains(testPolicy); err != nil {
			t.Fatal(err)
		}
		checkSaved(t, b, lb.IPv4, "filter", goldenFilter4)
		checkSaved(t, b, lb.IPv6, "nat", emptyNAT)
		checkSaved(t, b, lb.IPv6, "filter", emptyFilter)
		if out := sh(t, "ipset", "list", "-n"); strings.Contains(out, "-6") {
			t.Errorf("IPv6 sets created:\n%s", out)
		}
		if r, err := tb.Observe(); err != nil || r.Policy != testPolicy {
			t.Errorf("Observe = %s, %v", r.Policy, err)
		}
		if err := tb.AddEntry(lb.SetEntry{Set: lb.SetVIPs, Addr: netip.MustParseAddr("2001:db8::1")}); err == nil {
			t.Error("added an IPv6 entry on an IPv4-only host")
		}
	})
}
