package config

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
)

func TestParseCheck(t *testing.T) {
	s, err := ParseCheck(`{ type = "http", path = "/healthz", interval = "2s", rise = 2, fall = 3 }`)
	if err != nil {
		t.Fatal(err)
	}
	if s.Kind != check.KindHTTP || s.HTTP.Path != "/healthz" || s.Interval != 2*time.Second || s.Rise != 2 || s.Fall != 3 {
		t.Errorf("got %+v", s)
	}
	if s, err := ParseCheck(`{ type = "none" }`); s != nil || err != nil {
		t.Errorf("none: %+v %v", s, err)
	}
	for _, tt := range []struct{ in, want string }{
		{`{ type = "exec", command = "/bin/true" }`, "exec checks are not allowed"},
		{`{ type = "smtp" }`, `type "smtp" must be tcp, http, https, udp, dns, exec or none`},
		{`{ type = "tcp", rise = 0, fall = 5000 }`, "rise and fall must be within 1..1000"},
		{`{ type = "tcp", colour = "red" }`, "unknown key colour"},
		{`type = "tcp"`, "not a TOML inline table"},
		{`"tcp"`, "not a TOML inline table"},
		{`{ type = "tcp" } x = 1`, "not a TOML inline table"},
		{strings.Repeat(" ", MaxCheckText+1), "longer than 4096 bytes"},
		{"{ a = " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + " }", "nested more than 32 deep"},
	} {
		if _, err := ParseCheck(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.60q: %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestParseForward(t *testing.T) {
	for in, want := range map[string]lb.Forward{"masq": lb.Masq, "nat": lb.Masq, "droute": lb.DirectRoute, "dr": lb.DirectRoute, "tunnel": lb.Tunnel, "tun": lb.Tunnel} {
		if got, err := ParseForward(in); got != want || err != nil {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "NAT", "fullnat"} {
		if _, err := ParseForward(in); err == nil || err.Error() != fmt.Sprintf("forward %q must be masq, droute or tunnel", in) {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func FuzzParseCheck(f *testing.F) {
	f.Add(`{ type = "http", path = "/" }`)
	f.Add(`{ type = "tcp", port = 8080 }`)
	f.Add(`{ type = "tcp", address = "127.0.0.1", mark = 1 }`)
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseCheck(in)
		if err == nil && s != nil && s.Kind == check.KindExec {
			t.Fatalf("%q: an exec check", in)
		}
		if err == nil && s != nil && (s.Addr.IsValid() || s.Dial != (check.DialOptions{}) || s.HTTP.CAFile != "") {
			t.Fatalf("%q: a check aimed away from the backend: %+v", in, s)
		}
	})
}

// TestParseCheckConfined: an annotation's check probes the backend and
// nothing else. Each key that aims it elsewhere, or that reaches the
// load balancer's own files or marks, is refused by name; the keys that
// shape the probe to the backend are taken.
func TestParseCheckConfined(t *testing.T) {
	for _, tt := range []struct{ in, key string }{
		{`{ type = "http", address = "169.254.169.254", path = "/latest/meta-data/" }`, "address"},
		{`{ type = "tcp", address = "127.0.0.1", port = 9728 }`, "address"},
		{`{ type = "tcp", mark = 1234 }`, "mark"},
		{`{ type = "tcp", device = "lo" }`, "device"},
		{`{ type = "tcp", source = "192.0.2.1" }`, "source"},
		{`{ type = "https", ca_file = "/dev/zero" }`, "ca_file"},
		{`{ type = "tcp", command = "/bin/true" }`, "command"},
		{`{ type = "tcp", args = ["x"] }`, "args"},
		{`{ type = "tcp", env = ["A=b"] }`, "env"},
	} {
		_, err := ParseCheck(tt.in)
		want := fmt.Sprintf("key %q is not allowed in an annotation", tt.key)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", tt.in, err, want)
		}
	}
	s, err := ParseCheck(`{ type = "https", port = 8443, path = "/healthz", method = "HEAD", host = "web.example", sni = "web.example",
		insecure = true, headers = { X-Probe = "vipd" }, status = "200-299", body = "ok", body_regexp = "^ok",
		interval = "2s", timeout = "1s", rise = 2, fall = 3, initial = "down", jitter = 0.1 }`)
	if err != nil {
		t.Fatal(err)
	}
	if s.Port != 8443 || s.HTTP.Method != "HEAD" || s.HTTP.Host != "web.example" || !s.HTTP.InsecureSkipVerify || s.Addr.IsValid() {
		t.Errorf("got %+v", s)
	}
	if _, err := ParseCheck(`{ type = "tcp", interval = "100ms" }`); err == nil || err.Error() != "interval 100ms is shorter than 1s, the least an annotation's check may ask for" {
		t.Errorf("interval 100ms: %v", err)
	}
	for _, in := range []string{
		`{ type = "tcp", interval = "1s" }`,
		`{ type = "udp", payload = "ping", expect = "pong" }`,
		`{ type = "dns", name = "example.org", record = "A", tcp = true, expect_answer = true, no_recursion = true }`,
	} {
		if _, err := ParseCheck(in); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}
