// Package config reads vipd's TOML configuration, strictly: unknown keys
// are errors, every value is validated into a typed one, and every error
// names the file, the line and the key, all errors at once.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// Config is a validated configuration.
type Config struct {
	// File is the path the configuration was read from: the main file.
	File string
	// Include holds the include patterns of the main file, made absolute
	// or relative to the directory of File as the main file's path is.
	Include []string
	// Daemon holds the daemon-wide settings.
	Daemon Daemon
	// Spec is what vipd programs into the kernel.
	Spec lb.Spec
	// Health holds the health checking of services that have any, by
	// service name.
	Health map[string]ServiceHealth
	// HA is the [ha] section.
	HA HA
	// Kubernetes is the [kubernetes] section.
	Kubernetes Kubernetes
	// BGP is the [bgp] section.
	BGP BGP

	// parts are the files the configuration was read from: the main file,
	// then the included files in include order. Each file's services are
	// a contiguous run of Spec.Services, in file order.
	parts []part
	// nb is the number of backends of all services.
	nb int
	// execN is the number of services with an exec check, counted when
	// execCounted; execUser is CheckUser looked up, when execN > 0.
	execN       int
	execCounted bool
	execUser    *check.User
	// unchecked lists the host lookups an offline load skipped (see
	// LoadOptions).
	unchecked []string
}

// Backends returns the number of backends of all services.
func (c *Config) Backends() int { return c.nb }

// countBackends returns the number of backends of services.
func countBackends(services []lb.VirtualService) int {
	n := 0
	for i := range services {
		n += len(services[i].Backends)
	}
	return n
}

// part is one file of a configuration.
type part struct {
	file string
	// src is the text the file was parsed from.
	src []byte
	// chunks holds the offset in src of each block: 0 for the preamble
	// (everything before the first [[service]]), then the offset of each
	// service's [[service]] line, one per service. It is nil when the
	// file was not read block by block (see ParseFrom); a parse from such
	// a file decodes all of its next text.
	chunks []int
	// first is the index in Spec.Services of the file's first service.
	first int
	// rank is the index of the include pattern that matched the file; -1
	// for the main file.
	rank int
}

// Text is the content of one file of a configuration.
type Text struct {
	File string
	Data []byte
}

// Source returns the text the main file was parsed from. The caller must
// not modify it.
func (c *Config) Source() []byte {
	if len(c.parts) == 0 {
		return nil
	}
	return c.parts[0].src
}

// Texts returns the files the configuration was read from, the main file
// first, then the included files in order. The caller must not modify
// their data.
func (c *Config) Texts() []Text {
	out := make([]Text, len(c.parts))
	for i, p := range c.parts {
		out[i] = Text{File: p.file, Data: p.src}
	}
	return out
}

// FileServices is one file of a configuration and the services read from
// it: Spec.Services[From:To].
type FileServices struct {
	File     string
	From, To int
}

// Files returns the files the configuration was read from, the main file
// first, then the included files in order, each with its run of services.
func (c *Config) Files() []FileServices {
	out := make([]FileServices, len(c.parts))
	for i, p := range c.parts {
		out[i] = FileServices{File: p.file, From: p.first, To: c.partEnd(i)}
	}
	return out
}

// partEnd returns the index in Spec.Services after part i's services.
func (c *Config) partEnd(i int) int {
	if i+1 < len(c.parts) {
		return c.parts[i+1].first
	}
	return len(c.Spec.Services)
}

// partOf returns the index of the part read from file, or -1.
func (c *Config) partOf(file string) int {
	for i := range c.parts {
		if c.parts[i].file == file {
			return i
		}
	}
	return -1
}

// StopMode says what vipd does with the data plane when it stops.
type StopMode uint8

// The stop modes.
const (
	// StopKeep leaves every VIP, service and rule in place, so a restart
	// is hitless. It is the default.
	StopKeep StopMode = iota
	// StopClean removes everything vipd owns.
	StopClean
)

// String returns the mode's configuration name.
func (m StopMode) String() string {
	if m == StopClean {
		return "clean"
	}
	return "keep"
}

