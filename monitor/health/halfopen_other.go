//go:build !linux

package health

import (
	"context"
	"errors"
	"net/netip"
)

// halfOpenState is Linux's.
type halfOpenState struct{}

// errHalfOpenLinux is the error of half-open checks outside Linux.
var errHalfOpenLinux = errors.New("half-open tcp checks need Linux")

// NewHalfOpenCheck fails outside Linux.
func NewHalfOpenCheck(target netip.AddrPort, dial DialOptions) (*HalfOpenCheck, error) {
	return nil, errHalfOpenLinux
}

// Probe fails outside Linux.
func (c *HalfOpenCheck) Probe(context.Context) error { return errHalfOpenLinux }

// OpenHalfOpen fails outside Linux when asked for a family.
func OpenHalfOpen(v4, v6 bool) error {
	if v4 || v6 {
		return errHalfOpenLinux
	}
	return nil
}
