package bgpproc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/frame"
	"github.com/vipd/vipd/program"
)

// childEnv makes the test binary a vipd-bgp of the mode it names, with
// a fake speaker.
const childEnv = "VIPD_BGPPROC_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := fakeProgram(mode); err != nil {
			fmt.Fprintln(os.Stderr, "fake vipd-bgp:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// router is the fake speaker's one peer.
var router = netip.MustParseAddr("192.0.2.254")

// fakeSpeaker announces nothing: its peer reports the routes it was set.
type fakeSpeaker struct {
	// hang makes Peers never answer.
	hang    bool
	mu      sync.Mutex
	routes  map[netip.Prefix]Attrs
	retired bool
}

func (f *fakeSpeaker) Set(routes map[netip.Prefix]Attrs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes, f.retired = routes, false
	return nil
}

func (f *fakeSpeaker) Retire(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retired = true
	return nil
}

func (f *fakeSpeaker) Stop(context.Context) error { return f.Retire(context.Background()) }

func (f *fakeSpeaker) Peers() []Peer {
	if f.hang {
		select {}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.routes)
	if f.retired {
		n = 0
	}
	return []Peer{{Address: router, ASN: 65000, State: "established", Routes: n}}
}

// fakeProgram is vipd-bgp with the fake speaker: "ok" serves; "refuse"
// refuses the options; "garbage" and "huge" answer the options, then
// send a frame that is no message and one over the bound; "hang" never
// answers a Peers request.
func fakeProgram(mode string) error {
	conn, err := program.Socket("fake vipd-bgp")
	if err != nil {
		return err
	}
	return Serve(context.Background(), ServeOptions{Conn: conn, Start: func(ctx context.Context, o Options, onPeer func(Peer)) (Speaker, error) {
		switch mode {
		case "refuse":
			return nil, errors.New("refused: no router-id")
		case "garbage":
			go func() {
				time.Sleep(50 * time.Millisecond)
				conn.Write(binary.BigEndian.AppendUint32(nil, 9))
				conn.Write([]byte("{nonsense"))
			}()
		case "huge":
			go func() {
				time.Sleep(50 * time.Millisecond)
				conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30))
			}()
		}
		if o.ASN != 65001 || o.Peers[0].Password != "s3cret" {
			return nil, fmt.Errorf("options %+v", o)
		}
		onPeer(Peer{Address: router, ASN: 65000, State: "established"})
		return &fakeSpeaker{hang: mode == "hang"}, nil
	}})
}

// logBuffer is a log the tests read while the client writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// events records what OnPeer gets.
type events struct {
	mu    sync.Mutex
	peers []Peer
}

func (e *events) add(p Peer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peers = append(e.peers, p)
}

func (e *events) states() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, p := range e.peers {
		out = append(out, p.State)
	}
	return out
}

// start starts the test binary as a vipd-bgp of mode, started again
// after a crash within 20-100 ms.
func start(t *testing.T, mode string) (*Client, *logBuffer, *events, error) {
	return startAfter(t, mode, 20*time.Millisecond)
}

// startAfter is start, the program started again after restart.
func startAfter(t *testing.T, mode string, restart time.Duration) (*Client, *logBuffer, *events, error) {
	t.Helper()
	var log logBuffer
	var ev events
	c, err := Start(context.Background(), ClientOptions{
		Program: os.Args[0], Args: []string{"-test.run=^$"}, Env: []string{childEnv + "=" + mode},
		Options: Options{ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.1"), Peers: []PeerOptions{{Address: router, ASN: 65000, Password: "s3cret"}}},
		Logger:  slog.New(slog.NewTextHandler(&log, nil)), OnPeer: ev.add,
		RequestTimeout: time.Second, Restart: restart, MaxRestart: max(restart, 100*time.Millisecond),
	})
	if err == nil {
		t.Cleanup(func() { c.Stop(context.Background()) })
	}
	return c, &log, &ev, err
}

// waitFor polls cond for 10 seconds.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
	}
	t.Fatalf("%s: not after 10 s (last: %s)", what, last)
}

