package main

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vipd/vipd/agent/ledger"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/arp"
	"github.com/vipd/vipd/kernel/iptables"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/kernel/sysctl"
	"github.com/vipd/vipd/lb"
)

// kernelOptions say how much of the kernel openKernel opens.
type kernelOptions struct {
	// ReadOnly opens only what observation needs: the dummy interface is
	// not created and no announcer starts (vipd plan).
	ReadOnly bool
}

// openKernel opens the kernel adapters cfg needs. close releases them.
func openKernel(cfg *config.Config, log *slog.Logger, opts kernelOptions) (k lb.Kernel, close func(), err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var closers []func() error
	close = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			close()
		}
	}()

	v, err := ipvs.New(ipvs.Options{})
	if err != nil {
		return k, close, err
	}
	closers = append(closers, v.Close)
	k.IPVS = v

	d, err := link.New(link.Options{Interface: cfg.Daemon.Interface, Claimed: ledgerVIPs(cfg)})
	if err != nil {
		return k, close, err
	}
	closers = append(closers, d.Close)
	if !opts.ReadOnly {
		if err := d.Ensure(); err != nil {
			return k, close, err
		}
	}
	k.VIPs = d

	if cfg.Daemon.ManageSysctls {
		k.Sysctls = sysctl.New(sysctl.Options{})
	}
	if cfg.Daemon.ManageIPTables {
		t, err := iptables.New(iptables.Options{Logger: log})
		if err != nil {
			return k, close, err
		}
		closers = append(closers, t.Close)
		k.Rules = t
	}
	if len(cfg.Daemon.Uplinks) > 0 && !opts.ReadOnly {
		a, err := arp.New(arp.Options{
			Uplinks:  cfg.Daemon.Uplinks,
			Dummy:    cfg.Daemon.Interface,
			Count:    cfg.Daemon.GARP.Count,
			Interval: cfg.Daemon.GARP.Interval,
			Refresh:  cfg.Daemon.GARP.Refresh,
			Logger:   log,
		})
		if err != nil {
			return k, close, fmt.Errorf("announcer: %w", err)
		}
		closers = append(closers, a.Close)
		k.Announcer = a
	}
	k.Ledger = ledger.New(ledger.Path(cfg.Daemon.StateDir))
	return k, close, nil
}

// reconcilerOptions returns the reconciler options for planning cfg on
// the kernel k: the daemon's own (see agent), removal policy included, so
// that "vipd plan" drains where the daemon would.
func reconcilerOptions(cfg *config.Config, k lb.Kernel, log *slog.Logger) lb.Options {
	release, err := link.KernelRelease()
	if err != nil {
		log.Warn("cannot read the kernel release; conn_reuse_mode will be 0", "err", err)
	}
	return lb.Options{Kernel: k, Logger: log, KernelRelease: release, Dummy: cfg.Daemon.Interface, Removal: cfg.Daemon.Removal}
}

// ledgerVIPs returns the addresses of the services in vipd's ledger: on an
// interface that a vipd from before the interface mark created, they are
// vipd's VIPs (see link.Options.Claimed). A missing or unreadable ledger
// claims none.
func ledgerVIPs(cfg *config.Config) func(netip.Addr) bool {
	owned, err := ledger.New(ledger.Path(cfg.Daemon.StateDir)).Load()
	if err != nil || len(owned) == 0 {
		return nil
	}
	addrs := make(map[netip.Addr]bool, len(owned))
	for k := range owned {
		addrs[k.Addr] = true
	}
	return func(a netip.Addr) bool { return addrs[a] }
}
