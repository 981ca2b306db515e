package config

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

// Delta says how a Config differs from the base it was parsed from.
type Delta struct {
	// Full is true when there is no base or anything outside the
	// [[service]] blocks changed (the settings of the [daemon] section,
	// the file name): the caller must treat every service as changed. A
	// change of the text before the first [[service]] that leaves the
	// settings as they were (a comment) is not one.
	Full bool
	// Otherwise base.Spec.Services[From:OldTo] were replaced by
	// cfg.Spec.Services[From:NewTo]; every other service (and its Health
	// entry) is identical and in the same order (cfg.Spec.Services[:From]
	// equals base's [:From], cfg's [NewTo:] equals base's [OldTo:]). When
	// Full is true, From is 0, OldTo is the number of base's services and
	// NewTo the number of cfg's, so that the statement still holds.
	From, OldTo, NewTo int
}

// ParseFrom is Parse for a file that may be an edit of one that base was
// parsed from: it returns exactly what Parse returns for the files of base
// with file's text replaced by data, and the Delta from base. base may be
// nil; file is then the main file. base is never modified: the caller may
// keep it (to roll back, or after a rejected reload), and calls of
// ParseFrom on one base may run concurrently.
//
// file is base's main file (base.File), one of its included files, or a
// new file that matches one of its include patterns (see Config.Include); the
// other files are taken from base as they were. When the main file's
// include patterns change (or without base) the included files are read
// from disk again.
//
// A valid file is read block by block: the text before the first
// [[service]] line (the preamble, with [daemon]) and each [[service]]
// array element are decoded and validated on their own, in parallel. With
// a base, the blocks at the start and at the end of the file whose text is
// the same as in base's text of the file keep base's services, and only
// the blocks between them are decoded again; the checks across services
// then compare the new services with the others, without decoding them.
// Whatever this path does not understand (a decode or validation error, a
// conflict between services, a [[service]] line inside a multi-line
// string, a table other than the service's inside its block, ...) is left
// to a parse of every file whole, which reports every error with its file
// and line.
//
// The configuration keeps data (see Texts): the caller must not modify it
// afterwards. When the configuration has exec checks, check_user is looked
// up (see Config.resolveExec); the ca_file of the https checks of the
// services that changed is read (see Config.resolveCAFiles).
func ParseFrom(base *Config, file string, data []byte) (*Config, Delta, error) {
	return resolved(base)(parseFrom(base, file, data, nil))
}

// Spare is a configuration its owner hands over to ParseFromReusing: its
// service list may become the new configuration's, so that an edit that
// keeps the number of services costs the services it changes, not a
// copy of every service. Delta says how Config differs from the base of
// the parse: either was parsed from the other with that Delta.
type Spare struct {
	Config *Config
	Delta  Delta
}

// ParseFromReusing is ParseFrom that may build the new configuration in
// spare's memory. The caller hands spare over: neither it nor anything
// read from its Spec may be used afterwards, whatever the outcome. A
// spare that does not fit (another number of services, a full Delta, or
// base's own memory) is ignored.
func ParseFromReusing(base *Config, file string, data []byte, spare Spare) (*Config, Delta, error) {
	return resolved(base)(parseFrom(base, file, data, &spare))
}

// take returns the spare's service list made equal to base's, or nil
// when the spare does not fit an edit that keeps the number of base's
// services.
func (sp *Spare) take(base *Config) []lb.VirtualService {
	if sp == nil || sp.Config == nil || sp.Delta.Full || sp.Delta.OldTo != sp.Delta.NewTo {
		return nil
	}
	svcs, want := sp.Config.Spec.Services, base.Spec.Services
	if len(svcs) != len(want) || len(svcs) == 0 || &svcs[0] == &want[0] || sp.Delta.NewTo > len(svcs) {
		return nil
	}
	copy(svcs[sp.Delta.From:sp.Delta.NewTo], want[sp.Delta.From:sp.Delta.NewTo])
	sp.Config = nil // taken once
	return svcs
}

