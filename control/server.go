// Package control is vipd's control API: the server on the daemon's unix
// socket (Serve), its wire types (Reply) and its client (Call, CallRaw),
// which the vipd commands reload, plan, status, drain and undrain use.
// It also holds the limits that bound vipd's HTTP servers (Limits,
// Limiter), the control socket's and the metrics endpoint's.
package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
)

// Agent is what the control API serves: the agent's commands, its plan
// and its status (agent.Agent).
type Agent interface {
	Reload(ctx context.Context, opts agent.ReloadOptions) (agent.Outcome, error)
	Plan(ctx context.Context) ([]lb.Op, error)
	Status(ctx context.Context) (*status.Snapshot, error)
	Drain(ctx context.Context, opts agent.DrainOptions) (agent.Outcome, error)
	Undrain(ctx context.Context, opts agent.DrainOptions) (agent.Outcome, error)
	DrainNode(ctx context.Context, on bool) error
	Rejected(server metrics.Server)
}

// Serve serves a's control API on the unix socket path, readable and
// writable by root and the socket's group only. Commands go to the
// agent's main loop, so they see its state between passes, never during
// one; status comes from the agent's status cache, which reads the kernel
// at most once per stats_interval. The server is bound by lim.
func Serve(a Agent, path string, lim Limits, log *slog.Logger) (stop func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := agent.ClearStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// At the stop, the socket is removed only if it is still this one:
	// not by the listener's Close, which removes whatever is at path.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	own, err := os.Lstat(path)
	if err == nil {
		err = os.Chmod(path, 0o660)
	}
	if err != nil {
		l.Close()
		os.Remove(path)
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, rep Reply) {
		w.Header().Set("Content-Type", "application/json")
		if rep.Error != "" {
			w.WriteHeader(http.StatusConflict)
		}
		json.NewEncoder(w).Encode(rep)
	}
	busy := func(w http.ResponseWriter, _ *http.Request) {
		a.Rejected(metrics.ServerControl)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(Reply{Error: "busy: vipd is serving as many requests as it serves at a time; try again"})
	}
	// Commands go to the main loop; status is served from the cache.
	// Each has its own limit, so that a flood of one never refuses
	// the other.
	commands := Limiter(lim.MaxRequests, lim.RequestWait, busy)
	mux.Handle("POST /v1/reload", commands(func(w http.ResponseWriter, r *http.Request) {
		answer(w, ReplyOf(a.Reload(r.Context(), agent.ReloadOptions{Why: "control socket", Force: r.URL.Query().Get("force") == "1"})))
	}))
	mux.Handle("GET /v1/plan", commands(func(w http.ResponseWriter, r *http.Request) {
		ops, err := a.Plan(r.Context())
		if err != nil {
			answer(w, Reply{Error: err.Error()})
			return
		}
		rep := Reply{Planned: []string{}}
		for _, op := range ops {
			rep.Planned = append(rep.Planned, op.String())
		}
		answer(w, rep)
	}))
	mux.Handle("GET /v1/status", Limiter(lim.MaxRequests, lim.RequestWait, busy)(func(w http.ResponseWriter, r *http.Request) {
		snap, err := a.Status(r.Context())
		if r.Context().Err() != nil {
			return // the client is gone
		}
		if err != nil {
			answer(w, Reply{Error: err.Error()})
			return
		}
		if r.URL.Query().Get("format") == "table" {
			// vipd status's table, rendered here: at 10,000 services
			// the JSON costs the daemon and the command far more.
			w.Header().Set("Content-Type", TableType)
			status.RenderTable(w, snap) // fails only when the client is gone
			return
		}
		// Reply{Status: snap} as answer would encode it, a service at a
		// time rather than 30 MB at once at 10,000 services.
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":`)
		if status.WriteJSON(w, snap) == nil {
			io.WriteString(w, "}\n")
		}
	}))
	for _, kind := range []string{"drain", "undrain"} {
		do := a.Drain
		if kind == "undrain" {
			do = a.Undrain
		}
		mux.Handle("POST /v1/"+kind, commands(func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			if q.Get("node") == "1" {
				answer(w, ReplyOf(agent.Outcome{}, a.DrainNode(r.Context(), kind == "drain")))
				return
			}
			service, backend := q.Get("service"), q.Get("backend")
			if service == "*" {
				service = ""
			}
			addr, err := netip.ParseAddrPort(backend)
			if err != nil {
				answer(w, Reply{Error: fmt.Sprintf("backend %q is not address:port", backend)})
				return
			}
			answer(w, ReplyOf(do(r.Context(), agent.DrainOptions{Service: service, Backend: addr})))
		}))
	}
	srv := lim.Server(mux, log)
	l = lim.Listener(l)
	go srv.Serve(l)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, own) {
			os.Remove(path)
		}
	}, nil
}
