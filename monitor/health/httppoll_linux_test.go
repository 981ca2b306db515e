package health

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// rawServer listens on network's loopback address and answers each
// connection: it reads the request up to its empty line, passes it to
// requests if not nil, writes reply, and closes.
func rawServer(t *testing.T, network string, reply []byte, requests chan<- []byte) netip.AddrPort {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "tcp6" {
		addr = "[::1]:0"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var req []byte
				buf := make([]byte, 4096)
				for !bytes.Contains(req, []byte("\r\n\r\n")) {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					req = append(req, buf[:n]...)
				}
				if requests != nil {
					requests <- req
				}
				_, _ = c.Write(reply)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// TestPollHTTPRequest checks that the poller sends what net/http sends.
func TestPollHTTPRequest(t *testing.T) {
	requests := make(chan []byte, 2)
	addr := rawServer(t, "tcp4", []byte("HTTP/1.1 204 No Content\r\n\r\n"), requests)
	for _, opts := range []HTTPOptions{
		{},
		{Method: "HEAD", Path: "/health?x=1", Host: "svc.example:8080", Header: map[string]string{"x-check": "yes", "User-Agent": "mine"}},
		{Method: "POST", Path: "/post"},
	} {
		c, err := NewHTTPCheck(addr, false, opts, DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Probe(probeCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("%+v: net/http: %v", opts, err)
		}
		want := <-requests
		if err := pollProbe(t, testPoller(t), c, 5*time.Second); err != nil {
			t.Fatalf("%+v: poller: %v", opts, err)
		}
		if got := <-requests; !bytes.Equal(got, want) {
			t.Errorf("%+v: the poller sent\n%q\nnet/http sent\n%q", opts, got, want)
		}
	}
}

// TestPollHTTPResponses judges responses net/http's tests do not make:
// garbage, oversized, truncated, informational, chunked, long bodies.
func TestPollHTTPResponses(t *testing.T) {
	long := strings.Repeat("x", maxBody) + "needle"
	chunked := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nall \r\n5\r\ngood.\r\n0\r\n\r\n"
	tests := []struct {
		name  string
		reply string
		opts  HTTPOptions
		err   string // substring of the error; empty for success
	}{
		{"ok", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", HTTPOptions{}, ""},
		{"http/1.0, bare newlines", "HTTP/1.0 200 OK\nServer: x\n\n", HTTPOptions{}, ""},
		{"no reason phrase", "HTTP/1.1 200\r\n\r\n", HTTPOptions{}, ""},
		{"status mismatch", "HTTP/1.1 500 Oops\r\n\r\n", HTTPOptions{}, "status 500 not in 200-399"},
		{"status in list", "HTTP/1.1 404 Not Found\r\n\r\n", HTTPOptions{Status: mustRanges(t, "200,404")}, ""},
		{"nothing", "", HTTPOptions{}, "EOF"},
		{"garbage", "SSH-2.0-OpenSSH_9.2\r\n\r\n", HTTPOptions{}, "malformed HTTP"},
		{"binary", "\x00\x01\x02\x03 \xff\r\n\r\n", HTTPOptions{}, "malformed HTTP status code"},
		{"bad version", "HTTP/x 200 OK\r\n\r\n", HTTPOptions{}, "malformed HTTP version"},
		{"bad status code", "HTTP/1.1 2000 OK\r\n\r\n", HTTPOptions{}, "malformed HTTP status code"},
		{"bad header", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", HTTPOptions{}, "malformed MIME header"},
		{"truncated head", "HTTP/1.1 200 OK\r\nServer: x\r\n", HTTPOptions{}, "unexpected EOF"},
		{"oversized head", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("y", maxHeader) + "\r\n\r\n", HTTPOptions{}, "headers exceeded"},
		{"informational skipped", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 503 Busy\r\n\r\n", HTTPOptions{}, "status 503"},
		{"many informational", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 20) + "HTTP/1.1 200 OK\r\n\r\n", HTTPOptions{}, ""},
		{"informational too large", strings.Repeat("HTTP/1.1 100 Continue\r\nX: "+strings.Repeat("y", 1000)+"\r\n\r\n", 70) + "HTTP/1.1 200 OK\r\n\r\n", HTTPOptions{}, "headers exceeded"},
		{"switching protocols is final", "HTTP/1.1 101 Switching Protocols\r\n\r\n", HTTPOptions{}, "status 101"},
		{"body by length", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nall good.", HTTPOptions{Body: "good"}, ""},
		{"body by length, more after it", "HTTP/1.1 200 OK\r\ncontent-length:  3\r\n\r\nallgood", HTTPOptions{Body: "good"}, "body does not contain"},
		{"body of a bad length", "HTTP/1.1 200 OK\r\nContent-Length: 9x\r\n\r\nall good.", HTTPOptions{Body: "good"}, "bad Content-Length"},
		{"body of two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Length: 8\r\n\r\nall good.", HTTPOptions{Body: "good"}, "Content-Length"},
		{"body of a long length", "HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("x", 70000-6) + "needle", HTTPOptions{Body: "needle"}, "body does not contain"},
		{"body by length and chunked", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nall good.\r\n0\r\n\r\n", HTTPOptions{Body: "good"}, ""},
		{"no body for 204", "HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", HTTPOptions{BodyRegexp: "^$"}, ""},
		{"body missing", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nall good.", HTTPOptions{Body: "bad"}, `body does not contain "bad"`},
		{"body until close", "HTTP/1.1 200 OK\r\n\r\nall good.", HTTPOptions{BodyRegexp: `good\.$`}, ""},
		{"body chunked", chunked, HTTPOptions{Body: "all good."}, ""},
		{"body truncated", "HTTP/1.1 200 OK\r\nContent-Length: 90\r\n\r\nall good.", HTTPOptions{Body: "good"}, "read body: unexpected EOF"},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", HTTPOptions{Body: "good"}, "read body"},
		{"body beyond 64 KiB", "HTTP/1.1 200 OK\r\n\r\n" + long, HTTPOptions{Body: "needle"}, "body does not contain"},
		{"body within 64 KiB", "HTTP/1.1 200 OK\r\n\r\n" + long, HTTPOptions{Body: "xxx"}, ""},
		{"body not checked on a bad status", "HTTP/1.1 503 Busy\r\n\r\nmaintenance", HTTPOptions{Body: "maintenance"}, "status 503"},
		{"head has no body", "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", HTTPOptions{Method: "HEAD", BodyRegexp: "^$"}, ""},
	}
	p := testPoller(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := rawServer(t, "tcp4", []byte(tt.reply), nil)
			c, err := NewHTTPCheck(addr, false, tt.opts, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for way, probe := range map[string]func() error{
				"net/http": func() error { return c.Probe(probeCtx(t, 5*time.Second)) },
				"poller":   func() error { c.skip = 0; return pollProbe(t, p, c, 5*time.Second) },
				"polled":   func() error { c.skip = sameCallRetry; return pollProbe(t, p, c, 5*time.Second) },
			} {
				err := probe()
				switch {
				case tt.err == "" && err != nil:
					t.Errorf("%s: %v", way, err)
				case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
					t.Errorf("%s: %v, want an error containing %q", way, err, tt.err)
				}
			}
		})
	}
}

// TestPollHTTPSlowResponse writes a response a few bytes at a time, past
// the probe's write and first read, and then stops: the probe assembles
// it, or times out with the request context's error.
func TestPollHTTPSlowResponse(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const reply = "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nall good."
	hang := make(chan struct{})
	defer close(hang)
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = c.Read(make([]byte, 4096))
				r := reply
				if i == 1 {
					r = reply[:20]
				}
				for len(r) > 0 {
					n := min(len(r), 7)
					if _, err := c.Write([]byte(r[:n])); err != nil {
						return
					}
					r = r[n:]
					time.Sleep(5 * time.Millisecond)
				}
				<-hang
			}()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	p := testPoller(t)
	c, err := NewHTTPCheck(addr, false, HTTPOptions{Body: "good"}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pollProbe(t, p, c, 5*time.Second); err != nil {
		t.Errorf("response in pieces: %v", err)
	}
	c.skip = sameCallRetry // the request written on the poller
	err = pollProbe(t, p, c, 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("response that stops: %v, want a timeout", err)
	}
	if err == nil || !strings.Contains(err.Error(), `Get "http://`+addr.String()+`/"`) {
		t.Errorf("response that stops: %v, want net/http's form of error", err)
	}
}

// TestPollHTTPSourceIPv6 probes over IPv6 from a bound source.
func TestPollHTTPSourceIPv6(t *testing.T) {
	requests := make(chan []byte, 1)
	addr := rawServer(t, "tcp6", []byte("HTTP/1.1 200 OK\r\n\r\n"), requests)
	c, err := NewHTTPCheck(addr, false, HTTPOptions{}, DialOptions{Source: netip.MustParseAddr("::1")})
	if err != nil {
		t.Fatal(err)
	}
	if err := pollProbe(t, testPoller(t), c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if req := <-requests; !bytes.HasPrefix(req, []byte("GET / HTTP/1.1\r\nHost: [::1]:")) {
		t.Errorf("request %q", req)
	}
	closed, err := NewHTTPCheck(closedTCPPort(t), false, HTTPOptions{}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = pollProbe(t, testPoller(t), closed, 5*time.Second)
	if want := `Get "http://`; err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "connect: connection refused") {
		t.Errorf("closed port: %v", err)
	}
}
