package main

import (
	"log/slog"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
)

// openSources opens the sources of services cfg asks for besides the
// file: the Kubernetes API of its [kubernetes] section.
func openSources(cfg *config.Config, log *slog.Logger) ([]source.Source, error) {
	k := cfg.Kubernetes
	if !k.Enabled {
		return nil, nil
	}
	opts := kubernetes.Options{
		Kubeconfig:         k.Kubeconfig,
		LoadBalancerClass:  k.LoadBalancerClass,
		DefaultClass:       k.DefaultClass,
		Namespaces:         k.Namespaces,
		ServiceSelector:    k.ServiceSelector,
		Backends:           k.Backends,
		LeaderElection:     &k.LeaderElection,
		LeaseNamespace:     k.LeaseNamespace,
		LeaseName:          k.LeaseName,
		Identity:           k.Identity,
		LeaseDuration:      k.LeaseDuration,
		RenewDeadline:      k.RenewDeadline,
		RetryPeriod:        k.RetryPeriod,
		APIQPS:             k.APIQPS,
		APIBurst:           k.APIBurst,
		MetalLBAnnotations: k.MetalLBAnnotations,
		NoPacketFilter:     !cfg.Daemon.ManageIPTables,
		Logger:             log.With("source", "kubernetes"),
	}
	opts.Pools = kubernetes.PoolsOf(k)
	opts.NodeHealth = kubernetes.NodeHealthOf(k)
	src, err := kubernetes.New(opts)
	if err != nil {
		return nil, err
	}
	return []source.Source{src}, nil
}
