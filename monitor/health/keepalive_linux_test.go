package health

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// kaAction is what kaServer does with a request.
type kaAction int

const (
	kaKeep    kaAction = iota // answer, and wait for the next request
	kaClose                   // answer, and close the connection
	kaIdle                    // answer, and close the connection after 10 ms without a request
	kaIdle408                 // kaIdle, writing a 408 response before closing
	kaDrop                    // close without answering
	kaReset                   // reset without answering
	kaHang                    // answer nothing; wait for the client to close
)

// kaServer is a listener on loopback that answers requests on kept-alive
// connections as its reply function says, given the number of the
// request on its connection (from 0), and counts the connections it
// accepted, those whose end it saw, and the requests that asked for
// keep-alive.
type kaServer struct {
	addr     netip.AddrPort
	accepted atomic.Int64
	ended    atomic.Int64
	asked    atomic.Int64
	requests atomic.Int64
}

// serveKA listens on loopback and runs serve on each connection it
// accepts (closed after), counting them in a new kaServer, until t ends.
func serveKA(t *testing.T, serve func(s *kaServer, c net.Conn, br *bufio.Reader)) *kaServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &kaServer{addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			wg.Go(func() {
				defer s.ended.Add(1)
				defer c.Close()
				go func() { <-t.Context().Done(); c.Close() }()
				serve(s, c, bufio.NewReader(c))
			})
		}
	})
	return s
}

func newKAServer(t *testing.T, reply func(n int) (string, kaAction)) *kaServer {
	t.Helper()
	return serveKA(t, func(s *kaServer, c net.Conn, br *bufio.Reader) {
		for n := 0; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			s.requests.Add(1)
			if strings.EqualFold(req.Header.Get("Connection"), "keep-alive") {
				s.asked.Add(1)
			}
			text, action := reply(n)
			switch action {
			case kaDrop:
				return
			case kaReset:
				_ = c.(*net.TCPConn).SetLinger(0)
				return
			case kaHang:
				_, _ = br.ReadByte() // until the client closes
				return
			}
			if _, err := c.Write([]byte(text)); err != nil {
				return
			}
			switch action {
			case kaClose:
				return
			case kaIdle, kaIdle408:
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
				if _, err := br.Peek(1); err != nil {
					if action == kaIdle408 {
						_, _ = c.Write([]byte("HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
					}
					return
				}
				_ = c.SetReadDeadline(time.Time{})
			}
		}
	})
}

// live returns the connections the server has open.
func (s *kaServer) live() int64 { return s.accepted.Load() - s.ended.Load() }

const okReply = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"

// kaWays returns the two ways to probe an http check with keep-alive:
// on a poller, and through net/http, each with a new check of addr.
func kaWays(t *testing.T, addr netip.AddrPort, opts HTTPOptions) map[string]func(timeout time.Duration) error {
	t.Helper()
	opts.KeepAlive = true
	ways := map[string]func(time.Duration) error{}
	p := testPoller(t)
	for _, way := range []string{"poller", "net/http"} {
		c, err := NewHTTPCheck(addr, false, opts, DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.closeIdle)
		if way == "poller" {
			ways[way] = func(d time.Duration) error { return pollProbe(t, p, c, d) }
		} else {
			ways[way] = func(d time.Duration) error { return c.Probe(probeCtx(t, d)) }
		}
	}
	return ways
}

// TestKeepAliveReuse: probes with keep-alive ask for it and reuse one
// connection, whatever frames the response: a length, chunks (with
// trailers), no body, a head and body written apart; and the same
// server gets a connection per probe from a check without keep-alive.
func TestKeepAliveReuse(t *testing.T) {
	const probes = 10
	for _, tt := range []struct {
		name  string
		reply string
		opts  HTTPOptions
		split bool
	}{
		{"length", okReply, HTTPOptions{}, false},
		{"length, body matched", okReply, HTTPOptions{Body: "ok"}, false},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nok\n\r\n0\r\nX-Trailer: 1\r\n\r\n", HTTPOptions{}, false},
		{"chunked, body matched", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", HTTPOptions{Body: "ok"}, false},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", HTTPOptions{}, false},
		{"head", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", HTTPOptions{Method: "HEAD"}, false},
		{"informational first", "HTTP/1.1 100 Continue\r\n\r\n" + okReply, HTTPOptions{}, false},
		{"http/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 3\r\n\r\nok\n", HTTPOptions{}, false},
		{"body written after the head", okReply, HTTPOptions{}, true},
		{"chunks written after the head", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", HTTPOptions{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, way := range []string{"poller", "net/http"} {
				reply := tt.reply
				var s *kaServer
				if tt.split {
					s = newSplitServer(t, reply)
				} else {
					s = newKAServer(t, func(int) (string, kaAction) { return reply, kaKeep })
				}
				probe := kaWays(t, s.addr, tt.opts)[way]
				for i := range probes {
					if err := probe(5 * time.Second); err != nil {
						t.Fatalf("%s: probe %d: %v", way, i, err)
					}
				}
				if n := s.accepted.Load(); n != 1 {
					t.Errorf("%s: %d probes took %d connections, want 1", way, probes, n)
				}
				if n := s.asked.Load(); n != probes {
					t.Errorf("%s: %d of %d requests asked for keep-alive", way, n, probes)
				}
			}
		})
	}
	s := newKAServer(t, func(int) (string, kaAction) { return okReply, kaKeep })
	c, err := NewHTTPCheck(s.addr, false, HTTPOptions{}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := testPoller(t)
	for i := range probes {
		if err := pollProbe(t, p, c, 5*time.Second); err != nil {
			t.Fatalf("without keep-alive: probe %d: %v", i, err)
		}
	}
	if n, asked := s.accepted.Load(), s.asked.Load(); n != probes || asked != 0 {
		t.Errorf("without keep-alive: %d probes took %d connections, %d asked for keep-alive", probes, n, asked)
	}
}

// newSplitServer answers every request on a kept-alive connection with
// reply, its head first and the rest 5 ms later.
func newSplitServer(t *testing.T, reply string) *kaServer {
	t.Helper()
	i := strings.Index(reply, "\r\n\r\n") + 4
	head, body := reply[:i], reply[i:]
	return serveKA(t, func(s *kaServer, c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if strings.EqualFold(req.Header.Get("Connection"), "keep-alive") {
				s.asked.Add(1)
			}
			if _, err := c.Write([]byte(head)); err != nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
			if _, err := c.Write([]byte(body)); err != nil {
				return
			}
		}
	})
}

