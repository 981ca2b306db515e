package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/netutil"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/monitor/metrics"
	"github.com/vipd/vipd/monitor/status"
)

// serveControl serves a's control API on the unix socket path, readable
// and writable by root and the socket's group only. Commands go to the
// agent's main loop, so they see its state between passes, never during
// one; status comes from the agent's status cache, which reads the kernel
// at most once per stats_interval. The server is bound by lim.
func serveControl(a *agent.Agent, path string, lim serverLimits, log *slog.Logger) (stop func(), err error) {
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
	answer := func(w http.ResponseWriter, rep reply) {
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
		json.NewEncoder(w).Encode(reply{Error: "busy: vipd is serving as many requests as it serves at a time; try again"})
	}
	// Commands go to the main loop; status is served from the cache.
	// Each has its own limit, so that a flood of one never refuses
	// the other.
	commands := limiter(lim.MaxRequests, lim.RequestWait, busy)
	mux.Handle("POST /v1/reload", commands(func(w http.ResponseWriter, r *http.Request) {
		answer(w, replyOf(a.Reload(r.Context(), agent.ReloadOptions{Why: "control socket", Force: r.URL.Query().Get("force") == "1"})))
	}))
	mux.Handle("GET /v1/plan", commands(func(w http.ResponseWriter, r *http.Request) {
		ops, err := a.Plan(r.Context())
		if err != nil {
			answer(w, reply{Error: err.Error()})
			return
		}
		rep := reply{Planned: []string{}}
		for _, op := range ops {
			rep.Planned = append(rep.Planned, op.String())
		}
		answer(w, rep)
	}))
	mux.Handle("GET /v1/status", limiter(lim.MaxRequests, lim.RequestWait, busy)(func(w http.ResponseWriter, r *http.Request) {
		snap, err := a.Status(r.Context())
		if r.Context().Err() != nil {
			return // the client is gone
		}
		if err != nil {
			answer(w, reply{Error: err.Error()})
			return
		}
		if r.URL.Query().Get("format") == "table" {
			// vipd status's table, rendered here: at 10,000 services
			// the JSON costs the daemon and the command far more.
			w.Header().Set("Content-Type", tableType)
			status.RenderTable(w, snap) // fails only when the client is gone
			return
		}
		// reply{Status: snap} as answer would encode it, a service at a
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
				answer(w, replyOf(agent.Outcome{}, a.DrainNode(r.Context(), kind == "drain")))
				return
			}
			service, backend := q.Get("service"), q.Get("backend")
			if service == "*" {
				service = ""
			}
			addr, err := netip.ParseAddrPort(backend)
			if err != nil {
				answer(w, reply{Error: fmt.Sprintf("backend %q is not address:port", backend)})
				return
			}
			answer(w, replyOf(do(r.Context(), agent.DrainOptions{Service: service, Backend: addr})))
		}))
	}
	srv := lim.server(mux, log)
	l = lim.listener(l)
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

