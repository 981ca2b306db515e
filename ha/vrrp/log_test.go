package vrrp

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// newTestLogger logs to t, so that a failing test shows the routers'
// records.
func newTestLogger(t *testing.T, name string) *slog.Logger {
	return slog.New(&tHandler{t: t}).With("node", name)
}

type tHandler struct {
	t     *testing.T
	attrs []slog.Attr
}

func (h *tHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *tHandler) Handle(_ context.Context, r slog.Record) error {
	s := r.Time.Format("15:04:05.000") + " " + r.Level.String() + " " + r.Message
	for _, a := range h.attrs {
		s += " " + a.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		s += " " + a.String()
		return true
	})
	h.t.Log(s)
	return nil
}

func (h *tHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &tHandler{t: h.t, attrs: append(append([]slog.Attr{}, h.attrs...), as...)}
}

func (h *tHandler) WithGroup(string) slog.Handler { return h }

// captured is a logger's records, kept for a test to read.
type captured struct {
	mu   sync.Mutex
	recs []capturedRecord
}

type capturedRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logger returns a logger that keeps its records in c and logs them to
// t too.
func (c *captured) logger(t *testing.T) *slog.Logger {
	return slog.New(&capHandler{c: c, t: &tHandler{t: t}})
}

// count is the number of records with msg.
func (c *captured) count(msg string) int {
	return len(c.find(msg))
}

// find returns the records with msg.
func (c *captured) find(msg string) []capturedRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []capturedRecord
	for _, r := range c.recs {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

type capHandler struct {
	c     *captured
	t     slog.Handler
	attrs []slog.Attr
}

func (h *capHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *capHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := capturedRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.c.mu.Lock()
	h.c.recs = append(h.c.recs, rec)
	h.c.mu.Unlock()
	return h.t.Handle(ctx, r)
}

func (h *capHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &capHandler{c: h.c, t: h.t.WithAttrs(as), attrs: append(append([]slog.Attr{}, h.attrs...), as...)}
}

func (h *capHandler) WithGroup(string) slog.Handler { return h }
