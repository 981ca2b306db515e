// Package config reads vipd's TOML configuration, strictly: unknown keys
// are errors, every value is validated into a typed one, and every error
// names the file, the line and the key, all errors at once.
package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
)

// Config is a validated configuration.
type Config struct {
	// File is the path the configuration was read from.
	File string
	// Daemon holds the daemon-wide settings.
	Daemon Daemon
	// Spec is what vipd programs into the kernel.
	Spec lb.Spec
	// Health holds the health checking of services that have any, by
	// service name.
	Health map[string]ServiceHealth

	// src is the text the configuration was parsed from.
	src []byte
	// chunks holds the offset in src of each block: 0 for the preamble
	// (everything before the first [[service]]), then the offset of each
	// service's [[service]] line, one per service. It is nil when the
	// configuration was not read block by block (see ParseFrom); such a
	// configuration cannot be the base of an incremental parse.
	chunks []int
	// idx holds the cross-service counts of the configuration that owns
	// it, shared along a chain of incremental parses.
	idx *index
}

// Source returns the text the configuration was parsed from. The caller
// must not modify it.
func (c *Config) Source() []byte { return c.src }

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
	// ControlSocket is the path of the local control socket.
	ControlSocket string
	// StateDir holds vipd's ownership ledger.
	StateDir string
	// OnStop is what happens to the data plane on stop.
	OnStop StopMode
	// ResyncInterval is how often the kernel is re-read to repair drift.
	ResyncInterval time.Duration
	// Drain makes removed backends go to weight 0 before deletion.
	Drain bool
	// DrainServices drains a removed service's connections before
	// deleting it (its VIP stays bound meanwhile).
	DrainServices bool
	// DrainTimeout bounds a drain; zero waits for the last connection.
	DrainTimeout time.Duration
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
)

// Error is one problem in a configuration file.
type Error struct {
	File string
	Line int    // 0 when unknown
	Ctx  string // where in the file, such as `service "web": backend "10.0.0.1:80"`
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Ctx != "" {
		b.WriteString(e.Ctx)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors are all the problems found in one file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Load reads and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse validates data, naming it file in errors. On failure the error is
// an Errors listing every problem found. The configuration keeps data (see
// Source): the caller must not modify it afterwards.
func Parse(file string, data []byte) (*Config, error) {
	cfg, _, err := ParseFrom(nil, file, data)
	return cfg, err
}

// parseWhole decodes and validates data as one document. It is the
// reference behaviour of Parse, and the path that reports errors with
// their positions.
func parseWhole(file string, data []byte) (*Config, error) {
	var raw rawConfig
	md, err := toml.NewDecoder(strings.NewReader(string(data))).Decode(&raw)
	if err != nil {
		return nil, Errors{decodeError(file, err)}
	}
	v := &validator{file: file, src: data}
	for _, k := range md.Undecoded() {
		v.unknownKey(k)
	}
	cfg := v.config(&raw)
	if len(v.errs) > 0 {
		v.sort()
		return nil, v.errs
	}
	cfg.File = file
	cfg.src = data
	return cfg, nil
}

func decodeError(file string, err error) *Error {
	var pe toml.ParseError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.LastKey != "" && !strings.Contains(msg, pe.LastKey) {
			msg = fmt.Sprintf("%s: %s", pe.LastKey, msg)
		}
		return &Error{File: file, Line: pe.Position.Line, Msg: msg}
	}
	msg := err.Error()
	if m := decodeLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: file, Line: line, Msg: fmt.Sprintf("%s: %s", m[2], m[3])}
	}
	return &Error{File: file, Msg: strings.TrimPrefix(msg, "toml: ")}
}

// decodeLineRE matches the decoder's type errors, which carry their line
// in the message text only.
var decodeLineRE = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)
