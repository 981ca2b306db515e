package config

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/monitor/check"
)

// MaxCAFileSize is the largest ca_file vipd reads: 1 MiB, five times
// Debian's whole ca-certificates bundle.
const MaxCAFileSize = 1 << 20

// caFileRef is where a check names a ca_file: the service, and the file
// and line of the key.
type caFileRef struct {
	service string
	file    string
	line    int
	ctx     string
}

// resolveCAFiles reads the ca_file of each https check of the services
// that d says changed (every service when d is full, so that a full
// reload reads a rotated bundle again) into the check's spec, as
// configuration files are read (readFileLimit: a regular file, opened
// without blocking, of at most MaxCAFileSize bytes), so that the checks
// built from the configuration read no file. A file that cannot be read
// or holds no PEM certificate is an error on the line of the ca_file key
// that names it. c's maps are copied before they are changed: c may share
// them with the configuration it was parsed from.
func (c *Config) resolveCAFiles(d Delta) error {
	from, to := d.From, d.NewTo
	if d.Full {
		from, to = 0, len(c.Spec.Services)
	}
	read := map[string]*check.CABundle{}
	failed := map[string]error{}
	var errs Errors
	copied := false
	for i := from; i < to && i < len(c.Spec.Services); i++ {
		vs := &c.Spec.Services[i]
		h, ok := c.Health[vs.Name]
		if !ok {
			continue
		}
		var checks map[netip.AddrPort]*check.Spec
		// The backends that share a check share its copy with the CA.
		withCA := map[*check.Spec]*check.Spec{}
		for j := range vs.Backends {
			addr := vs.Backends[j].Addr
			spec, ok := h.Checks[addr]
			if !ok || spec.HTTP.CAFile == "" {
				continue
			}
			file := spec.HTTP.CAFile
			b, err := read[file], failed[file]
			if b == nil && err == nil {
				b, err = readCAFile(file)
				if err != nil {
					failed[file] = err
				} else {
					read[file] = b
				}
			}
			if err != nil {
				ref := c.caFileRef(i, j)
				errs = append(errs, &Error{File: ref.file, Line: ref.line, Ctx: ref.ctx, Msg: fmt.Sprintf("ca_file: %v", err)})
				continue
			}
			if checks == nil {
				checks = maps.Clone(h.Checks)
			}
			s := withCA[spec]
			if s == nil {
				s = new(*spec)
				s.HTTP.CA = b
				withCA[spec] = s
			}
			checks[addr] = s
		}
		if checks != nil {
			if !copied {
				c.Health = maps.Clone(c.Health)
				copied = true
			}
			h.Checks = checks
			c.Health[vs.Name] = h
		}
	}
	if len(errs) == 0 {
		return nil
	}
	// A service's check is every backend's: one error for each key.
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
	errs = slices.CompactFunc(errs, func(a, b *Error) bool { return *a == *b })
	return errs
}

// readCAFile reads and parses the ca_file file.
func readCAFile(file string) (*check.CABundle, error) {
	data, err := readFileLimit(file, MaxCAFileSize)
	if err != nil {
		return nil, err
	}
	return check.NewCABundle(file, data)
}

// caFileRef returns where the check of backend j of service i names its
// ca_file: the backend's own check, or else the service's.
func (c *Config) caFileRef(i, j int) caFileRef {
	vs := &c.Spec.Services[i]
	ref := caFileRef{service: vs.Name, file: c.File, ctx: fmt.Sprintf("service %q: check", vs.Name)}
	for pi := range c.parts {
		p := &c.parts[pi]
		if i < p.first || i >= c.partEnd(pi) {
			continue
		}
		ref.file = p.file
		pos := (&validator{file: p.file, src: p.src}).positions()
		path := fmt.Sprintf("service.%d.backend.%d.check", i-p.first, j)
		if _, ok := pos.exact(path + ".ca_file"); ok {
			ref.ctx = fmt.Sprintf("service %q: backend %q: check", vs.Name, vs.Backends[j].Addr.String())
		} else {
			path = fmt.Sprintf("service.%d.check", i-p.first)
		}
		ref.line = pos.line(path + ".ca_file")
		break
	}
	return ref
}
