package main

import (
	"errors"
	"fmt"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
)

// errHostVIP marks a configuration with a VIP that is an address of
// another interface of the host.
var errHostVIP = errors.New("a VIP is an address of the host")

// hostVIPError describes the VIPs of cfg that found says are host
// addresses, naming each one's file, or returns nil when there are none.
func hostVIPError(cfg *config.Config, found []lb.HostVIP) error {
	if len(found) == 0 {
		return nil
	}
	file := map[string]string{}
	for _, f := range cfg.Files() {
		for _, vs := range cfg.Spec.Services[f.From:f.To] {
			file[vs.Name] = f.File
		}
	}
	errs := []error{errHostVIP}
	for _, h := range found {
		errs = append(errs, fmt.Errorf("%s: service %q: vip %s is an address of interface %s, not of vipd's interface %s: vipd would take it over, and filter_vip_ports would drop new connections to its other ports (SSH among them); use an address no interface of the host has",
			file[h.Service], h.Service, h.VIP, h.Interface, cfg.Daemon.Interface))
	}
	return errors.Join(errs...)
}

// refuseHostVIPs returns an error when a VIP of services, services of
// cfg, is an address of another interface of the host.
func (d *daemon) refuseHostVIPs(cfg *config.Config, services []lb.VirtualService) error {
	found, err := d.r.HostVIPs(services)
	if err != nil {
		return err
	}
	return hostVIPError(cfg, found)
}

// checkHostVIPs reads this host's addresses and returns an error when a
// VIP of cfg is one of another interface's (vipd check).
func checkHostVIPs(cfg *config.Config) error {
	d, err := link.New(link.Options{Interface: cfg.Daemon.Interface})
	if err != nil {
		return fmt.Errorf("check vips against the host's addresses (--offline skips it): %w", err)
	}
	defer d.Close()
	addrs, err := d.HostAddrs()
	if err != nil {
		return fmt.Errorf("check vips against the host's addresses (--offline skips it): %w", err)
	}
	return hostVIPError(cfg, lb.HostVIPs(cfg.Spec.Services, lb.Host{Addrs: addrs, Dummy: cfg.Daemon.Interface}))
}
