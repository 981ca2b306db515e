package health

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
)

// testUser returns the user exec checks of the tests run as: nobody when
// the tests run as root, as production runs them, or else the tests' own
// user, the one user an unprivileged process can run commands as.
func testUser(t *testing.T) *User {
	t.Helper()
	if os.Geteuid() != 0 {
		return &User{Name: "current", UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
	}
	u, err := config.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	return &u
}

// userDir returns a new directory that u owns and every user can reach.
func userDir(t *testing.T, u *User) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestExecCheck(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.1:8080")
	u := testUser(t)
	tests := []struct {
		name string
		opts ExecOptions
		err  string
	}{
		{"true", ExecOptions{Command: "/bin/true"}, ""},
		{"false", ExecOptions{Command: "/bin/false"}, "exit status 1"},
		{"output captured", ExecOptions{Command: "/bin/sh", Args: []string{"-c", "echo starting; echo 'backend said no' >&2; exit 3"}}, `exit status 3; output: "starting\nbackend said no"`},
		{"environment", ExecOptions{
			Command: "/bin/sh",
			Args:    []string{"-c", `test "$VIPD_BACKEND_ADDR" = 127.0.0.1 && test "$VIPD_BACKEND_PORT" = 8080 && test "$EXTRA" = yes`},
			Env:     []string{"EXTRA=yes"},
		}, ""},
		{"home and lang may be overridden", ExecOptions{
			Command: "/bin/sh",
			Args:    []string{"-c", `test "$HOME" = /var/lib/check && test "$LANG" = C.UTF-8`},
			Env:     []string{"HOME=/var/lib/check", "LANG=C.UTF-8"},
		}, ""},
		{"missing command", ExecOptions{Command: "/nonexistent/vipd-check"}, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.User = u
			c, err := NewExecCheck(addr, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Probe(probeCtx(t, 5*time.Second))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("probe: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("probe: %v, want error containing %q", err, tt.err)
			}
		})
	}
}

func TestExecCheckTimeoutKillsGroup(t *testing.T) {
	u := testUser(t)
	pidFile := filepath.Join(userDir(t, u), "pid")
	// The shell starts a child that would outlive it, records the child's
	// pid and waits: the timeout must kill both.
	c, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{
		Command: "/bin/sh",
		Args:    []string{"-c", `sleep 30 & echo $! > "$PIDFILE"; echo waiting; wait`},
		Env:     []string{"PIDFILE=" + pidFile},
		User:    u,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = c.Probe(probeCtx(t, 300*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "killed at timeout") || !strings.Contains(err.Error(), "waiting") {
		t.Fatalf("probe: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("probe took %s with a 300ms timeout", d)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shell's child to die", func() bool { return !running(pid) })
}

// running reports whether a process exists and is not a zombie.
func running(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestExecOutputTail(t *testing.T) {
	tl := &tail{max: 8}
	_, _ = tl.Write([]byte("0123456789"))
	_, _ = tl.Write([]byte("abc"))
	if got := tl.String(); got != "...56789abc" {
		t.Errorf("tail %q", got)
	}
}

func TestExecOptionsValidate(t *testing.T) {
	u := testUser(t)
	for _, tt := range []struct {
		opts ExecOptions
		err  string
	}{
		{ExecOptions{}, "exec command is missing"},
		{ExecOptions{Command: "true"}, `exec command "true" is not an absolute path: commands are not looked up in PATH (write the full path, say /usr/bin/true)`},
		{ExecOptions{Command: "bin/check"}, "not an absolute path"},
		{ExecOptions{Command: "/bin/true\x00x"}, "NUL"},
		{ExecOptions{Command: "/bin/true", Args: []string{"a\x00"}}, "NUL"},
		{ExecOptions{Command: "/bin/true", Env: []string{"NOEQUALS"}}, "is not NAME=value"},
		{ExecOptions{Command: "/bin/true", Env: []string{"=x"}}, "is not NAME=value"},
		{ExecOptions{Command: "/bin/true", Env: []string{"1X=x"}}, "is not a variable name"},
		{ExecOptions{Command: "/bin/true", Env: []string{"A-B=x"}}, "is not a variable name"},
		{ExecOptions{Command: "/bin/true", Env: []string{"X=a\x00b"}}, "NUL"},
		{ExecOptions{Command: "/bin/true", Env: []string{"PATH=/tmp"}}, "exec env may not set PATH: vipd sets it (PATH=/usr/sbin:/usr/bin:/sbin:/bin)"},
		{ExecOptions{Command: "/bin/true", Env: []string{"VIPD_BACKEND_ADDR=10.0.0.1"}}, "exec env may not set VIPD_BACKEND_ADDR: VIPD_ variables are vipd's"},
		{ExecOptions{Command: "/bin/true", Env: []string{"VIPD_ANYTHING=1"}}, "may not set VIPD_ANYTHING"},
		{ExecOptions{Command: "/bin/true", Env: []string{"LD_PRELOAD=/tmp/x.so"}}, "exec env may not set LD_PRELOAD: loader variables (LD_*)"},
		{ExecOptions{Command: "/bin/true", Env: []string{"LD_LIBRARY_PATH=/tmp"}}, "may not set LD_LIBRARY_PATH"},
		{ExecOptions{Command: "/bin/true", Env: []string{"BASH_ENV=/tmp/x"}}, "may not set BASH_ENV: it makes a shell"},
		{ExecOptions{Command: "/bin/true", Env: []string{"ENV=/tmp/x"}}, "may not set ENV"},
		{ExecOptions{Command: "/bin/true", Env: []string{"IFS=/"}}, "may not set IFS"},
		{ExecOptions{Command: "/bin/true", Env: []string{"SHELLOPTS=xtrace"}}, "may not set SHELLOPTS"},
		{ExecOptions{Command: "/bin/true", Env: []string{"BASH_FUNC_ls=() { :; }"}}, "may not set BASH_FUNC_ls"},
		{ExecOptions{Command: "/bin/true", Env: []string{"GCONV_PATH=/tmp"}}, "may not set GCONV_PATH"},
		{ExecOptions{Command: "/bin/true", Env: []string{"A=1", "A=2"}}, "exec env sets A twice"},
	} {
		tt.opts.User = u
		_, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q %q: %v, want an error containing %q", tt.opts.Command, tt.opts.Env, err, tt.err)
		}
	}
	for _, env := range [][]string{{"HOME=/var/lib/x", "LANG=C.UTF-8", "LC_ALL=C", "_X1=", "PGPASSFILE=/etc/x"}, nil} {
		if _, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{Command: "/bin/true", Env: env, User: u}); err != nil {
			t.Errorf("env %q: %v", env, err)
		}
	}
	if _, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{Command: "/bin/true"}); err == nil ||
		!strings.Contains(err.Error(), "exec check has no user to run as") {
		t.Errorf("exec check without a user: %v", err)
	}
}

func TestExecCheckRefusesReplaceableCommand(t *testing.T) {
	u := testUser(t)
	dir := t.TempDir()
	script := func(dir string, mode os.FileMode) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "check")
		if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	chmod := func(p string, mode os.FileMode) {
		t.Helper()
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	chmod(filepath.Dir(dir), 0o755)
	chmod(dir, 0o755)
	open := filepath.Join(dir, "open")
	sticky := filepath.Join(dir, "sticky")
	group := filepath.Join(dir, "group")
	tests := []struct {
		name, cmd, err string
	}{
		{"world-writable file", script(filepath.Join(dir, "file"), 0o757), "is writable by every user (mode -rwxr-xrwx), who could replace the check: chmod o-w"},
		{"world-writable directory", script(open, 0o755), "directory " + open + " is writable by every user (mode -rwxrwxrwx)"},
		{"sticky world-writable directory", script(sticky, 0o755), ""},
		{"group-writable", script(group, 0o775), ""},
		{"symbolic link into a world-writable directory", filepath.Join(dir, "link"), "directory " + open + " is writable by every user"},
		{"a directory", dir, "is not a regular file"},
	}
	chmod(open, 0o777)
	chmod(sticky, 0o777|os.ModeSticky)
	chmod(group, 0o775)
	if err := os.Symlink(filepath.Join(open, "check"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{Command: tt.cmd, User: u})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Probe(probeCtx(t, 5*time.Second))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("probe: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("probe: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}
