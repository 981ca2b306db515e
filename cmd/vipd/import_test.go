package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportCommand: vipd import prints the configuration on standard
// output and the issues on standard error, exits 1 when there are issues
// unless --allow-partial, and its output passes vipd check.
func TestImportCommand(t *testing.T) {
	dir := t.TempDir()
	kconf := filepath.Join(dir, "keepalived.conf")
	if err := os.WriteFile(kconf, []byte("virtual_server 192.0.2.10 80 {\n  lb_algo rr\n  real_server 10.0.0.1 80 {\n    PING_CHECK {\n    }\n  }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	saved := "-A -t 192.0.2.20:443 -s wrr\n-a -t 192.0.2.20:443 -r 10.0.0.2:443 -g -w 3\n"
	for _, tt := range []struct {
		args  []string
		stdin string
		code  int
		out   string
		issue string
	}{
		{[]string{"import", "keepalived", kconf}, "", 1, `vip = "192.0.2.10"`, kconf + ":4: PING_CHECK: vipd has no ICMP echo check"},
		{[]string{"import", "keepalived", "--allow-partial", kconf}, "", 0, `scheduler = "rr"`, kconf + ":4: PING_CHECK"},
		{[]string{"import", "ipvsadm"}, saved, 0, `forward = "droute"`, ""},
		{[]string{"import", "ipvsadm", "-"}, saved + "-X\n", 1, `weight = 3`, "stdin:3: -X: unknown option"},
	} {
		var out, errOut strings.Builder
		root := newRoot(&out, &errOut)
		root.SetIn(strings.NewReader(tt.stdin))
		root.SetArgs(tt.args)
		err := root.Execute()
		code := 0
		var ex exitError
		switch {
		case errors.As(err, &ex):
			code = int(ex)
		case err != nil:
			t.Fatalf("%v: %v", tt.args, err)
		}
		if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errOut.String(), tt.issue) || (tt.issue == "") != (errOut.Len() == 0) {
			t.Errorf("%v: exit %d, printed %q and %q; want %d, %q and %q", tt.args, code, out.String(), errOut.String(), tt.code, tt.out, tt.issue)
			continue
		}
		path := filepath.Join(dir, "vipd.toml")
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		var cout, cerr strings.Builder
		check := newRoot(&cout, &cerr)
		check.SetArgs([]string{"check", "--offline", path})
		if err := check.Execute(); err != nil || !strings.Contains(cout.String(), "ok, 1 services") {
			t.Errorf("%v: vipd check of the output: %v %s%s", tt.args, err, cout.String(), cerr.String())
		}
	}
}

// TestImportMetalLB: vipd import metallb reads several files, prints the
// pools and [bgp] on standard output and the issues with their file and
// line on standard error, exits 1 unless --allow-partial, and its output
// passes vipd check.
func TestImportMetalLB(t *testing.T) {
	pools := filepath.Join("..", "..", "migrate", "testdata", "metallb", "pools.yaml")
	bgp := filepath.Join("..", "..", "migrate", "testdata", "metallb", "bgp.yaml")
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"import", "metallb", pools, bgp}, 1},
		{[]string{"import", "metallb", "--allow-partial", pools, bgp}, 0},
	} {
		var out, errOut strings.Builder
		root := newRoot(&out, &errOut)
		root.SetArgs(tt.args)
		err := root.Execute()
		code := 0
		var ex exitError
		switch {
		case errors.As(err, &ex):
			code = int(ex)
		case err != nil:
			t.Fatalf("%v: %v", tt.args, err)
		}
		for _, want := range []string{`name = "production"`, `[[bgp.peer]]`, `address = "10.0.1.1"`, `default_class = true`} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v: no %q in the output:\n%s", tt.args, want, out.String())
			}
		}
		for _, want := range []string{bgp + ":33: BGPPeer tor-b: passwordSecret", pools + ":49: IPAddressPool team-selected", "vipd: 3 pools imported; 13 constructs"} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("%v: no %q in the issues:\n%s", tt.args, want, errOut.String())
			}
		}
		if code != tt.code {
			t.Errorf("%v: exit %d, want %d", tt.args, code, tt.code)
		}
		path := filepath.Join(t.TempDir(), "vipd.toml")
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		var cout, cerr strings.Builder
		check := newRoot(&cout, &cerr)
		check.SetArgs([]string{"check", "--offline", path})
		if err := check.Execute(); err != nil || !strings.Contains(cout.String(), "ok, 0 services") {
			t.Errorf("%v: vipd check of the output: %v %s%s", tt.args, err, cout.String(), cerr.String())
		}
	}
	var out, errOut strings.Builder
	root := newRoot(&out, &errOut)
	root.SetArgs([]string{"import", "metallb"})
	if err := root.Execute(); err == nil {
		t.Errorf("vipd import metallb without a file succeeded")
	}
}
