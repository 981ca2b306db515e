package sysctl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

func writeFile(t *testing.T, root, path, content string) {
	t.Helper()
	p := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTempRoot(t *testing.T) {
	root := t.TempDir()
	writeFile(t, root, "net/ipv4/ip_forward", "0\n")
	writeFile(t, root, "net/ipv4/tcp_rmem", "4096\t131072\t6291456\n")
	s := New(Options{Root: root})

	if v, err := s.Get("net/ipv4/ip_forward"); err != nil || v != "0" {
		t.Fatalf("get: %q, %v", v, err)
	}
	if v, err := s.Get("net/ipv4/tcp_rmem"); err != nil || v != "4096\t131072\t6291456" {
		t.Errorf("get multi-valued: %q, %v", v, err)
	}
	if err := s.Set("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "net/ipv4/ip_forward")); string(b) != "1" {
		t.Errorf("file holds %q after set, want %q", b, "1")
	}
	if v, err := s.Get("net/ipv4/ip_forward"); err != nil || v != "1" {
		t.Errorf("get after set: %q, %v", v, err)
	}
}

func TestMissing(t *testing.T) {
	root := t.TempDir()
	s := New(Options{Root: root})
	for _, tc := range []struct{ path, want string }{
		{lb.SysctlVSConntrack, "net/ipv4/vs/conntrack: no such sysctl (is ip_vs loaded?)"},
		{"net/ipv4/conf/eth9/arp_ignore", "net/ipv4/conf/eth9/arp_ignore: no such sysctl (is there an interface eth9?)"},
		{"net/ipv6/conf/all/forwarding", "net/ipv6/conf/all/forwarding: no such sysctl (is IPv6 disabled?)"},
		{"kernel/nosuch", "kernel/nosuch: no such sysctl"},
	} {
		_, err := s.Get(tc.path)
		if err == nil || err.Error() != tc.want || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("get %s: %v, want %q matching fs.ErrNotExist", tc.path, err, tc.want)
		}
		err = s.Set(tc.path, "1")
		if err == nil || err.Error() != tc.want || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("set %s: %v, want %q matching fs.ErrNotExist", tc.path, err, tc.want)
		}
	}
	// Set must not have created anything.
	entries, _ := os.ReadDir(root)
	if len(entries) != 0 {
		t.Errorf("set created %v in the root", entries)
	}
}

func TestBadPaths(t *testing.T) {
	s := New(Options{Root: t.TempDir()})
	for _, p := range []string{"", "/etc/passwd", "../etc/passwd", "net/../../etc/passwd", "net//ipv4/ip_forward", "net/ipv4/ip_forward/", "."} {
		if _, err := s.Get(p); err == nil {
			t.Errorf("get %q: no error", p)
		}
		if err := s.Set(p, "1"); err == nil {
			t.Errorf("set %q: no error", p)
		}
	}
}

func TestDefaultRoot(t *testing.T) {
	if got := New(Options{}).root; got != DefaultRoot {
		t.Errorf("root %q, want %q", got, DefaultRoot)
	}
}

// inNewNetns runs f on a thread in a new network namespace. The thread is
// never returned to the scheduler: it exits with the goroutine.
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	done := make(chan struct{})
	var failed error
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with us
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			failed = err
			return
		}
		f()
	}()
	<-done
	if failed != nil {
		t.Fatalf("unshare network namespace: %v", failed)
	}
}

func TestProcSysInNetns(t *testing.T) {
	s := New(Options{})
	host, err := s.Get(lb.SysctlIPForward)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	inNewNetns(t, func() {
		check := func(err error) {
			if err != nil {
				errs = append(errs, err)
			}
		}
		for _, v := range []string{"1", "0", "1"} {
			check(s.Set(lb.SysctlIPForward, v))
			if got, err := s.Get(lb.SysctlIPForward); err != nil || got != v {
				errs = append(errs, errors.New("ip_forward reads "+got+" after setting "+v))
			}
		}
		check(s.Set("net/ipv4/conf/lo/arp_ignore", "1"))
		if got, err := s.Get("net/ipv4/conf/lo/arp_ignore"); err != nil || got != "1" {
			errs = append(errs, errors.New("lo arp_ignore reads "+got))
		}
		if err := s.Set(lb.SysctlIPForward, "2x"); err == nil {
			errs = append(errs, errors.New("setting ip_forward to 2x succeeded"))
		}
		_, err := s.Get("net/ipv4/conf/nosuch0/arp_ignore")
		if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, errors.New("missing interface: "+errString(err)))
		}
		// ip_vs sysctls exist only where ip_vs is loaded.
		_, statErr := os.Stat("/proc/sys/net/ipv4/vs")
		err = s.Set(lb.SysctlVSConntrack, "1")
		switch {
		case statErr == nil && err != nil:
			errs = append(errs, err)
		case statErr != nil && (err == nil || err.Error() != "net/ipv4/vs/conntrack: no such sysctl (is ip_vs loaded?)"):
			errs = append(errs, errors.New("conntrack without ip_vs: "+errString(err)))
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	if got, err := s.Get(lb.SysctlIPForward); err != nil || got != host {
		t.Errorf("host ip_forward changed from %s to %s (%v)", host, got, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// TestIPVSSysctls sets the ip_vs parameters vipd manages. It needs a
// kernel with ip_vs: in the test guest (VIPD_VM=1) it must run.
func TestIPVSSysctls(t *testing.T) {
	if os.Getenv("VIPD_VM") != "1" && os.Getenv("VIPD_GUEST") != "1" {
		if _, err := os.Stat("/proc/sys/net/ipv4/vs"); err != nil {
			t.Skip("no ip_vs on this kernel; runs in the test guest (test/vm)")
		}
	}
	s := New(Options{})
	var errs []error
	inNewNetns(t, func() {
		for _, c := range []struct{ path, value string }{
			{lb.SysctlVSConntrack, "1"},
			{lb.SysctlExpireNodest, "1"},
			{lb.SysctlExpireQuiescent, "1"},
			{lb.SysctlConnReuseMode, "0"},
			{lb.SysctlConnReuseMode, "1"},
			{lb.SysctlIPv6Forward, "1"},
			{lb.SysctlARPIgnore, "1"},
			{lb.SysctlARPAnnounce, "2"},
		} {
			if err := s.Set(c.path, c.value); err != nil {
				errs = append(errs, err)
				continue
			}
			if got, err := s.Get(c.path); err != nil || got != c.value {
				errs = append(errs, errors.New(c.path+" reads "+got+", want "+c.value+": "+errString(err)))
			}
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
}
