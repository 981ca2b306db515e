package lb

import (
	"fmt"
	"maps"
	"slices"
)

// Fresh is a read of the kernel's sysctls and rules made beside the
// passes (see ReadFresh), so that a resync's read of them, its slowest
// part (iptables-save), holds up no pass.
type Fresh struct {
	// writes is the count of operations on sysctls and rules when the
	// read began.
	writes  uint64
	sysctls map[string]string
	rules   *Rules
}

// ReadFresh reads from the kernel the sysctls the reconciler caches and
// vipd's rules, as the first pass after Refresh would, without holding
// the reconciler: passes may run meanwhile. UseFresh then hands the read
// to the passes that follow.
func (r *Reconciler) ReadFresh() (*Fresh, error) {
	r.mu.Lock()
	// No pass runs while r.mu is held: every operation counted has
	// ended, and the read below sees it.
	f := &Fresh{writes: r.hostWrites.Load()}
	paths := slices.Collect(maps.Keys(r.sysctls))
	r.mu.Unlock()
	k := r.opts.Kernel
	if k.Sysctls != nil {
		f.sysctls = make(map[string]string, len(paths))
		for _, path := range paths {
			// A sysctl that cannot be read is left out: the pass reads
			// it again (see observe).
			if v, err := k.Sysctls.Get(path); err == nil {
				f.sysctls[path] = v
			}
		}
	}
	if k.Rules != nil {
		rules, err := k.Rules.Observe()
		if err != nil {
			return nil, fmt.Errorf("observe rules: %w", err)
		}
		if rules.Entries == nil {
			rules.Entries = map[SetEntry]struct{}{}
		}
		f.rules = &rules
	}
	return f, nil
}

// UseFresh makes the sysctls and rules of f, a read by ReadFresh, what the
// next passes trust, as a pass after Refresh would have read them. It
// reports false, changing nothing, when a pass operated on sysctls or
// rules since the read began, since the read may have missed that: the
// caller then calls Refresh, and the next pass reads them itself.
func (r *Reconciler) UseFresh(f *Fresh) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hostWrites.Load() != f.writes {
		return false
	}
	r.sysctls, r.rules = f.sysctls, f.rules
	return true
}