// resolved returns what completes the result of a parse from base: the
// exec checks' user and the https checks' CA files, or an error.
func resolved(base *Config) func(*Config, Delta, error) (*Config, Delta, error) {
	return func(cfg *Config, d Delta, err error) (*Config, Delta, error) {
		if err != nil || cfg == base {
			return cfg, d, err
		}
		if err := cfg.resolveExec(base, d); err != nil {
			return nil, Delta{Full: true}, err
		}
		if err := cfg.resolveCAFiles(d); err != nil {
			return nil, Delta{Full: true}, err
		}
		return cfg, d, nil
	}
}

func parseFrom(base *Config, file string, data []byte, sp *Spare) (*Config, Delta, error) {
	if base == nil || file == base.File {
		return parseMain(base, file, data, sp)
	}
	file = filepath.Clean(file)
	pi := base.partOf(file)
	if pi != 0 {
		if err := base.checkIncludedWith(pi, data); err != nil {
			return nil, Delta{Full: true}, Errors{{File: file, Msg: err.Error()}}
		}
	}
	switch {
	case pi == 0:
		return parseMain(base, file, data, sp)
	case pi < 0:
		rank := base.rankOf(file)
		if rank < 0 {
			return nil, Delta{Full: true}, Errors{{File: file, Msg: fmt.Sprintf("not part of the configuration: no include pattern of %s matches it", base.File)}}
		}
		return replacePart(base, partPos(base.parts, rank, file), true, &includedText{Text{File: file, Data: data}, rank}, nil)
	}
	return replacePart(base, pi, false, &includedText{Text{File: file, Data: data}, base.parts[pi].rank}, sp)
}

// ParseRemoved returns the configuration base becomes without the
// included file file, which was deleted, and the Delta from base. A file
// that is not one of base's included files changes nothing.
func ParseRemoved(base *Config, file string) (*Config, Delta, error) {
	return resolved(base)(parseRemoved(base, file))
}

func parseRemoved(base *Config, file string) (*Config, Delta, error) {
	file = filepath.Clean(file)
	pi := base.partOf(file)
	if pi < 0 {
		return base, Delta{}, nil
	}
	if pi == 0 {
		return nil, Delta{Full: true}, Errors{{File: file, Msg: "the main configuration file was removed"}}
	}
	return replacePart(base, pi, false, nil, nil)
}

// Reload reads base's main file and every file it includes again, and
// returns the configuration they make and its Delta from base: the
// changes of several files count as a full change.
func Reload(base *Config) (*Config, Delta, error) {
	return reload(base, nil)
}

// ReloadReusing is Reload that may build the new configuration in
// spare's memory (see ParseFromReusing): the first file that changed is
// parsed with it. The caller hands spare over whatever the outcome.
func ReloadReusing(base *Config, spare Spare) (*Config, Delta, error) {
	return reload(base, &spare)
}

func reload(base *Config, sp *Spare) (*Config, Delta, error) {
	parse := func(c *Config, file string, data []byte) (*Config, Delta, error) {
		if sp != nil {
			s := *sp
			sp = nil
			return ParseFromReusing(c, file, data, s)
		}
		return ParseFrom(c, file, data)
	}
	data, err := readFile(base.File)
	if err != nil {
		return nil, Delta{Full: true}, fmt.Errorf("read config: %w", err)
	}
	cfg := base
	var delta Delta
	changed := 0
	step := func(c *Config, d Delta, err error) error {
		if err != nil {
			return err
		}
		if d.Full || d.From != d.OldTo || d.From != d.NewTo {
			changed++
			delta = d
		}
		cfg = c
		return nil
	}
	if !bytes.Equal(data, base.Source()) {
		if err := step(parse(base, base.File, data)); err != nil {
			return nil, Delta{Full: true}, err
		}
	}
	if !slices.Equal(cfg.Include, base.Include) {
		// ParseFrom has just read the files of the new patterns.
		return cfg, fullDelta(base, cfg), nil
	}
	incl, err := readIncluded(cfg.File, cfg.Include)
	if err != nil {
		return nil, Delta{Full: true}, includeErrors(Text{File: cfg.File, Data: cfg.Source()}, err)
	}
	found := map[string]bool{}
	for _, t := range incl {
		found[t.File] = true
		if pi := cfg.partOf(t.File); pi >= 0 && bytes.Equal(cfg.parts[pi].src, t.Data) {
			continue
		}
		if err := step(parse(cfg, t.File, t.Data)); err != nil {
			return nil, Delta{Full: true}, err
		}
	}
	for _, t := range cfg.included() {
		if !found[t.File] {
			if err := step(ParseRemoved(cfg, t.File)); err != nil {
				return nil, Delta{Full: true}, err
			}
		}
	}
	if changed > 1 {
		delta = fullDelta(base, cfg)
	}
	return cfg, delta, nil
}

