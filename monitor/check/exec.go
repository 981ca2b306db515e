package check

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

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
	// (see monitor/health.ExecCheck). It may set neither PATH nor a VIPD_ variable, which
	// vipd sets, nor a variable that makes the loader, the C library or a
	// shell run code that the command does not name (see CheckExecEnv).
	// It may override HOME and LANG.
	Env []string
	// User is the identity the command runs as. It is not part of the
	// configuration of a check but of the daemon (check_user): the config
	// package sets it on the Targets it returns. health.NewExecCheck refuses an
	// exec check without one; there is no default, and never root.
	User *User
}

// Validate reports every problem of o at once.
func (o ExecOptions) Validate() error {
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
