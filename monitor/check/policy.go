package check

import (
	"fmt"
	"strings"

	"github.com/vipd/vipd/lb"
)

// Action is what happens to a failed backend.
type Action uint8

// The failure actions.
const (
	// Quiesce keeps a failed backend with weight 0: IPVS sends it no new
	// connections but keeps the existing ones, which may still work.
	Quiesce Action = iota
	// Remove drops a failed backend from the service. What happens to its
	// connections is the reconciler's business, as for any removed
	// backend: with drain on, it is drained (weight 0 until idle or the
	// drain timeout); with drain off it is deleted at once and, with
	// expire_nodest_conn set, its connections are dropped.
	Remove
)

// String returns the action's configuration name.
func (a Action) String() string {
	switch a {
	case Quiesce:
		return "quiesce"
	case Remove:
		return "remove"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction parses "quiesce" or "remove".
func ParseAction(s string) (Action, error) {
	switch strings.ToLower(s) {
	case "quiesce":
		return Quiesce, nil
	case "remove":
		return Remove, nil
	}
	return 0, fmt.Errorf("unknown failure action %q (want quiesce or remove)", s)
}

// Policy is what a service does with its backends' health.
type Policy struct {
	// Action is what happens to a failed backend.
	Action Action
	// Quorum is the fewest healthy backends the service trusts its checks
	// with; zero turns quorum off. Below it the service fails open: every
	// configured backend is programmed at its configured weight, health
	// ignored. A mass failure is more often the checks' fault (or the
	// network's) than the backends', and if it is real, spreading the
	// load over every backend is no worse than piling it on the few that
	// pass. Quorum 1 fails open only when every backend is down.
	Quorum int
	// Hysteresis delays the return to normal: once quorum is lost, it is
	// regained only with Quorum+Hysteresis healthy backends, so a count
	// hovering at the quorum does not flap the whole service.
	Hysteresis int
	// Sorry is a fallback backend (its Addr set) used alone when no
	// backend is healthy; it takes precedence over failing open. A zero
	// weight counts as 1. It is a backend like the others, forwarded by
	// its own Forward method.
	Sorry lb.Destination
}

// Validate reports a policy's problems.
func (p Policy) Validate() error {
	switch {
	case p.Action != Quiesce && p.Action != Remove:
		return fmt.Errorf("failure action %s is unknown", p.Action)
	case p.Quorum < 0:
		return fmt.Errorf("quorum %d is negative", p.Quorum)
	case p.Hysteresis < 0:
		return fmt.Errorf("quorum hysteresis %d is negative", p.Hysteresis)
	case p.Hysteresis > 0 && p.Quorum == 0:
		return fmt.Errorf("quorum hysteresis %d without a quorum", p.Hysteresis)
	}
	return nil
}
