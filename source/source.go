// Package source defines what an origin of desired virtual services gives
// the agent: the configuration file, the Kubernetes API. The agent
// programs the merge of every source's services; each service is owned by
// the source that produced it, and two sources never share a service key
// (VIP, port and protocol, or firewall mark) or a service name: the
// source that claims one second is refused it, with a Conflict, and the
// first keeps it.
package source

import (
	"context"
	"fmt"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// Source is one origin of desired services.
type Source interface {
	// Name names the source in logs, status and conflicts; it is
	// unique in an agent ("file", "kubernetes").
	Name() string
	// Run runs the source until ctx ends, handing each new state to
	// sink. It returns nil when ctx ends, and an error when the source
	// cannot go on (the agent then stops).
	Run(ctx context.Context, sink Sink) error
}

// Sink is the agent's side of a source.
type Sink interface {
	// Publish replaces the source's services with snap's, whole, and
	// waits until the agent has taken them: it returns the services
	// refused because another source owns their key or name, and an
	// error when the agent did not take snap (ctx ended, or the agent
	// stopped). A service refused now is taken by a later Publish once
	// the owner has let go of it. The sink keeps no snapshot but the
	// last it took: once a Publish has returned nil, the source may
	// reuse the Services of the snapshot before (see
	// Snapshot.Changed), never those of the last.
	Publish(ctx context.Context, snap Snapshot) ([]Conflict, error)
	// Report says whether the source is in step with its origin: nil
	// when it is, or why not (the API server cannot be reached). A
	// source that is not in step keeps its last snapshot programmed;
	// the agent shows the error in its status and metrics.
	Report(err error)
}

// Snapshot is everything a source wants programmed.
type Snapshot struct {
	// Services are the source's virtual services, valid as a Spec's
	// (see lb.Spec); their names are unique in the agent, so a source
	// other than the file prefixes them (e.g. "k8s/NAMESPACE/NAME/PORT/PROTO").
	Services []lb.VirtualService
	// Health holds the health checks of the services that have any, by
	// service name.
	Health map[string]config.ServiceHealth
	// Changed, when not nil, says that the snapshot differs from the
	// last one the sink took from this source only in the content of
	// these services (their backends, say): the same names, in the same
	// order, sorted by name, with the same keys. It lets the agent
	// program those services alone; nil says anything may have changed.
	// The agent checks what it relies on, and falls back to a full pass
	// when the hint does not hold.
	Changed []string
}

// Conflict is a service refused because another source owns its key or
// its name.
type Conflict struct {
	// Service is the refused service's name.
	Service string
	// Key is the key in dispute; zero when the dispute is the name.
	Key lb.ServiceKey
	// Owner is the source that keeps it, and OwnerService its service.
	Owner, OwnerService string
	// Reason, when not empty, says why the service is refused instead
	// of an owner (its VIP is an address of the host, say).
	Reason string
}

// Error describes the conflict as the refused source's user reads it.
func (c Conflict) Error() string {
	if c.Reason != "" {
		return fmt.Sprintf("service %q: %s", c.Service, c.Reason)
	}
	if c.Key == (lb.ServiceKey{}) {
		return fmt.Sprintf("service %q: the name is taken by %s's service %q", c.Service, c.Owner, c.OwnerService)
	}
	return fmt.Sprintf("service %q: %s is taken by %s's service %q", c.Service, c.Key, c.Owner, c.OwnerService)
}
