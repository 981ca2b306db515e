package vrrp

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// needKeepalived returns keepalived's path. Without it the test skips,
// or fails when CI is set: CI installs it (test/deps.sh).
func needKeepalived(t *testing.T) string {
	t.Helper()
	nstest.Need(t)
	return lookKeepalived(t, "keepalived", []string{"/usr/sbin/keepalived", "/sbin/keepalived"})
}

func lookKeepalived(t testing.TB, name string, paths []string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("keepalived is not installed (test/deps.sh installs it); CI runs the interop tests")
	}
	t.Skip("keepalived is not installed (apt-get install keepalived)")
	return ""
}

// recordTB records what a test helper fails or skips with.
type recordTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordTB) Helper() {}

func (r *recordTB) Fatal(args ...any) {
	r.fatal = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recordTB) Skip(args ...any) {
	r.skip = fmt.Sprint(args...)
	runtime.Goexit()
}

// TestKeepalivedMissing: without keepalived the interop tests skip, and
// fail when CI is set.
func TestKeepalivedMissing(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recordTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			lookKeepalived(r, "no-such-keepalived", []string{filepath.Join(t.TempDir(), "keepalived")})
		}()
		<-done
		if ci == "" && (r.skip == "" || r.fatal != "") || ci != "" && (r.fatal == "" || r.skip != "") {
			t.Errorf("CI=%q: fatal %q, skip %q", ci, r.fatal, r.skip)
		}
	}
}

// kaConfig is a keepalived VRRP instance on the peer's interface "vp".
type kaConfig struct {
	priority uint8
	// interval is advert_int in centiseconds.
	interval uint16
	vips     []netip.Addr
	// unicast, when set, is the source and peer for unicast mode.
	src, peer netip.Addr
}

// keepalived is a keepalived process (-P: the VRRP child only) in the
// peer namespace, whose states its notify FIFO reports.
type keepalived struct {
	t      *testing.T
	peer   *nstest.Peer
	vips   []netip.Addr
	dir    string
	cmd    *exec.Cmd
	out    *nstest.Buffer
	states chan kaState
	fifo   *os.File
	done   chan struct{}
}

type kaState struct {
	at    time.Time
	state string
}

func startKeepalived(t *testing.T, bin string, p *nstest.Peer, c kaConfig) *keepalived {
	t.Helper()
	dir, err := os.MkdirTemp("", "vrrp-keepalived-")
	if err != nil {
		t.Fatal(err)
	}
	k := &keepalived{t: t, peer: p, vips: c.vips, dir: dir, out: &nstest.Buffer{}, states: make(chan kaState, 64), done: make(chan struct{})}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// Read and write, so that opening does not wait for keepalived.
	if k.fifo, err = os.OpenFile(fifo, os.O_RDWR, 0); err != nil {
		t.Fatal(err)
	}
	go k.readStates()
	var b strings.Builder
	fmt.Fprintf(&b, "global_defs {\n  router_id vrrp-test\n  vrrp_version 3\n  notify_fifo %s\n}\n", fifo)
	fmt.Fprintf(&b, "vrrp_instance VI_19 {\n  state BACKUP\n  interface vp\n  virtual_router_id 19\n  priority %d\n  advert_int %.2f\n", c.priority, float64(c.interval)/100)
	if c.src.IsValid() {
		// keepalived sends IPv6 unicast with hop limit 64 unless told;
		// vipd requires 255 (RFC 5798 section 7.1), as keepalived does
		// of what it receives when the peer sets min_ttl 255.
		fmt.Fprintf(&b, "  unicast_src_ip %v\n  unicast_ttl 255\n  unicast_peer {\n    %v min_ttl 255\n  }\n", c.src, c.peer)
	}
	b.WriteString("  virtual_ipaddress {\n")
	for _, a := range c.vips {
		fmt.Fprintf(&b, "    %v/%d\n", a, a.BitLen())
	}
	b.WriteString("  }\n}\n")
	conf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	k.cmd = exec.Command(bin, "-n", "-l", "-D", "-G", "-P", "-R", "-f", conf,
		"-p", filepath.Join(dir, "keepalived.pid"), "-r", filepath.Join(dir, "vrrp.pid"))
	k.cmd.Stdout, k.cmd.Stderr = k.out, k.out
	// Started from a thread in the peer's namespace, keepalived runs
	// there. No parent-death signal: that thread ends at once.
	p.Do(t, k.cmd.Start)
	go func() {
		k.cmd.Wait()
		close(k.done)
	}()
	t.Cleanup(func() {
		k.kill()
		k.fifo.Close()
		k.checkLog()
		if t.Failed() {
			t.Logf("keepalived's config:\n%s\nkeepalived's log:\n%s", b.String(), k.out.String())
		}
		os.RemoveAll(dir)
	})
	return k
}

