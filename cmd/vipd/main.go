// Command vipd is a bare-metal L4 load balancer: it binds VIPs to a dummy
// interface, programs Linux IPVS and the iptables helpers IPVS needs, and
// keeps them in step with a TOML configuration.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	if err := newRoot(os.Stdout, os.Stderr).Execute(); err != nil {
		var ex exitError
		if errors.As(err, &ex) {
			os.Exit(int(ex))
		}
		fmt.Fprintln(os.Stderr, "vipd:", err)
		os.Exit(1)
	}
}

// exitError ends the program with a status after output was printed.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "vipd",
		Short: "A bare-metal L4 load balancer on Linux IPVS",
		Long: `vipd binds virtual IPs to a dummy interface it owns, programs Linux IPVS
(every scheduler; NAT, direct-routing and tunnel forwarding) and the
iptables helpers IPVS needs, announces VIPs with gratuitous ARP, and keeps
all of it in step with a TOML file, touching only what it owns.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newCheckCmd(), newPlanCmd(), newRunCmd(), newReloadCmd(), newStatusCmd(),
		newDrainCmd("drain"), newDrainCmd("undrain"), newVersionCmd(), newImportCmd())
	return root
}

func newCheckCmd() *cobra.Command {
	var offline bool
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a configuration file",
		Long: `Check reads FILE, and the files it includes, and reports every
problem in them, each with the file, line and key. Unless --offline, it
also looks up the exec checks' user (check_user), reads the https checks'
ca_file and refuses a VIP that is an address of another interface of this
host; with --offline it looks nothing up on this host and prints a line
for each kind of lookup it skipped. It exits 0 when the configuration is
valid.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.LoadWith(args[0], config.LoadOptions{Offline: offline})
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), err)
				return exitError(1)
			}
			if offline {
				for _, s := range cfg.Unchecked() {
					fmt.Fprintf(cmd.OutOrStdout(), "offline: not checked: %s\n", s)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "offline: not checked: no VIP is an address of another interface of this host")
			} else if err := checkHostVIPs(cfg); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), err)
				return exitError(1)
			}
			if n := len(cfg.Texts()); n > 1 {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok, %d services in %d files\n", cfg.File, len(cfg.Spec.Services), n)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok, %d services\n", cfg.File, len(cfg.Spec.Services))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&offline, "offline", false, "check the files alone: no lookups on this host (users, ca_file, addresses)")
	return cmd
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print vipd's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, args []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "vipd", versionString())
		},
	}
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v = s.Value[:12]
			}
		}
		if v != "" {
			return v
		}
	}
	return "devel"
}
