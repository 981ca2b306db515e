package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/status"
)

// noteReload runs a reload and records what it did for the status page
// (Snapshot.Reload).
func (a *Agent) noteReload(ctx context.Context, in fileRead, force bool) (Outcome, error) {
	out, err := a.reload(ctx, in, force)
	r := &status.Reload{Time: time.Now(), Why: in.why, File: in.name(), Result: "applied",
		Applied: len(out.Applied), Failed: len(out.Failed), Changes: opCounts(out.Applied)}
	if in.all {
		r.File = ""
	} else {
		r.File = a.relative(in.file)
	}
	if err != nil {
		r.Result, r.Error = "failed", err.Error()
	}
	a.lastReload = r
	if a.stats != nil {
		a.stats.Invalidate()
	}
	return out, err
}

// opCounts counts ops by kind, in order of first appearance: "add-backend 3".
func opCounts(ops []lb.Op) []string {
	var kinds []lb.OpKind
	n := map[lb.OpKind]int{}
	for _, op := range ops {
		if n[op.Kind] == 0 {
			kinds = append(kinds, op.Kind)
		}
		n[op.Kind]++
	}
	out := make([]string, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, fmt.Sprintf("%s %d", k, n[k]))
	}
	return out
}

// annotate adds to snap what only the agent knows: the source of each
// service, and the last reload. It runs in the main loop.
func (a *Agent) annotate(snap *status.Snapshot) {
	snap.Reload = a.lastReload
	if len(a.sources.by) == 0 {
		return
	}
	for i := range snap.Services {
		s := &snap.Services[i]
		for name, st := range a.sources.by {
			if st != nil && st.taken[s.Name] {
				s.Source = name
				break
			}
		}
	}
}

// LastStatus returns the last status snapshot taken, however old, without
// taking one; nil before the first (or if the last take failed).
func (a *Agent) LastStatus() *status.Snapshot {
	if a.stats == nil {
		return nil
	}
	snap, err := a.stats.Last()
	if err != nil {
		return nil
	}
	return snap
}
