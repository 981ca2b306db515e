package main

import (
	"errors"
	"log/slog"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// openKernel opens the kernel adapters cfg needs.
func openKernel(cfg *config.Config, log *slog.Logger) (lb.Kernel, func(), error) {
	return lb.Kernel{}, func() {}, errors.New("kernel adapters are not available in this build")
}

// reconcilerOptions returns the reconciler options for cfg.
func reconcilerOptions(cfg *config.Config, k lb.Kernel, log *slog.Logger) lb.Options {
	return lb.Options{
		Kernel:       k,
		Logger:       log,
		Dummy:        cfg.Daemon.Interface,
		Drain:        cfg.Daemon.Drain,
		DrainTimeout: cfg.Daemon.DrainTimeout,
	}
}