// waitEstablished waits for the fake peer's established event.
func waitEstablished(t *testing.T, ev *events) {
	t.Helper()
	waitFor(t, "the established event", func() (bool, string) {
		return slices.Contains(ev.states(), "established"), fmt.Sprint(ev.states())
	})
}

// kill kills the running program, as a crash would, and returns it.
func kill(c *Client) *child {
	c.mu.Lock()
	ch := c.ch
	c.mu.Unlock()
	ch.Cmd.Process.Kill()
	return ch
}

// killEstablished waits for the fake peer's session, then kills the
// program that reported it.
func killEstablished(t *testing.T, c *Client, ev *events) *child {
	t.Helper()
	waitEstablished(t, ev)
	return kill(c)
}

// routesOf is how many routes the fake peer says it gets.
func routesOf(c *Client) (bool, string, int) {
	ps := c.Peers()
	if len(ps) != 1 {
		return false, fmt.Sprint(ps), -1
	}
	return ps[0].State == "established", fmt.Sprint(ps), ps[0].Routes
}

// TestClient runs the program's whole life: the options reach it, an
// event comes back, routes are set and retired, and Stop ends it with a
// clean exit.
func TestClient(t *testing.T) {
	c, _, ev, err := start(t, "ok")
	if err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ev)
	routes := map[netip.Prefix]Attrs{
		netip.MustParsePrefix("198.51.100.1/32"): {Communities: []uint32{65000<<16 | 1}},
		netip.MustParsePrefix("2001:db8::1/128"): {LargeCommunities: []LargeCommunity{{Global: 1, Local1: 2, Local2: 3}}},
	}
	if err := c.Set(routes); err != nil {
		t.Fatal(err)
	}
	if up, ps, n := routesOf(c); !up || n != 2 {
		t.Errorf("after Set of 2 routes: %s", ps)
	}
	if err := c.Retire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ps, n := routesOf(c); n != 0 {
		t.Errorf("after Retire: %s", ps)
	}
	ch := c.ch
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-ch.Exited()
	if err := ch.Err(); err != nil {
		t.Errorf("the program's exit: %v, want a clean one", err)
	}
	if err := c.Set(routes); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Set after Stop: %v", err)
	}
}

// TestClientRestarts kills the program: the client reports the session
// idle, starts it again and announces the routes last set there.
func TestClientRestarts(t *testing.T) {
	c, log, ev, err := start(t, "ok")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(map[netip.Prefix]Attrs{netip.MustParsePrefix("198.51.100.1/32"): {}, netip.MustParsePrefix("198.51.100.2/32"): {}, netip.MustParsePrefix("198.51.100.3/32"): {}}); err != nil {
		t.Fatal(err)
	}
	first := killEstablished(t, c, ev)
	waitFor(t, "the session reported idle", func() (bool, string) {
		return slices.Contains(ev.states(), "idle"), fmt.Sprint(ev.states())
	})
	waitFor(t, "a new program with the 3 routes", func() (bool, string) {
		c.mu.Lock()
		again := c.ch != nil && c.ch != first
		c.mu.Unlock()
		up, ps, n := routesOf(c)
		return again && up && n == 3, ps
	})
	if !strings.Contains(log.String(), "the BGP speaker program ended") || !strings.Contains(log.String(), "started again") {
		t.Errorf("log:\n%s", log)
	}
}

// TestClientRefusedOptions: a program that refuses the options fails
// the start with its reason, and is not left running.
func TestClientRefusedOptions(t *testing.T) {
	_, _, _, err := start(t, "refuse")
	if err == nil || !strings.Contains(err.Error(), "refused: no router-id") {
		t.Fatalf("start: %v", err)
	}
}

