package agent

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
)

// privateRunEnv is set in a test binary re-executed by privateRun.
const privateRunEnv = "VIPD_TEST_PRIVATE_RUN"

// nobody is the local user of the attacks: any unprivileged uid.
const nobody = 65534

// privateRun runs the calling test in a re-executed test binary with a
// mount and a network namespace of its own, in which /run is a fresh
// tmpfs laid out as a host's (/run 0755, /run/lock 1777): the test may
// then take, plant and break the real lock paths without touching the
// host's. It reports whether the caller is that re-executed test (run
// the body) or the parent (return: the child's verdict is the test's).
func privateRun(t *testing.T) bool {
	t.Helper()
	if os.Getenv(privateRunEnv) != "" {
		if err := syscall.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
			t.Fatalf("mount a private /run: %v", err)
		}
		if err := os.Mkdir("/run/lock", 0o1777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod("/run/lock", 0o1777); err != nil {
			t.Fatal(err)
		}
		return true
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (a private mount namespace, a second user); CI runs the tests as root")
		}
		t.Skip("needs root: runs in a private mount and network namespace")
	}
	// The attacks are flock(1) and ln(1), run as nobody.
	for _, tool := range []string{"flock", "ln"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (test/deps.sh installs util-linux)", tool)
			}
			t.Skipf("needs %s", tool)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), privateRunEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("in a private /run:\n%s", out)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("the re-executed test did not pass")
	}
	return false
}

// asNobody starts sh -c script as the unprivileged user nobody and
// returns its first line of output (or what it said on failing) once it
// printed one or ended. The process is killed when t ends.
func asNobody(t *testing.T, script string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}, Setpgid: true}
	cmd.Dir = "/"
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { cmd.Wait(); w.Close(); close(ended) }()
	// flock's command is a child of its own: end the process group.
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-ended })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, r)
	}()
	select {
	case s := <-line:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("%q as nobody said nothing in 10s", script)
		return ""
	}
}

// tried fails t unless the attack as nobody ran: it said ok, or that it
// was denied.
func tried(t *testing.T, said, ok string) {
	t.Helper()
	if said != ok && !strings.Contains(said, "Permission denied") {
		t.Fatalf("the attack did not run: %q", said)
	}
}

// lockConfig is a configuration whose state_dir is dir.
func lockConfig(dir string) *config.Config {
	return &config.Config{Daemon: config.Daemon{StateDir: dir}}
}

// madeNetnsLock returns this namespace's lock, its directory made as a
// vipd that ran before (or the unit's RuntimeDirectory) leaves it.
func madeNetnsLock(t *testing.T) string {
	t.Helper()
	lock, err := NetnsLock()
	if err != nil {
		t.Fatal(err)
	}
	if err := netnsLockDir(kernelLockDir); err != nil {
		t.Fatal(err)
	}
	return lock
}

// TestNetnsLockHeldByLocalUser: a local user who takes the flock of this
// namespace's lock first (flock(1) opens the file read-only, creating it
// if it can) does not keep vipd from starting.
func TestNetnsLockHeldByLocalUser(t *testing.T) {
	if !privateRun(t) {
		return
	}
	lock := madeNetnsLock(t)
	said := asNobody(t, "exec flock --nonblock "+lock+" -c 'echo held; exec sleep 60'")
	t.Logf("nobody, flock %s: %s", lock, said)
	tried(t, said, "held")
	release, err := lockDaemon(lockConfig(t.TempDir()), lock)
	if err != nil {
		t.Fatalf("a local user's flock keeps vipd out: %v", err)
	}
	release()
}