// TestKeepAliveServerCloses: a server that closes idle connections
// between probes (saying 408 first, or not), or drops or resets its kept
// connection on the next request without an answer or with a 408, fails
// no probe: a probe finds a closed connection before writing to it, or
// tries once more on a new one when its connection ends before any
// answer or answers 408.
func TestKeepAliveServerCloses(t *testing.T) {
	const probes = 10
	for _, tt := range []struct {
		name   string
		action kaAction
		pause  time.Duration
		reply  string
	}{
		{"idle timeout", kaIdle, 30 * time.Millisecond, ""},
		{"idle timeout with a 408", kaIdle408, 30 * time.Millisecond, ""},
		{"dropped on the next request", kaDrop, 0, ""},
		{"reset on the next request", kaReset, 0, ""},
		{"408 on the next request", kaClose, 0, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, way := range []string{"poller", "net/http"} {
				s := newKAServer(t, func(n int) (string, kaAction) {
					switch {
					case tt.action == kaIdle || tt.action == kaIdle408:
						return okReply, tt.action
					case n == 0:
						return okReply, kaKeep
					}
					return tt.reply, tt.action
				})
				probe := kaWays(t, s.addr, HTTPOptions{})[way]
				for i := range probes {
					if err := probe(5 * time.Second); err != nil {
						t.Errorf("%s: probe %d: %v", way, i, err)
					}
					time.Sleep(tt.pause)
				}
				// A server slower than the pause closes fewer.
				if n := s.accepted.Load(); n != probes && (tt.pause == 0 || n < 2 || n > probes) {
					t.Errorf("%s: %d probes took %d connections, want one each", way, probes, n)
				}
			}
		})
	}
}

