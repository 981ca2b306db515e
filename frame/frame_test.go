package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

type msg struct {
	Op string `json:"op"`
	N  int    `json:"n,omitempty"`
}

// TestRoundTrip writes two messages and reads them back, then io.EOF.
func TestRoundTrip(t *testing.T) {
	var b bytes.Buffer
	for _, m := range []msg{{Op: "a", N: 1}, {Op: "b"}} {
		if err := Write(&b, m, 100); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []msg{{Op: "a", N: 1}, {Op: "b"}} {
		var got msg
		if err := Read(&b, &got, 100); err != nil || got != want {
			t.Fatalf("read %+v, %v; want %+v", got, err, want)
		}
	}
	if err := Read(&b, &msg{}, 100); !errors.Is(err, io.EOF) {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
	if err := Write(io.Discard, msg{Op: strings.Repeat("x", 200)}, 100); !errors.Is(err, ErrTooBig) {
		t.Errorf("writing a message over the bound: %v", err)
	}
}

// headerOnly is a reader that fails the test if more than a header is
// read from it.
type headerOnly struct {
	t   *testing.T
	hdr []byte
}

func (h *headerOnly) Read(p []byte) (int, error) {
	if len(h.hdr) == 0 {
		h.t.Fatal("read past the header of a frame over the bound")
	}
	n := copy(p, h.hdr)
	h.hdr = h.hdr[n:]
	return n, nil
}

// TestRefuses: a frame over the bound before its body is read; bad
// JSON, unknown fields, trailing data and a frame cut short.
func TestRefuses(t *testing.T) {
	if err := Read(&headerOnly{t, binary.BigEndian.AppendUint32(nil, 1<<31)}, &msg{}, 100); !errors.Is(err, ErrTooBig) {
		t.Errorf("a frame of 2 GiB: %v", err)
	}
	frame := func(data string) *bytes.Reader {
		return bytes.NewReader(append(binary.BigEndian.AppendUint32(nil, uint32(len(data))), data...))
	}
	for _, tt := range []struct {
		name string
		r    io.Reader
		want string
	}{
		{"garbage", frame("{nonsense"), "decode a frame"},
		{"unknown field", frame(`{"op":"a","extra":1}`), `unknown field "extra"`},
		{"trailing data", frame(`{"op":"a"} {"op":"b"}`), "data after the message"},
		{"cut short", io.LimitReader(frame(`{"op":"a"}`), 8), "unexpected EOF"},
		{"header cut short", bytes.NewReader([]byte{0, 0}), "unexpected EOF"},
	} {
		if err := Read(tt.r, &msg{}, 100); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}
