package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/migrate"
)

// maxPrinted is the most issues vipd import prints: the first ones, then
// a count of the others.
const maxPrinted = 100

func newImportCmd() *cobra.Command {
	var allowPartial bool
	var finishAs func(cmd *cobra.Command, r migrate.Result, noun string, n int) error
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Print a vipd configuration made from keepalived's, ipvsadm's or MetalLB's",
		Long: `Import reads the configuration of another IPVS manager and prints a vipd
configuration that programs the same table. Every construct that has no
equivalent in vipd is listed on standard error as FILE:LINE: what: why, and
makes the exit status 1 unless --allow-partial; the configuration is printed
either way, with a comment naming where each service came from.`,
	}
	cmd.PersistentFlags().BoolVar(&allowPartial, "allow-partial", false, "exit 0 even when some constructs could not be imported")
	finish := func(cmd *cobra.Command, r migrate.Result) error {
		return finishAs(cmd, r, "services", r.Services)
	}
	finishAs = func(cmd *cobra.Command, r migrate.Result, noun string, n int) error {
		cmd.OutOrStdout().Write(r.TOML)
		printed := min(len(r.Issues), maxPrinted)
		for _, i := range r.Issues[:printed] {
			fmt.Fprintln(cmd.ErrOrStderr(), i)
		}
		all := len(r.Issues) + r.MoreIssues
		if all > printed {
			fmt.Fprintf(cmd.ErrOrStderr(), "... and %d more issues\n", all-printed)
		}
		if all > 0 {
			listed := "listed above"
			if all > printed {
				listed = fmt.Sprintf("the first %d listed above", printed)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "vipd: %d %s imported; %d constructs not imported as they are (%s)\n", n, noun, all, listed)
			if !allowPartial {
				return exitError(1)
			}
		}
		return nil
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "keepalived FILE",
		Short: "Import a keepalived.conf and the files it includes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return finish(cmd, migrate.Keepalived(args[0], migrate.KeepalivedOptions{}))
		},
	})
	var live bool
	ipvsadmCmd := &cobra.Command{
		Use:   "ipvsadm [FILE|-]",
		Short: "Import the output of ipvsadm -Sn, or with --live the kernel's table",
		Long: `Import the output of "ipvsadm -Sn" from FILE, or from standard input
without FILE or with "-". With --live, read the kernel's IPVS table through
the same netlink adapter the daemon uses instead (root).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if live {
				if len(args) > 0 {
					return fmt.Errorf("import ipvsadm: --live reads the kernel, not %s", args[0])
				}
				v, err := ipvs.New(ipvs.Options{})
				if err != nil {
					return fmt.Errorf("import ipvsadm --live: %w", err)
				}
				defer v.Close()
				svcs, err := v.Services()
				if err != nil {
					return fmt.Errorf("import ipvsadm --live: read the IPVS table: %w", err)
				}
				return finish(cmd, migrate.Table("the kernel's IPVS table", svcs))
			}
			var in io.Reader = cmd.InOrStdin()
			name := "stdin"
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("import ipvsadm: %w", err)
				}
				defer f.Close()
				in, name = f, args[0]
			}
			return finish(cmd, migrate.Ipvsadm(name, in))
		},
	}
	ipvsadmCmd.Flags().BoolVar(&live, "live", false, "read the kernel's IPVS table instead of ipvsadm -Sn output")
	cmd.AddCommand(ipvsadmCmd)
	cmd.AddCommand(&cobra.Command{
		Use:   "metallb FILE...",
		Short: "Import MetalLB's custom resources into [kubernetes] pools and [bgp]",
		Long: `Import MetalLB's custom resources (metallb.io/v1beta1, and v1beta2 for
BGPPeer) from YAML files: documents separated by "---", or the lists that
"kubectl get -o yaml" writes, such as the output of
  kubectl get -n metallb-system -o yaml ipaddresspools,l2advertisements,bgppeers,bgpadvertisements,communities
IPAddressPools become [[kubernetes.pool]]s; with BGPPeers, they and the
BGPAdvertisements become [bgp], otherwise the L2Advertisements' interfaces
become [daemon] uplinks. Secrets are not read.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := migrate.MetalLB(args, migrate.MetalLBOptions{})
			return finishAs(cmd, r, "pools", r.Pools)
		},
	})
	return cmd
}
