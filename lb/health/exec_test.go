package health

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestExecCheck(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.1:8080")
	tests := []struct {
		name string
		opts ExecOptions
		err  string
	}{
		{"true", ExecOptions{Command: "true"}, ""},
		{"false", ExecOptions{Command: "false"}, "exit status 1"},
		{"output captured", ExecOptions{Command: "sh", Args: []string{"-c", "echo starting; echo 'backend said no' >&2; exit 3"}}, `exit status 3; output: "starting\nbackend said no"`},
		{"environment", ExecOptions{
			Command: "sh",
			Args:    []string{"-c", `test "$VIPD_BACKEND_ADDR" = 127.0.0.1 && test "$VIPD_BACKEND_PORT" = 8080 && test "$EXTRA" = yes`},
			Env:     []string{"EXTRA=yes"},
		}, ""},
		{"missing command", ExecOptions{Command: "/nonexistent/vipd-check"}, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
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
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The shell starts a child that would outlive it, records the child's
	// pid and waits: the timeout must kill both.
	c, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), ExecOptions{
		Command: "sh",
		Args:    []string{"-c", `sleep 30 & echo $! > "$PIDFILE"; echo waiting; wait`},
		Env:     []string{"PIDFILE=" + pidFile},
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
	for _, o := range []ExecOptions{{}, {Command: "true", Env: []string{"NOEQUALS"}}, {Command: "true", Env: []string{"=x"}}} {
		if _, err := NewExecCheck(netip.MustParseAddrPort("127.0.0.1:80"), o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
