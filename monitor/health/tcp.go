package health

import (
	"context"
	"net"
	"net/netip"
)

// TCPCheck is up when a TCP connection to its address is established.
//
// It closes the connection with a reset (SO_LINGER 0) rather than a FIN,
// as HAProxy's checks do: at thousands of checks a second an orderly close
// would leave the balancer one TIME_WAIT socket per probe for a minute.
//
// On Linux the Manager runs its probes on a poller (a non-blocking
// connect watched by epoll, see poller) rather than through Probe, which
// dials with the net package.
type TCPCheck struct {
	target netip.AddrPort
	dial   DialOptions
	addr   string
	dialer *net.Dialer
	// The poller's (Linux): the target's socket address, built at the
	// first probe, and how many more probes do not ask at once whether
	// the connect finished (see start).
	sa   socketAddr
	skip int
}

// NewTCPCheck returns a check that connects to addr.
func NewTCPCheck(addr netip.AddrPort, dial DialOptions) *TCPCheck {
	return &TCPCheck{target: addr, dial: dial, addr: addr.String(), dialer: dialerFor(dial, "tcp")}
}

// Probe connects and closes the connection.
func (c *TCPCheck) Probe(ctx context.Context) error {
	conn, err := c.dialer.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	// The connection was established: that is the check. A failing
	// close says nothing more about the backend.
	_ = conn.Close()
	return nil
}
