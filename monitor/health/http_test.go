package health

import (
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	checkdesc "github.com/vipd/vipd/monitor/check"
)

// backendMux serves the paths the http tests probe.
func backendMux(t *testing.T) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "all good, version 1.2\n")
	})
	mux.HandleFunc("/503", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "maintenance", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/404", http.NotFound)
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ok", http.StatusFound)
	})
	mux.HandleFunc("/redirect-away", func(w http.ResponseWriter, r *http.Request) {
		// Never dialled: the check does not leave the backend.
		http.Redirect(w, r, "http://elsewhere.invalid/ok", http.StatusFound)
	})
	mux.HandleFunc("/redirect-host", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://svc.example/host", http.StatusMovedPermanently)
	})
	mux.HandleFunc("/redirect-loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/redirect-loop", http.StatusFound)
	})
	mux.HandleFunc("/host", func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "svc.example" {
			http.Error(w, "wrong host "+r.Host, http.StatusMisdirectedRequest)
		}
	})
	mux.HandleFunc("/sni", func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || r.TLS.ServerName != "example.com" {
			http.Error(w, "wrong sni", http.StatusMisdirectedRequest)
		}
	})
	mux.HandleFunc("/method", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodHead || r.Header.Get("X-Check") != "yes" {
			http.Error(w, "wrong request", http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	return mux
}

func serverAddr(t *testing.T, srv *httptest.Server) netip.AddrPort {
	t.Helper()
	addr := srv.Listener.Addr().(*net.TCPAddr).AddrPort()
	if !addr.Addr().IsLoopback() {
		t.Fatalf("test server on %s, not loopback", addr)
	}
	return addr
}

func mustRanges(t *testing.T, s string) []StatusRange {
	t.Helper()
	r, err := checkdesc.ParseStatusRanges(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestHTTPCheck(t *testing.T) {
	srv := httptest.NewServer(backendMux(t))
	defer srv.Close()
	addr := serverAddr(t, srv)

	tests := []struct {
		name string
		opts HTTPOptions
		err  string // substring of the error; empty for success
	}{
		{"ok", HTTPOptions{Path: "/ok"}, ""},
		{"default path is 404", HTTPOptions{}, "status 404 not in 200-399"},
		{"503", HTTPOptions{Path: "/503"}, "status 503 not in 200-399"},
		{"503 accepted by range", HTTPOptions{Path: "/503", Status: mustRanges(t, "500-503")}, ""},
		{"404 accepted by list", HTTPOptions{Path: "/404", Status: mustRanges(t, "200,404")}, ""},
		{"404 not in class", HTTPOptions{Path: "/404", Status: mustRanges(t, "2xx,3xx")}, "status 404 not in 200-299,300-399"},
		{"body contains", HTTPOptions{Path: "/ok", Body: "all good"}, ""},
		{"body missing", HTTPOptions{Path: "/ok", Body: "all bad"}, `body does not contain "all bad"`},
		{"body regexp", HTTPOptions{Path: "/ok", BodyRegexp: `version \d+\.\d+`}, ""},
		{"body regexp fails", HTTPOptions{Path: "/ok", BodyRegexp: `^broken`}, "body does not match"},
		{"body checked after status", HTTPOptions{Path: "/503", Body: "maintenance"}, "status 503"},
		{"host header", HTTPOptions{Path: "/host", Host: "svc.example"}, ""},
		{"wrong host header", HTTPOptions{Path: "/host"}, "status 421"},
		{"method and header", HTTPOptions{Path: "/method", Method: "HEAD", Header: map[string]string{"X-Check": "yes"}}, ""},
		{"redirect judged by default", HTTPOptions{Path: "/redirect", Status: mustRanges(t, "200")}, "status 302 not in 200"},
		{"redirect in default range", HTTPOptions{Path: "/redirect"}, ""},
		{"redirect followed", HTTPOptions{Path: "/redirect", Status: mustRanges(t, "200"), FollowRedirects: true}, ""},
		{"redirect elsewhere not followed", HTTPOptions{Path: "/redirect-away", Status: mustRanges(t, "200"), FollowRedirects: true}, "status 302"},
		{"redirect to host followed to backend", HTTPOptions{Path: "/redirect-host", Host: "svc.example", Status: mustRanges(t, "200"), FollowRedirects: true}, ""},
		{"redirect loop", HTTPOptions{Path: "/redirect-loop", FollowRedirects: true}, "stopped after 10 redirects"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewHTTPCheck(addr, false, tt.opts, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// Every way the check can probe: through net/http, and on
			// the poller where it can run there.
			for way, probe := range httpProbes(t, c) {
				err = probe(5 * time.Second)
				switch {
				case tt.err == "" && err != nil:
					t.Errorf("%s: probe: %v", way, err)
				case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
					t.Errorf("%s: probe: %v, want error containing %q", way, err, tt.err)
				}
			}
		})
	}
}

func TestHTTPCheckTimeout(t *testing.T) {
	srv := httptest.NewServer(backendMux(t))
	defer srv.Close()
	c, err := NewHTTPCheck(serverAddr(t, srv), false, HTTPOptions{Path: "/slow"}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for way, probe := range httpProbes(t, c) {
		if err := probe(100 * time.Millisecond); err == nil {
			t.Fatalf("%s: slow response passed", way)
		}
	}
	start := time.Now()
	if err := c.Probe(probeCtx(t, 100*time.Millisecond)); err == nil {
		t.Fatal("slow response passed")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("probe took %s with a 100ms timeout", d)
	}
}

func TestHTTPCheckClosedPort(t *testing.T) {
	c, err := NewHTTPCheck(closedTCPPort(t), false, HTTPOptions{}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for way, probe := range httpProbes(t, c) {
		if err := probe(5 * time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: closed port: %v", way, err)
		}
	}
}

func TestHTTPSCheck(t *testing.T) {
	srv := httptest.NewTLSServer(backendMux(t))
	defer srv.Close()
	addr := serverAddr(t, srv)
	// The test server's self-signed certificate names 127.0.0.1, ::1 and
	// example.com.
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemCert := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	bundle, err := checkdesc.NewCABundle(ca, pemCert)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		opts HTTPOptions
		err  string
	}{
		{"verify fails on self-signed", HTTPOptions{Path: "/ok"}, "certificate"},
		{"verify off", HTTPOptions{Path: "/ok", InsecureSkipVerify: true}, ""},
		{"verify with ca file", HTTPOptions{Path: "/ok", CAFile: ca, CA: bundle}, ""},
		{"sni from host", HTTPOptions{Path: "/sni", Host: "example.com", CAFile: ca, CA: bundle}, ""},
		{"explicit sni", HTTPOptions{Path: "/sni", SNI: "example.com", CAFile: ca, CA: bundle}, ""},
		{"no sni", HTTPOptions{Path: "/sni", CAFile: ca, CA: bundle}, "status 421"},
		{"sni not in certificate", HTTPOptions{Path: "/ok", SNI: "other.example", CAFile: ca, CA: bundle}, "certificate"},
		{"sni not in certificate, verify off", HTTPOptions{Path: "/ok", SNI: "other.example", InsecureSkipVerify: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewHTTPCheck(addr, true, tt.opts, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for way, probe := range httpProbes(t, c) {
				err = probe(5 * time.Second)
				switch {
				case tt.err == "" && err != nil:
					t.Errorf("%s: probe: %v", way, err)
				case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
					t.Errorf("%s: probe: %v, want error containing %q", way, err, tt.err)
				}
			}
		})
	}

	if _, err := NewHTTPCheck(addr, true, HTTPOptions{CAFile: ca}, DialOptions{}); err == nil {
		t.Error("CA file not read with the configuration accepted")
	}
	if _, err := checkdesc.NewCABundle("empty.pem", []byte("not pem")); err == nil {
		t.Error("CA file without certificates accepted")
	}
}

func TestParseStatusRanges(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"200", "200"},
		{"200-399", "200-399"},
		{"200, 204 ,300-302", "200,204,300-302"},
		{"2xx,4XX", "200-299,400-499"},
	}
	for _, tt := range tests {
		rs, err := checkdesc.ParseStatusRanges(tt.in)
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
			continue
		}
		var s []string
		for _, r := range rs {
			s = append(s, r.String())
		}
		if got := strings.Join(s, ","); got != tt.want {
			t.Errorf("%q: %s, want %s", tt.in, got, tt.want)
		}
	}
	for _, bad := range []string{"", "abc", "399-200", "99", "600", "6xx", "200-", "200,,300"} {
		if _, err := checkdesc.ParseStatusRanges(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