// parseFallback parses the files of base whole, with t in place of the
// file of the same name (or added), or without the file named gone, for
// the errors; or, when a file is valid in a way the block parser does not
// take, for the configuration.
func parseFallback(base *Config, t *Text, gone string) (*Config, Delta, error) {
	main := Text{}
	if base != nil {
		main = Text{File: base.File, Data: base.Source()}
	}
	if t != nil && (base == nil || t.File == base.File) {
		main = *t
	}
	included := func(cfg *Config) ([]includedText, error) {
		if base == nil || !slices.Equal(cfg.Include, base.Include) {
			return readIncluded(cfg.File, cfg.Include)
		}
		incl := base.included()
		if gone != "" {
			incl = slices.DeleteFunc(incl, func(x includedText) bool { return x.File == gone })
		}
		if t != nil && t.File != base.File {
			i := slices.IndexFunc(incl, func(x includedText) bool { return x.File == t.File })
			if i >= 0 {
				incl[i].Data = t.Data
			} else {
				rank := base.rankOf(t.File)
				j := partPos(base.parts, rank, t.File) - 1 // parts hold the main file first
				incl = slices.Insert(incl, max(j, 0), includedText{*t, rank})
			}
		}
		return incl, nil
	}
	cfg, err := parseWhole(main, included)
	if err != nil {
		return nil, Delta{Full: true}, err
	}
	return cfg, fullDelta(base, cfg), nil
}

func fullDelta(base, cfg *Config) Delta {
	d := Delta{Full: true, NewTo: len(cfg.Spec.Services)}
	if base != nil {
		d.OldTo = len(base.Spec.Services)
	}
	return d
}

// partPos returns where a part read from file, matched by include
// pattern rank, goes among parts: after the main file, by rank, then by
// name.
func partPos(parts []part, rank int, file string) int {
	i := 1
	for i < len(parts) && (parts[i].rank < rank || parts[i].rank == rank && parts[i].file < file) {
		i++
	}
	return i
}

// block is one validated [[service]] element.
type block struct {
	vs lb.VirtualService
	// health is the service's health checking, nil for none.
	health *ServiceHealth
}

// edit is a change of one file of a configuration: base's services
// [from, oldTo) become blocks, and the file's part becomes p (inserted
// before part pi with insert; part pi is removed when p is nil).
type edit struct {
	pi     int
	insert bool
	p      *part
	// from and oldTo index the replaced services in base.Spec.Services.
	from, oldTo int
	blocks      []block
	// settings holds the daemon settings of the result.
	settings *Config
	// spare, when set, may hold the result's services (see Spare).
	spare *Spare
}

// delta returns the Delta of e.
func (e *edit) delta() Delta {
	return Delta{From: e.from, OldTo: e.oldTo, NewTo: e.from + len(e.blocks)}
}

