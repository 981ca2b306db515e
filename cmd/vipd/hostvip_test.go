package main

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
)

// TestDaemonHostVIP: a VIP that is an address of another host interface
// is refused at start, with nothing touched, and by a reload, with the
// running configuration kept.
func TestDaemonHostVIP(t *testing.T) {
	dir := t.TempDir()
	k := lbtest.New()
	k.SetHostAddrs("eth0", netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("fe80::1"))
	h := newHarness(t, dir, k)
	h.write(h.header("") + twoServices)
	err := runDaemon(context.Background(), daemonOptions{
		Path:   h.path,
		Logger: slog.New(slog.DiscardHandler),
		OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
			return k.Interface(), func() {}, nil
		},
		KernelRelease: "6.1.0-27-cloud-amd64",
	})
	want := `vipd.toml: service "web": vip 192.0.2.10 is an address of interface eth0, not of vipd's interface vipd0`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("start = %v, want %q", err, want)
	}
	if dump := k.Dump(); strings.Contains(dump, "192.0.2") {
		t.Fatalf("a refused start touched the kernel:\n%s", dump)
	}

	// The uplink's address moved: vipd starts. A reload that adds a
	// service on the uplink's new address is refused.
	k.SetHostAddrs("eth0", netip.MustParseAddr("198.51.100.1"))
	h.run()
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	good := h.k.Dump()
	h.write(h.header("") + twoServices + "\n[[service]]\nname = \"ssh-box\"\nvip = \"198.51.100.1\"\nport = 80\nbackend = [{ address = \"10.0.0.9\" }]\n")
	h.eventually("the refusal", h.logHas(`service \"ssh-box\": vip 198.51.100.1 is an address of interface eth0`))
	if got := h.k.Dump(); got != good {
		t.Errorf("a refused reload changed the kernel:\n%s\nwant\n%s", got, good)
	}
}

// TestCheckHostAddresses runs vipd check in a private network namespace
// whose interface has the address of a VIP: refused, naming the service
// and the interface; with --offline the files alone pass.
func TestCheckHostAddresses(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, []byte(twoServices), 0o644); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	defer netns.Set(orig)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink1"}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("uplink0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP("192.0.2.11"))}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args       []string
		out, fault string
	}{
		{[]string{"check", path}, "", `vipd.toml: service "api": vip 192.0.2.11 is an address of interface uplink0`},
		{[]string{"check", "--offline", path}, "ok, 2 services", ""},
	} {
		var out, errOut strings.Builder
		root := newRoot(&out, &errOut)
		root.SetArgs(tt.args)
		err := root.Execute()
		if (err != nil) != (tt.fault != "") || !strings.Contains(out.String(), tt.out) || !strings.Contains(errOut.String(), tt.fault) {
			t.Errorf("%v: %v, printed %q and %q; want %q and %q", tt.args, err, out.String(), errOut.String(), tt.out, tt.fault)
		}
	}
}
