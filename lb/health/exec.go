package health

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// maxOutput is how much of an exec check's output its error keeps: the
// last bytes, where the reason for a failure usually is.
const maxOutput = 1024

// execWaitDelay bounds the wait for a killed command's output pipes, held
// open by any child that escaped its process group.
const execWaitDelay = time.Second

// ExecOptions configure exec checks.
type ExecOptions struct {
	// Command is the program to run, looked up in PATH if it has no
	// slash.
	Command string
	// Args are its arguments.
	Args []string
	// Env adds "NAME=value" variables to the daemon's environment, after
	// VIPD_BACKEND_ADDR and VIPD_BACKEND_PORT.
	Env []string
}

func (o ExecOptions) validate() error {
	var errs []error
	if o.Command == "" {
		errs = append(errs, errors.New("exec command is missing"))
	}
	for _, kv := range o.Env {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			errs = append(errs, fmt.Errorf("exec env %q is not NAME=value", kv))
		}
	}
	return errors.Join(errs...)
}

// ExecCheck is up when its command exits with status 0. The command gets
// the probed address in VIPD_BACKEND_ADDR and VIPD_BACKEND_PORT; it runs
// in its own process group, all of which is killed at the timeout. The
// tail of its output (stdout and stderr together) is part of the error of
// a failed probe.
type ExecCheck struct {
	opts ExecOptions
	env  []string
}

// NewExecCheck returns a check that runs opts.Command for addr.
func NewExecCheck(addr netip.AddrPort, opts ExecOptions) (*ExecCheck, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	env := append(os.Environ(),
		"VIPD_BACKEND_ADDR="+addr.Addr().String(),
		"VIPD_BACKEND_PORT="+strconv.Itoa(int(addr.Port())),
	)
	env = append(env, opts.Env...)
	return &ExecCheck{opts: opts, env: env}, nil
}

// Probe runs the command once.
func (c *ExecCheck) Probe(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, c.opts.Command, c.opts.Args...)
	cmd.Env = c.env
	out := &tail{max: maxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = execWaitDelay
	killGroup(cmd)
	err := cmd.Run()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("killed at timeout: %w", context.Cause(ctx))
	}
	if s := out.String(); s != "" {
		return fmt.Errorf("exec %s: %w; output: %q", c.opts.Command, err, s)
	}
	return fmt.Errorf("exec %s: %w", c.opts.Command, err)
}

// tail is a writer that keeps the last max bytes written to it.
type tail struct {
	max int
	buf []byte
	cut bool
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// String returns the kept output without surrounding space, marked as
// cut if earlier output was dropped.
func (t *tail) String() string {
	s := strings.TrimSpace(string(t.buf))
	if t.cut {
		s = "..." + s
	}
	return s
}
