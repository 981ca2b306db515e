package program

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary a program: "drop" drops every
// privilege, "drop-bind" every one but CAP_NET_BIND_SERVICE, and both
// print their threads' status and that of a program they run; "echo"
// echoes what comes on its socket.
const childEnv = "VIPD_PROGRAM_TEST_CHILD"

func TestMain(m *testing.M) {
	switch mode := os.Getenv(childEnv); mode {
	case "":
		os.Exit(m.Run())
	case "drop", "drop-bind":
		var keep []int
		if mode == "drop-bind" {
			keep = append(keep, unix.CAP_NET_BIND_SERVICE)
		}
		if err := DropPrivileges(keep...); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		tasks, _ := filepath.Glob("/proc/self/task/*/status")
		for _, f := range tasks {
			b, _ := os.ReadFile(f)
			os.Stdout.Write(b)
		}
		// What a program it runs holds.
		out, err := exec.Command("/bin/cat", "/proc/self/status").Output()
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Print("---- exec\n")
		os.Stdout.Write(out)
	case "echo":
		conn, err := Socket("echo")
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		io.Copy(conn, conn)
	}
	os.Exit(0)
}

// TestDropPrivileges: every thread holds the capabilities kept alone
// (bounding, permitted, effective), no inheritable or ambient one, and
// no_new_privs; a program it runs gains none; a binary built with cgo
// is refused, saying so.
func TestDropPrivileges(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
	for _, tt := range []struct{ mode, caps string }{
		{"drop", "0000000000000000"},
		{"drop-bind", "0000000000000400"},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), childEnv+"="+tt.mode)
			out, err := cmd.Output()
			if withCgo() {
				// make test builds without cgo; a go test with it sees
				// the refusal.
				if err == nil || !strings.Contains(string(out), "built with cgo (build it with CGO_ENABLED=0)") {
					t.Errorf("with cgo: %v, %s", err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			threads, child, ok := strings.Cut(string(out), "---- exec\n")
			if !ok {
				t.Fatalf("no status of the program it ran:\n%s", out)
			}
			want := map[string]string{"CapInh": "0000000000000000", "CapPrm": tt.caps, "CapEff": tt.caps,
				"CapBnd": tt.caps, "CapAmb": "0000000000000000", "NoNewPrivs": "1"}
			for _, part := range []struct {
				name, status string
				least        int
			}{{"threads", threads, 2}, {"the program it ran", child, 1}} {
				seen := map[string]int{}
				for line := range strings.Lines(part.status) {
					k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
					if w, ok := want[k]; ok {
						seen[k]++
						if v = strings.TrimSpace(v); v != w {
							t.Errorf("%s: %s %s, want %s", part.name, k, v, w)
						}
					}
				}
				for k := range want {
					if seen[k] < part.least {
						t.Errorf("%s: %s seen %d times, want at least %d", part.name, k, seen[k], part.least)
					}
				}
			}
		})
	}
}

// TestStart starts a program that echoes on its socket, and sees it
// exit when the socket closes; a program started by hand, without the
// socket, is told what it is for.
func TestStart(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := Start(Options{Program: os.Args[0], Env: []string{childEnv + "=echo"}, Output: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c.Conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	c.Conn.Close()
	select {
	case <-c.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the program did not exit when its socket closed")
	}
	if err := c.Err(); err != nil {
		t.Errorf("exit: %v", err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=echo")
	out, _ := cmd.Output()
	if !strings.Contains(string(out), "file descriptor 3 is not a socket: echo is started by vipd run") {
		t.Errorf("by hand: %s", out)
	}
	if _, err := Start(Options{Program: "/nonexistent/vipd-bgp"}); err == nil {
		t.Error("a program that is not there started")
	}
}

// withCgo reports whether the test binary is built with cgo.
func withCgo() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return true
	}
	for _, s := range info.Settings {
		if s.Key == "CGO_ENABLED" {
			return s.Value == "1"
		}
	}
	return false
}
