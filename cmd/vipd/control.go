package main

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/control"
	"github.com/vipd/vipd/monitor/status"
)

// The commands that talk to a running daemon through its control socket
// (see package control).

func newReloadCmd() *cobra.Command {
	var (
		socket string
		force  bool
	)
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Ask the running daemon to reload its configuration file",
		Long: `Reload asks the running vipd to re-read its configuration file and
prints the operations it applied. A file with errors, or one that would
delete more than reload_guard of the services or backends, is refused and
the running configuration keeps serving; --force applies the latter anyway.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/v1/reload"
			if force {
				path += "?force=1"
			}
			rep, err := control.Call(socket, http.MethodPost, path)
			if err != nil {
				return err
			}
			if err := printReply(cmd, rep); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reloaded: %d operations applied\n", len(rep.Applied))
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().BoolVar(&force, "force", false, "apply even if the reload guard refuses")
	return cmd
}

func socketFlag(cmd *cobra.Command, socket *string) {
	cmd.Flags().StringVar(socket, "socket", config.DefaultControlSocket, "control socket of the running vipd")
}

// printReply prints what a reply applied and failed, and its error.
func printReply(cmd *cobra.Command, rep control.Reply) error {
	out := cmd.OutOrStdout()
	for _, a := range rep.Applied {
		fmt.Fprintln(out, "applied:", a)
	}
	for _, f := range rep.Failed {
		fmt.Fprintln(out, "failed:", f)
	}
	if rep.Error != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), rep.Error)
		return exitError(1)
	}
	return nil
}

func newStatusCmd() *cobra.Command {
	var socket, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every service and backend as the running daemon sees them",
		Long: `Status shows every service and backend: configured and current weight and
why they differ (health, admin drain, draining after removal, drift), health
and since when, connections and rates: ipvsadm -Ln --stats joined with what
vipd knows, as of the time printed. vipd reads the kernel for it at most
once per stats_interval (and again after a change it made), however many
ask; the metrics show the same. -o json prints the same for scripts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
			path := "/v1/status"
			switch output {
			case "json":
			case "table", "":
				// The daemon renders the table; an older one answers
				// JSON, rendered here.
				path += "?format=table"
			default:
				return fmt.Errorf("-o %q: want table or json", output)
			}
			a, err := control.CallRaw(socket, http.MethodGet, path)
			if err != nil {
				return err
			}
			switch head, tail, ok := a.StatusJSON(); {
			case output != "json" && a.OK && a.ContentType == control.TableType:
				a.Copy(out, 0, 0)
			case output == "json" && ok:
				// The daemon's snapshot, indented as it comes:
				// decoding it and encoding it again took seconds at
				// 10,000 services.
				x := &indenter{w: out}
				a.Copy(x, head, tail)
				if err := x.Close(); err != nil {
					return fmt.Errorf("status: bad reply from vipd: %w", err)
				}
			default:
				var rep control.Reply
				if err := a.Decode(&rep); err != nil {
					return err
				}
				if rep.Error != "" || rep.Status == nil {
					return printReply(cmd, control.Reply{Error: "status: " + rep.Error})
				}
				render := status.RenderTable
				if output == "json" {
					render = status.RenderJSON
				}
				if err := render(out, rep.Status); err != nil {
					return err
				}
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("status: %w", err)
			}
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newDrainCmd(kind string) *cobra.Command {
	var (
		socket string
		node   bool
	)
	short := "Take a backend out of rotation (weight 0) until undrained; survives reloads and restarts"
	nodeHelp := "drain the node: hand its VIPs to its [ha] peer at once and stay out of the election, or withdraw its [bgp] routes, until vipd undrain --node"
	if kind == "undrain" {
		short = "Put an admin-drained backend back into rotation"
		nodeHelp = "undrain the node: take part in the [ha] election again, or announce its [bgp] routes again"
	}
	cmd := &cobra.Command{
		Use:   kind + " SERVICE BACKEND | " + kind + " --node",
		Short: short,
		Long: short + `.
SERVICE is a service name, or "*" for every service that has BACKEND;
BACKEND is address:port as the backend is configured. With --node, the
node itself: a node with an [ha] section hands its VIPs to its peer (it
advertises priority 0) and stays a backup, across restarts, until vipd
undrain --node.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if node {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if node {
				rep, err := control.Call(socket, http.MethodPost, "/v1/"+kind+"?node=1")
				if err != nil {
					return err
				}
				if err := printReply(cmd, rep); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%sed the node\n", kind)
				return nil
			}
			q := url.Values{"service": {args[0]}, "backend": {args[1]}}
			rep, err := control.Call(socket, http.MethodPost, "/v1/"+kind+"?"+q.Encode())
			if err != nil {
				return err
			}
			if err := printReply(cmd, rep); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%sed %s %s\n", kind, args[0], args[1])
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().BoolVar(&node, "node", false, nodeHelp)
	return cmd
}

// The servers' limits. The control socket's write timeout is the
// client's, as a reload of a large configuration may take a minute, and
// its idle timeout is short, as its client makes one request per
// connection; the metrics endpoint's write timeout allows a slow scrape
// of a large table, and its idle timeout keeps a scraper's connection
// from one scrape to the next. The metrics endpoint, open to whoever
// reaches metrics_listen, cannot be held by anyone's idle or slow
// connections (MaxConnsPerClient, and see connSlots), and a scrape
// waits a second for one of the four renderings rather than be refused
// by a burst of others.
var (
	controlLimits = control.Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 5 * time.Minute,
		IdleTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 32, MaxRequests: 4}
	metricsLimits = control.Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: time.Minute,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10, MaxConns: 64, MaxConnsPerClient: 8, MaxRequests: 4, RequestWait: time.Second}
)

// slowHeaders is how long a metrics client may take to send its
// request's headers before another client that finds every connection
// slot taken may take its slot: a scraper sends them at once.
const slowHeaders = time.Second