// TestKeepAliveNotKept: a response that says Connection: close, an
// HTTP/1.0 one without keep-alive, and one framed by the connection's end
// pass, and the next probe opens a new connection; so does one with
// bytes after it.
func TestKeepAliveNotKept(t *testing.T) {
	const probes = 5
	for _, tt := range []struct {
		name, reply string
		action      kaAction
	}{
		{"connection close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nok\n", kaClose},
		{"connection close, server keeps it", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nok\n", kaKeep},
		{"http/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n", kaClose},
		{"until close", "HTTP/1.1 200 OK\r\n\r\nok\n", kaClose},
		{"bytes after the response", okReply + "HTTP/1.1 200 OK\r\n\r\n", kaKeep},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, way := range []string{"poller", "net/http"} {
				s := newKAServer(t, func(int) (string, kaAction) { return tt.reply, tt.action })
				probe := kaWays(t, s.addr, HTTPOptions{})[way]
				for i := range probes {
					if err := probe(5 * time.Second); err != nil {
						t.Fatalf("%s: probe %d: %v", way, i, err)
					}
				}
				if n := s.accepted.Load(); n != probes {
					t.Errorf("%s: %d probes took %d connections, want one each", way, probes, n)
				}
				waitFor(t, way+": the server to see every connection closed", func() bool { return s.live() == 0 })
			}
		})
	}
}

// TestKeepAliveFailureCloses: a probe on a kept connection that times
// out (the server answers nothing) or gets a failing answer fails, and
// closes the connection; the next probe opens a new one.
func TestKeepAliveFailureCloses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		reply  string
		action kaAction
		err    string
	}{
		{"hung", "", kaHang, "context deadline exceeded"},
		{"503", "HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", kaKeep, "status 503"},
		{"body mismatch", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nno\n", kaKeep, "body does not contain"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, way := range []string{"poller", "net/http"} {
				s := newKAServer(t, func(n int) (string, kaAction) {
					if n == 1 {
						return tt.reply, tt.action
					}
					return okReply, kaKeep
				})
				probe := kaWays(t, s.addr, HTTPOptions{Body: "ok"})[way]
				if err := probe(5 * time.Second); err != nil {
					t.Fatalf("%s: first probe: %v", way, err)
				}
				err := probe(200 * time.Millisecond)
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("%s: second probe: %v, want an error containing %q", way, err, tt.err)
				}
				waitFor(t, way+": the server to see the failed probe's connection closed", func() bool { return s.ended.Load() == 1 })
				if err := probe(5 * time.Second); err != nil {
					t.Errorf("%s: third probe: %v", way, err)
				}
				if n, live := s.accepted.Load(), s.live(); n != 2 || live != 1 {
					t.Errorf("%s: %d connections, %d open; want 2, 1", way, n, live)
				}
			}
		})
	}
}