// readStates reads "INSTANCE "VI_19" MASTER 200" lines from the FIFO.
func (k *keepalived) readStates() {
	s := bufio.NewScanner(k.fifo)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) >= 3 && f[0] == "INSTANCE" {
			k.states <- kaState{time.Now(), f[2]}
		}
	}
}

// await waits for keepalived to report state, failing the test after
// within.
func (k *keepalived) await(state string, within time.Duration) time.Time {
	k.t.Helper()
	return k.awaitSince(time.Time{}, state, within)
}

// awaitSince waits for keepalived to report state at since or later.
func (k *keepalived) awaitSince(since time.Time, state string, within time.Duration) time.Time {
	k.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case s := <-k.states:
			if s.state == state && !s.at.Before(since) {
				return s.at
			}
		case <-deadline:
			k.t.Fatalf("keepalived reported no %s within %v", state, within)
		}
	}
}

// logged fails the test unless keepalived's log has a line containing
// s.
func (k *keepalived) logged(s string) {
	k.t.Helper()
	for range 100 {
		if strings.Contains(k.out.String(), s) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	k.t.Errorf("keepalived logged no %q", s)
}

// checkLog fails the test if keepalived complained about a packet: a bad
// checksum, a wrong address list, an invalid field.
func (k *keepalived) checkLog() {
	for _, l := range strings.Split(k.out.String(), "\n") {
		low := strings.ToLower(l)
		for _, bad := range []string{"invalid", "checksum", "not present", "mismatch", "wrong", "bogus"} {
			if strings.Contains(low, bad) {
				k.t.Errorf("keepalived: %s", l)
			}
		}
	}
}

// vrrpPID is the pid of keepalived's VRRP child.
func (k *keepalived) vrrpPID() int {
	k.t.Helper()
	for range 100 {
		b, err := os.ReadFile(filepath.Join(k.dir, "vrrp.pid"))
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	k.t.Fatal("keepalived wrote no vrrp.pid")
	return 0
}

// kill kills keepalived's VRRP child and then keepalived with SIGKILL,
// so that it goes silent without advertising priority 0, and returns
// when the child was killed. It removes the virtual addresses keepalived
// left on the peer's interface, as a restarted host would not have them.
func (k *keepalived) kill() time.Time {
	k.t.Helper()
	select {
	case <-k.done:
		return time.Now()
	default:
	}
	if err := syscall.Kill(k.vrrpPID(), syscall.SIGKILL); err != nil {
		k.t.Fatal(err)
	}
	at := time.Now()
	k.cmd.Process.Kill()
	<-k.done
	k.peer.Do(k.t, func() error {
		l, err := netlink.LinkByName("vp")
		if err != nil {
			return err
		}
		for _, a := range k.vips {
			ipn := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
			if err := netlink.AddrDel(l, &netlink.Addr{IPNet: ipn}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("remove %v from vp: %w", a, err)
			}
		}
		return nil
	})
	return at
}

// terminate asks keepalived to stop gracefully (SIGTERM), which
// advertises priority 0, and returns when it was sent the signal.
func (k *keepalived) terminate() time.Time {
	k.t.Helper()
	if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		k.t.Fatal(err)
	}
	return time.Now()
}
