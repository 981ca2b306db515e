package kubernetes

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestGate drives the gate with a real listener: an answer that says the
// server is unavailable, or none at all, shuts it; a shut gate holds
// requests (they never reach the server) until the probe, which passes it,
// gets any other answer.
func TestGate(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusOK)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	url := srv.URL
	g := newGate()
	do := gatedGet(t, g)
	get := func(ctx context.Context) (int, error) { return do(ctx, url) }
	// held checks that a request waits at the gate and never reaches the
	// server.
	held := func(what string) {
		t.Helper()
		before := hits.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := get(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: a request went through a shut gate: %v", what, err)
		}
		if n := hits.Load(); n != before {
			t.Errorf("%s: the server saw %d requests through a shut gate", what, n-before)
		}
	}

	if got, err := get(context.Background()); err != nil || got != http.StatusOK || g.isShut() {
		t.Fatalf("open gate: %d %v shut=%v", got, err, g.isShut())
	}
	for _, unavail := range []int{http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout} {
		code.Store(int32(unavail))
		if got, err := get(context.Background()); err != nil || got != unavail {
			t.Fatalf("%d: %d %v", unavail, got, err)
		}
		if !g.isShut() {
			t.Fatalf("%d did not shut the gate", unavail)
		}
		held(http.StatusText(unavail))
		// The probe passes; while the server still says so, the gate
		// stays shut.
		if _, err := get(passGate(context.Background())); err != nil || !g.isShut() {
			t.Fatalf("%d: the probe: %v shut=%v", unavail, err, g.isShut())
		}
		// A request waiting at the gate goes when the probe finds the
		// server back.
		code.Store(http.StatusOK)
		waiting := make(chan error, 1)
		go func() {
			got, err := get(context.Background())
			if err == nil && got != http.StatusOK {
				err = errors.New(http.StatusText(got))
			}
			waiting <- err
		}()
		select {
		case err := <-waiting:
			t.Fatalf("%d: a request went before the probe: %v", unavail, err)
		case <-time.After(50 * time.Millisecond):
		}
		if _, err := get(passGate(context.Background())); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-waiting:
			if err != nil {
				t.Fatalf("%d: the held request: %v", unavail, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d: the held request did not go after the probe", unavail)
		}
	}

	// Answers about the request, not the server, leave the gate open; so
	// does throttling, which client-go waits out for that request alone.
	for _, other := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusInternalServerError, http.StatusConflict, http.StatusTooManyRequests} {
		code.Store(int32(other))
		if _, err := get(context.Background()); err != nil || g.isShut() {
			t.Fatalf("%d: %v shut=%v", other, err, g.isShut())
		}
	}
	// A probe answered with such a status (a probe the server forbids)
	// still opens the gate: the server is there.
	code.Store(http.StatusServiceUnavailable)
	get(context.Background())
	code.Store(http.StatusForbidden)
	if _, err := get(passGate(context.Background())); err != nil || g.isShut() {
		t.Fatalf("a forbidden probe: %v shut=%v", err, g.isShut())
	}

	// A request with a body that a shut gate holds until its caller gives
	// up: its body is closed, as a RoundTripper's contract says.
	code.Store(http.StatusServiceUnavailable)
	get(context.Background())
	body := &closeRecorder{Reader: strings.NewReader("{}")}
	bctx, bcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	req, err := http.NewRequestWithContext(bctx, "PUT", url, body)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.wrap(http.DefaultTransport).RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) || !body.closed.Load() {
		t.Errorf("a held request with a body: %v, body closed %v", err, body.closed.Load())
	}
	bcancel()
	code.Store(http.StatusOK)
	if _, err := get(passGate(context.Background())); err != nil || g.isShut() {
		t.Fatalf("the probe: %v shut=%v", err, g.isShut())
	}

	// A request its caller ends says nothing of the server.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := get(ctx); !errors.Is(err, context.Canceled) || g.isShut() {
		t.Fatalf("a cancelled request: %v shut=%v", err, g.isShut())
	}

	// No answer at all: the server is gone.
	srv.Close()
	if _, err := get(context.Background()); err == nil || !g.isShut() {
		t.Fatalf("no server: %v shut=%v", err, g.isShut())
	}
	if _, err := get(passGate(context.Background())); err == nil || !g.isShut() {
		t.Fatalf("a probe of no server: %v shut=%v", err, g.isShut())
	}
	// A server that answers again (the gate knows no address): the probe
	// opens the gate.
	code.Store(http.StatusOK)
	back := httptest.NewServer(srv.Config.Handler)
	defer back.Close()
	url = back.URL
	if _, err := get(passGate(context.Background())); err != nil || g.isShut() {
		t.Fatalf("a probe of the server back: %v shut=%v", err, g.isShut())
	}
}

// TestGateProbes checks that a shut gate opens by itself: its own probe
// finds the server answering, with nothing else passing the gate (the
// source's loop may itself be waiting at it), and that it stays shut while
// the server says it is unavailable.
func TestGateProbes(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusServiceUnavailable)
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			probes.Add(1)
		}
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	g := newGate()
	do := gatedGet(t, g)
	get := func(ctx context.Context, path string) (int, error) { return do(ctx, srv.URL+path) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.start(ctx, func(ctx context.Context) { get(ctx, "/readyz") })

	if got, err := get(ctx, "/"); err != nil || got != http.StatusServiceUnavailable || !g.isShut() {
		t.Fatalf("503: %d %v shut=%v", got, err, g.isShut())
	}
	waiting := make(chan error, 1)
	go func() {
		got, err := get(ctx, "/")
		if err == nil && got != http.StatusOK {
			err = errors.New(http.StatusText(got))
		}
		waiting <- err
	}()
	// Probes that find the server unavailable leave the gate shut.
	deadline := time.Now().Add(10 * time.Second)
	for probes.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the shut gate probed %d times in 10 s", probes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-waiting:
		t.Fatalf("a request went while the server said 503: %v", err)
	default:
	}
	code.Store(http.StatusOK)
	select {
	case err := <-waiting:
		if err != nil {
			t.Fatalf("the held request: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gate did not open by itself after the server came back")
	}
	if g.isShut() {
		t.Fatal("the gate is shut after the server came back")
	}
	// Open, the gate stops probing.
	n := probes.Load()
	time.Sleep(3 * gateProbeEvery)
	if m := probes.Load(); m != n {
		t.Errorf("an open gate probed %d times", m-n)
	}
}

// closeRecorder is a request body that records its close.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error {
	c.closed.Store(true)
	return nil
}

// gatedGet returns a function that GETs a URL through g and returns the
// answer's status.
func gatedGet(t *testing.T, g *gate) func(ctx context.Context, url string) (int, error) {
	c := &http.Client{Transport: g.wrap(http.DefaultTransport)}
	return func(ctx context.Context, url string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
}