// Daemon holds daemon-wide settings.
type Daemon struct {
	// Interface is the dummy interface that holds the VIPs.
	Interface string
	// Uplinks are the interfaces VIPs are announced on.
	Uplinks []string
	// StrictARP sets arp_ignore/arp_announce (see lb.Spec).
	StrictARP bool
	// ManageSysctls lets vipd set the sysctls IPVS needs.
	ManageSysctls bool
	// ManageIPTables lets vipd keep its iptables chains and ipsets.
	ManageIPTables bool
	// MetricsListen is the Prometheus listen address, or "" for none.
	MetricsListen string
	// StatusPage serves the status page at / on MetricsListen.
	StatusPage bool
	// ControlSocket is the path of the local control socket.
	ControlSocket string
	// StateDir holds vipd's ownership ledger.
	StateDir string
	// OnStop is what happens to the data plane on stop.
	OnStop StopMode
	// ResyncInterval is how often the kernel is re-read to repair drift.
	ResyncInterval time.Duration
	// StatsInterval is how long the status that "vipd status" and the
	// metrics show is served before a request reads the kernel again.
	StatsInterval time.Duration
	// Removal says how removed backends and services leave the kernel:
	// drain (Drain), drain_services (DrainServices), drain_timeout
	// (DrainTimeout) and drain_grace (Grace). The daemon, a reload and
	// "vipd plan" hand this one value to the planner.
	Removal lb.RemovalPolicy
	// GARP says how VIPs are announced.
	GARP GARP
	// Watch reloads the file when it changes (SIGHUP always does).
	Watch bool
	// ReloadGuard is the largest share of services or backends a reload
	// may delete; larger deletions are refused unless forced. 1 disables
	// the guard.
	ReloadGuard float64
	// OnApplyError says what a reload does when operations fail.
	OnApplyError ApplyErrorMode
	// CheckUser is the user, "user" or "user:group", exec checks run as
	// (see LookupUser); never root. It is looked up when the
	// configuration has exec checks.
	CheckUser string
}

// ApplyErrorMode says what happens when a reload's operations fail.
type ApplyErrorMode string

// The modes.
const (
	// ApplyRollback returns the kernel to the last good configuration and
	// keeps running it.
	ApplyRollback ApplyErrorMode = "rollback"
	// ApplyContinue keeps the new configuration; later passes retry what
	// failed.
	ApplyContinue ApplyErrorMode = "continue"
)

// GARP configures gratuitous ARP and unsolicited neighbour advertisements.
type GARP struct {
	// Count is the number of announcements in the burst sent when a VIP
	// comes up.
	Count int
	// Interval separates the announcements of a burst.
	Interval time.Duration
	// Refresh repeats a single announcement this often; zero for never.
	Refresh time.Duration
}

// Defaults.
const (
	DefaultInterface     = "vipd0"
	DefaultControlSocket = "/run/vipd/vipd.sock"
	DefaultMetricsListen = "127.0.0.1:9728"
	DefaultStateDir      = "/var/lib/vipd"
	DefaultScheduler     = "wlc"
	DefaultSNATMark      = 0x4000000
	// DefaultCheckUser is the system user the package creates for exec
	// checks.
	DefaultCheckUser = "vipd-check"
)

// MaxAllow is the largest number of entries of a service's allow list.
// Every entry is one member of an ipset, per address of a nodeport
// service, and the kernel's sets hold 65536 members by default.
const MaxAllow = 256

// DefaultDrainGrace is drain_grace's default. A handshake in flight when a
// backend leaves completes within one round trip, or after the backend
// retransmits its SYN-ACK when the first one was lost: Linux retransmits
// after 1 s (the initial RTO of RFC 6298). Two seconds cover that with a
// second to spare on a loaded host. (A client's retransmitted SYN needs no
// cover: IPVS schedules it anew, away from a backend at weight 0.)
const DefaultDrainGrace = 2 * time.Second

// DefaultStatsInterval is stats_interval's default. Prometheus scrapes
// every 15 s or more, so a scraper never gets the data its previous
// scrape took, and IPVS refreshes its rate estimates only every 2 s;
// yet however many ask, the kernel is read at most once in 5 s, so that
// the read of a large table, which is slow, holds the reconciler a
// minority of the time.
const DefaultStatsInterval = 5 * time.Second

