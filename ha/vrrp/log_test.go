package vrrp

import (
	"context"
	"log/slog"
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
