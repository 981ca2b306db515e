package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vipd/vipd/control"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

func newPlanCmd() *cobra.Command {
	var (
		fromEmpty bool
		socket    string
	)
	cmd := &cobra.Command{
		Use:   "plan [FILE]",
		Short: "Show what vipd would change in the kernel for a configuration",
		Long: `Plan validates FILE, reads the live kernel state (IPVS, the dummy
interface's VIPs, sysctls and vipd's rules) and prints the operations that
would make the kernel match, one per line, in the order vipd applies them.
It changes nothing. With --from-empty, or where the kernel cannot be read
(no ip_vs, not root), it plans against an empty kernel. Without FILE it asks
the running daemon what a reload of its file would do, health checks and
admin drains included.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				rep, err := control.Call(socket, "GET", "/v1/plan")
				if err != nil {
					return err
				}
				if rep.Error != "" {
					return printReply(cmd, rep)
				}
				for _, op := range rep.Planned {
					fmt.Fprintln(cmd.OutOrStdout(), op)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d operations\n", len(rep.Planned))
				return nil
			}
			cfg, err := config.Load(args[0])
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), err)
				return exitError(1)
			}
			var ops []lb.Op
			if !fromEmpty {
				ops, err = planLive(cmd.Context(), cfg)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "vipd: cannot read the kernel (%v); planning from an empty kernel\n", err)
				}
			}
			if fromEmpty || err != nil {
				ops = planEmpty(cfg)
			}
			out := cmd.OutOrStdout()
			for _, op := range ops {
				fmt.Fprintln(out, op)
			}
			fmt.Fprintf(out, "%d operations\n", len(ops))
			return nil
		},
	}
	cmd.Flags().BoolVar(&fromEmpty, "from-empty", false, "plan against an empty kernel instead of the live one")
	socketFlag(cmd, &socket)
	return cmd
}

// planEmpty plans cfg against an empty kernel, taking NodePort addresses
// from this host's interfaces.
func planEmpty(cfg *config.Config) []lb.Op {
	host := lb.Host{Dummy: cfg.Daemon.Interface, Addrs: localAddrs()}
	return lb.Plan(lb.Desired(&cfg.Spec, host), lb.NewState(), lb.PlanOptions{Removal: cfg.Daemon.Removal})
}

// localAddrs lists this host's addresses through the standard library, so
// that planning needs no privileges.
func localAddrs() map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	ifs, err := net.Interfaces()
	if err != nil {
		return out
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				out[ifc.Name] = append(out[ifc.Name], p.Addr())
			}
		}
	}
	return out
}

// planLive plans cfg against the running kernel.
func planLive(ctx context.Context, cfg *config.Config) ([]lb.Op, error) {
	k, closeFn, err := openKernel(cfg, nil, kernelOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return planOn(ctx, cfg, k)
}

// planOn plans cfg against the kernel k with the daemon's reconciler
// options, so that a removal plans as the daemon would do it.
func planOn(ctx context.Context, cfg *config.Config, k lb.Kernel) ([]lb.Op, error) {
	r := lb.NewReconciler(reconcilerOptions(cfg, k, slog.New(slog.DiscardHandler)))
	return r.Plan(ctx, &cfg.Spec)
}
