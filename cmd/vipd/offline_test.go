package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckOffline: vipd check --offline looks nothing up on this host
// (the exec checks' user, the ca_file of https checks, the host's
// addresses) and says, a line for each kind, what it did not check;
// without --offline the same configuration fails on this host.
func TestCheckOffline(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	conf := "[daemon]\ncheck_user = \"probe-not-on-this-host\"\n" +
		"[[service]]\nname = \"web\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n" +
		"[service.check]\ntype = \"exec\"\ncommand = \"/usr/local/bin/probe\"\n" +
		"[[service]]\nname = \"api\"\nvip = \"192.0.2.11\"\nport = 443\nbackend = [{ address = \"10.0.0.2\" }]\n" +
		"[service.check]\ntype = \"https\"\nca_file = \"" + filepath.Join(dir, "not-on-this-host.pem") + "\"\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runVipd(t, "check", "--offline", path)
	if code != 0 {
		t.Fatalf("vipd check --offline: exit %d: %s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		`offline: not checked: user "probe-not-on-this-host" (check_user) of the exec checks of service "web" exists` + "\n",
		`offline: not checked: ca_file "` + filepath.Join(dir, "not-on-this-host.pem") + `" of service "api" is a readable file of PEM certificates` + "\n",
		"offline: not checked: no VIP is an address of another interface of this host\n",
		path + ": ok, 2 services\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("no %q in:\n%s", want, stdout)
		}
	}
	if n := strings.Count(stdout, "offline: "); n != 3 {
		t.Errorf("%d offline lines, want 3:\n%s", n, stdout)
	}
	// Online, the same configuration fails on this host's lookups.
	if code, _, stderr := runVipd(t, "check", path); code != 1 || !strings.Contains(stderr, "probe-not-on-this-host") {
		t.Errorf("vipd check: exit %d, %q; want 1 and the unknown user", code, stderr)
	}
}

// TestCheckCAFile: vipd check refuses a ca_file that is a FIFO at once,
// naming the file, the line and the key.
func TestCheckCAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ca.pem")
	mkfifo(t, fifo)
	path := filepath.Join(dir, "vipd.toml")
	conf := "[[service]]\nname = \"api\"\nvip = \"192.0.2.11\"\nport = 443\nbackend = [{ address = \"10.0.0.2\" }]\n" +
		"[service.check]\ntype = \"https\"\nca_file = \"" + fifo + "\"\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runVipd(t, "check", path)
	if want := path + `:8: service "api": check: ca_file: ` + fifo + ": not a regular file (a FIFO)"; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("vipd check: exit %d, %q; want 1 and %q", code, stderr, want)
	}
}
