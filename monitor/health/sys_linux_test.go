package health

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_NET_ADMIN, CAP_NET_RAW)")
	}
}

func TestDialMark(t *testing.T) {
	needRoot(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	opts := DialOptions{Mark: 0x1234, Device: "lo"}
	if err := NewTCPCheck(up, opts).Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("marked probe bound to lo: %v", err)
	}
	// The probe's socket carries the mark.
	conn, err := dialerFor(opts, "tcp").DialContext(probeCtx(t, 5*time.Second), "tcp", up.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mark int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		mark, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if mark != 0x1234 {
		t.Errorf("socket mark %#x, want 0x1234", mark)
	}
}

func TestDialDeviceMissing(t *testing.T) {
	needRoot(t)
	up := listenTCP(t, "tcp4", "127.0.0.1:0")
	err := NewTCPCheck(up, DialOptions{Device: "vipdnope0"}).Probe(probeCtx(t, 5*time.Second))
	if err == nil {
		t.Fatal("probe bound to a missing device passed")
	}
}

// TestExecCheckRunsAsUser runs a real exec check as nobody, as vipd runs
// them as check_user, and reads back what its command saw: its ids,
// groups, capabilities, no_new_privs, working directory, standard input,
// descriptors and environment. It runs in a copy of this test binary
// that has a supplementary group, 4242, which the command must not keep.
func TestExecCheckRunsAsUser(t *testing.T) {
	needRoot(t)
	if os.Getenv("VIPD_TEST_EXEC_GROUPS") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExecCheckRunsAsUser$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "VIPD_TEST_EXEC_GROUPS=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{0, 4242}}}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestExecCheckRunsAsUser") {
			t.Fatalf("in a process with groups 0 and 4242: %v\n%s", err, out)
		}
		return
	}
	if groups, err := os.Getgroups(); err != nil || !slices.Contains(groups, 4242) {
		t.Fatalf("the test process's groups: %v %v, want 4242 among them", groups, err)
	}
	u, err := config.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir := userDir(t, &u)
	out := filepath.Join(dir, "out")
	script := filepath.Join(filepath.Dir(dir), "check.sh")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
exec >"$OUT" 2>&1
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "groups=$(id -G)"
echo "cwd=$(pwd)"
echo "stdin=$(readlink /proc/$$/fd/0)"
if [ -e /proc/$$/fd/$LEAK ]; then echo "leaked=yes"; else echo "leaked=no"; fi
while IFS= read -r l; do
	case $l in Cap*|NoNewPrivs*) echo "$l";; esac
done </proc/$$/status
env | sed 's/^/env /'
`), 0o755); err != nil {
		t.Fatal(err)
	}
	// A descriptor vipd holds without close-on-exec, and a variable of
	// vipd's environment: neither may reach the command.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const leak = 100
	if err := syscall.Dup2(int(f.Fd()), leak); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(leak)
	t.Setenv("VIPD_TEST_SECRET", "vipd's own")
	c, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:8080"), ExecOptions{
		Command: script,
		Env:     []string{"OUT=" + out, "LEAK=" + strconv.Itoa(leak), "EXTRA=yes"},
		User:    &u,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Probe(probeCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var env []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if kv, ok := strings.CutPrefix(l, "env "); ok {
			env = append(env, kv)
			continue
		}
		k, v, _ := strings.Cut(l, "=")
		if k2, v2, ok := strings.Cut(l, ":"); ok && !strings.Contains(k2, "=") {
			k, v = k2, strings.TrimSpace(v2)
		}
		got[k] = v
	}
	want := map[string]string{
		"uid": "65534", "gid": "65534", "groups": "65534", "cwd": "/", "stdin": "/dev/null", "leaked": "no",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// The environment is the fixed one, the configured variables and
	// what sh itself sets (PWD), nothing of vipd's.
	allowed := map[string]string{
		"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "LANG": "C",
		"VIPD_BACKEND_ADDR": "127.0.0.1", "VIPD_BACKEND_PORT": "8080",
		"OUT": out, "LEAK": strconv.Itoa(leak), "EXTRA": "yes", "PWD": "/",
	}
	seen := map[string]bool{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		seen[k] = true
		if w, ok := allowed[k]; !ok || w != v {
			t.Errorf("environment has %s", kv)
		}
	}
	for k := range allowed {
		if !seen[k] && k != "PWD" {
			t.Errorf("environment lacks %s", k)
		}
	}
	if t.Failed() {
		t.Logf("the command saw:\n%s", b)
	}
}

// TestExecCheckDiesWithVipd kills a process that runs an exec check (this
// test binary again, as a helper) and checks that the command dies too.
func TestExecCheckDiesWithVipd(t *testing.T) {
	needRoot(t)
	if os.Getenv("VIPD_TEST_EXEC_HELPER") != "" {
		return // the helper runs TestExecHelper only
	}
	u, err := config.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(userDir(t, &u), "pid")
	helper := exec.Command(os.Args[0], "-test.run=^TestExecHelper$", "-test.count=1")
	helper.Env = append(os.Environ(), "VIPD_TEST_EXEC_HELPER="+pidFile)
	var out strings.Builder
	helper.Stdout, helper.Stderr = &out, &out
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	waitFor(t, "the helper's check to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if !running(pid) {
		t.Fatalf("the check's command %d is not running; helper said: %s", pid, out.String())
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	waitFor(t, "the check's command to die with the helper", func() bool { return !running(pid) })
}

// TestExecHelper is the helper of TestExecCheckDiesWithVipd: it runs an
// exec check that records its pid and sleeps, and waits to be killed.
func TestExecHelper(t *testing.T) {
	pidFile := os.Getenv("VIPD_TEST_EXEC_HELPER")
	if pidFile == "" {
		return // only as a helper
	}
	u, err := config.LookupUser("nobody")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{
		Command: "/bin/sh",
		Args:    []string{"-c", `echo $$ > "$PIDFILE"; exec sleep 60`},
		Env:     []string{"PIDFILE=" + pidFile},
		User:    &u,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("the check ended before the helper was killed: %v", c.Probe(probeCtx(t, time.Minute)))
}

func TestCanSwitch(t *testing.T) {
	nobody := User{Name: "nobody", UID: 65534, GID: 65534}
	const all = 1<<capKill | 1<<capSetgid | 1<<capSetuid
	for _, tt := range []struct {
		name       string
		euid, egid int
		eff        uint64
		err        string
	}{
		{"root with the capabilities", 0, 0, all, ""},
		{"an unprivileged vipd with them", 998, 998, all, ""},
		{"the user itself", 65534, 65534, 0, ""},
		{"root without CAP_KILL", 0, 0, all &^ (1 << capKill), "vipd runs as uid 0, gid 0 without CAP_KILL, so it cannot run exec checks as nobody (uid 65534, gid 65534)"},
		{"an unprivileged vipd", 1000, 1000, 0, "without CAP_SETUID, CAP_SETGID, CAP_KILL"},
		{"the user in another group", 65534, 1000, 0, "without CAP_SETUID, CAP_SETGID, CAP_KILL"},
	} {
		err := canSwitch(nobody, tt.euid, tt.egid, tt.eff)
		if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.err)
		}
	}
	if err := CanRunAs(nobody); os.Geteuid() == 0 && err != nil {
		t.Errorf("root: %v", err)
	}
}
