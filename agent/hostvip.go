package agent

import (
	"errors"
	"fmt"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// ErrHostVIP marks a configuration with a VIP that is an address of
// another interface of the host.
var ErrHostVIP = errors.New("a VIP is an address of the host")

// HostVIPError describes the VIPs of cfg that found says are host
// addresses, naming each one's file, or returns nil when there are none.
func HostVIPError(cfg *config.Config, found []lb.HostVIP) error {
	if len(found) == 0 {
		return nil
	}
	file := map[string]string{}
	for _, f := range cfg.Files() {
		for _, vs := range cfg.Spec.Services[f.From:f.To] {
			file[vs.Name] = f.File
		}
	}
	errs := []error{ErrHostVIP}
	for _, h := range found {
		errs = append(errs, fmt.Errorf("%s: service %q: vip %s is an address of interface %s, not of vipd's interface %s: vipd would take it over, and filter_vip_ports would drop new connections to its other ports (SSH among them); use an address no interface of the host has",
			file[h.Service], h.Service, h.VIP, h.Interface, cfg.Daemon.Interface))
	}
	return errors.Join(errs...)
}

// refuseHostVIPs returns an error when a VIP of services, services of
// cfg, is an address of another interface of the host.
func (a *Agent) refuseHostVIPs(cfg *config.Config, services []lb.VirtualService) error {
	found, err := a.r.HostVIPs(services)
	if err != nil {
		return err
	}
	return HostVIPError(cfg, found)
}
