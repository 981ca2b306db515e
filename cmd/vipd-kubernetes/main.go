// Command vipd-kubernetes is vipd's Kubernetes provider: the daemon
// (vipd run) starts it when the configuration enables [kubernetes], and
// it runs the Kubernetes source in a process of its own, without
// capabilities, talking to the daemon over the socket it inherits as
// file descriptor 3 (see package source/process). It is not meant to be
// started by hand.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vipd/vipd/program"
	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/process"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vipd-kubernetes:", err)
		os.Exit(1)
	}
}

func run() error {
	if err := program.DropPrivileges(); err != nil {
		return fmt.Errorf("drop privileges: %w", err)
	}
	conn, err := program.Socket("vipd-kubernetes")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return process.Serve(ctx, process.ServeOptions{Conn: conn, Log: os.Stderr, Open: open})
}

// open returns the Kubernetes source of the daemon's options.
func open(o process.Options, log *slog.Logger) (process.Provider, error) {
	opts, err := optionsOf(o)
	if err != nil {
		return nil, err
	}
	opts.Logger = log
	src, err := kubernetes.New(opts)
	if err != nil {
		return nil, err
	}
	return provider{src}, nil
}

// optionsOf returns the source's options of the wire's: the same fields
// by name (a test proves they are), with the wire's log level besides.
func optionsOf(o process.Options) (kubernetes.Options, error) {
	var out kubernetes.Options
	data, err := json.Marshal(o)
	if err != nil {
		return out, fmt.Errorf("options: %w", err)
	}
	type plain kubernetes.Options
	all := struct {
		*plain
		LogLevel int `json:"log_level"`
	}{plain: (*plain)(&out)}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&all); err != nil {
		return out, fmt.Errorf("options: %w", err)
	}
	return out, nil
}

// provider adapts the source to process.Provider.
type provider struct{ s *kubernetes.Source }

func (p provider) Run(ctx context.Context, sink source.Sink) error { return p.s.Run(ctx, sink) }

func (p provider) SetPools(pools []process.Pool) error {
	out := make([]kubernetes.Pool, len(pools))
	for i, q := range pools {
		out[i] = kubernetes.Pool(q)
	}
	return p.s.SetPools(out)
}

func (p provider) Counts() []process.PoolCount {
	var out []process.PoolCount
	p.s.EachPool(func(pool, family string, total, inUse, free float64) {
		out = append(out, process.PoolCount{Pool: pool, Family: family, Total: total, InUse: inUse, Free: free})
	})
	return out
}
