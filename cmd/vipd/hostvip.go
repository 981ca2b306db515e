package main

import (
	"fmt"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
)

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
	return agent.HostVIPError(cfg, lb.HostVIPs(cfg.Spec.Services, lb.Host{Addrs: addrs, Dummy: cfg.Daemon.Interface}))
}