// reply is the control API's answer, as JSON.
type reply struct {
	Applied []string         `json:"applied,omitempty"`
	Failed  []string         `json:"failed,omitempty"`
	Planned []string         `json:"planned,omitempty"`
	Status  *status.Snapshot `json:"status,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// replyOf is the reply that tells what a command did.
func replyOf(out agent.Outcome, err error) reply {
	var rep reply
	for _, op := range out.Applied {
		rep.Applied = append(rep.Applied, op.String())
	}
	for _, f := range out.Failed {
		rep.Failed = append(rep.Failed, f.Error())
	}
	if err != nil {
		rep.Error = err.Error()
	}
	return rep
}

// serverLimits bound one of vipd's HTTP servers: the control socket's or
// the metrics endpoint's.
type serverLimits struct {
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

// The servers' limits. The control socket's write timeout is the
// client's, as a reload of a large configuration may take a minute, and
// its idle timeout is short, as its client makes one request per
// connection; the metrics endpoint's write timeout allows a slow scrape
// of a large table, and its idle timeout keeps a scraper's connection
// from one scrape to the next. The metrics endpoint, open to whoever
// reaches metrics_listen, cannot be held by anyone's idle or slow
// connections (MaxConnsPerClient, and see connSlots), and a scrape
// waits a second for one of the four renderings rather than be refused
// by a burst of others.
var (
	controlLimits = serverLimits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 5 * time.Minute,
		IdleTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10, MaxConns: 32, MaxRequests: 4}
	metricsLimits = serverLimits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: time.Minute,
		IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10, MaxConns: 64, MaxConnsPerClient: 8, MaxRequests: 4, RequestWait: time.Second}
)

// slowHeaders is how long a metrics client may take to send its
// request's headers before another client that finds every connection
// slot taken may take its slot: a scraper sends them at once.
const slowHeaders = time.Second

// server returns an http.Server for h with l's timeouts, logging its
// errors (failed accepts) to log.
func (l serverLimits) server(h http.Handler, log *slog.Logger) *http.Server {
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

// listener limits ln to l's connections, which wait in the listen queue
// for a slot.
func (l serverLimits) listener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.MaxConns)
}

// limiter returns what wraps a handler so that it serves at most n
// requests at a time, handing the others to busy at once, or after
// waiting wait at most for a request to end.
func limiter(n int, wait time.Duration, busy http.HandlerFunc) func(http.HandlerFunc) http.Handler {
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

// controlClient talks to a running daemon's control socket. It makes one
// request per connection: an idle connection would hold one of the
// server's few until its idle timeout.
func controlClient(socket string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Minute,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", socket)
		}},
	}
}

// tableType is the content type of the status table the control socket
// renders (GET /v1/status?format=table).
const tableType = "text/plain; charset=utf-8"

// callControl sends one request and decodes the reply.
func callControl(socket, method, path string) (reply, error) {
	var rep reply
	a, err := callControlRaw(socket, method, path)
	if err != nil {
		return rep, err
	}
	return rep, a.decode(&rep)
}

// answer is a control socket's answer, read whole: in pieces of 256 KiB
// rather than in a buffer that doubles (the status of 10,000 services is
// 10 MiB as a table, 30 MiB as JSON), and before anything is printed, so
// that a reader that stops reading (vipd status | less) holds none of
// the daemon's few status requests.
type answer struct {
	status      string // the HTTP status line's text
	ok          bool   // 200 OK
	contentType string
	pieces      [][]byte
}

// callControlRaw sends one request and reads the answer.
func callControlRaw(socket, method, path string) (answer, error) {
	req, err := http.NewRequest(method, "http://vipd"+path, nil)
	if err != nil {
		return answer{}, err
	}
	resp, err := controlClient(socket).Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("is vipd running? %w", err)
	}
	defer resp.Body.Close()
	a := answer{status: resp.Status, ok: resp.StatusCode == http.StatusOK, contentType: resp.Header.Get("Content-Type")}
	for {
		p := make([]byte, 256<<10)
		n, err := io.ReadFull(resp.Body, p)
		if n > 0 {
			a.pieces = append(a.pieces, p[:n])
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return a, nil
		}
		if err != nil {
			return answer{}, fmt.Errorf("read reply: %w", err)
		}
	}
}

// decode decodes a JSON answer into rep.
func (a answer) decode(rep any) error {
	if err := json.Unmarshal(bytes.Join(a.pieces, nil), rep); err != nil {
		return fmt.Errorf("bad reply from vipd (%s): %w", a.status, err)
	}
	return nil
}

// size is the answer's length in bytes.
func (a answer) size() int {
	n := 0
	for _, p := range a.pieces {
		n += len(p)
	}
	return n
}

// writeTo writes the answer's bytes from skip on, but the last trim, to w.
func (a answer) writeTo(w io.Writer, skip, trim int) error {
	end := a.size() - trim
	at := 0
	for _, p := range a.pieces {
		lo, hi := max(skip-at, 0), min(end-at, len(p))
		at += len(p)
		if lo >= hi {
			continue
		}
		if _, err := w.Write(p[lo:hi]); err != nil {
			return err
		}
	}
	return nil
}

// statusJSON says whether a is a status reply as the daemon sends it,
// {"status":SNAPSHOT} and a newline, and how long its head and tail are.
func (a answer) statusJSON() (head, tail int, ok bool) {
	const open, end = `{"status":`, "}\n"
	n := a.size()
	if !a.ok || n < len(open)+len(end) {
		return 0, 0, false
	}
	// The head and the tail may straddle pieces.
	var first, last bytes.Buffer
	a.writeTo(&first, 0, n-len(open))
	a.writeTo(&last, n-len(end), 0)
	if first.String() != open || last.String() != end {
		return 0, 0, false
	}
	return len(open), len(end), true
}

func newReloadCmd() *cobra.Command {
	var (
		socket string
		force  bool
	)
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Ask the running daemon to reload its configuration file",
		Long: `Reload asks the running vipd to re-read its configuration file and
prints the operations it applied. A file with errors, or one that would
delete more than reload_guard of the services or backends, is refused and
the running configuration keeps serving; --force applies the latter anyway.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/v1/reload"
			if force {
				path += "?force=1"
			}
			rep, err := callControl(socket, http.MethodPost, path)
			if err != nil {
				return err
			}
			if err := printReply(cmd, rep); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reloaded: %d operations applied\n", len(rep.Applied))
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().BoolVar(&force, "force", false, "apply even if the reload guard refuses")
	return cmd
}

func socketFlag(cmd *cobra.Command, socket *string) {
	cmd.Flags().StringVar(socket, "socket", config.DefaultControlSocket, "control socket of the running vipd")
}

// printReply prints what a reply applied and failed, and its error.
func printReply(cmd *cobra.Command, rep reply) error {
	out := cmd.OutOrStdout()
	for _, a := range rep.Applied {
		fmt.Fprintln(out, "applied:", a)
	}
	for _, f := range rep.Failed {
		fmt.Fprintln(out, "failed:", f)
	}
	if rep.Error != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), rep.Error)
		return exitError(1)
	}
	return nil
}

