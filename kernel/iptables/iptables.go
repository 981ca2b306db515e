// Package iptables implements lb.RuleTables with iptables chains and
// ipsets.
//
// vipd owns a fixed set of chains, named with the prefix "VIPD-", and the
// jumps to them from the built-in chains; it never flushes, reorders or
// deletes anyone else's rules. The chains never grow with the number of
// services: per-service data lives in ipsets, one set per kind and address
// family (vipd-vips-4, vipd-served-6, ...), whose members are added and
// removed one netlink call at a time.
//
// Chains are written atomically with iptables-restore --noflush (and
// ip6tables-restore), with the iptables binaries the system selects or a
// chosen backend. The nat table marks new connections to SNAT services
// (PREROUTING and OUTPUT) and masquerades marked IPVS traffic
// (POSTROUTING); the filter table drops new connections to VIPs on ports
// no service serves (INPUT), letting ICMP through.
//
// The policy the chains implement is recorded in a rule comment. Observe
// reads it back, renders that policy and compares the result with the
// live chains, reporting the zero policy when they differ so that the
// planner rewrites them.
package iptables

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// Backends name the iptables variants Options.Backend selects.
const (
	// BackendSystem uses the binaries the system selects
	// (iptables-restore, through Debian's alternatives).
	BackendSystem = ""
	// BackendLegacy uses iptables-legacy-restore and friends.
	BackendLegacy = "legacy"
	// BackendNFT uses iptables-nft-restore and friends.
	BackendNFT = "nft"
)

// Options configure Tables.
type Options struct {
	// Backend selects the iptables variant: BackendSystem (the default),
	// BackendLegacy or BackendNFT.
	Backend string
	// NoIPVSMatch leaves "-m ipvs --ipvs" out of the masquerade rule, for
	// kernels without the xt_ipvs match (where the rule cannot load). The
	// mark alone then selects the traffic. Production hosts run IPVS and
	// keep the match; tests on hosts without IPVS set this.
	NoIPVSMatch bool
	// LockWait is how long iptables-restore waits for the xtables lock;
	// zero means 5 seconds.
	LockWait time.Duration
	// IPv4Only leaves ip6tables and the IPv6 sets alone, for hosts
	// without IPv6 (booted with ipv6.disable=1), where ip6tables cannot
	// run. New sets it when the kernel has no IPv6.
	IPv4Only bool
	// Logger receives debug records of the scripts written; nil discards
	// them.
	Logger *slog.Logger
}

// Tables implements lb.RuleTables. Its methods are safe for concurrent use.
type Tables struct {
	opts Options
	log  *slog.Logger
	nl   *netlink.Handle
	// families are the address families vipd's chains and sets exist in.
	families []lb.Family

	mu sync.Mutex
}

var _ lb.RuleTables = (*Tables)(nil)

