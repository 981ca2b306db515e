package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/lb/lbtest"
)

// TestControlSocketPath: vipd replaces only a stale socket at
// control_socket. A regular file, a directory or a symbolic link there
// (control_socket mistyped) ends the start before vipd touches the
// kernel, with an error naming the path, and is left as it was; the
// link is not followed. A socket something listens on is another vipd's.
// A stale socket (its vipd killed) is replaced and answers.
func TestControlSocketPath(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, sock string)
		want  []string
	}{
		{"regular file", func(t *testing.T, sock string) {
			if err := os.WriteFile(sock, []byte("precious\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a socket", "a regular file"}},
		{"directory", func(t *testing.T, sock string) {
			if err := os.Mkdir(sock, 0o755); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a socket", "a directory"}},
		{"symbolic link to a file", func(t *testing.T, sock string) {
			target := filepath.Join(filepath.Dir(sock), "target")
			if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, sock); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a socket", "a symbolic link"}},
		{"symbolic link to a stale socket", func(t *testing.T, sock string) {
			target := filepath.Join(filepath.Dir(sock), "target")
			staleSocket(t, target)
			if err := os.Symlink(target, sock); err != nil {
				t.Fatal(err)
			}
		}, []string{"not a socket", "a symbolic link"}},
		{"live socket", func(t *testing.T, sock string) {
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, []string{"something listens on it", "another vipd"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			path := daemonDir(t, root, "a", "")
			sock := filepath.Join(root, "a", "vipd.sock")
			c.setup(t, sock)
			before := listing(t, filepath.Join(root, "a"))
			in := launch(t, "vipd", lbtest.New(), launchOptions{path: path})
			err := in.mustFail(append(c.want, sock)...)
			t.Logf("refused: %v", err)
			if after := listing(t, filepath.Join(root, "a")); after != before {
				t.Errorf("the start changed the directory:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
	t.Run("stale socket", func(t *testing.T) {
		root := t.TempDir()
		path := daemonDir(t, root, "a", "")
		sock := filepath.Join(root, "a", "vipd.sock")
		staleSocket(t, sock)
		in := launch(t, "vipd", lbtest.New(), launchOptions{path: path})
		in.mustRun()
		if rep, err := control.Call(sock, "GET", "/v1/status"); err != nil || rep.Status == nil {
			t.Fatalf("status on the replaced socket: %+v %v", rep, err)
		}
	})
}

// staleSocket leaves a unix socket at path that nothing listens on, as a
// killed vipd does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket %s: %v %v", path, fi, err)
	}
}

// listing describes the entries of dir but state/: name, type, inode,
// size, link target and contents.
func listing(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		if e.Name() == "state" {
			continue
		}
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(e.Name() + " " + fi.Mode().String())
		b.WriteString(" ino " + strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10))
		if target, err := os.Readlink(p); err == nil {
			b.WriteString(" -> " + target)
		}
		if fi.Mode().IsRegular() {
			c, _ := os.ReadFile(p)
			b.WriteString(" " + string(c))
		}
		b.WriteString("\n")
	}
	return b.String()
}
