// Package statuspage is the daemon's status page: an HTML view of the
// status snapshot (the one "vipd status" and the metrics show), served on
// the metrics listener at GET / when [daemon] status_page is on.
//
// Design, and why:
//
//   - The page reads the snapshot cache (Options.Status is the agent's
//     Status), never the kernel: however many pages are open, the daemon
//     reads IPVS at most once per stats_interval, as for a scrape.
//   - It is rendered on the server with html/template, which escapes
//     everything it prints: service names, errors and annotations come
//     from tenants (Kubernetes Services). The page works without
//     JavaScript: the whole table, filtered by ?q= (a substring of a
//     service's name, address, source, state or a backend's address) and
//     paginated by ?page= (PageSize services a page), so that 10,000
//     services stay usable and a page costs the same whatever the total.
//   - CSS and a small script are embedded in the binary and served from
//     /static/ (no external assets). The Content-Security-Policy admits
//     only them: no inline script or style, so an escaping mistake could
//     still not run a script.
//   - Live: the script polls /status.json?v=VERSION (with the page's q
//     and page) at most once a second, and only while the tab is
//     visible. VERSION is the snapshot's time: while the cache serves the
//     same snapshot the answer is 204 and costs a map-free comparison;
//     otherwise it is the server-rendered HTML of the page's main part in
//     JSON, which the script swaps in. The same template renders both, so
//     there is one renderer and nothing is built from data in the
//     browser.
//   - A page opened while the cache holds a snapshot younger than
//     MaxStale paints it at once (its age is shown), rather than wait
//     for a take, which at 10,000 services reads 100,000 backends; the
//     script's first poll, at once, brings the fresh one. Without
//     script the page is at most MaxStale old, and each load has the
//     cache take a fresh one for the next (without waiting for it).
//   - Sparklines are inline SVG built on the server from History: a
//     ring of Buckets buckets of Step (ten minutes) per service and
//     backend, fed with every snapshot the daemon takes (see
//     History for the memory it takes).
//   - Read-only: GET and HEAD only (the mux answers 405 to the rest), no
//     mutation endpoint, and the listener stays metrics_listen's
//     (127.0.0.1 by default).
package statuspage

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/monitor/status"
)

// PageSize is the number of services on a page.
const PageSize = 50

// maxQuery bounds the filter's length, in bytes.
const maxQuery = 256

//go:embed assets
var assets embed.FS

var (
	tmpl = template.Must(template.New("page.html").Funcs(funcs).ParseFS(assets, "assets/page.html"))
	css  = mustRead("assets/page.css")
	js   = mustRead("assets/page.js")
	// assetTag is a hash of the assets, in their URLs: a new binary's
	// assets are fetched again, and the browser may keep them a day.
	assetTag = func() string {
		h := sha256.Sum256(append(append([]byte{}, css...), js...))
		return hex.EncodeToString(h[:6])
	}()
)

func mustRead(name string) []byte {
	b, err := assets.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return b
}

// Options configure a Server.
type Options struct {
	// Status returns the daemon's status snapshot from its cache.
	Status func(context.Context) (*status.Snapshot, error)
	// Last returns the last snapshot taken without taking one; nil
	// means none. The page itself (not its data) shows it when it is
	// younger than MaxStale, so that it paints at once while the
	// script fetches a fresh one; nil always waits for Status.
	Last func() *status.Snapshot
	// History is the recent past the sparklines show; nil shows none.
	History *History
	// Version is vipd's version, shown in the footer.
	Version string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server serves the status page.
type Server struct {
	opts Options

	// idx is the lowercased text the filter searches, of one snapshot.
	mu  sync.Mutex
	idx *index
}

// New returns a Server.
func New(opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Server{opts: opts}
}

// Routes returns the server's handlers by ServeMux pattern: the page, its
// data and its assets, all GET (and so HEAD).
func (s *Server) Routes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET /{$}":           http.HandlerFunc(s.page),
		"GET /status.json":   http.HandlerFunc(s.data),
		"GET /static/{file}": http.HandlerFunc(s.static),
	}
}

