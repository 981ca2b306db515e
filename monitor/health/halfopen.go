package health

import "net/netip"

// HalfOpenCheck is a tcp check that sends a SYN and reads the answer
// rather than connecting (TCPOptions.HalfOpen): a SYN-ACK acknowledging
// the SYN is up, a reset is down (connection refused), and no answer by
// the timeout is down.
//
// Its SYNs leave from one raw socket per address family, which the
// process shares among all half-open checks, and from one of a pool of
// ports that the process reserves by binding TCP sockets to them without
// listening: the kernel then neither gives those ports to connections of
// its own nor finds a socket for a SYN-ACK sent to them, so it answers
// the SYN-ACK with a reset, which ends the half-open connection on the
// backend. One goroutine per family reads the SYN-ACKs and resets that a
// socket filter lets through (those sent to the pool's ports) and hands
// each to the probe waiting for it, by the backend's address and port,
// the probe's port and the acknowledgement of the probe's (random)
// sequence number. On the Manager's poller a probe costs no socket,
// goroutine or timer of its own: the poller's heap times it out.
//
// It needs Linux and CAP_NET_RAW; it does not take DialOptions.Mark or
// Device (a raw socket's mark and device are the socket's, not the
// packet's), and takes Source.
type HalfOpenCheck struct {
	target netip.AddrPort
	dial   DialOptions
	halfOpenState
}
