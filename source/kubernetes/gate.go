package kubernetes

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// A gate holds the source's requests to the API server while the server is
// known to be unavailable, and lets them go as soon as a request that passes
// the gate finds it answering again: the gate's own probe, every
// gateProbeEvery while it is shut, or the source's.
//
// Without it, each of client-go's informers retries a failed list or watch
// after a back-off that doubles up to 30 s (60 s with its jitter), so that
// after an outage of the API server the source would stay out of step for up
// to a minute after the server is back. Behind the gate a request waits
// instead of failing, so an informer fails once per outage and goes on the
// moment the server answers.
type gate struct {
	// ctx bounds the gate's probing, and probe asks the server whether
	// it answers, passing the gate (its answer moves the gate); probe is
	// nil until start.
	ctx   context.Context
	probe func(context.Context)

	mu sync.Mutex
	// open is closed while requests may go.
	open chan struct{}
	// probing says that the gate's probing goroutine runs.
	probing bool
}

// gateProbeEvery is how often a shut gate asks the server whether it
// answers again.
const gateProbeEvery = 500 * time.Millisecond

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// start makes a shut gate probe the server with probe until it opens or
// ctx ends. Called once, before the first request.
func (g *gate) start(ctx context.Context, probe func(context.Context)) {
	g.ctx, g.probe = ctx, probe
}

// shut holds the requests that come until the next release, and starts
// probing.
func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
	if g.probe != nil && !g.probing {
		g.probing = true
		go g.probeUntilOpen(g.open)
	}
}

// probeUntilOpen probes the server every gateProbeEvery until open is
// closed or the gate's context ends.
func (g *gate) probeUntilOpen(open <-chan struct{}) {
	defer func() {
		g.mu.Lock()
		g.probing = false
		shut := g.isShutLocked()
		g.mu.Unlock()
		// Shut again between the release and this end: probe again.
		if shut && g.ctx.Err() == nil {
			g.shut()
		}
	}()
	t := time.NewTicker(gateProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-open:
			return
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(passGate(g.ctx), gateProbeEvery)
		g.probe(ctx)
		cancel()
	}
}

// release lets the held requests go.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// opened returns a channel closed while requests may go.
func (g *gate) opened() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// isShut reports whether requests are held.
func (g *gate) isShut() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isShutLocked()
}

func (g *gate) isShutLocked() bool {
	select {
	case <-g.open:
		return false
	default:
		return true
	}
}

type passKey struct{}

// passGate returns a context whose requests pass a shut gate: the probe
// that finds the server back.
func passGate(ctx context.Context) context.Context {
	return context.WithValue(ctx, passKey{}, true)
}

// wrap returns next behind the gate. Each answer moves the gate: one that
// says the server is unavailable (no answer at all, 502, 503, 504) shuts
// it, any other opens it. A 429 opens it: the server throttles one flow
// (client-go waits as it says and retries), which is no reason to hold the
// others.
func (g *gate) wrap(next http.RoundTripper) http.RoundTripper {
	return &gatedTransport{g: g, next: next}
}

type gatedTransport struct {
	g    *gate
	next http.RoundTripper
}

func (t *gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if ctx.Value(passKey{}) == nil {
		select {
		case <-t.g.opened():
		case <-ctx.Done():
			// A RoundTripper closes the body, even when it fails.
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, ctx.Err()
		}
	}
	resp, err := t.next.RoundTrip(req)
	switch {
	case err != nil:
		// A request ended by its caller says nothing of the server.
		if ctx.Err() == nil {
			t.g.shut()
		}
	case unavailable(resp.StatusCode):
		t.g.shut()
	default:
		t.g.release()
	}
	return resp, err
}

// WrappedRoundTripper returns the transport behind the gate, as client-go's
// own wrappers do.
func (t *gatedTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// unavailable reports whether an HTTP status says that the server cannot
// serve now (starting, stopping, or behind a proxy that cannot reach it),
// rather than anything about the request.
func unavailable(code int) bool {
	switch code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
