package check

// UDPOptions configure udp checks.
type UDPOptions struct {
	// Payload is the datagram sent; it may be empty.
	Payload []byte
	// Expect, when set, must occur in the reply.
	Expect []byte
}