// parseMain parses the main file block by block. When the include
// patterns and the settings that validate services are base's, only the
// main file's blocks that changed are decoded and the included files are
// base's; otherwise every file is decoded, the included ones from base's
// texts when the patterns are the same, or else read from disk.
func parseMain(base *Config, file string, data []byte, sp *Spare) (*Config, Delta, error) {
	fallback := func() (*Config, Delta, error) { return parseFallback(base, &Text{File: file, Data: data}, "") }
	var old *part
	if base != nil {
		old = &base.parts[0]
	}
	chunks, keep, keepEnd := splitBlocks(data, old)
	settings := &Config{}
	if !decodePreamble(file, data[:preambleEnd(data, chunks)], settings) {
		return fallback()
	}
	same := base != nil && slices.Equal(settings.Include, base.Include)
	if same && settings.Daemon.ManageIPTables == base.Daemon.ManageIPTables {
		blocks, ok := readBlocks(file, data, chunks, keep, keepEnd, settings)
		if !ok {
			return fallback()
		}
		e := edit{p: &part{file: file, src: data, chunks: chunks, rank: -1}, from: keep, oldTo: base.partEnd(0) - keepEnd, blocks: blocks, settings: settings, spare: sp}
		cfg, ok := splice(base, e)
		if !ok {
			return fallback()
		}
		if !sameSettings(settings, base) {
			return cfg, fullDelta(base, cfg), nil
		}
		return cfg, e.delta(), nil
	}

	blocks, ok := readBlocks(file, data, chunks, 0, 0, settings)
	if !ok {
		return fallback()
	}
	parts := []part{{file: file, src: data, chunks: chunks, rank: -1}}
	var incl []includedText
	if same {
		incl = base.included()
	} else if len(settings.Include) > 0 {
		var err error
		if incl, err = readIncluded(file, settings.Include); err != nil {
			return nil, Delta{Full: true}, includeErrors(Text{File: file, Data: data}, err)
		}
	}
	for _, t := range incl {
		ch, bl, ok := parsePart(t.Text, settings)
		if !ok {
			return fallback()
		}
		parts = append(parts, part{file: t.File, src: t.Data, chunks: ch, first: len(blocks), rank: t.rank})
		blocks = append(blocks, bl...)
	}
	cfg, ok := splice(&Config{}, edit{from: 0, oldTo: 0, blocks: blocks, settings: settings})
	if !ok {
		return fallback()
	}
	cfg.File, cfg.parts = file, parts
	return cfg, fullDelta(base, cfg), nil
}

// parsePart decodes an included file block by block with the daemon
// settings of settings. It reports false for anything but [[service]]
// blocks that are each valid.
func parsePart(t Text, settings *Config) ([]int, []block, bool) {
	chunks := blockStarts(t.Data)
	if !emptyPreamble(t.Data[:preambleEnd(t.Data, chunks)]) {
		return nil, nil, false
	}
	blocks, ok := readBlocks(t.File, t.Data, chunks, 0, 0, settings)
	return chunks, blocks, ok
}

// blockStarts returns the offsets of data's blocks: 0 for the preamble,
// then the offset of each [[service]] line (see appendHeaders).
func blockStarts(data []byte) []int {
	return appendHeaders([]int{0}, data, 0, len(data))
}

// preambleEnd returns where the preamble of data, whose blocks start at
// chunks, ends.
func preambleEnd(data []byte, chunks []int) int {
	if len(chunks) > 1 {
		return chunks[1]
	}
	return len(data)
}

