package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client talks to a running daemon's control socket. It makes one
// request per connection: an idle connection would hold one of the
// server's few until its idle timeout.
func Client(socket string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Minute,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", socket)
		}},
	}
}

// TableType is the content type of the status table the control socket
// renders (GET /v1/status?format=table).
const TableType = "text/plain; charset=utf-8"

// Call sends one request and decodes the reply.
func Call(socket, method, path string) (Reply, error) {
	var rep Reply
	a, err := CallRaw(socket, method, path)
	if err != nil {
		return rep, err
	}
	return rep, a.Decode(&rep)
}

// Answer is a control socket's answer, read whole: in pieces of 256 KiB
// rather than in a buffer that doubles (the status of 10,000 services is
// 10 MiB as a table, 30 MiB as JSON), and before anything is printed, so
// that a reader that stops reading (vipd status | less) holds none of
// the daemon's few status requests.
type Answer struct {
	// OK says the status was 200 OK.
	OK bool
	// ContentType is the answer's Content-Type.
	ContentType string

	status string // the HTTP status line's text
	pieces [][]byte
}

// CallRaw sends one request and reads the answer.
func CallRaw(socket, method, path string) (Answer, error) {
	req, err := http.NewRequest(method, "http://vipd"+path, nil)
	if err != nil {
		return Answer{}, err
	}
	resp, err := Client(socket).Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("is vipd running? %w", err)
	}
	defer resp.Body.Close()
	a := Answer{status: resp.Status, OK: resp.StatusCode == http.StatusOK, ContentType: resp.Header.Get("Content-Type")}
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
			return Answer{}, fmt.Errorf("read reply: %w", err)
		}
	}
}

// Decode decodes a JSON answer into rep.
func (a Answer) Decode(rep any) error {
	if err := json.Unmarshal(bytes.Join(a.pieces, nil), rep); err != nil {
		return fmt.Errorf("bad reply from vipd (%s): %w", a.status, err)
	}
	return nil
}

// size is the answer's length in bytes.
func (a Answer) size() int {
	n := 0
	for _, p := range a.pieces {
		n += len(p)
	}
	return n
}

// Copy writes the answer's bytes from skip on, but the last trim, to w.
func (a Answer) Copy(w io.Writer, skip, trim int) error {
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

// StatusJSON says whether a is a status reply as the daemon sends it,
// {"status":SNAPSHOT} and a newline, and how long its head and tail are.
func (a Answer) StatusJSON() (head, tail int, ok bool) {
	const open, end = `{"status":`, "}\n"
	n := a.size()
	if !a.OK || n < len(open)+len(end) {
		return 0, 0, false
	}
	// The head and the tail may straddle pieces.
	var first, last bytes.Buffer
	a.Copy(&first, 0, n-len(open))
	a.Copy(&last, n-len(end), 0)
	if first.String() != open || last.String() != end {
		return 0, 0, false
	}
	return len(open), len(end), true
}
