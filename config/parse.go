package config

import (
	"bytes"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/BurntSushi/toml"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
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
// nil; file is then the main file. base is never modified, so the caller
// may keep it (to roll back, or after a rejected reload).
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
// a base, only the blocks that span the bytes that differ from base's
// text of the file are decoded again, and the others are taken from base;
// that costs a comparison of the two texts, a copy of base's services and
// the changed blocks, unless the change of the preamble changes how
// services are validated (manage_iptables). Whatever this path does not
// understand (a decode or validation error, a conflict between services, a
// [[service]] line inside a multi-line string, a table other than the
// service's inside its block, ...) is left to a parse of every file whole,
// which reports every error with its file and line.
//
// Configurations parsed from one another share an index of their services'
// names, keys and VIPs, which belongs to the latest of them: calls of
// ParseFrom on configurations of one such chain must not run concurrently.
// The daemon calls it from its main loop only. The configuration keeps
// data (see Texts): the caller must not modify it afterwards.
//
// When the configuration has exec checks, check_user is looked up (see
// Config.resolveExec).
func ParseFrom(base *Config, file string, data []byte) (*Config, Delta, error) {
	return resolved(base)(parseFrom(base, file, data))
}

// resolved returns what completes the result of a parse from base: the
// exec checks' user, or an error.
func resolved(base *Config) func(*Config, Delta, error) (*Config, Delta, error) {
	return func(cfg *Config, d Delta, err error) (*Config, Delta, error) {
		if err != nil {
			return cfg, d, err
		}
		if err := cfg.resolveExec(base, d); err != nil {
			return nil, Delta{Full: true}, err
		}
		return cfg, d, nil
	}
}

func parseFrom(base *Config, file string, data []byte) (*Config, Delta, error) {
	if base == nil || file == base.File {
		return parseMain(base, file, data)
	}
	file = filepath.Clean(file)
	pi := base.partOf(file)
	if pi < 0 {
		rank := base.rankOf(file)
		if rank < 0 {
			return nil, Delta{Full: true}, Errors{{File: file, Msg: fmt.Sprintf("not part of the configuration: no include pattern of %s matches it", base.File)}}
		}
		return replacePart(base, partPos(base.parts, rank, file), true, &includedText{Text{File: file, Data: data}, rank})
	}
	cfg, d, st := parseDelta(base, pi, file, data)
	switch st {
	case deltaDone:
		return cfg, d, nil
	case deltaFallback:
		return parseFallback(base, &Text{File: file, Data: data}, "")
	}
	return replacePart(base, pi, false, &includedText{Text{File: file, Data: data}, base.parts[pi].rank})
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
	return replacePart(base, pi, false, nil)
}

// Reload reads base's main file and every file it includes again, and
// returns the configuration they make and its Delta from base: the
// changes of several files count as a full change.
func Reload(base *Config) (*Config, Delta, error) {
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
		if err := step(ParseFrom(base, base.File, data)); err != nil {
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
		if err := step(ParseFrom(cfg, t.File, t.Data)); err != nil {
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

// parseMain parses the main file whole, block by block. The included files
// are base's when the include patterns are the same (and so are their
// services, unless the settings that validate them changed), or else read
// from disk.
func parseMain(base *Config, file string, data []byte) (*Config, Delta, error) {
	if base != nil {
		cfg, d, st := parseDelta(base, 0, file, data)
		switch st {
		case deltaDone:
			return cfg, d, nil
		case deltaFallback:
			return parseFallback(base, &Text{File: file, Data: data}, "")
		}
	}
	chunks := appendHeaders([]int{0}, data, 0, len(data))
	end := len(data)
	if len(chunks) > 1 {
		end = chunks[1]
	}
	settings := &Config{}
	if !decodePreamble(file, data[:end], settings) {
		return parseFallback(base, &Text{File: file, Data: data}, "")
	}
	n := len(chunks) - 1
	blocks := make([]block, n)
	if !decodeBlocks(file, data, chunks[1:], len(data), 0, settings, blocks) {
		return parseFallback(base, &Text{File: file, Data: data}, "")
	}
	parts := []part{{file: file, src: data, chunks: chunks, rank: -1}}
	same := base != nil && slices.Equal(settings.Include, base.Include)
	reuse := same && settings.Daemon.ManageIPTables == base.Daemon.ManageIPTables
	var kept []lb.VirtualService // base's services of the included files
	if reuse {
		mainEnd := base.partEnd(0)
		kept = base.Spec.Services[mainEnd:]
		for _, q := range base.parts[1:] {
			q.first += n - mainEnd
			parts = append(parts, q)
		}
	} else {
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
				return parseFallback(base, &Text{File: file, Data: data}, "")
			}
			parts = append(parts, part{file: t.File, src: t.Data, chunks: ch, first: len(blocks), rank: t.rank})
			blocks = append(blocks, bl...)
		}
	}
	cfg := &Config{File: file, Include: settings.Include, Daemon: settings.Daemon, Spec: settings.Spec, parts: parts}
	if total := len(blocks) + len(kept); total > 0 {
		cfg.Spec.Services = make([]lb.VirtualService, total)
	}
	copy(cfg.Spec.Services[len(blocks):], kept)
	idx := &index{}
	idx.reset()
	for i := range blocks {
		cfg.Spec.Services[i] = blocks[i].vs
	}
	for i := range cfg.Spec.Services {
		idx.add(&cfg.Spec.Services[i], 1)
	}
	if idx.bad > 0 {
		return parseFallback(base, &Text{File: file, Data: data}, "")
	}
	if reuse {
		cfg.Health = spliceHealth(base.Health, base.Spec.Services[:base.partEnd(0)], blocks)
	} else {
		for i := range blocks {
			if h := blocks[i].health; h != nil {
				if cfg.Health == nil {
					cfg.Health = map[string]ServiceHealth{}
				}
				cfg.Health[blocks[i].vs.Name] = *h
			}
		}
	}
	cfg.idx = idx
	idx.owner = cfg
	if reuse && sameSettings(settings, base) {
		return cfg, Delta{OldTo: base.partEnd(0), NewTo: n}, nil
	}
	return cfg, fullDelta(base, cfg), nil
}

// parsePart decodes an included file block by block with the daemon
// settings of settings. It reports false for anything but [[service]]
// blocks that are each valid.
func parsePart(t Text, settings *Config) ([]int, []block, bool) {
	chunks := appendHeaders([]int{0}, t.Data, 0, len(t.Data))
	end := len(t.Data)
	if len(chunks) > 1 {
		end = chunks[1]
	}
	if !emptyPreamble(t.Data[:end]) {
		return nil, nil, false
	}
	blocks := make([]block, len(chunks)-1)
	if !decodeBlocks(t.File, t.Data, chunks[1:], len(t.Data), 0, settings, blocks) {
		return nil, nil, false
	}
	return chunks, blocks, true
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

// replacePart returns base with its part pi replaced by t, parsed whole
// block by block: inserted before part pi with insert, removed when t is
// nil.
func replacePart(base *Config, pi int, insert bool, t *includedText) (*Config, Delta, error) {
	e := edit{pi: pi, insert: insert, settings: base}
	if insert {
		e.from = len(base.Spec.Services)
		if pi < len(base.parts) {
			e.from = base.parts[pi].first
		}
		e.oldTo = e.from
	} else {
		e.from, e.oldTo = base.parts[pi].first, base.partEnd(pi)
	}
	gone := ""
	var ft *Text
	if t != nil {
		ch, bl, ok := parsePart(t.Text, base)
		if !ok {
			return parseFallback(base, &t.Text, "")
		}
		e.p = &part{file: t.File, src: t.Data, chunks: ch, first: e.from, rank: t.rank}
		e.blocks = bl
		ft = &t.Text
	} else {
		gone = base.parts[pi].file
	}
	cfg, st := splice(base, e)
	if st != deltaDone {
		return parseFallback(base, ft, gone)
	}
	return cfg, Delta{From: e.from, OldTo: e.oldTo, NewTo: e.from + len(e.blocks)}, nil
}

type deltaStatus int

const (
	// deltaDone: the incremental parse succeeded.
	deltaDone deltaStatus = iota
	// deltaCold: base cannot help (the preamble changed, ...); parse
	// block by block from scratch.
	deltaCold
	// deltaFallback: the file has a problem; parse it whole for the
	// errors.
	deltaFallback
)

// parseDelta parses data, the new text of base's part pi, again only
// where it differs from the part's text.
func parseDelta(base *Config, pi int, file string, data []byte) (*Config, Delta, deltaStatus) {
	bp := &base.parts[pi]
	nc := len(bp.chunks)
	if nc < 2 || bp.file != file {
		// Without services, any change is in the preamble.
		return nil, Delta{}, deltaCold
	}
	a, b := bp.src, data
	d := len(b) - len(a)
	k, m := nc, nc // the blocks bp.chunks[k:m] are parsed again
	// The daemon settings, from base unless the preamble changed.
	settings := base
	var (
		starts []int
		blocks []block
		decode func() bool // decodes the changed blocks
	)
	if p, s := diffRange(a, b); p+s < len(a) || d != 0 {
		ea := len(a) - s // a[p:ea] became b[p:len(b)-s]

		// Block k is the last whose [[service]] line lies wholly in the
		// common prefix: blocks before it are unchanged and still end
		// where block k starts, at the same offset in both texts (loA
		// and loB).
		k = sort.SearchInts(bp.chunks, p) - 1 // the last block starting before p
		for k >= 1 && lineEnd(a, bp.chunks[k]) >= p {
			k--
		}
		loA, loB := 0, 0
		if k >= 1 {
			loA, loB = bp.chunks[k], bp.chunks[k]
		} else {
			// The preamble may have changed: read it again. The blocks
			// from the first one on can be kept as long as their
			// validation does not change.
			h := nextHeader(b, 0, len(b))
			if h < 0 {
				return nil, Delta{}, deltaCold
			}
			if pi == 0 {
				settings = &Config{}
				if !decodePreamble(file, b[:h], settings) {
					return nil, Delta{}, deltaFallback
				}
				if settings.Daemon.ManageIPTables != base.Daemon.ManageIPTables || !slices.Equal(settings.Include, base.Include) {
					return nil, Delta{}, deltaCold
				}
			} else if !emptyPreamble(b[:h]) {
				return nil, Delta{}, deltaFallback
			}
			k, loA, loB = 1, bp.chunks[1], h
		}
		// Block m is the first after k whose [[service]] line, and the
		// newline before it, lie wholly in the common suffix: it and the
		// blocks after it are unchanged. nc stands for the end of the
		// file.
		m = sort.Search(nc, func(i int) bool { return bp.chunks[i] > ea })
		hiA := len(a)
		if m < nc {
			hiA = bp.chunks[m]
		}
		hiB := hiA + d
		if hiA < loA || hiB < loB {
			return nil, Delta{}, deltaCold // cannot happen
		}
		starts = appendHeaders(nil, b, loB, hiB)
		if loB < hiB && (len(starts) == 0 || starts[0] != loB) {
			return nil, Delta{}, deltaCold // cannot happen: a block starts at loB
		}
		blocks = make([]block, len(starts))
		decode = func() bool { return decodeBlocks(file, b, starts, hiB, k-1, settings, blocks) }
	}
	chunks := make([]int, 0, nc-(m-k)+len(starts))
	chunks = append(chunks, bp.chunks[:k]...)
	chunks = append(chunks, starts...)
	for _, c := range bp.chunks[m:] {
		chunks = append(chunks, c+d)
	}
	e := edit{
		pi: pi, p: &part{file: bp.file, src: b, chunks: chunks, first: bp.first, rank: bp.rank},
		from: bp.first + k - 1, oldTo: bp.first + m - 1,
		blocks: blocks, decode: decode, settings: settings,
	}
	cfg, st := splice(base, e)
	if st != deltaDone {
		return nil, Delta{}, st
	}
	if settings != base && !sameSettings(settings, base) {
		return cfg, fullDelta(base, cfg), deltaDone
	}
	return cfg, Delta{From: e.from, OldTo: e.oldTo, NewTo: e.from + len(blocks)}, deltaDone
}

// edit is a change of one file of a configuration: its services
// [from, oldTo) become blocks and its part becomes p (inserted before part
// pi with insert; part pi is removed when p is nil).
type edit struct {
	pi     int
	insert bool
	p      *part
	// from and oldTo index the replaced services in base.Spec.Services.
	from, oldTo int
	blocks      []block
	// decode, if not nil, fills blocks; it runs while the services that
	// stay are copied.
	decode func() bool
	// settings holds the daemon settings of the result.
	settings *Config
}

// splice applies e to base.
//
// An edit that keeps the number of services, of a configuration that is
// the latest of its chain and was itself made by such an edit of a
// configuration since retired (the daemon's running configuration, made
// from the one it replaced), takes the retired configuration's service
// array: it differs from base's only where base's edit was, so bringing
// it up to date and writing e's services costs the two edits, not a copy
// of every service.
func splice(base *Config, e edit) (*Config, deltaStatus) {
	old := base.Spec.Services[e.from:e.oldTo]
	newTo := e.from + len(e.blocks)
	var reuse []lb.VirtualService
	if p := base.pred; p != nil && p.retired && base.idx != nil && base.idx.owner == base &&
		len(e.blocks) == len(old) && len(p.Spec.Services) == len(base.Spec.Services) {
		reuse = p.Spec.Services
	}

	// Copy the services that stay while the changed blocks are decoded:
	// both take about as long for a large file.
	var services []lb.VirtualService
	n := len(base.Spec.Services) - len(old) + len(e.blocks)
	spliceCopy := func() {
		if n > 0 && reuse == nil {
			services = make([]lb.VirtualService, n)
			copy(services, base.Spec.Services[:e.from])
			copy(services[newTo:], base.Spec.Services[e.oldTo:])
		}
	}
	decoded := true
	if e.decode != nil && n >= parallelSpliceMin && reuse == nil && runtime.GOMAXPROCS(0) > 1 {
		var wg sync.WaitGroup
		wg.Go(func() { decoded = e.decode() })
		spliceCopy()
		wg.Wait()
	} else {
		if e.decode != nil {
			decoded = e.decode()
		}
		if decoded {
			spliceCopy()
		}
	}
	if !decoded {
		return nil, deltaFallback
	}

	idx := base.idx
	if idx == nil || idx.owner != base {
		if idx == nil {
			idx = &index{}
		}
		idx.rebuild(base)
	}
	for i := range old {
		idx.add(&old[i], -1)
	}
	for i := range e.blocks {
		idx.add(&e.blocks[i].vs, 1)
	}
	if idx.bad > 0 {
		// Undo, so that the index still describes base.
		for i := range e.blocks {
			idx.add(&e.blocks[i].vs, -1)
		}
		for i := range old {
			idx.add(&old[i], 1)
		}
		return nil, deltaFallback
	}

	s := e.settings
	cfg := &Config{File: base.File, Include: s.Include, Daemon: s.Daemon, Spec: s.Spec, idx: idx}
	if reuse != nil {
		// Only now that the edit cannot fail: the array then stays as
		// it was for the next attempt.
		copy(reuse[base.predFrom:base.predTo], base.Spec.Services[base.predFrom:base.predTo])
		services = reuse
		base.pred.Spec.Services = nil // it is cfg's now
	}
	// base's predecessor is never reused from base again: its array is
	// cfg's, or base is no longer the latest of its chain.
	base.pred = nil
	if len(e.blocks) == len(old) {
		cfg.pred, cfg.predFrom, cfg.predTo = base, e.from, e.oldTo
	}
	for i := range e.blocks {
		services[e.from+i] = e.blocks[i].vs
	}
	if base.nb > 0 {
		cfg.nb = base.nb
		for i := range old {
			cfg.nb -= len(old[i].Backends)
		}
		for i := range e.blocks {
			cfg.nb += len(e.blocks[i].vs.Backends)
		}
	}
	cfg.Spec.Services = services
	cfg.Health = spliceHealth(base.Health, old, e.blocks)

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
	idx.owner = cfg
	return cfg, deltaDone
}

// sameSettings reports whether a and b have the same settings outside
// their services.
func sameSettings(a, b *Config) bool {
	sa, sb := a.Spec, b.Spec
	sa.Services, sb.Services = nil, nil
	return reflect.DeepEqual(a.Daemon, b.Daemon) && reflect.DeepEqual(sa, sb) && slices.Equal(a.Include, b.Include)
}

// spliceHealth returns h without the entries of the services in old and
// with those of blocks, copying h only if that changes anything.
func spliceHealth(h map[string]ServiceHealth, old []lb.VirtualService, blocks []block) map[string]ServiceHealth {
	touched := false
	for i := range old {
		if _, ok := h[old[i].Name]; ok {
			touched = true
			break
		}
	}
	for i := range blocks {
		if blocks[i].health != nil {
			touched = true
			break
		}
	}
	if !touched {
		return h
	}
	out := make(map[string]ServiceHealth, len(h)+len(blocks))
	for name, sh := range h {
		out[name] = sh
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
// reports false for anything but a clean include key and [daemon] section.
func decodePreamble(file string, data []byte, cfg *Config) bool {
	if !withinLimits(data) || tooManyKeys(data) {
		return false
	}
	var pre *rawConfig
	if m, ok := decodeFast(data); ok {
		c := converter{ok: true}
		if pre = c.preamble(m); !c.ok {
			pre = nil
		}
	}
	if pre == nil {
		// Something go-toml or the conversion does not know: let
		// BurntSushi fill the raw structure as it does for the whole file.
		var raw rawConfig
		md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
		if err != nil || len(raw.Service) > 0 || len(md.Undecoded()) > 0 {
			return false
		}
		for _, k := range md.Keys() {
			// Only [daemon] and include, spelt exactly so: the decoder
			// also matches keys such as "Service" to fields, which the
			// whole file could spell both ways.
			if k[0] != "daemon" && k[0] != "include" {
				return false
			}
		}
		pre = &raw
	}
	v := &validator{file: file}
	v.daemon(&pre.Daemon, cfg)
	cfg.Include = v.include(pre.Include, cfg.Daemon.Watch)
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
	if !withinLimits(data) || tooManyKeys(data) {
		return block{}, false
	}
	var r *rawService
	if m, ok := decodeFast(data); ok {
		c := converter{ok: true}
		if r = c.serviceBlock(m); !c.ok {
			r = nil
		}
	}
	if r == nil {
		// Something go-toml or the conversion does not know: let
		// BurntSushi fill the raw structure as it does for the whole file.
		var raw rawServiceBlock
		md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
		if err != nil || len(raw.Service) != 1 || len(md.Undecoded()) > 0 {
			return block{}, false
		}
		for _, k := range md.Keys() {
			if k[0] != "service" {
				return block{}, false
			}
		}
		r = &raw.Service[0]
	}
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
	if ok && (len(h.Checks) > 0 || h.Policy != (health.Policy{})) {
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

// The steps by which commonPrefix and commonSuffix narrow down the first
// difference: large steps compare at memory speed, each later one
// searches the one step the previous one stopped at.
var equalSteps = [...]int{64 << 10, 4 << 10, 256, 16, 1}

// parallelSpliceMin is the number of services from which an incremental
// parse copies the unchanged ones while it decodes the changed ones.
const parallelSpliceMin = 1000

// parallelDiffMin is the size from which diffRange compares from both ends
// at once.
const parallelDiffMin = 1 << 20

// diffRange returns lengths p and s of a common prefix and a common suffix
// of a and b that do not overlap (p+s <= min(len(a), len(b))), so that
// a[p:len(a)-s] became b[p:len(b)-s]. For a large text the prefix and the
// suffix are compared at once, on two processors; they then stop where
// they meet, and the range may be wider than the smallest one (at most by
// a step of the comparison), which is still correct.
func diffRange(a, b []byte) (p, s int) {
	n := min(len(a), len(b))
	if n < parallelDiffMin || runtime.GOMAXPROCS(0) < 2 {
		p = commonPrefix(a, b)
		return p, commonSuffix(a[p:], b[p:])
	}
	// Each side publishes how far it has compared; each stops once the two
	// cover everything.
	var pDone, sDone atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { s = scanEqual(a, b, n, true, &sDone, &pDone) })
	p = scanEqual(a, b, n, false, &pDone, &sDone)
	wg.Wait()
	return p, min(s, n-p)
}

// scanEqual returns the length of the common prefix (or, with suffix, the
// common suffix) of a and b within n bytes, or less once it and the other
// side together cover n. It publishes its progress in done.
func scanEqual(a, b []byte, n int, suffix bool, done, other *atomic.Int64) int {
	la, lb := len(a), len(b)
	eq := func(i, step int) bool {
		if suffix {
			return bytes.Equal(a[la-i-step:la-i], b[lb-i-step:lb-i])
		}
		return bytes.Equal(a[i:i+step], b[i:i+step])
	}
	i := 0
	for _, step := range equalSteps {
		for i+step <= n && eq(i, step) {
			i += step
			if step == equalSteps[0] {
				done.Store(int64(i))
				if i+int(other.Load()) >= n {
					return i
				}
			}
		}
	}
	return i
}

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	var done, other atomic.Int64
	return scanEqual(a, b, min(len(a), len(b)), false, &done, &other)
}

// commonSuffix returns the length of the longest common suffix of a and b.
func commonSuffix(a, b []byte) int {
	var done, other atomic.Int64
	return scanEqual(a, b, min(len(a), len(b)), true, &done, &other)
}

// svcKey identifies a service for the duplicate check: NodePort services
// are compared among themselves, by protocol, port and family.
type svcKey struct {
	key      lb.ServiceKey
	nodePort bool
}

// index counts what must be unique among services, so that an incremental
// parse checks the cross-service rules of validator.config in the time of
// the blocks it replaces. It describes the services of owner only; the
// configurations of a chain of incremental parses share it.
type index struct {
	owner *Config
	names map[string]int32
	keys  map[svcKey]int32
	// vips counts the services on each VIP by announce (false, true).
	vips map[netip.Addr][2]int32
	// backends counts the backends on each address.
	backends map[netip.Addr]int32
	// bad is the number of names, keys and VIPs in conflict, and of
	// addresses that are both a VIP and a backend.
	bad int
}

func (x *index) reset() {
	if x.names == nil {
		x.names = map[string]int32{}
		x.keys = map[svcKey]int32{}
		x.vips = map[netip.Addr][2]int32{}
		x.backends = map[netip.Addr]int32{}
	} else {
		clear(x.names)
		clear(x.keys)
		clear(x.vips)
		clear(x.backends)
	}
	x.bad = 0
	x.owner = nil
}

// rebuild makes x describe base.
func (x *index) rebuild(base *Config) {
	x.reset()
	for i := range base.Spec.Services {
		x.add(&base.Spec.Services[i], 1)
	}
	x.owner = base
}

// add counts vs in (d = 1) or out (d = -1).
func (x *index) add(vs *lb.VirtualService, d int32) {
	n := x.names[vs.Name]
	x.bad -= b2i(n > 1)
	n += d
	x.bad += b2i(n > 1)
	if n == 0 {
		delete(x.names, vs.Name)
	} else {
		x.names[vs.Name] = n
	}

	k := svcKey{vs.Service.Key, vs.NodePort}
	n = x.keys[k]
	x.bad -= b2i(n > 1)
	n += d
	x.bad += b2i(n > 1)
	if n == 0 {
		delete(x.keys, k)
	} else {
		x.keys[k] = n
	}

	if vs.VIP.IsValid() {
		c := x.vips[vs.VIP]
		x.bad -= b2i(c[0] > 0 && c[1] > 0) + b2i(x.onVIP(vs.VIP))
		c[b2i(vs.Announce)] += d
		if c == [2]int32{} {
			delete(x.vips, vs.VIP)
		} else {
			x.vips[vs.VIP] = c
		}
		x.bad += b2i(c[0] > 0 && c[1] > 0) + b2i(x.onVIP(vs.VIP))
	}
	for i := range vs.Backends {
		a := vs.Backends[i].Addr.Addr()
		n := x.backends[a]
		if n+d == 0 {
			delete(x.backends, a)
		} else {
			x.backends[a] = n + d
		}
		// The address's conflict changes only when its first backend
		// comes or its last one goes.
		if (n == 0) != (n+d == 0) {
			if _, ok := x.vips[a]; ok {
				x.bad += b2i(n == 0) - b2i(n+d == 0)
			}
		}
	}
}

// onVIP reports whether a is both a VIP and a backend's address.
func (x *index) onVIP(a netip.Addr) bool {
	if x.backends[a] == 0 {
		return false
	}
	_, ok := x.vips[a]
	return ok
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