// Handler returns the routes in a mux of their own (tests).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for p, h := range s.Routes() {
		mux.Handle(p, h)
	}
	return mux
}

// csp admits the page's own assets alone.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

func headers(w http.ResponseWriter, ctype string) {
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

func (s *Server) static(w http.ResponseWriter, r *http.Request) {
	var body []byte
	switch r.PathValue("file") {
	case "page.css":
		body = css
		headers(w, "text/css; charset=utf-8")
	case "page.js":
		body = js
		headers(w, "text/javascript; charset=utf-8")
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "public, max-age=86400")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
}

// query is what a request asks for: a filter and a page (from 1).
type query struct {
	Q    string
	Page int
}

func parseQuery(v url.Values) query {
	q := query{Q: strings.TrimSpace(v.Get("q")), Page: 1}
	if len(q.Q) > maxQuery {
		q.Q = q.Q[:maxQuery]
	}
	if p, err := strconv.Atoi(v.Get("page")); err == nil && p > 1 {
		q.Page = p
	}
	return q
}

// version names a snapshot for /status.json?v=.
func version(snap *status.Snapshot) string {
	return strconv.FormatInt(snap.Time.UnixNano(), 36)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) *status.Snapshot {
	snap, err := s.opts.Status(r.Context())
	if err != nil || snap == nil {
		if r.Context().Err() == nil {
			msg := "no status yet"
			if err != nil {
				msg = err.Error()
			}
			headers(w, "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("status unavailable: " + msg + "\n"))
		}
		return nil
	}
	return snap
}

// MaxStale is the oldest snapshot the page paints at once (see
// Options.Last).
const MaxStale = 30 * time.Second

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	var snap *status.Snapshot
	if s.opts.Last != nil {
		if last := s.opts.Last(); last != nil && s.opts.Now().Sub(last.Time) < MaxStale {
			snap = last
			// Have the cache take a fresh snapshot if this one is
			// older than stats_interval, without waiting for it: a
			// request that gives up leaves its take to serve the
			// next (see status.Cache.Get).
			ctx, cancel := context.WithTimeout(r.Context(), time.Millisecond)
			s.opts.Status(ctx)
			cancel()
		}
	}
	if snap == nil {
		if snap = s.snapshot(w, r); snap == nil {
			return
		}
	}
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "page", s.view(snap, parseQuery(r.URL.Query()))); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	headers(w, "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	reply(w, r, buf.Bytes())
}

// reply writes body, gzipped (at the fastest level) when the client
// takes it and the body is large enough to gain: a page of 50 services
// of 10 backends shrinks about tenfold.
func reply(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Add("Vary", "Accept-Encoding")
	if len(body) < 1024 || !acceptsGzip(r) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
		return
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	zw.Write(body)
	zw.Close()
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.Write(buf.Bytes())
}

func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, e := range strings.Split(v, ",") {
			if e, _, _ := strings.Cut(strings.TrimSpace(e), ";"); e == "gzip" {
				return true
			}
		}
	}
	return false
}

// dataReply is /status.json's answer.
type dataReply struct {
	// Version is the snapshot's, for the next request's v.
	Version string `json:"version"`
	// Time is the snapshot's time.
	Time time.Time `json:"time"`
	// Main is the HTML of the page's main part.
	Main string `json:"main"`
	// Title is the document's title.
	Title string `json:"title"`
}

func (s *Server) data(w http.ResponseWriter, r *http.Request) {
	snap := s.snapshot(w, r)
	if snap == nil {
		return
	}
	headers(w, "application/json")
	w.Header().Set("Cache-Control", "no-store")
	v := version(snap)
	if r.URL.Query().Get("v") == v {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	view := s.view(snap, parseQuery(r.URL.Query()))
	var buf bytes.Buffer
	if err := tmpl.ExecuteTemplate(&buf, "main", view); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// The HTML is escaped already; JSON's escaping of <, > and & would
	// only make it longer.
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(dataReply{Version: v, Time: snap.Time, Main: buf.String(), Title: view.Title}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	reply(w, r, out.Bytes())
}