// New returns Tables for opts. It opens a netlink socket for ipset calls;
// Close releases it.
func New(opts Options) (*Tables, error) {
	switch opts.Backend {
	case BackendSystem, BackendLegacy, BackendNFT:
	default:
		return nil, fmt.Errorf("unknown iptables backend %q (want %q, %q or %q)", opts.Backend, BackendSystem, BackendLegacy, BackendNFT)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.LockWait <= 0 {
		opts.LockWait = 5 * time.Second
	}
	if _, err := os.Stat("/proc/net/if_inet6"); errors.Is(err, fs.ErrNotExist) {
		opts.IPv4Only = true
	}
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	t := &Tables{opts: opts, log: opts.Logger, nl: h, families: []lb.Family{lb.IPv4, lb.IPv6}}
	if opts.IPv4Only {
		t.families = t.families[:1]
	}
	return t, nil
}

// Close releases the netlink socket.
func (t *Tables) Close() error {
	t.nl.Close()
	return nil
}

// command returns the name of an iptables tool, such as
// "ip6tables-nft-restore", for family f.
func (t *Tables) command(f lb.Family, tool string) string {
	name := "iptables"
	if f == lb.IPv6 {
		name = "ip6tables"
	}
	if t.opts.Backend != BackendSystem {
		name += "-" + t.opts.Backend
	}
	return name + "-" + tool
}

func (t *Tables) render(f lb.Family, p lb.RulePolicy) []table {
	return render(f, p, renderOptions{noIPVSMatch: t.opts.NoIPVSMatch})
}

// Observe implements lb.RuleTables. It returns the members of vipd's sets
// and the policy the chains implement, or the zero policy when they are
// missing or differ from what that policy renders.
func (t *Tables) Observe() (lb.Rules, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rules := lb.Rules{Entries: map[lb.SetEntry]struct{}{}}
	for _, f := range t.families {
		for _, k := range setKinds {
			entries, err := t.listSet(k, f)
			if err != nil {
				return lb.Rules{}, err
			}
			for _, e := range entries {
				rules.Entries[e] = struct{}{}
			}
		}
	}
	live := map[lb.Family]map[string]*table{}
	for _, f := range t.families {
		tables, err := t.save(f)
		if err != nil {
			return lb.Rules{}, err
		}
		live[f] = tables
	}
	p, ok := parsePolicy(live[lb.IPv4]["nat"])
	if !ok {
		return rules, nil
	}
	for _, f := range t.families {
		for _, want := range t.render(f, p) {
			if !equal(&want, live[f][want.name]) {
				t.log.Debug("vipd chains differ from their policy", "family", f.String(), "table", want.name, "policy", p.String())
				return rules, nil
			}
		}
	}
	rules.Policy = p
	return rules, nil
}

// SyncChains implements lb.RuleTables. It creates vipd's sets if missing
// and writes all of vipd's chains and jumps for p, one atomic
// iptables-restore per family. A disabled policy removes them.
func (t *Tables) SyncChains(p lb.RulePolicy) error {
	if !p.Enabled {
		return t.RemoveChains()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.families {
		for _, k := range setKinds {
			if err := t.createSet(k, f); err != nil {
				return err
			}
		}
	}
	for _, f := range t.families {
		if err := t.write(f, t.render(f, p)); err != nil {
			return err
		}
	}
	return nil
}

// RemoveChains implements lb.RuleTables. It deletes the jumps to vipd's
// chains, the chains, and vipd's sets, and nothing else.
func (t *Tables) RemoveChains() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, f := range t.families {
		if err := t.write(f, t.render(f, lb.RulePolicy{})); err != nil {
			return err
		}
	}
	var errs []error
	for _, f := range t.families {
		for _, k := range setKinds {
			errs = append(errs, t.destroySet(k, f))
		}
	}
	return errors.Join(errs...)
}

// AddEntry implements lb.RuleTables. Adding a present entry is no error;
// a missing set is created.
func (t *Tables) AddEntry(e lb.SetEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name, ne, err := toNetlink(e)
	if err != nil {
		return err
	}
	if !slices.Contains(t.families, lb.FamilyOf(e.Addr)) {
		return fmt.Errorf("add %s: this host has no ipv6", e)
	}
	err = t.nl.IpsetAdd(name, ne)
	if isNoSet(err) {
		if err := t.createSet(e.Set, lb.FamilyOf(e.Addr)); err != nil {
			return err
		}
		err = t.nl.IpsetAdd(name, ne)
	}
	if err != nil {
		return fmt.Errorf("add %s to ipset %s: %w", e, name, err)
	}
	return nil
}

// DelEntry implements lb.RuleTables. Deleting a missing entry, or from a
// missing set, is no error.
func (t *Tables) DelEntry(e lb.SetEntry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name, ne, err := toNetlink(e)
	if err != nil {
		return err
	}
	if err := t.nl.IpsetDel(name, ne); err != nil && !isNoSet(err) {
		return fmt.Errorf("delete %s from ipset %s: %w", e, name, err)
	}
	return nil
}

// save runs iptables-save for family f and returns vipd's part of each
// table.
func (t *Tables) save(f lb.Family) (map[string]*table, error) {
	out, err := t.run(t.command(f, "save"), nil)
	if err != nil {
		return nil, err
	}
	return parseSave(out), nil
}

// write makes vipd's chains in family f match want, with one
// iptables-restore --noflush.
func (t *Tables) write(f lb.Family, want []table) error {
	live, err := t.save(f)
	if err != nil {
		return err
	}
	script := restoreScript(want, live)
	if script == "" {
		return nil
	}
	t.log.Debug("iptables-restore", "family", f.String(), "script", script)
	wait := strconv.Itoa(int((t.opts.LockWait + time.Second - 1) / time.Second))
	if _, err := t.run(t.command(f, "restore"), []byte(script), "-w", wait, "--noflush"); err != nil {
		return withFailedLine(err, script)
	}
	return nil
}

// run runs an iptables tool and returns its standard output. Its error
// names the command and includes its standard error.
func (t *Tables) run(name string, stdin []byte, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return "", fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
		}
		return "", fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, msg)
	}
	return stdout.String(), nil
}

// failedLine finds the line number iptables-restore reports.
var failedLine = regexp.MustCompile(`line:? (\d+)`)

// withFailedLine adds the script line iptables-restore failed at to err.
func withFailedLine(err error, script string) error {
	m := failedLine.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(script, "\n")
	if n < 1 || n > len(lines) || lines[n-1] == "COMMIT" {
		return err
	}
	return fmt.Errorf("%w (line %d: %s)", err, n, lines[n-1])
}
