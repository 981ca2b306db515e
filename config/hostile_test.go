package config

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// hostileSvc is a [[service]] block named name on vip with one backend.
func hostileSvc(name, vip, backend string) string {
	return fmt.Sprintf("[[service]]\nname = %q\nvip = %q\nport = 80\nbackend = [{ address = %q }]\n", name, vip, backend)
}

// TestBackendOnVIPEdit checks that an incremental parse refuses an edit
// that puts a backend on a VIP, or a VIP on a backend, as a whole parse
// does, and that the rejected edit leaves its base usable.
func TestBackendOnVIPEdit(t *testing.T) {
	base := hostileSvc("a", "192.0.2.1", "10.0.0.1") + hostileSvc("b", "192.0.2.2", "10.0.0.2") + hostileSvc("c", "192.0.2.3", "10.0.0.3")
	for _, tt := range []struct {
		name, old, new, want string
	}{
		{"backend on vip", `address = "10.0.0.3"`, `address = "192.0.2.1"`,
			`t.toml:15: service "c": backend "192.0.2.1:80": address 192.0.2.1 is the vip of service "a"`},
		{"backend on later vip", `address = "10.0.0.1"`, `address = "192.0.2.3"`,
			`t.toml:13: service "c": vip 192.0.2.3 is the address of backend "192.0.2.3:80" of service "a"`},
		{"vip on backend", `vip = "192.0.2.2"`, `vip = "10.0.0.1"`,
			`t.toml:8: service "b": vip 10.0.0.1 is the address of backend "10.0.0.1:80" of service "a"`},
		{"vip on later backend", `vip = "192.0.2.2"`, `vip = "10.0.0.3"`,
			`t.toml:15: service "c": backend "10.0.0.3:80": address 10.0.0.3 is the vip of service "b"`},
		{"backend on own vip", `address = "10.0.0.2"`, `address = "192.0.2.2:8080"`,
			`t.toml:10: service "b": backend "192.0.2.2:8080": address 192.0.2.2 is the vip of service "b"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prev, err := Parse("t.toml", []byte(base))
			if err != nil {
				t.Fatal(err)
			}
			edited := strings.Replace(base, tt.old, tt.new, 1)
			if edited == base {
				t.Fatalf("%q is not in the base", tt.old)
			}
			if _, _, err := ParseFrom(prev, "t.toml", []byte(edited)); errString(err) != tt.want {
				t.Fatalf("ParseFrom:\n got %v\nwant %s", err, tt.want)
			}
			// The rejected edit must leave prev's index as it was: a
			// valid edit then still takes the incremental path (a
			// conflict left in the index would make it parse whole,
			// with a full Delta).
			fixed := strings.Replace(base, `address = "10.0.0.3"`, `address = "10.0.0.30"`, 1)
			got, d, err := ParseFrom(prev, "t.toml", []byte(fixed))
			want, wantErr := parseWholeFile("t.toml", []byte(fixed))
			if diff := sameParse(got, err, want, wantErr); diff != "" || err != nil {
				t.Fatalf("valid edit after a rejected one: %v %s", err, diff)
			}
			if d != (Delta{From: 2, OldTo: 3, NewTo: 3}) {
				t.Fatalf("valid edit after a rejected one: delta %+v, want service 3 only", d)
			}
		})
	}
}

// TestBackendOnVIPIncluded checks the rule across files: a backend of an
// included file on the main file's VIP, and an edit of an included file
// that makes one.
func TestBackendOnVIPIncluded(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	incl := filepath.Join(dir, "services.d", "x.toml")
	mainText := "include = [\"services.d/*.toml\"]\n" + hostileSvc("a", "192.0.2.1", "10.0.0.1")
	writeFile(t, main, mainText)
	writeFile(t, incl, hostileSvc("x", "192.0.2.9", "192.0.2.1:8080"))
	want := incl + `:5: service "x": backend "192.0.2.1:8080": address 192.0.2.1 is the vip of service "a"`
	if _, err := Load(main); errString(err) != want {
		t.Fatalf("Load:\n got %v\nwant %s", err, want)
	}

	// Incremental parses of either file.
	writeFile(t, incl, hostileSvc("x", "192.0.2.9", "10.0.0.9"))
	base, err := Load(main)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ParseFrom(base, incl, []byte(hostileSvc("x", "192.0.2.9", "192.0.2.1")))
	if want := incl + `:5: service "x": backend "192.0.2.1:80": address 192.0.2.1 is the vip of service "a"`; errString(err) != want {
		t.Fatalf("ParseFrom of the included file:\n got %v\nwant %s", err, want)
	}
	// An edit of the main file that moves its VIP onto the included
	// file's backend: the main file's services come first, so the error
	// is on the backend.
	_, _, err = ParseFrom(base, main, []byte(strings.Replace(mainText, `vip = "192.0.2.1"`, `vip = "10.0.0.9"`, 1)))
	if want := incl + `:5: service "x": backend "10.0.0.9:80": address 10.0.0.9 is the vip of service "a"`; errString(err) != want {
		t.Fatalf("ParseFrom of the main file:\n got %v\nwant %s", err, want)
	}
}

// TestDefaultNames checks that the names vipd gives unnamed services pass
// the rule for names, for the longest forms an address can be written in,
// and that a user may write such a name out.
func TestDefaultNames(t *testing.T) {
	var b strings.Builder
	for i, s := range []struct{ proto, vip, backend string }{
		{"tcp", "192.0.2.10", "10.0.0.1"},
		{"udp", "203.0.113.255", "10.0.0.1"},
		{"sctp", "2001:0db8:0000:0000:0000:0000:0000:0010", "fd00::1"},
		{"sctp", "2001:db8::ffff:192.0.2.10", "fd00::1"},
		{"sctp", "0000:0000:0000:0000:0000:ffff:192.0.2.11", "10.0.0.1"},
		{"tcp", "2001:DB8::A", "fd00::1"},
	} {
		fmt.Fprintf(&b, "[[service]]\nprotocol = %q\nvip = %q\nport = %d\nbackend = [{ address = %q }]\n", s.proto, s.vip, 65535-i, s.backend)
	}
	b.WriteString("[[service]]\nfwmark = 4294967295\nbackend = [{ address = \"10.0.0.1\" }]\n")
	b.WriteString("[[service]]\nnodeport = true\nprotocol = \"sctp\"\nport = 65535\nbackend = [{ address = \"10.0.0.1\" }]\n")
	cfg, err := Parse("t.toml", []byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Spec.Services) != 8 {
		t.Fatalf("%d services, want 8", len(cfg.Spec.Services))
	}
	var named strings.Builder
	for i, vs := range cfg.Spec.Services {
		if err := validServiceName(vs.Name); err != nil {
			t.Errorf("default name of service %d: %v", i+1, err)
		}
		fmt.Fprintf(&named, "[[service]]\nname = %q\n", vs.Name)
	}
	longest := "sctp-0000:0000:0000:0000:0000:ffff:192.0.2.11-65531"
	if cfg.Spec.Services[4].Name != longest {
		t.Errorf("default name %q, want %q", cfg.Spec.Services[4].Name, longest)
	}
	// The same services, named explicitly with their default names.
	explicit := strings.ReplaceAll(b.String(), "[[service]]\n", "")
	blocks := strings.Split(named.String(), "[[service]]\n")[1:]
	var out strings.Builder
	for i, body := range strings.SplitAfter(explicit, "}]\n")[:8] {
		out.WriteString("[[service]]\n" + blocks[i] + body)
	}
	again, err := Parse("t.toml", []byte(out.String()))
	if err != nil {
		t.Fatalf("default names written out: %v", err)
	}
	for i := range again.Spec.Services {
		if g, w := again.Spec.Services[i].Name, cfg.Spec.Services[i].Name; g != w {
			t.Errorf("service %d: name %q, want %q", i+1, g, w)
		}
	}
}

// TestNameLength checks the bound on names: 64 bytes pass, 65 do not.
func TestNameLength(t *testing.T) {
	for _, n := range []int{1, 63, 64} {
		name := strings.Repeat("n", n)
		if _, err := Parse("t.toml", []byte(hostileSvc(name, "192.0.2.1", "10.0.0.1"))); err != nil {
			t.Errorf("name of %d bytes: %v", n, err)
		}
	}
	name := strings.Repeat("n", 65)
	want := `t.toml:2: service "` + name + `": name "nnnnnnnnnnnnnnnnnnnn"... is longer than 64 bytes`
	if _, err := Parse("t.toml", []byte(hostileSvc(name, "192.0.2.1", "10.0.0.1"))); errString(err) != want {
		t.Errorf("name of 65 bytes:\n got %v\nwant %s", err, want)
	}
}