// TestNetnsLockSymlinkPlanted: a local user who plants a symbolic link at
// the lock's path, to a file of root's, neither has that file truncated
// and written (fs.protected_symlinks=0) nor keeps vipd from starting
// (=1: the open fails).
func TestNetnsLockSymlinkPlanted(t *testing.T) {
	if !privateRun(t) {
		return
	}
	victim := "/run/victim"
	if err := os.WriteFile(victim, []byte("root's secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lock := madeNetnsLock(t)
	said := asNobody(t, "ln -s "+victim+" "+lock+" && echo planted")
	t.Logf("nobody, ln -s %s %s: %s", victim, lock, said)
	tried(t, said, "planted")
	release, err := lockDaemon(lockConfig(t.TempDir()), lock)
	if err != nil {
		t.Errorf("a local user's symbolic link keeps vipd out: %v", err)
	} else {
		release()
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's secret\n" {
		t.Errorf("the link's target now holds %q", b)
	}
}

// TestStateLockHeldByLocalUser: the state lock of a state_dir others may
// enter (StateDirectory's default is 0755) cannot be held by a local
// user either: the lock of the vipd that ran before cannot be opened.
func TestStateLockHeldByLocalUser(t *testing.T) {
	if !privateRun(t) {
		return
	}
	dir := "/run/state"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	release, err := lockDaemon(lockConfig(dir), "")
	if err != nil {
		t.Fatal(err)
	}
	release()
	lock := filepath.Join(dir, stateLockName)
	said := asNobody(t, "exec flock --nonblock "+lock+" -c 'echo held; exec sleep 60'")
	t.Logf("nobody, flock %s: %s", lock, said)
	tried(t, said, "held")
	release, err = lockDaemon(lockConfig(dir), "")
	if err != nil {
		t.Fatalf("a local user's flock keeps vipd out: %v", err)
	}
	release()
}

// TestNetnsLockDir: the directory of the namespace locks is made root's
// and 0700, and its parent root's and closed to others' writes; one that
// exists otherwise (another owner, another mode, a link, not a
// directory) is refused with an error naming it, and left as it was.
func TestNetnsLockDir(t *testing.T) {
	if !privateRun(t) {
		return
	}
	lock, err := NetnsLock()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(lock)
	parent := filepath.Dir(dir)
	if dir != "/run/vipd/lock" {
		t.Errorf("the namespace lock %s is not in /run/vipd/lock", lock)
	}
	release, err := lockDaemon(lockConfig(t.TempDir()), lock)
	if err != nil {
		t.Fatal(err)
	}
	release()
	for _, c := range []struct {
		path string
		mode os.FileMode
		uid  int
	}{{parent, os.ModeDir | 0o755, 0}, {dir, os.ModeDir | 0o700, 0}, {lock, 0o600, 0}} {
		st, err := os.Lstat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != c.mode || int(st.Sys().(*syscall.Stat_t).Uid) != c.uid {
			t.Errorf("%s: %v uid %d, want %v uid %d", c.path, st.Mode(), st.Sys().(*syscall.Stat_t).Uid, c.mode, c.uid)
		}
	}
	if b, _ := os.ReadFile(lock); strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("the lock holds %q, want this pid", b)
	}

	// Each bad layout, made from scratch.
	for _, c := range []struct {
		name  string
		setup func() error
		want  string // in the error: the path it names
	}{
		{"lock dir of another user", func() error {
			return mkdir(dir, 0o700, nobody)
		}, dir},
		{"lock dir open to others", func() error {
			return mkdir(dir, 0o755, 0)
		}, dir},
		{"lock dir writable by its group", func() error {
			return mkdir(dir, 0o770, 0)
		}, dir},
		{"lock dir a link", func() error {
			if err := mkdir("/run/elsewhere", 0o700, 0); err != nil {
				return err
			}
			if err := mkdir(parent, 0o755, 0); err != nil {
				return err
			}
			return os.Symlink("/run/elsewhere", dir)
		}, dir},
		{"lock dir a file", func() error {
			if err := mkdir(parent, 0o755, 0); err != nil {
				return err
			}
			return os.WriteFile(dir, nil, 0o600)
		}, dir},
		{"parent of another user", func() error {
			if err := mkdir(parent, 0o755, nobody); err != nil {
				return err
			}
			return mkdir(dir, 0o700, 0)
		}, parent},
		{"parent writable by others", func() error {
			if err := mkdir(parent, 0o777, 0); err != nil {
				return err
			}
			return mkdir(dir, 0o700, 0)
		}, parent},
		{"lock file of another user", func() error {
			if err := mkdir(dir, 0o700, 0); err != nil {
				return err
			}
			if err := os.WriteFile(lock, nil, 0o600); err != nil {
				return err
			}
			return os.Chown(lock, nobody, nobody)
		}, lock},
		{"lock file a directory", func() error {
			if err := mkdir(dir, 0o700, 0); err != nil {
				return err
			}
			return os.Mkdir(lock, 0o700)
		}, lock},
		{"lock file a FIFO", func() error {
			if err := mkdir(dir, 0o700, 0); err != nil {
				return err
			}
			return syscall.Mkfifo(lock, 0o600)
		}, lock},
		{"lock file a link", func() error {
			if err := mkdir(dir, 0o700, 0); err != nil {
				return err
			}
			if err := os.WriteFile("/run/victim", []byte("x\n"), 0o600); err != nil {
				return err
			}
			return os.Symlink("/run/victim", lock)
		}, lock},
		{"lock file a second hard link", func() error {
			if err := mkdir(dir, 0o700, 0); err != nil {
				return err
			}
			if err := os.WriteFile("/run/victim", []byte("x\n"), 0o600); err != nil {
				return err
			}
			return os.Link("/run/victim", lock)
		}, lock},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range []string{parent, "/run/elsewhere", "/run/victim"} {
				if err := os.RemoveAll(p); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.setup(); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, parent, "/run/victim")
			lock, err := NetnsLock()
			if err == nil {
				var release func()
				release, err = lockDaemon(lockConfig(t.TempDir()), lock)
				if err == nil {
					release()
				}
			}
			if err == nil {
				t.Fatalf("accepted")
			}
			t.Logf("refused: %v", err)
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("the error does not name %s", c.want)
			}
			if after := snapshot(t, parent, "/run/victim"); after != before {
				t.Errorf("changed:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
}

// mkdir makes path with mode and owner uid, whatever the umask.
func mkdir(path string, mode os.FileMode, uid int) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(path, mode); err != nil {
		return err
	}
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	return os.Chown(path, uid, uid)
}

// snapshot lists the files below roots with their modes, owners, sizes
// and contents.
func snapshot(t *testing.T, roots ...string) string {
	t.Helper()
	var b strings.Builder
	for _, root := range roots {
		filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
			if err != nil {
				if !errors.Is(err, os.ErrNotExist) {
					b.WriteString(path + " " + err.Error() + "\n")
				}
				return nil
			}
			st := fi.Sys().(*syscall.Stat_t)
			b.WriteString(path + " " + fi.Mode().String() + " " + strconv.Itoa(int(st.Uid)) + " " + strconv.Itoa(int(fi.Size())))
			if fi.Mode().IsRegular() {
				c, _ := os.ReadFile(path)
				b.WriteString(" " + strconv.Quote(string(c)))
			}
			b.WriteString("\n")
			return nil
		})
	}
	return b.String()
}