// Error is one problem in a configuration file.
type Error struct {
	File string
	Line int    // 0 when unknown
	Col  int    // the column (in bytes, from 1) in Line; 0 when unknown
	Ctx  string // where in the file, such as `service "web": backend "10.0.0.1:80"`
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Col > 0 {
			fmt.Fprintf(&b, ":%d", e.Col)
		}
	}
	b.WriteString(": ")
	if e.Ctx != "" {
		b.WriteString(capText(e.Ctx, MaxMessageLen))
		b.WriteString(": ")
	}
	b.WriteString(capText(e.Msg, MaxMessageLen))
	return b.String()
}

// Errors are all the problems found in a configuration: file by file, the
// main file first, each file's in line order. Error prints the first
// MaxErrors of them and a count of the others.
type Errors []*Error

func (es Errors) Error() string {
	n := len(es)
	if n > MaxErrors+1 {
		n = MaxErrors
	}
	s := make([]string, 0, n+1)
	for _, e := range es[:n] {
		s = append(s, e.Error())
	}
	if n < len(es) {
		s = append(s, fmt.Sprintf("... and %d more errors", len(es)-MaxErrors))
	}
	return strings.Join(s, "\n")
}

// Load reads and validates the configuration file at path, and the files
// it includes.
func Load(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse validates data, naming it file in errors, and reads the files it
// includes. On failure the error is an Errors listing every problem found.
// The configuration keeps data (see Source): the caller must not modify it
// afterwards.
func Parse(file string, data []byte) (*Config, error) {
	cfg, _, err := ParseFrom(nil, file, data)
	return cfg, err
}

// parseWhole decodes and validates each file of a configuration as one
// document: main, then the included files that included returns once the
// main file's include patterns are known. It is the reference behaviour
// of Parse, and the path that reports errors with their positions.
func parseWhole(main Text, included func(cfg *Config) ([]includedText, error)) (*Config, error) {
	if e := checkLimits(main.File, main.Data); e != nil {
		return nil, Errors{e}
	}
	var raw rawConfig
	md, err := toml.NewDecoder(bytes.NewReader(main.Data)).Decode(&raw)
	if err != nil {
		return nil, Errors{decodeError(main.File, err)}
	}
	v := &validator{file: main.File, src: main.Data}
	v.unknownKeys(md.Undecoded())
	x := newCross()
	cfg := v.config(&raw, x)
	v.sort()
	errs := v.errs
	cfg.File = main.File
	cfg.parts = []part{{file: main.File, src: main.Data, rank: -1}}
	if len(cfg.Include) == len(raw.Include) && len(cfg.Include) > 0 {
		incl, err := included(cfg)
		if err != nil {
			errs = append(errs, includeErrors(main, err)...)
		}
		for _, t := range incl {
			cfg.parts = append(cfg.parts, part{file: t.File, src: t.Data, first: len(cfg.Spec.Services), rank: t.rank})
			errs = append(errs, parseIncludedWhole(main.File, t.Text, cfg, x)...)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	cfg.nb = countBackends(cfg.Spec.Services)
	return cfg, nil
}

// parseIncludedWhole decodes and validates an included file as one
// document, appending its services to cfg, and returns its errors.
func parseIncludedWhole(mainFile string, t Text, cfg *Config, x *cross) Errors {
	if e := checkLimits(t.File, t.Data); e != nil {
		return Errors{e}
	}
	var raw rawConfig
	md, err := toml.NewDecoder(bytes.NewReader(t.Data)).Decode(&raw)
	if err != nil {
		return Errors{decodeError(t.File, err)}
	}
	v := &validator{file: t.File, src: t.Data}
	var misplaced []string
	for _, k := range []string{"daemon", "include"} {
		if md.IsDefined(k) {
			misplaced = append(misplaced, k)
		}
	}
	// The decoder's metadata is not needed past this point: it may be
	// freed before the positions of the errors are indexed.
	v.unknownKeys(md.Undecoded())
	for _, k := range misplaced {
		v.errorf(k, "", "%s belongs in the main file %s: an included file holds [[service]] tables only", k, mainFile)
	}
	v.services(raw.Service, cfg, x)
	v.sort()
	return v.errs
}

// includeErrors reports a failure to read the files that main includes,
// at the line of its include key: one Error for each of the errors that
// err joins.
func includeErrors(main Text, err error) Errors {
	v := &validator{file: main.File, src: main.Data}
	line := v.positions().line("include")
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make(Errors, len(errs))
	for i, e := range errs {
		out[i] = &Error{File: main.File, Line: line, Msg: e.Error()}
	}
	return out
}

// includedText is the content of an included file and the index of the
// include pattern that matched it.
type includedText struct {
	Text
	rank int
}

// readIncluded reads the files that match patterns (see globIncluded),
// each as readFile does. The error lists every file it could not read.
func readIncluded(mainFile string, patterns []string) ([]includedText, error) {
	out, err := globIncluded(mainFile, patterns)
	if err != nil {
		return nil, err
	}
	if err := checkIncluded(len(out), 0); err != nil {
		return nil, err
	}
	var errs []error
	var size int64
	for i := range out {
		if out[i].Data, err = readFile(out[i].File); err != nil {
			errs = append(errs, fmt.Errorf("read included file: %w", err))
		}
		size += int64(len(out[i].Data))
		if err := checkIncluded(len(out), size); err != nil {
			return nil, err
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// globIncluded lists, without reading them, the files that match
// patterns, pattern by pattern and each pattern's matches in lexical
// order. A file is listed once, for the first pattern that matches it;
// the main file is never included. A glob that matches nothing is no
// error (an empty services.d is normal); a pattern without wildcards names
// a file that must exist. On error it still returns every match it found.
func globIncluded(mainFile string, patterns []string) ([]includedText, error) {
	seen := map[string]bool{filepath.Clean(mainFile): true}
	var (
		out  []includedText
		errs []error
	)
	for r, p := range patterns {
		matches, err := filepath.Glob(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("include %q: %w", p, err))
			continue
		}
		if len(matches) == 0 && !hasMeta(p) {
			errs = append(errs, fmt.Errorf("include %q: %w", p, fs.ErrNotExist))
		}
		for _, m := range matches {
			m = filepath.Clean(m)
			if !seen[m] {
				seen[m] = true
				out = append(out, includedText{Text{File: m}, r})
			}
		}
	}
	return out, errors.Join(errs...)
}

// includeRank returns the index of the first of patterns that matches
// file, or -1 when none does or file is the main file.
func includeRank(mainFile string, patterns []string, file string) int {
	if file == mainFile {
		return -1
	}
	for r, p := range patterns {
		if ok, _ := filepath.Match(p, file); ok {
			return r
		}
	}
	return -1
}

// included returns c's included files.
func (c *Config) included() []includedText {
	out := make([]includedText, 0, len(c.parts))
	for _, p := range c.parts[min(1, len(c.parts)):] {
		out = append(out, includedText{Text{File: p.file, Data: p.src}, p.rank})
	}
	return out
}

// rankOf returns the index of the first of c's include patterns that
// matches file, or -1 when none does or file is the main file.
func (c *Config) rankOf(file string) int { return includeRank(c.File, c.Include, file) }

func decodeError(file string, err error) *Error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		// The message may quote the file, which need not be vipd's.
		msg := redactValues(pe.Message, pe.LastKey)
		if pe.LastKey != "" && !strings.Contains(msg, pe.LastKey) {
			msg = fmt.Sprintf("%s: %s", pe.LastKey, msg)
		}
		return &Error{File: file, Line: pe.Position.Line, Msg: msg}
	}
	msg := err.Error()
	if m := decodeLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: file, Line: line, Msg: fmt.Sprintf("%s: %s", m[2], redactValues(m[3], m[2]))}
	}
	return &Error{File: file, Msg: redactValues(strings.TrimPrefix(msg, "toml: "), "")}
}

// decodeLineRE matches the decoder's type errors, which carry their line
// in the message text only.
var decodeLineRE = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)
