//go:build !linux

package health

import (
	"errors"
	"time"
)

// errPollerClosed ends the probes in flight when a poller closes.
var errPollerClosed = errors.New("health checks stopped")

// poller runs probes on non-blocking sockets; only Linux has one, and
// elsewhere every probe runs through Prober.Probe.
type poller struct{}

// newPoller fails outside Linux.
func newPoller() (*poller, error) { return nil, errors.New("probes on a poller need Linux") }

// usable reports false: there is no poller.
func (p *poller) usable() bool { return false }

// close does nothing.
func (p *poller) close() {}

// flush does nothing.
func (p *poller) flush() {}

// drive does nothing.
func (p *poller) drive() {}

// pending reports false: there is no poller.
func (p *poller) pending() bool { return false }

// tend does nothing.
func (p *poller) tend() {}

// setSlack does nothing.
func (p *poller) setSlack(time.Duration) {}

// pollRequest returns nil: no http check runs on a poller.
func (c *HTTPCheck) pollRequest() []byte { return nil }

// socketAddr is a socket address for the poller, which only Linux has.
type socketAddr = struct{}

// keptConn is the poller's kept connection of an http check, which only
// Linux has.
type keptConn struct{}

// init does nothing: there is no poller.
func (*keptConn) init(*HTTPCheck) {}

// closeKept does nothing: there is no poller.
func (c *HTTPCheck) closeKept() {}

// collectWait is how long the replies of half-open probes may wait to
// be collected with slack: slack, at least minCollect.
func collectWait(slack time.Duration) time.Duration { return max(slack, minCollect) }

// minCollect is the shortest wait of a reply with no slack.
const minCollect = time.Millisecond
