package health

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
)

// NewProber builds the check spec describes against target, the address
// Spec.Target resolved. It validates spec and reads the files it names
// (an https check's CA file).
func NewProber(spec Spec, target netip.AddrPort) (Prober, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if !target.IsValid() {
		return nil, fmt.Errorf("%s check has no target address", spec.Kind)
	}
	s := spec.WithDefaults()
	switch s.Kind {
	case KindTCP:
		if s.TCP.HalfOpen {
			return NewHalfOpenCheck(target, s.Dial)
		}
		return NewTCPCheck(target, s.Dial), nil
	case KindHTTP, KindHTTPS:
		return NewHTTPCheck(target, s.Kind == KindHTTPS, s.HTTP, s.Dial)
	case KindUDP:
		return NewUDPCheck(target, s.UDP, s.Dial), nil
	case KindDNS:
		return NewDNSCheck(target, s.DNS, s.Dial)
	case KindExec:
		return NewExecCheck(target, s.Exec)
	}
	return nil, fmt.Errorf("unknown check type %s", s.Kind)
}

// A check's identity has three parts, which decide what an Update does
// with the check's state:
//
//   - Its target (targetKey): the kind of check and where its probes go,
//     the probed address and the socket options that pick the path (mark,
//     device, source). A result is a fact about one target; a check of a
//     new target knows nothing and starts from its initial state.
//   - Its question (checkID.question): what it asks the target, the
//     options of its kind (a tcp check's half-open, which asks whether
//     the port answers a SYN rather than whether a connection is
//     established; an http check's method, path, host, headers,
//     expected status and body; a udp check's payload; a dns check's
//     query; an exec check's command).
//   - Its timing: interval, timeout, rise, fall, jitter and initial
//     state, which say how often and how patiently it asks.
//
// Targets with the same three parts share one check (their checkKeys are
// equal). A check whose question or timing changes keeps the state of its
// target: the backend stays up (or down) and the next probe, with the new
// settings, carries on from there. Changing the question is treated as an
// edit rather than a new target because the operator edits the check of a
// server whose health is known: an outage on every edit of a path or an
// expected status is the failure this avoids, and a wrong new question is
// caught by the next fall probes, as a server breaking would be. The
// consecutive counts start again when the question changes, since a
// streak of answers to another question is not one of answers to this
// one.

// checkID is what a check's state depends on besides the address it
// probes: how its probes get there, and the question it asks.
type checkID struct {
	// path hashes the kind and the dial options (mark, device, source).
	path [16]byte
	// question hashes the kind's options, after defaults.
	question [sha256.Size]byte
}

// targetKey identifies a check's target: the address it probes, and how.
type targetKey struct {
	addr netip.AddrPort
	path [16]byte
}

// question is what a check asks, as keyOf hashes it.
type question struct {
	TCP  TCPOptions
	HTTP HTTPOptions
	UDP  UDPOptions
	DNS  DNSOptions
	Exec ExecOptions
}

// checkKey identifies a check: targets with equal keys share one check,
// run once for every service and backend that asks for it. It is its
// target address and a hash of the rest, which keeps the maps keyed by it
// small.
type checkKey struct {
	target netip.AddrPort
	spec   [sha256.Size]byte // of the Spec with defaults but Addr and Port
}

// keyOf returns the key and the id of the check spec describes against
// target, the address Spec.Target resolved. Between them they cover every
// field of the Spec; TestCheckKeyParts checks that they do.
func keyOf(spec Spec, target netip.AddrPort) (checkKey, checkID) {
	spec = spec.WithDefaults()
	b, err := json.Marshal(&question{spec.TCP, spec.HTTP, spec.UDP, spec.DNS, spec.Exec})
	if err != nil {
		// The options hold only plain data; Marshal cannot fail on them.
		panic(fmt.Sprintf("health: encode spec: %v", err))
	}
	var id checkID
	id.question = sha256.Sum256(b)

	b = append(b[:0], byte(spec.Kind))
	b = binary.BigEndian.AppendUint32(b, spec.Dial.Mark)
	src, _ := spec.Dial.Source.MarshalBinary() // cannot fail
	b = append(b, byte(len(src)))
	b = append(b, src...)
	b = append(b, spec.Dial.Device...) // last: its end is the end
	path := sha256.Sum256(b)
	copy(id.path[:], path[:])

	b = append(b[:0], id.question[:]...)
	b = append(b, path[:]...)
	b = append(b, byte(spec.Initial))
	for _, v := range [...]uint64{uint64(spec.Interval), uint64(spec.Timeout), uint64(spec.Rise), uint64(spec.Fall), math.Float64bits(spec.Jitter)} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return checkKey{target: target, spec: sha256.Sum256(b)}, id
}
