package config

import "fmt"

// LoadOptions configure LoadWith.
type LoadOptions struct {
	// Offline checks the files alone, for a configuration checked on
	// another host than the one it is for: nothing is looked up on this
	// host. The exec checks' user (check_user) is not looked up in the
	// user and group databases, and the https checks' ca_file is not
	// read. Config.Unchecked lists what was left unchecked. A
	// configuration loaded offline is for checking only: its exec checks
	// have no user and its https checks no certificates.
	Offline bool
}

// LoadWith is Load with options.
func LoadWith(path string, opts LoadOptions) (*Config, error) {
	if !opts.Offline {
		return Load(path)
	}
	data, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, _, err := parseFrom(nil, path, data, nil)
	if err != nil {
		return nil, err
	}
	cfg.unchecked = cfg.offlineUnchecked()
	return cfg, nil
}

// Unchecked returns what a configuration loaded offline (see
// LoadOptions) left unchecked, a sentence for each kind of host lookup it
// skipped, such as `user "probe" (check_user) of the exec checks of
// service "web" exists`. It is nil for a configuration loaded otherwise.
func (c *Config) Unchecked() []string { return c.unchecked }

// offlineUnchecked returns the lookups of c that an offline load skips.
func (c *Config) offlineUnchecked() []string {
	var out []string
	var execFirst string
	execN := 0
	var caFirst, caService string
	caFiles := map[string]bool{}
	for i := range c.Spec.Services {
		vs := &c.Spec.Services[i]
		h, ok := c.Health[vs.Name]
		if !ok {
			continue
		}
		if hasExec(h) {
			if execN == 0 {
				execFirst = vs.Name
			}
			execN++
		}
		for _, b := range vs.Backends {
			s := h.Checks[b.Addr]
			if s == nil {
				continue
			}
			f := s.HTTP.CAFile
			if f == "" || caFiles[f] {
				continue
			}
			if len(caFiles) == 0 {
				caFirst, caService = f, vs.Name
			}
			caFiles[f] = true
		}
	}
	if execN > 0 {
		s := fmt.Sprintf("user %q (check_user) of the exec checks of service %q", c.Daemon.CheckUser, execFirst)
		if execN > 1 {
			s += fmt.Sprintf(" and %d more services", execN-1)
		}
		out = append(out, s+" exists")
	}
	if len(caFiles) > 0 {
		s := fmt.Sprintf("ca_file %q of service %q", caFirst, caService)
		if len(caFiles) > 1 {
			s += fmt.Sprintf(" and %d more ca_files", len(caFiles)-1)
		}
		out = append(out, s+" is a readable file of PEM certificates")
	}
	return out
}