// TestLockFileNeverFollows: whatever the lock's directory, a symbolic or
// a second hard link at a lock's path is refused and its target left as
// it was; a lock an older vipd made 0644 is made 0600.
func TestLockFileNeverFollows(t *testing.T) {
	for _, kind := range []string{"symbolic", "hard"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			link := os.Symlink
			if kind == "hard" {
				link = os.Link
			}
			state := filepath.Join(dir, "state")
			if err := os.Mkdir(state, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := link(victim, filepath.Join(state, stateLockName)); err != nil {
				t.Fatal(err)
			}
			release, err := lockDaemon(lockConfig(state), "")
			if err == nil {
				release()
				t.Errorf("a %s link at the lock's path was accepted", kind)
			} else {
				t.Logf("refused: %v", err)
				if !strings.Contains(err.Error(), filepath.Join(state, stateLockName)) {
					t.Errorf("the error does not name the lock")
				}
			}
			if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
				t.Errorf("the link's target now holds %q", b)
			}
		})
	}
	t.Run("0644", func(t *testing.T) {
		state := t.TempDir()
		lock := filepath.Join(state, stateLockName)
		if err := os.WriteFile(lock, []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		release, err := lockDaemon(lockConfig(state), "")
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		if st, err := os.Stat(lock); err != nil || st.Mode() != 0o600 {
			t.Errorf("lock %v %v, want 0600", st.Mode(), err)
		}
	})
}
