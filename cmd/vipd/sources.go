package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/process"
)

// kubernetesProgram is the name of the Kubernetes provider program,
// found beside the vipd executable unless [kubernetes] program says
// where.
const kubernetesProgram = "vipd-kubernetes"

// openSources opens the sources of services cfg asks for besides the
// file: the Kubernetes API of its [kubernetes] section, which runs in a
// program of its own (vipd-kubernetes). A program that is not there
// fails the start.
func openSources(cfg *config.Config, log *slog.Logger) ([]source.Source, error) {
	k := cfg.Kubernetes
	if !k.Enabled {
		return nil, nil
	}
	program := k.Program
	if program == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: the provider program: set [kubernetes] program: %w", err)
		}
		program = filepath.Join(filepath.Dir(exe), kubernetesProgram)
	}
	log = log.With("source", "kubernetes")
	opts := process.OptionsOf(cfg)
	opts.LogLevel = int(leastLevel(log))
	src, err := process.New(process.SourceOptions{Program: program, Options: opts, Logger: log, NamePrefix: "k8s/"})
	if err != nil {
		where := "(the default beside vipd; [kubernetes] program names another)"
		if k.Program != "" {
			where = "([kubernetes] program)"
		}
		return nil, fmt.Errorf("kubernetes: the provider program %s %s: %w", program, where, err)
	}
	return []source.Source{src}, nil
}

// leastLevel returns the least level log takes.
func leastLevel(log *slog.Logger) slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if log.Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError
}
