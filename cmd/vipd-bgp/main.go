// Command vipd-bgp is vipd's BGP speaker: the daemon (vipd run) starts it
// when the configuration has a [bgp] section, and it runs the speaker
// (package ha/bgp, GoBGP) in a process of its own that keeps no
// capability but CAP_NET_BIND_SERVICE, talking to the daemon over the
// socket it inherits as file descriptor 3 (see package ha/bgpproc). It
// is not meant to be started by hand.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/ha/bgp"
	"github.com/vipd/vipd/ha/bgpproc"
	"github.com/vipd/vipd/program"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vipd-bgp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("vipd-bgp", flag.ContinueOnError)
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	format := fs.String("log-format", "text", "log format: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(*level, *format)
	if err != nil {
		return err
	}
	// Port 179 is below 1024; nothing else the speaker does needs a
	// capability (TCP MD5 signatures and TTLs do not).
	if err := program.DropPrivileges(unix.CAP_NET_BIND_SERVICE); err != nil {
		return fmt.Errorf("drop privileges: %w", err)
	}
	conn, err := program.Socket("vipd-bgp")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return bgpproc.Serve(ctx, bgpproc.ServeOptions{Conn: conn, Start: func(ctx context.Context, o bgpproc.Options, onPeer func(bgp.Peer)) (bgpproc.Speaker, error) {
		return bgp.Start(ctx, bgp.Options{Options: o, Logger: log, OnPeer: onPeer})
	}})
}

// newLogger returns the logger of the daemon's flags, on standard error,
// which is the daemon's.
func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(os.Stderr, opts)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return slog.New(h), nil
}