// TestKeepAliveManagerCloses: the Manager's http checks with keep-alive
// hold one connection each while they run, probing with no failure;
// an Update that removes checks closes theirs, and Run's return closes
// the rest: the server sees every connection end, and the process's
// descriptors are back to their count before.
func TestKeepAliveManagerCloses(t *testing.T) {
	const checks = 20
	s := newKAServer(t, func(int) (string, kaAction) { return okReply, kaKeep })
	fds := openFDs(t)
	targets := func(n int) []Target {
		var ts []Target
		for i := range n {
			// A path each: a check each, to the one server.
			spec := Spec{Kind: KindHTTP, Interval: 20 * time.Millisecond, Timeout: time.Second, Jitter: -1,
				HTTP: HTTPOptions{KeepAlive: true, Path: "/" + string(rune('a'+i))}}
			ts = append(ts, Target{Service: "web", Backend: netip.AddrPortFrom(s.addr.Addr(), uint16(1000+i)), Spec: withPort(spec, s.addr.Port())})
		}
		return ts
	}
	m := NewManager(Options{StartSpread: 10 * time.Millisecond})
	if err := m.Update(targets(checks)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	waitFor(t, "10 probes of each check", func() bool { return m.Stats().Probes >= 10*checks })
	if st := m.Stats(); st.Failures != 0 {
		t.Errorf("%d of %d probes failed", st.Failures, st.Probes)
	}
	if n, live := s.accepted.Load(), s.live(); n != checks || live != checks {
		t.Errorf("%d checks took %d connections, %d open; want %d, %d", checks, n, live, checks, checks)
	}
	if err := m.Update(targets(checks / 2)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed checks' connections closed", func() bool { return s.live() == checks/2 })
	before := m.Stats().Probes
	waitFor(t, "more probes", func() bool { return m.Stats().Probes >= before+5*checks/2 })
	if live := s.live(); live != checks/2 {
		t.Errorf("%d connections open after the removal, want %d", live, checks/2)
	}
	cancel()
	<-done
	waitFor(t, "every connection closed after Run", func() bool { return s.live() == 0 })
	waitFor(t, "the descriptors back to their count before", func() bool { return openFDs(t) <= fds })
	if st := m.Stats(); st.Failures != 0 || s.accepted.Load() != checks {
		t.Errorf("%d probes failed, %d connections; want 0, %d", st.Failures, s.accepted.Load(), checks)
	}
}

// withPort returns spec probing port.
func withPort(spec Spec, port uint16) Spec {
	spec.Port = port
	return spec
}

// tlsCounted is a TLS test server that counts the connections it
// accepted and closed.
type tlsCounted struct {
	srv              *httptest.Server
	newConns, closed atomic.Int64
	fail             atomic.Bool
}

// newTLSCounted starts a tlsCounted that closes connections idle for
// idle (zero: never); it answers 503 while fail is set.
func newTLSCounted(t *testing.T, idle time.Duration) *tlsCounted {
	s := &tlsCounted{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.fail.Load() {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	}))
	s.srv.Config.IdleTimeout = idle
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.newConns.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	return s
}

// TestKeepAliveHTTPS: https checks with keep-alive reuse one TLS
// connection (one handshake), survive a server that closes idle ones,
// and close theirs on a failure and on closeIdle.
func TestKeepAliveHTTPS(t *testing.T) {
	s := newTLSCounted(t, 0)
	c, err := NewHTTPCheck(serverAddr(t, s.srv), true, HTTPOptions{KeepAlive: true, InsecureSkipVerify: true}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := c.Probe(probeCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := s.newConns.Load(); n != 1 {
		t.Errorf("10 probes took %d connections, want 1", n)
	}
	s.fail.Store(true)
	if err := c.Probe(probeCtx(t, 5*time.Second)); err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("failing probe: %v", err)
	}
	waitFor(t, "the failed probe's connection closed", func() bool { return s.closed.Load() == 1 })
	s.fail.Store(false)
	if err := c.Probe(probeCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	c.closeIdle()
	waitFor(t, "every connection closed", func() bool { return s.newConns.Load() == 2 && s.closed.Load() == 2 })

	idle := newTLSCounted(t, 10*time.Millisecond)
	c, err = NewHTTPCheck(serverAddr(t, idle.srv), true, HTTPOptions{KeepAlive: true, InsecureSkipVerify: true}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.closeIdle()
	for i := range 5 {
		if err := c.Probe(probeCtx(t, 5*time.Second)); err != nil {
			t.Errorf("probe %d against idle timeouts: %v", i, err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	if n := idle.newConns.Load(); n != 5 {
		t.Errorf("5 probes apart by more than the idle timeout took %d connections, want 5", n)
	}
}

// TestKeepAliveFramed: framed measures a response, or says that its
// connection cannot be reused.
func TestKeepAliveFramed(t *testing.T) {
	get, err := NewHTTPCheck(netip.MustParseAddrPort("127.0.0.1:80"), false, HTTPOptions{KeepAlive: true}, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		resp string
		want int // -2: len(resp)
	}{
		{okReply, -2},
		{okReply[:len(okReply)-1], 0},
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nok\n", -1},
		{"HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nok\n", -1},
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", -1},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", -1},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n", -2},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n", 0},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", -1},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\nXX0\r\n\r\n", -1},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n200000\r\n", -1},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", -1},
		{"HTTP/1.1 200 OK\r\nConnection: Upgrade, Close\r\nContent-Length: 0\r\n\r\n", -1},
		{"HTTP/1.1 101 Switching Protocols\r\n\r\n", -1},
		{"HTTP/1.1 304 Not Modified\r\nContent-Length: 30\r\n\r\n", -2},
		{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", -2},
		{"HTTP/1.1 100 Continue\r\n\r\n", 0},
	} {
		want := tt.want
		if want == -2 {
			want = len(tt.resp)
		}
		if got := get.framed([]byte(tt.resp)); got != want {
			t.Errorf("framed(%q) = %d, want %d", tt.resp, got, want)
		}
	}
}

// TestKeepAliveSpec: a Spec refuses keep-alive on checks other than
// http and https, and builds http and https checks that keep their
// connection.
func TestKeepAliveSpec(t *testing.T) {
	ka := HTTPOptions{KeepAlive: true}
	for _, k := range []Kind{KindTCP, KindUDP, KindDNS, KindExec} {
		s := Spec{Kind: k, HTTP: ka}
		if k == KindExec {
			s.Exec.Command = "/bin/true"
		}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "http options do not apply to "+k.String()+" checks") {
			t.Errorf("%s check with keep-alive: %v, want it refused", k, err)
		}
		if _, err := NewProber(s, netip.MustParseAddrPort("127.0.0.1:80")); err == nil {
			t.Errorf("%s check with keep-alive built", k)
		}
	}
	for _, k := range []Kind{KindHTTP, KindHTTPS} {
		p, err := NewProber(Spec{Kind: k, HTTP: ka}, netip.MustParseAddrPort("127.0.0.1:80"))
		if err != nil {
			t.Fatalf("%s check with keep-alive: %v", k, err)
		}
		if c, ok := p.(*HTTPCheck); !ok || !c.opts.KeepAlive {
			t.Errorf("%s check with keep-alive built %T without it", k, p)
		}
	}
}

// BenchmarkProbeHTTPSKeepAlive compares https probes (net/http, on the
// caller's goroutine) that keep their TLS connection with probes that
// open one each, against one TLS server in this process: per probe, the
// wall time (ns/op), allocations and CPU of each way, both ends
// together; then both ways in turns, for the ratio of their CPU.
func BenchmarkProbeHTTPSKeepAlive(b *testing.B) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	}))
	srv.Config.ErrorLog = nil
	srv.StartTLS()
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr).AddrPort()
	checks := make([]*HTTPCheck, 2)
	for i, keep := range []bool{true, false} {
		c, err := NewHTTPCheck(addr, true, HTTPOptions{KeepAlive: keep, InsecureSkipVerify: true}, DialOptions{})
		if err != nil {
			b.Fatal(err)
		}
		defer c.closeIdle()
		checks[i] = c
	}
	probe := func(b *testing.B, c *HTTPCheck) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Probe(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for i, name := range []string{"keepalive", "new"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			c0, _ := cpuTime(b)
			n := 0
			for b.Loop() {
				probe(b, checks[i])
				n++
			}
			c1, _ := cpuTime(b)
			b.ReportMetric(float64((c1-c0).Nanoseconds())/1000/float64(n), "cpu-µs/probe")
		})
	}
	b.Run("ratio", func(b *testing.B) {
		var cpu [2]time.Duration
		n := 0
		for b.Loop() {
			for i, c := range checks {
				c0, _ := cpuTime(b)
				for range 20 {
					probe(b, c)
				}
				c1, _ := cpuTime(b)
				cpu[i] += c1 - c0
			}
			n += 20
		}
		b.ReportMetric(float64(cpu[0].Microseconds())/float64(n), "keepalive-cpu-µs/probe")
		b.ReportMetric(float64(cpu[1].Microseconds())/float64(n), "new-cpu-µs/probe")
		b.ReportMetric(float64(cpu[0])/float64(cpu[1]), "keepalive/new")
	})
}
