package config

import "testing"

// TestStatusPage checks the [daemon] status_page switch: on by default,
// off with false, and a type error for anything but a boolean.
func TestStatusPage(t *testing.T) {
	const svc = "\n[[service]]\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.11\" }]\n"
	for _, tc := range []struct {
		daemon string
		want   bool
	}{
		{"", true},
		{"[daemon]\nstatus_page = true\n", true},
		{"[daemon]\nstatus_page = false\n", false},
	} {
		cfg, err := Parse("t.toml", []byte(tc.daemon+svc))
		if err != nil {
			t.Fatalf("%q: %v", tc.daemon, err)
		}
		if cfg.Daemon.StatusPage != tc.want {
			t.Errorf("%q: status_page = %v, want %v", tc.daemon, cfg.Daemon.StatusPage, tc.want)
		}
	}
	if _, err := Parse("t.toml", []byte("[daemon]\nstatus_page = \"no\"\n"+svc)); err == nil {
		t.Error("status_page = \"no\" was accepted")
	} else {
		t.Log(err)
	}
}
