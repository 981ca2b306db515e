// Package health checks vipd's backends and turns their health into the
// destinations a service should program.
//
// It has three parts:
//
//   - Check types (TCPCheck, HTTPCheck, UDPCheck, DNSCheck, ExecCheck),
//     each a Prober whose Probe reports one attempt. NewProber builds one
//     from a Spec, the typed form of a configured check.
//   - A Manager that runs checks: Update hands it the wanted checks, one
//     Target per service, backend and check. Identical checks are shared
//     and run once, a check keeps its state across updates that do not
//     change its target (what it probes, as opposed to its settings), and
//     a rise/fall state machine turns probe results into up/down states
//     whose changes are reported once each.
//   - Apply, a pure function that turns a service's configured backends,
//     their health and a failure Policy (quiesce or remove, quorum, sorry
//     server) into the backends to program.
//
// The package never changes the kernel: the reconciler calls Apply on each
// pass and runs a pass when the Manager reports a transition.
package health

import (
	"context"
	"time"
)

// Prober is one kind of health check against one target. Probe makes one
// attempt and returns nil when the target is healthy. It must return once
// ctx is done; the Manager gives each attempt a context that ends at the
// check's timeout. A Prober must be safe for use by one goroutine at a
// time; the Manager never runs two attempts of one check at once.
type Prober interface {
	Probe(ctx context.Context) error
}

// ProberFunc adapts a function to a Prober.
type ProberFunc func(ctx context.Context) error

// Probe calls f.
func (f ProberFunc) Probe(ctx context.Context) error { return f(ctx) }

// pollProber is a Prober that can also probe on a poller, which the
// Manager prefers: without a goroutine of its own.
type pollProber interface {
	Prober
	// start begins one attempt that must end by deadline, and returns
	// at once. done gets the result exactly once: from p's goroutine,
	// or from start's caller before start returns when the attempt
	// ends at once. A timeout's error wraps os.ErrDeadlineExceeded or
	// context.DeadlineExceeded. start returns false, and done is never
	// called, when this prober's attempts cannot run on a poller (an
	// https check, say): Probe runs them.
	start(p *poller, deadline time.Time, done func(error)) bool
}
