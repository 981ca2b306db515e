package health

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// ExecPath is the PATH of every exec check's command.
const ExecPath = "/usr/sbin:/usr/bin:/sbin:/bin"

// ExecOptions configure exec checks.
type ExecOptions struct {
	// Command is the absolute path of the program to run. It is never
	// looked up in PATH: a relative name would run whatever a directory
	// of a PATH the operator did not write holds under that name.
	Command string
	// Args are its arguments.
	Args []string
	// Env adds "NAME=value" variables to the command's fixed environment
	// (see ExecCheck). It may set neither PATH nor a VIPD_ variable, which
	// vipd sets, nor a variable that makes the loader, the C library or a
	// shell run code that the command does not name (see CheckExecEnv).
	// It may override HOME and LANG.
	Env []string
	// User is the identity the command runs as. It is not part of the
	// configuration of a check but of the daemon (check_user): the config
	// package sets it on the Targets it returns. NewExecCheck refuses an
	// exec check without one; there is no default, and never root.
	User *User
}

func (o ExecOptions) validate() error {
	var errs []error
	if err := CheckExecCommand(o.Command); err != nil {
		errs = append(errs, err)
	}
	for _, a := range o.Args {
		if strings.ContainsRune(a, 0) {
			errs = append(errs, fmt.Errorf("exec argument %q holds a NUL byte", a))
		}
	}
	seen := map[string]bool{}
	for _, kv := range o.Env {
		if err := CheckExecEnv(kv); err != nil {
			errs = append(errs, err)
			continue
		}
		name, _, _ := strings.Cut(kv, "=")
		if seen[name] {
			errs = append(errs, fmt.Errorf("exec env sets %s twice", name))
		}
		seen[name] = true
	}
	return errors.Join(errs...)
}

// CheckExecCommand checks an exec check's command: an absolute path.
func CheckExecCommand(command string) error {
	switch {
	case command == "":
		return errors.New("exec command is missing")
	case strings.ContainsRune(command, 0):
		return fmt.Errorf("exec command %q holds a NUL byte", command)
	case !filepath.IsAbs(command):
		return fmt.Errorf("exec command %q is not an absolute path: commands are not looked up in PATH (write the full path, say /usr/bin/%s)", command, filepath.Base(command))
	}
	return nil
}

// execEnvReserved holds the variables that make a shell or the C library
// run code, or parse a script, other than the command says: configured env
// may not set them (nor LD_*, BASH_FUNC_*, PATH or VIPD_*).
var execEnvReserved = []string{
	"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "CDPATH", "GLOBIGNORE", "PS4", "PROMPT_COMMAND",
	"GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF",
}

// CheckExecEnv checks one "NAME=value" entry of an exec check's env: NAME
// is a portable variable name (letters, digits and _, not starting with a
// digit), the value holds no NUL byte, and NAME is not one that vipd sets
// (PATH, VIPD_*) or one that loads or runs code the command does not name:
// loader variables (LD_*), shell start-up and parsing variables (BASH_ENV,
// ENV, SHELLOPTS, BASHOPTS, IFS, CDPATH, GLOBIGNORE, PS4, PROMPT_COMMAND,
// BASH_FUNC_*) and the C library's (GCONV_PATH, GLIBC_TUNABLES, LOCPATH,
// NLSPATH, HOSTALIASES, RESOLV_HOST_CONF).
func CheckExecEnv(kv string) error {
	name, value, ok := strings.Cut(kv, "=")
	if !ok || name == "" {
		return fmt.Errorf("exec env %q is not NAME=value", kv)
	}
	for i, r := range name {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return fmt.Errorf("exec env %q: %q is not a variable name (letters, digits and _, not starting with a digit)", kv, name)
		}
	}
	if strings.ContainsRune(value, 0) {
		return fmt.Errorf("exec env %s: the value holds a NUL byte", name)
	}
	switch {
	case name == "PATH":
		return fmt.Errorf("exec env may not set %s: vipd sets it (%s=%s); call programs by their full path instead", name, name, ExecPath)
	case strings.HasPrefix(name, "VIPD_"):
		return fmt.Errorf("exec env may not set %s: VIPD_ variables are vipd's (VIPD_BACKEND_ADDR, VIPD_BACKEND_PORT)", name)
	case strings.HasPrefix(name, "LD_"):
		return fmt.Errorf("exec env may not set %s: loader variables (LD_*) make every program of the check load code the command does not name", name)
	case slices.Contains(execEnvReserved, name) || strings.HasPrefix(name, "BASH_FUNC_"):
		return fmt.Errorf("exec env may not set %s: it makes a shell or the C library run or parse code the command does not name", name)
	}
	return nil
}

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
	if err := opts.validate(); err != nil {
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