// splitBlocks returns the offsets of data's blocks, as blockStarts does.
// With old, the part of the same file in a base configuration, it also
// returns how many service blocks at the start of data (keep) and at its
// end (keepEnd) have the text of old's blocks there, and it looks for
// [[service]] lines only between those: blocks of the same text at the
// same offsets, from the start or from the end, start where old's did.
func splitBlocks(data []byte, old *part) (chunks []int, keep, keepEnd int) {
	if old == nil || old.chunks == nil {
		return blockStarts(data), 0, 0
	}
	oc, src := old.chunks, old.src
	n, d := len(oc), len(data)-len(src)
	end := func(j int) int { // the end of old's block j
		if j+1 < n {
			return oc[j+1]
		}
		return len(src)
	}
	// The same blocks from the start, but the last (which ends with the
	// file); after them, a block starts where old's did, unless its
	// [[service]] line changed.
	p := 0
	for p < n-1 && end(p) <= len(data) && bytes.Equal(src[oc[p]:end(p)], data[oc[p]:end(p)]) {
		p++
	}
	if p > 0 && nextHeader(data, oc[p], lineEnd(data, oc[p])) != oc[p] {
		p--
	}
	lo := oc[p] // where the blocks read again start
	// The same service blocks from the end, each on a line of its own.
	s := 0
	for j := n - 1; j >= max(p, 1) && oc[j]+d >= lo; j-- {
		at := oc[j] + d
		if !bytes.Equal(src[oc[j]:end(j)], data[at:end(j)+d]) || at > 0 && data[at-1] != '\n' {
			break
		}
		s++
	}
	hi := len(data)
	if s > 0 {
		hi = oc[n-s] + d
	}
	chunks = make([]int, 0, n+8)
	chunks = append(chunks, oc[:max(p, 1)]...)
	chunks = appendHeaders(chunks, data, lo, hi)
	for _, c := range oc[n-s:] {
		chunks = append(chunks, c+d)
	}
	return chunks, max(p-1, 0), s
}

// readBlocks decodes and validates data's service blocks, which start at
// chunks[1:], with the daemon settings of settings, but the first keep and
// the last keepEnd: it returns the blocks between those.
func readBlocks(file string, data []byte, chunks []int, keep, keepEnd int, settings *Config) ([]block, bool) {
	n := len(chunks) - 1
	end := len(data)
	if keepEnd > 0 {
		end = chunks[n-keepEnd+1]
	}
	blocks := make([]block, n-keep-keepEnd)
	return blocks, decodeBlocks(file, data, chunks[1+keep:1+n-keepEnd], end, keep, settings, blocks)
}

// emptyPreamble reports whether the text before an included file's first
// [[service]] holds nothing but blanks and comments.
func emptyPreamble(data []byte) bool {
	if !withinLimits(data) {
		return false
	}
	m, ok := decodeFast(data)
	return ok && len(m) == 0
}

// replacePart returns base with its part pi replaced by t, parsed block
// by block: inserted before part pi with insert, removed when t is nil.
func replacePart(base *Config, pi int, insert bool, t *includedText, sp *Spare) (*Config, Delta, error) {
	e := edit{pi: pi, insert: insert, settings: base, spare: sp}
	if insert {
		e.from = len(base.Spec.Services)
		if pi < len(base.parts) {
			e.from = base.parts[pi].first
		}
		e.oldTo = e.from
	} else {
		e.from, e.oldTo = base.parts[pi].first, base.partEnd(pi)
	}
	if t == nil {
		if cfg, ok := splice(base, e); ok {
			return cfg, e.delta(), nil
		}
		return parseFallback(base, nil, base.parts[pi].file)
	}
	var old *part
	if !insert {
		old = &base.parts[pi]
	}
	chunks, keep, keepEnd := splitBlocks(t.Data, old)
	if !emptyPreamble(t.Data[:preambleEnd(t.Data, chunks)]) {
		return parseFallback(base, &t.Text, "")
	}
	blocks, ok := readBlocks(t.File, t.Data, chunks, keep, keepEnd, base)
	if !ok {
		return parseFallback(base, &t.Text, "")
	}
	e.p = &part{file: t.File, src: t.Data, chunks: chunks, first: e.from, rank: t.rank}
	e.from += keep
	e.oldTo -= keepEnd
	e.blocks = blocks
	cfg, ok := splice(base, e)
	if !ok {
		return parseFallback(base, &t.Text, "")
	}
	return cfg, e.delta(), nil
}

