package agent

import (
	"errors"
	"fmt"
	"net/netip"

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
// cfg, is an address of another interface of the host. Without services
// it reads nothing: reading the host's addresses lists every VIP of the
// dummy interface, a thousand at 10,000 services.
func (a *Agent) refuseHostVIPs(cfg *config.Config, services []lb.VirtualService) error {
	if len(services) == 0 {
		return nil
	}
	found, err := a.r.HostVIPs(services)
	if err != nil {
		return err
	}
	return HostVIPError(cfg, found)
}

// reloadedVIPs returns the services of a reload from running to cfg whose
// VIPs must be checked against the host's addresses: with a full change,
// all of cfg's; otherwise the changed services whose VIP none of the
// services they replace had. A VIP the running configuration had in the
// same place was checked when it came, and a change that keeps every VIP
// (a backend's weight, say) reads no host address.
func reloadedVIPs(running, cfg *config.Config, delta config.Delta) []lb.VirtualService {
	cur := cfg.Spec.Services[delta.From:delta.NewTo]
	if delta.Full {
		return cur
	}
	had := map[netip.Addr]bool{}
	for _, vs := range running.Spec.Services[delta.From:delta.OldTo] {
		had[vs.VIP] = true
	}
	var out []lb.VirtualService
	for i := range cur {
		if cur[i].VIP.IsValid() && !had[cur[i].VIP] {
			out = append(out, cur[i])
		}
	}
	return out
}
