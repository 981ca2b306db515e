// Package frame writes and reads the messages vipd exchanges with the
// programs it runs (vipd-kubernetes, vipd-bgp) over a socket: each a
// 4-byte big-endian length, then that many bytes of JSON. A reader
// refuses a frame over its bound before it reads it, and JSON with
// fields its message type does not have.
package frame

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrTooBig is the error of a frame longer than the bound.
var ErrTooBig = errors.New("frame too big")

// Write sends v's JSON as one frame of at most max bytes.
func Write(w io.Writer, v any, max int) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if len(data) > max {
		return fmt.Errorf("a message of %d bytes: %w (the bound is %d)", len(data), ErrTooBig, max)
	}
	buf := make([]byte, 4, 4+len(data))
	binary.BigEndian.PutUint32(buf, uint32(len(data)))
	if _, err := w.Write(append(buf, data...)); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// Read reads the next frame, of at most max bytes, into v. io.EOF says
// the peer closed between frames.
func Read(r io.Reader, v any, max int) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return fmt.Errorf("a frame of %d bytes: %w (the bound is %d)", n, ErrTooBig, max)
	}
	// The buffer grows with what arrives, not with what the header
	// says.
	var data bytes.Buffer
	if _, err := io.CopyN(&data, r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read a frame of %d bytes: %w", n, err)
	}
	d := json.NewDecoder(&data)
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("decode a frame: %w", err)
	}
	if d.More() {
		return errors.New("decode a frame: data after the message")
	}
	return nil
}