// splice returns base with e applied, a new configuration that shares
// nothing with base that either may change. It reports false when the
// services conflict with one another (see conflicts).
func splice(base *Config, e edit) (*Config, bool) {
	old := base.Spec.Services[e.from:e.oldTo]
	newTo := e.from + len(e.blocks)
	var services []lb.VirtualService
	if len(old) == len(e.blocks) {
		services = e.spare.take(base)
	}
	if services != nil {
		for i := range e.blocks {
			services[e.from+i] = e.blocks[i].vs
		}
	} else if n := len(base.Spec.Services) - len(old) + len(e.blocks); n > 0 {
		services = make([]lb.VirtualService, n)
		copy(services, base.Spec.Services[:e.from])
		for i := range e.blocks {
			services[e.from+i] = e.blocks[i].vs
		}
		copy(services[newTo:], base.Spec.Services[e.oldTo:])
	}
	if conflicts(services, e.from, newTo, old) {
		return nil, false
	}
	// A pool must hold no VIP of the services: the added ones, or all
	// when the pools changed.
	k, check := &e.settings.Kubernetes, services[e.from:newTo]
	if !k.samePools(&base.Kubernetes) {
		check = services
	}
	if k.poolsHoldVIPs(check) {
		return nil, false
	}
	s := e.settings
	cfg := &Config{File: base.File, Include: s.Include, Daemon: s.Daemon, HA: s.HA, BGP: s.BGP, Kubernetes: s.Kubernetes, Spec: s.Spec}
	cfg.Spec.Services = services
	cfg.nb = base.nb - countBackends(old) + countBackends(services[e.from:newTo])
	cfg.Health = spliceHealth(base.Health, old, e.blocks)
	if len(base.parts) > 0 {
		parts := make([]part, 0, len(base.parts)+1)
		parts = append(parts, base.parts[:e.pi]...)
		if e.p != nil {
			parts = append(parts, *e.p)
		}
		rest := base.parts[e.pi:]
		if !e.insert {
			rest = rest[1:]
		}
		for _, q := range rest {
			q.first += newTo - e.oldTo
			parts = append(parts, q)
		}
		cfg.parts = parts
	}
	return cfg, true
}

// sameSettings reports whether a and b have the same settings outside
// their services.
func sameSettings(a, b *Config) bool {
	sa, sb := a.Spec, b.Spec
	sa.Services, sb.Services = nil, nil
	return reflect.DeepEqual(a.Daemon, b.Daemon) && a.HA.Equal(b.HA) && a.BGP.Equal(b.BGP) && a.Kubernetes.Equal(b.Kubernetes) && reflect.DeepEqual(sa, sb) && slices.Equal(a.Include, b.Include)
}

