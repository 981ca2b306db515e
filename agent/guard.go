package agent

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// guard refuses a change that removes more than reload_guard of the
// running configuration's services or backends, or of those of any one
// of its files: a truncated included file is refused as a truncated main
// file is. A file that is gone (deleted, or moved out of the include
// patterns) was removed on purpose and only counts towards the whole.
// delta says which services changed.
func (a *Agent) guard(cfg *config.Config, delta config.Delta) error {
	share := a.cfg.Daemon.ReloadGuard
	old := a.cfg.Spec.Services
	present := make(map[string]bool, len(cfg.Files()))
	for _, f := range cfg.Files() {
		present[f.File] = true
	}
	rem := lb.Remain(cfg.Spec.Services[delta.From:delta.NewTo])
	var (
		total lb.Removal
		files []string
	)
	for _, f := range a.cfg.Files() {
		from, to := max(f.From, delta.From), min(f.To, delta.OldTo)
		if from >= to {
			continue // none of the file's services changed
		}
		r := rem.Removed(old[from:to])
		total.Services += r.Services
		total.Backends += r.Backends
		if !present[f.File] || r.Services == 0 && r.Backends == 0 {
			continue
		}
		r.OfServices, r.OfBackends = f.To-f.From, 0
		for i := f.From; i < f.To; i++ {
			r.OfBackends += len(old[i].Backends)
		}
		if ex, desc := r.Exceeds(share); ex {
			files = append(files, fmt.Sprintf("%s: the change %s of that file", a.relative(f.File), desc))
		}
	}
	total.OfServices, total.OfBackends = len(old), a.cfg.Backends()
	if ex, desc := total.Exceeds(share); ex {
		return fmt.Errorf("%w: the new configuration %s, more than reload_guard = %v; run \"vipd reload --force\" if that is intended",
			ErrReloadRejected, desc, share)
	}
	if len(files) > 0 {
		return fmt.Errorf("%w: %s, more than reload_guard = %v of one file (truncated?); delete a file to remove all its services, or run \"vipd reload --force\" if that is intended",
			ErrReloadRejected, strings.Join(files, "; "), share)
	}
	return nil
}

// relative names file relative to the main file's directory when it is
// below it.
func (a *Agent) relative(file string) string {
	rel, err := filepath.Rel(filepath.Dir(a.cfg.File), file)
	if err != nil || strings.HasPrefix(rel, "..") {
		return file
	}
	return rel
}