// TestClientRefusesWhatIsNoMessage: a program that sends a frame that
// is no message, or one over the bound, is taken for broken: the client
// ends it (before reading a frame over the bound), says why, and starts
// it again.
func TestClientRefusesWhatIsNoMessage(t *testing.T) {
	for _, tt := range []struct{ mode, why string }{
		{"garbage", "decode a frame"},
		{"huge", "frame too big"},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			c, log, _, err := start(t, tt.mode)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the program ended for "+tt.why, func() (bool, string) {
				s := log.String()
				return strings.Contains(s, "the BGP speaker program ended") && strings.Contains(s, tt.why), s
			})
			waitFor(t, "a new program", func() (bool, string) {
				s := log.String()
				return strings.Contains(s, "started again"), s
			})
			c.Stop(context.Background())
		})
	}
}

// TestServeRefuses: the program refuses a first message that is not the
// options, and options of another wire version, and says why.
func TestServeRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    message
		want string
	}{
		{"not options first", message{ID: 1, Op: opSet}, "the first message is set"},
		{"another version", message{ID: 1, Op: opStart, Version: Version + 1, Start: &Options{}}, "wire version 2, want 1"},
		{"unknown operation", message{ID: 1, Op: "flush"}, `unknown operation "flush"`},
		{"no id", message{Op: opRetire}, "without an id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			daemon, prog := net.Pipe()
			defer daemon.Close()
			done := make(chan error, 1)
			go func() {
				done <- Serve(context.Background(), ServeOptions{Conn: prog, Start: func(context.Context, Options, func(Peer)) (Speaker, error) {
					return &fakeSpeaker{}, nil
				}})
				prog.Close()
			}()
			if err := frame.Write(daemon, &tt.m, MaxFrame); err != nil {
				t.Fatal(err)
			}
			var reply message
			replied := frame.Read(daemon, &reply, MaxFrame)
			err := <-done
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Serve: %v, want %q", err, tt.want)
			}
			if tt.m.Op == opStart || tt.m.Op == opSet {
				if replied != nil || !strings.Contains(reply.Error, tt.want) {
					t.Errorf("reply %+v (%v), want an error %q", reply, replied, tt.want)
				}
			}
		})
	}
}

// TestStopWhileRestarting: a Stop while the program is down and the
// client waits to start it again ends at once, and starts none.
func TestStopWhileRestarting(t *testing.T) {
	c, _, _, err := startAfter(t, "ok", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kill(c)
	waitFor(t, "the program gone", func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.ch == nil, "still running"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("Stop waited for the restart")
	}
}

// TestClientHungProgram: a program that does not answer a request in
// time is taken for hung: the request fails over to the last state it
// reported, and the program is killed and started again.
func TestClientHungProgram(t *testing.T) {
	c, log, ev, err := start(t, "hang")
	if err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ev)
	t0 := time.Now()
	ps := c.Peers()
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Peers took %s", d)
	}
	if len(ps) != 1 || ps[0].Address != router {
		t.Errorf("peers %v, want the last state reported", ps)
	}
	waitFor(t, "the hung program killed and started again", func() (bool, string) {
		s := log.String()
		return strings.Contains(s, "taken for hung") && strings.Contains(s, "started again"), s
	})
}

// TestSetWhileRestarting: routes set while the program is down fail to
// reach it then, and the program announces them when it is back.
func TestSetWhileRestarting(t *testing.T) {
	c, _, ev, err := startAfter(t, "ok", 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(map[netip.Prefix]Attrs{netip.MustParsePrefix("198.51.100.1/32"): {}}); err != nil {
		t.Fatal(err)
	}
	killEstablished(t, c, ev)
	waitFor(t, "the program gone", func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.ch == nil, "still running"
	})
	two := map[netip.Prefix]Attrs{netip.MustParsePrefix("198.51.100.1/32"): {}, netip.MustParsePrefix("198.51.100.2/32"): {}}
	if err := c.Set(two); err == nil || !strings.Contains(err.Error(), "restarting") {
		t.Errorf("Set while restarting: %v", err)
	}
	waitFor(t, "the new program with the 2 routes set while it was down", func() (bool, string) {
		up, ps, n := routesOf(c)
		return up && n == 2, ps
	})
}
