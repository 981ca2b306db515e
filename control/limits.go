package control

import (
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// Limits bound one of vipd's HTTP servers: the control socket's or the
// metrics endpoint's.
type Limits struct {
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// http.Server's: a client that sends its request slowly, reads the
	// reply slowly or keeps an idle connection open is cut off.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxHeaderBytes is http.Server's.
	MaxHeaderBytes int
	// MaxConns is the most connections open at a time. On the control
	// socket more wait in the listen queue, so that clients cannot
	// exhaust vipd's file descriptors; on the metrics endpoint a
	// connection beyond it takes the slot of one that holds it without
	// using it (see connSlots), or is closed.
	MaxConns int
	// MaxConnsPerClient is the most connections one client (an IPv4
	// address, an IPv6 /64, or loopback) holds on the metrics endpoint;
	// its next one takes the slot of its own idle one, or is closed.
	// 0 sets no such limit.
	MaxConnsPerClient int
	// MaxRequests is the most requests served at a time (of each kind
	// on the control socket: status, and commands); more are refused
	// with 503, not queued, after waiting RequestWait at most for one to
	// end (in the order they came).
	MaxRequests int
	RequestWait time.Duration
}

// Server returns an http.Server for h with l's timeouts, logging its
// errors (failed accepts) to log.
func (l Limits) Server(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Listener limits ln to l's connections, which wait in the listen queue
// for a slot.
func (l Limits) Listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.MaxConns)
}

// Limiter returns what wraps a handler so that it serves at most n
// requests at a time, handing the others to busy at once, or after
// waiting wait at most for a request to end.
func Limiter(n int, wait time.Duration, busy http.HandlerFunc) func(http.HandlerFunc) http.Handler {
	slots := make(chan struct{}, n)
	return func(h http.HandlerFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case slots <- struct{}{}:
			default:
				if wait <= 0 {
					busy(w, r)
					return
				}
				t := time.NewTimer(wait)
				defer t.Stop()
				select {
				case slots <- struct{}{}:
				case <-t.C:
					busy(w, r)
					return
				case <-r.Context().Done():
					return
				}
			}
			defer func() { <-slots }()
			h(w, r)
		})
	}
}
