package health

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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

// ExecCheck is up when its command exits with status 0.
//
// The command runs as its User, with that user's group as its only group,
// no capabilities (the switch from root to another uid clears them all),
// no_new_privs (set-user-ID programs and file capabilities give it
// nothing), in its own process group, all of which is killed at the
// timeout, and is killed too if vipd dies. Its working directory is /,
// its standard input /dev/null, and it gets no file descriptors of vipd's
// but its standard output and error.
//
// Its environment is fixed: PATH=/usr/sbin:/usr/bin:/sbin:/bin, HOME=/,
// LANG=C, the probed address in VIPD_BACKEND_ADDR and VIPD_BACKEND_PORT,
// and the configured Env, nothing of vipd's own environment.
//
// A command that others can replace is refused at each probe: a
// world-writable file, or one in a world-writable directory without the
// sticky bit (on any part of its path, symbolic links resolved).
//
// The tail of its output (stdout and stderr together) is part of the error
// of a failed probe.
type ExecCheck struct {
	opts ExecOptions
	env  []string
	run  runAs
}

// NewExecCheck returns a check that runs opts.Command for addr as
// opts.User. It fails when vipd cannot switch to that user (see
// CanRunAs).
func NewExecCheck(addr netip.AddrPort, opts ExecOptions) (*ExecCheck, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.User == nil {
		return nil, errors.New("exec check has no user to run as (check_user)")
	}
	run, err := newRunAs(*opts.User)
	if err != nil {
		return nil, err
	}
	env := []string{
		"PATH=" + ExecPath,
		"HOME=/",
		"LANG=C",
		"VIPD_BACKEND_ADDR=" + addr.Addr().String(),
		"VIPD_BACKEND_PORT=" + strconv.Itoa(int(addr.Port())),
	}
	// Configured variables come last: they override HOME and LANG, and
	// may set nothing else that is here.
	env = append(env, opts.Env...)
	return &ExecCheck{opts: opts, env: env, run: run}, nil
}

// Probe runs the command once.
func (c *ExecCheck) Probe(ctx context.Context) error {
	if err := checkReplaceable(c.opts.Command); err != nil {
		return fmt.Errorf("exec %s: %w", c.opts.Command, err)
	}
	cmd := exec.CommandContext(ctx, c.opts.Command, c.opts.Args...)
	cmd.Env = c.env
	cmd.Dir = "/"
	out := &tail{max: maxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = execWaitDelay
	err := c.run(cmd)
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

// checkReplaceable refuses a command that any user could replace: a
// world-writable file, or one below a world-writable directory that lacks
// the sticky bit. A group-writable file or directory is the group's
// members' to change, the administrator's decision (Debian once made
// /usr/local writable by group staff), and passes.
func checkReplaceable(command string) error {
	real, err := filepath.EvalSymlinks(command)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", real)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("%s is writable by every user (mode %s), who could replace the check: chmod o-w %s", real, fi.Mode().Perm(), real)
	}
	for dir := filepath.Dir(real); ; dir = filepath.Dir(dir) {
		di, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if di.Mode().Perm()&0o002 != 0 && di.Mode()&os.ModeSticky == 0 {
			return fmt.Errorf("directory %s is writable by every user (mode %s), who could replace the check: chmod o-w %s, or move the command", dir, di.Mode().Perm(), dir)
		}
		if dir == "/" || dir == "." {
			return nil
		}
	}
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
