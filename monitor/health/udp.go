package health

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// maxReply is the largest reply a udp or dns probe reads over UDP.
const maxReply = 4096

// UDPCheck is up when a datagram sent to its address is answered. An
// ICMP port-unreachable reply (a closed port) fails at once; silence
// fails at the timeout, so only services that answer the payload can be
// checked this way.
type UDPCheck struct {
	addr   string
	opts   UDPOptions
	dialer *net.Dialer
}

// NewUDPCheck returns a check that sends opts.Payload to addr.
func NewUDPCheck(addr netip.AddrPort, opts UDPOptions, dial DialOptions) *UDPCheck {
	return &UDPCheck{addr: addr.String(), opts: opts, dialer: dialerFor(dial, "udp")}
}

// Probe sends the payload and waits for one reply.
func (c *UDPCheck) Probe(ctx context.Context) error {
	conn, err := c.dialer.DialContext(ctx, "udp", c.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := deadlineFromContext(ctx, conn)
	defer stop()
	if _, err := conn.Write(c.opts.Payload); err != nil {
		return udpError("send to", c.addr, err)
	}
	buf := make([]byte, maxReply)
	n, err := conn.Read(buf)
	if err != nil {
		return udpError("no reply from", c.addr, err)
	}
	if len(c.opts.Expect) > 0 && !bytes.Contains(buf[:n], c.opts.Expect) {
		return fmt.Errorf("reply from %s (%d bytes) does not contain %q", c.addr, n, c.opts.Expect)
	}
	return nil
}

// udpError describes a failed send or receive, naming an ICMP
// unreachable for what it is.
func udpError(what, addr string, err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("port unreachable at %s: %w", addr, err)
	}
	return fmt.Errorf("%s %s: %w", what, addr, err)
}

// deadlineFromContext makes conn's reads and writes end at ctx's deadline
// or when ctx is cancelled. The returned function releases the watch.
func deadlineFromContext(ctx context.Context, conn net.Conn) (stop func() bool) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return context.AfterFunc(ctx, func() {
		_ = conn.SetDeadline(time.Unix(1, 0))
	})
}