// spliceHealth returns h without the entries of the services in old and
// with those of blocks, copying h only if that changes anything.
func spliceHealth(h map[string]ServiceHealth, old []lb.VirtualService, blocks []block) map[string]ServiceHealth {
	touched := slices.ContainsFunc(old, func(vs lb.VirtualService) bool { _, ok := h[vs.Name]; return ok }) ||
		slices.ContainsFunc(blocks, func(b block) bool { return b.health != nil })
	if !touched {
		return h
	}
	out := maps.Clone(h)
	if out == nil {
		out = make(map[string]ServiceHealth, len(blocks))
	}
	for i := range old {
		delete(out, old[i].Name)
	}
	for i := range blocks {
		if blocks[i].health != nil {
			out[blocks[i].vs.Name] = *blocks[i].health
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// decodePreamble decodes and validates the text before the first
// [[service]] line into cfg's daemon settings and include patterns. It
// reports false for anything but a clean include key, [daemon], [ha],
// [bgp] and [kubernetes] sections.
func decodePreamble(file string, data []byte, cfg *Config) bool {
	var raw rawConfig
	if !withinLimits(data) || !decodeRaw(data, &raw, "daemon", "ha", "bgp", "kubernetes", "include") || len(raw.Service) > 0 {
		return false
	}
	v := &validator{file: file}
	v.daemon(&raw.Daemon, cfg)
	v.ha(&raw.HA, cfg)
	v.bgp(&raw.BGP, cfg)
	v.kubernetes(&raw.Kubernetes, cfg)
	cfg.Include = v.include(raw.Include, cfg.Daemon.Watch)
	return len(v.errs) == 0
}

// rawServiceBlock is what one [[service]] block decodes into.
type rawServiceBlock struct {
	Service []rawService `toml:"service"`
}

// decodeBlock decodes and validates the block of service i, with the
// daemon settings of cfg. It reports false for anything but one valid
// service and nothing else.
func decodeBlock(file string, data []byte, i int, cfg *Config) (block, bool) {
	var raw rawServiceBlock
	if !withinLimits(data) || !decodeRaw(data, &raw, "service") || len(raw.Service) != 1 {
		return block{}, false
	}
	r := &raw.Service[0]
	v := &validator{file: file}
	vs, ok := v.service(i, r, cfg)
	if !ok {
		return block{}, false
	}
	h, ok := v.serviceHealth(i, r, &vs)
	if len(v.errs) > 0 {
		return block{}, false
	}
	b := block{vs: vs}
	if ok && (len(h.Checks) > 0 || h.Policy != (check.Policy{})) {
		b.health = &h
	}
	return b, true
}

// decodeBlocks decodes the blocks starting at starts (the last one ends
// at end) into out, in parallel when there are many. The first is
// service first.
func decodeBlocks(file string, data []byte, starts []int, end, first int, cfg *Config, out []block) bool {
	n := len(starts)
	decode := func(i int) bool {
		e := end
		if i+1 < n {
			e = starts[i+1]
		}
		b, ok := decodeBlock(file, data[starts[i]:e], first+i, cfg)
		out[i] = b
		return ok
	}
	const batch = 16
	workers := min(runtime.GOMAXPROCS(0), (n+batch-1)/batch)
	if workers <= 1 {
		for i := range n {
			if !decode(i) {
				return false
			}
		}
		return true
	}
	var (
		next   atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for !failed.Load() {
				lo := int(next.Add(batch)) - batch
				if lo >= n {
					return
				}
				for i := lo; i < min(lo+batch, n); i++ {
					if !decode(i) {
						failed.Store(true)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// appendHeaders appends the offsets of the lines in data[from:to] that
// start a top-level [[service]] element: "[[service]]", with optional
// blanks around the name and the brackets, and an optional comment.
// Such a line inside a multi-line string or array is found too; the block
// that it ends then fails to decode (the string or array is unterminated).
func appendHeaders(dst []int, data []byte, from, to int) []int {
	for from < to {
		h := nextHeader(data, from, to)
		if h < 0 {
			break
		}
		dst = append(dst, h)
		from = lineEnd(data, h)
	}
	return dst
}

// nextHeader returns the offset of the first [[service]] line (see
// appendHeaders) that starts in data[from:to], or -1.
func nextHeader(data []byte, from, to int) int {
	for i := from; i < to; {
		j := bytes.Index(data[i:to], []byte("[["))
		if j < 0 {
			break
		}
		j += i
		if ls, ok := serviceHeader(data, j); ok && ls >= from {
			return ls
		}
		i = j + 2
	}
	return -1
}

// serviceHeader reports whether the "[[" at data[j] starts a [[service]]
// line, and the offset of that line.
func serviceHeader(data []byte, j int) (int, bool) {
	ls := j
	for ls > 0 && (data[ls-1] == ' ' || data[ls-1] == '\t') {
		ls--
	}
	if ls > 0 && data[ls-1] != '\n' {
		return 0, false
	}
	k := skipBlanks(data, j+2)
	if !bytes.HasPrefix(data[k:], []byte("service")) {
		return 0, false
	}
	k = skipBlanks(data, k+len("service"))
	if !bytes.HasPrefix(data[k:], []byte("]]")) {
		return 0, false
	}
	k = skipBlanks(data, k+2)
	switch {
	case k == len(data), data[k] == '\n', data[k] == '#':
	case data[k] == '\r' && k+1 < len(data) && data[k+1] == '\n':
	default:
		return 0, false
	}
	return ls, true
}

func skipBlanks(data []byte, k int) int {
	for k < len(data) && (data[k] == ' ' || data[k] == '\t') {
		k++
	}
	return k
}

// lineEnd returns the offset of the newline that ends the line at i, or
// len(data).
func lineEnd(data []byte, i int) int {
	if j := bytes.IndexByte(data[i:], '\n'); j >= 0 {
		return i + j
	}
	return len(data)
}

// svcKey identifies a service for the duplicate check: NodePort services
// are compared among themselves, by protocol, port and family.
type svcKey struct {
	key      lb.ServiceKey
	nodePort bool
}

// index holds what must be unique among some services, for the checks
// across services of validator.services: their names, keys, VIPs (by
// announce, false and true) and backends' addresses.
type index struct {
	names    map[string]int32
	keys     map[svcKey]int32
	vips     map[netip.Addr][2]int32
	backends map[netip.Addr]int32
	// bad says that the services conflict: a name or key used twice, a
	// VIP announced and not, an address both a VIP and a backend's.
	bad bool
}

// newIndex returns the index of services.
func newIndex(services []lb.VirtualService) *index {
	nb := 0
	for i := range services {
		nb += len(services[i].Backends)
	}
	x := &index{
		names:    make(map[string]int32, len(services)),
		keys:     make(map[svcKey]int32, len(services)),
		vips:     make(map[netip.Addr][2]int32, len(services)),
		backends: make(map[netip.Addr]int32, nb),
	}
	for i := range services {
		x.add(&services[i])
	}
	return x
}

func (x *index) add(vs *lb.VirtualService) {
	x.names[vs.Name]++
	k := svcKey{vs.Service.Key, vs.NodePort}
	x.keys[k]++
	x.bad = x.bad || x.names[vs.Name] > 1 || x.keys[k] > 1
	if vs.VIP.IsValid() {
		c := x.vips[vs.VIP]
		c[b2i(vs.Announce)]++
		x.vips[vs.VIP] = c
		x.bad = x.bad || c[0] > 0 && c[1] > 0 || x.backends[vs.VIP] > 0
	}
	for i := range vs.Backends {
		a := vs.Backends[i].Addr.Addr()
		x.backends[a]++
		_, onVIP := x.vips[a]
		x.bad = x.bad || onVIP
	}
}

// conflicts reports whether services conflict with one another (see
// index), knowing that they did not with removed in place of the added
// services[from:to]. A conflict then involves an added service, and one of
// the others only for what the added services hold that the removed ones
// did not: the others are walked only for that, and not at all when an
// edit keeps every name, key, VIP and backend address.
func conflicts(services []lb.VirtualService, from, to int, removed []lb.VirtualService) bool {
	a := newIndex(services[from:to])
	if a.bad {
		return true
	}
	if from == 0 && to == len(services) {
		return false
	}
	r := newIndex(removed)
	walkServices := !subset(a.names, r.names) || !subset(a.keys, r.keys) || !subset(a.backends, r.backends)
	walkBackends := false
	for v, c := range a.vips {
		rc := r.vips[v]
		walkBackends = walkBackends || rc == [2]int32{}
		walkServices = walkServices || c[0] > 0 && rc[0] == 0 || c[1] > 0 && rc[1] == 0
	}
	if !walkServices && !walkBackends {
		return false
	}
	for i := range services {
		if i >= from && i < to {
			continue
		}
		vs := &services[i]
		if a.names[vs.Name] > 0 || a.keys[svcKey{vs.Service.Key, vs.NodePort}] > 0 {
			return true
		}
		if vs.VIP.IsValid() && (a.vips[vs.VIP][b2i(!vs.Announce)] > 0 || a.backends[vs.VIP] > 0) {
			return true
		}
		if walkBackends {
			for j := range vs.Backends {
				if _, ok := a.vips[vs.Backends[j].Addr.Addr()]; ok {
					return true
				}
			}
		}
	}
	return false
}

// subset reports whether every key of a is a key of b.
func subset[K comparable, V any](a map[K]V, b map[K]V) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
