package kubernetes

import (
	"context"
	"net/http"
	"sync"
)

// A gate holds the source's requests to the API server while the server is
// known to be unavailable, and lets them go as soon as a request (the
// source's readiness probe, which passes the gate) finds it answering again.
//
// Without it, each of client-go's informers retries a failed list or watch
// after a back-off that doubles up to 30 s (60 s with its jitter), so that
// after an outage of the API server the source would stay out of step for up
// to a minute after the server is back. Behind the gate a request waits
// instead of failing, so an informer fails once per outage and goes on the
// moment the server answers.
type gate struct {
	mu sync.Mutex
	// open is closed while requests may go.
	open chan struct{}
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

// shut holds the requests that come until the next release.
func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
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
	select {
	case <-g.opened():
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
// says the server is unavailable (no answer at all, 429, 502, 503, 504)
// shuts it, any other opens it.
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
// serve now (starting, stopping, overloaded, or behind a proxy that cannot
// reach it), rather than anything about the request.
func unavailable(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