func newStatusCmd() *cobra.Command {
	var socket, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every service and backend as the running daemon sees them",
		Long: `Status shows every service and backend: configured and current weight and
why they differ (health, admin drain, draining after removal, drift), health
and since when, connections and rates: ipvsadm -Ln --stats joined with what
vipd knows, as of the time printed. vipd reads the kernel for it at most
once per stats_interval (and again after a change it made), however many
ask; the metrics show the same. -o json prints the same for scripts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
			path := "/v1/status"
			switch output {
			case "json":
			case "table", "":
				// The daemon renders the table; an older one answers
				// JSON, rendered here.
				path += "?format=table"
			default:
				return fmt.Errorf("-o %q: want table or json", output)
			}
			a, err := callControlRaw(socket, http.MethodGet, path)
			if err != nil {
				return err
			}
			switch head, tail, ok := a.statusJSON(); {
			case output != "json" && a.ok && a.contentType == tableType:
				a.writeTo(out, 0, 0)
			case output == "json" && ok:
				// The daemon's snapshot, indented as it comes:
				// decoding it and encoding it again took seconds at
				// 10,000 services.
				x := &indenter{w: out}
				a.writeTo(x, head, tail)
				if err := x.Close(); err != nil {
					return fmt.Errorf("status: bad reply from vipd: %w", err)
				}
			default:
				var rep reply
				if err := a.decode(&rep); err != nil {
					return err
				}
				if rep.Error != "" || rep.Status == nil {
					return printReply(cmd, reply{Error: "status: " + rep.Error})
				}
				render := status.RenderTable
				if output == "json" {
					render = status.RenderJSON
				}
				if err := render(out, rep.Status); err != nil {
					return err
				}
			}
			if err := out.Flush(); err != nil {
				return fmt.Errorf("status: %w", err)
			}
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newDrainCmd(kind string) *cobra.Command {
	var (
		socket string
		node   bool
	)
	short := "Take a backend out of rotation (weight 0) until undrained; survives reloads and restarts"
	nodeHelp := "drain the node: hand its VIPs to its [ha] peer at once and stay out of the election, or withdraw its [bgp] routes, until vipd undrain --node"
	if kind == "undrain" {
		short = "Put an admin-drained backend back into rotation"
		nodeHelp = "undrain the node: take part in the [ha] election again, or announce its [bgp] routes again"
	}
	cmd := &cobra.Command{
		Use:   kind + " SERVICE BACKEND | " + kind + " --node",
		Short: short,
		Long: short + `.
SERVICE is a service name, or "*" for every service that has BACKEND;
BACKEND is address:port as the backend is configured. With --node, the
node itself: a node with an [ha] section hands its VIPs to its peer (it
advertises priority 0) and stays a backup, across restarts, until vipd
undrain --node.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if node {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if node {
				rep, err := callControl(socket, http.MethodPost, "/v1/"+kind+"?node=1")
				if err != nil {
					return err
				}
				if err := printReply(cmd, rep); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%sed the node\n", kind)
				return nil
			}
			q := url.Values{"service": {args[0]}, "backend": {args[1]}}
			rep, err := callControl(socket, http.MethodPost, "/v1/"+kind+"?"+q.Encode())
			if err != nil {
				return err
			}
			if err := printReply(cmd, rep); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%sed %s %s\n", kind, args[0], args[1])
			return nil
		},
	}
	socketFlag(cmd, &socket)
	cmd.Flags().BoolVar(&node, "node", false, nodeHelp)
	return cmd
}
