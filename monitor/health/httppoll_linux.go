package health

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A plain http check that follows no redirects runs on the poller, as a
// minimal HTTP/1.1 client: it connects, writes the request net/http would
// (built once, by net/http), reads the response into a buffer and judges
// it as Probe does: the status line and headers (informational responses
// skipped), then, only if the check matches the body, the body, which
// net/http's own parser decodes from the buffer. Then it closes the
// connection with a reset without reading more. https checks, and checks
// that follow redirects, run through net/http (Probe) on a worker.
//
// With keep-alive the request asks for it, and a probe whose response
// passes reads the whole response (framed by Content-Length or chunked,
// 1 MiB at most) and, unless the response says Connection: close or
// more bytes follow it, keeps the connection for the next probe (see
// keptConn), which writes its request there and reads one response.

// Limits of a response read on the poller: its headers, those of the
// informational responses before it included (net/http's
// MaxResponseHeaderBytes, as Probe sets it), and all of it, chunk framing
// included, before the first maxBody bytes of the body are in.
const (
	maxHeader      = 64 << 10
	maxResponse    = 1 << 20
	readBufferSize = 4 << 10
)

// The states of an http probe on the poller (pollOp.state).
const (
	httpConnecting = iota
	httpWriting
	httpReading
	// httpDraining reads the rest of a response that passed, to keep
	// its connection.
	httpDraining
)

// readBuffers holds response buffers between probes.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, 0, readBufferSize); return &b }}

// pollRequest returns the request bytes net/http writes for c, or nil if
// c cannot run on the poller.
func (c *HTTPCheck) pollRequest() []byte {
	if c.tls || c.opts.FollowRedirects {
		return nil
	}
	req, err := c.newRequest(context.Background())
	if err != nil {
		return nil
	}
	var b bytes.Buffer
	if err := req.Write(&b); err != nil {
		return nil
	}
	if c.opts.KeepAlive {
		// Connection: keep-alive is one of the request's headers.
		return b.Bytes()
	}
	// The transport's DisableKeepAlives, which it adds after the
	// request's headers.
	head, ok := bytes.CutSuffix(b.Bytes(), []byte("\r\n\r\n"))
	if !ok {
		return nil
	}
	return append(head, "\r\nConnection: close\r\n\r\n"...)
}

// keptConn is an http check's connection kept between probes on the
// poller (HTTPOptions.KeepAlive): a probe takes it, and gives it back
// through the poller (pollKeeper) when its response passed and ended
// cleanly; closeIdle closes it. Its socket is watched by no poller while
// kept, and only one probe of a check runs at a time.
type keptConn struct {
	mu sync.Mutex
	fd int // -1: none
	// retry is the probe running on a kept connection: what retried
	// needs to start it again on a new one. retryDone is the check's
	// retried, made once.
	retry struct {
		p        *poller
		deadline time.Time
		done     func(error)
	}
	retryDone func(error)
}

// init readies k, the kept connection of c: none yet.
func (k *keptConn) init(c *HTTPCheck) {
	k.fd = -1
	k.retryDone = c.retried
}

// takeKept returns the kept connection, now the caller's, or -1.
func (c *HTTPCheck) takeKept() int {
	c.keptConn.mu.Lock()
	fd := c.keptConn.fd
	c.keptConn.fd = -1
	c.keptConn.mu.Unlock()
	return fd
}

// kept keeps fd, a connection whose probe passed, for the next probe.
func (c *HTTPCheck) kept(fd int) {
	c.keptConn.mu.Lock()
	old := c.keptConn.fd
	c.keptConn.fd = fd
	c.keptConn.mu.Unlock()
	if old >= 0 {
		rawClose(old) // not reached: a probe takes the kept one
	}
}

// closeKept closes the kept connection, if any.
func (c *HTTPCheck) closeKept() {
	if fd := c.takeKept(); fd >= 0 {
		rawClose(fd)
	}
}

var _ pollKeeper = (*HTTPCheck)(nil)

// errStale ends a probe on a kept connection that turned out dead:
// retried starts it again on a new connection.
var errStale = errors.New("kept connection closed")

// retried is the done function of a probe on a kept connection: it ends
// the probe with err, or starts it again on a new connection if the kept
// one was dead.
func (c *HTTPCheck) retried(err error) {
	r := c.keptConn.retry
	c.keptConn.retry.p, c.keptConn.retry.done = nil, nil
	if err == errStale {
		c.startNew(r.p, r.deadline, r.done)
		return
	}
	r.done(err)
}

// start begins a probe on p, if c can run there, and reports whether it
// did: on the kept connection, if it has one that is still open, or
// else on a new one.
func (c *HTTPCheck) start(p *poller, deadline time.Time, done func(error)) bool {
	if c.request == nil {
		return false
	}
	if c.opts.KeepAlive {
		if fd := c.takeKept(); fd >= 0 && c.reuse(p, fd, deadline, done) {
			return true
		}
	}
	c.startNew(p, deadline, done)
	return true
}

// reuse begins a probe on fd, the kept connection, and reports whether
// it did. It closes fd and reports false if the connection is found
// dead before the request is written: the server closed it, or wrote
// what no request asked for, or the write failed.
func (c *HTTPCheck) reuse(p *poller, fd int, deadline time.Time, done func(error)) bool {
	var b [1]byte
	if _, err := rawPeek(fd, b[:]); err != unix.EAGAIN {
		rawClose(fd)
		return false
	}
	op := &pollOp{fd: fd, deadline: p.at(deadline), handler: c, done: c.keptConn.retryDone, state: httpWriting, reused: true}
	if end, _ := c.write(op); end {
		rawClose(fd)
		return false
	}
	c.keptConn.retry.p, c.keptConn.retry.deadline, c.keptConn.retry.done = p, deadline, done
	events := uint32(unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET)
	if op.state != httpReading {
		events |= unix.EPOLLOUT
	}
	if err := p.add(op, events); err != nil {
		c.keptConn.retry.p, c.keptConn.retry.done = nil, nil
		rawClose(fd)
		done(c.urlError(err))
	}
	return true
}

// startNew begins a probe on a new connection. As a tcp check's start
// does, it asks at once whether the connect has finished, if the last
// probe found it had; then it writes the request at once too, and the
// poller waits for the response alone.
func (c *HTTPCheck) startNew(p *poller, deadline time.Time, done func(error)) {
	if c.sa.len == 0 {
		c.sa = rawAddrOf(c.target)
	}
	fd, err := dialConnect(c.dial, c.target, &c.sa)
	if err != nil {
		done(c.urlError(dialErr(c.dial, c.target, err)))
		return
	}
	op := &pollOp{fd: fd, deadline: p.at(deadline), handler: c, done: done}
	if c.skip == 0 {
		switch err := rawConnect(fd, &c.sa); err {
		case unix.EALREADY, unix.EINPROGRESS, unix.EINTR:
			c.skip = sameCallRetry - 1
		case nil, unix.EISCONN:
			op.state = httpWriting
			if end, err := c.write(op); end {
				rawClose(fd)
				done(err)
				return
			}
		default:
			rawClose(fd)
			done(c.urlError(dialErr(c.dial, c.target, os.NewSyscallError("connect", err))))
			return
		}
	} else {
		c.skip--
	}
	events := uint32(unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET)
	if op.state != httpReading {
		events |= unix.EPOLLOUT
	}
	if err := p.add(op, events); err != nil {
		unix.Close(fd)
		done(c.urlError(err))
	}
}

var _ pollProber = (*HTTPCheck)(nil)

// urlError wraps err as net/http's client does.
func (c *HTTPCheck) urlError(err error) error {
	m := c.opts.Method
	return &url.Error{Op: m[:1] + strings.ToLower(m[1:]), URL: c.url, Err: err}
}

// event carries the probe on: the connect's end, the request's writing,
// the response's reading.
func (c *HTTPCheck) event(op *pollOp, events uint32) (bool, error) {
	if op.state == httpConnecting {
		if err := connected(op.fd, events); err != nil {
			return true, c.urlError(dialErr(c.dial, c.target, err))
		}
		if events&unix.EPOLLOUT == 0 {
			return false, nil
		}
		op.state = httpWriting
	}
	if op.state == httpWriting {
		if end, err := c.write(op); end || op.state == httpWriting {
			return end, err
		}
	}
	return c.read(op)
}

// write writes what is left of the request, and moves op on to reading
// once it is all written.
func (c *HTTPCheck) write(op *pollOp) (bool, error) {
	// op.buf is what is written until the reading starts.
	written := len(op.buf)
	for written < len(c.request) {
		n, err := rawSend(op.fd, c.request[written:])
		if err == unix.EAGAIN {
			op.buf = c.request[:written]
			return false, nil
		}
		if err != nil {
			if op.reused {
				return true, errStale
			}
			return true, c.urlError(os.NewSyscallError("write", err))
		}
		written += n
	}
	op.buf = nil
	op.state = httpReading
	return false, nil
}

// read reads what the socket holds and judges the response as soon as
// it can; with keep-alive, a response that passed is read to its end.
func (c *HTTPCheck) read(op *pollOp) (bool, error) {
	if op.buf == nil {
		op.buf = (*readBuffers.Get().(*[]byte))[:0]
	}
	var rerr error
	for {
		if len(op.buf) == cap(op.buf) {
			if len(op.buf) >= maxResponse {
				break
			}
			op.buf = append(op.buf, make([]byte, len(op.buf))...)[:len(op.buf)]
		}
		n, err := rawRead(op.fd, op.buf[len(op.buf):cap(op.buf)])
		if err == unix.EAGAIN {
			return false, nil
		}
		if err != nil {
			rerr = os.NewSyscallError("read", err)
			break
		}
		if n == 0 {
			break
		}
		op.buf = op.buf[:len(op.buf)+n]
		if len(op.buf) >= maxResponse {
			break
		}
		if op.state == httpDraining {
			if c.drained(op) {
				return true, nil
			}
			continue
		}
		if end, err := c.judge(op.buf, false); end {
			if err != nil && op.reused && is408(op.buf) {
				// The server closed the kept connection idle, saying
				// so as the request crossed it: retried tries a new
				// one.
				c.release(op)
				return true, errStale
			}
			if err == nil && c.opts.KeepAlive {
				op.state = httpDraining
				if !c.drained(op) {
					continue
				}
				return true, nil
			}
			c.release(op)
			return true, err
		}
	}
	if op.state == httpDraining {
		// The response passed; its connection ended (or the response
		// outgrew maxResponse) before it did, and is not kept.
		c.release(op)
		return true, nil
	}
	if op.reused && len(op.buf) == 0 {
		// The kept connection was closed or reset before any of the
		// response came: the server dropped it, as servers drop idle
		// connections; retried tries a new one.
		c.release(op)
		return true, errStale
	}
	// The response has ended (or outgrown maxResponse).
	_, err := c.judge(op.buf, true)
	if err == errIncomplete {
		switch {
		case rerr != nil:
			err = c.urlError(rerr)
		case len(op.buf) >= maxResponse:
			err = fmt.Errorf("response exceeds %d bytes before the first %d of its body", maxResponse, maxBody)
		case len(op.buf) == 0:
			err = c.urlError(io.EOF)
		default:
			err = c.urlError(io.ErrUnexpectedEOF)
		}
	}
	c.release(op)
	return true, err
}

// drained reports whether op, a probe with keep-alive whose response
// passed, has ended: its response is all in, or can never be. It marks
// op to keep its connection if the connection can carry the next
// request, and releases op's buffer, when it reports true.
func (c *HTTPCheck) drained(op *pollOp) bool {
	n := c.framed(op.buf)
	if n == 0 {
		return false
	}
	// A connection with more bytes than the response is in an unknown
	// state.
	op.keep = n == len(op.buf)
	c.release(op)
	return true
}

// release gives op's buffer back, unless it grew.
func (c *HTTPCheck) release(op *pollOp) {
	if (op.state == httpReading || op.state == httpDraining) && cap(op.buf) == readBufferSize {
		b := op.buf[:0]
		readBuffers.Put(&b)
	}
	op.buf = nil
}

// timeout returns the error of a probe whose deadline passed: the dial's
// before the connection, the request context's after.
func (c *HTTPCheck) timeout(op *pollOp) error {
	c.release(op)
	if op.state == httpConnecting {
		return c.urlError(dialErr(c.dial, c.target, os.ErrDeadlineExceeded))
	}
	return c.urlError(context.DeadlineExceeded)
}

// errIncomplete says that a response needs more bytes than were read.
var errIncomplete = errors.New("incomplete response")

// judge judges the response in b, of which eof says whether more can come,
// as Probe does, and reports whether it could. An error it returns that
// is errIncomplete means that b ended before the response could be
// judged.
func (c *HTTPCheck) judge(b []byte, eof bool) (bool, error) {
	tooLarge := func() error {
		return c.urlError(fmt.Errorf("net/http: server response headers exceeded %d bytes; aborted", maxHeader))
	}
	for head := 0; ; {
		end := headerEnd(b[head:])
		if end < 0 {
			if len(b) > maxHeader {
				return true, tooLarge()
			}
			return eof, errIncomplete
		}
		if head+end > maxHeader {
			return true, tooLarge()
		}
		code, err := parseHead(b[head : head+end])
		if err != nil {
			return true, c.urlError(err)
		}
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			head += end
			continue
		}
		b = b[head:]
		if !statusOK(c.opts.Status, code) {
			return true, fmt.Errorf("status %d not in %s", code, c.ranges)
		}
		if c.opts.Body == "" && c.bodyRe == nil {
			return true, nil
		}
		if n, ok := contentLength(b[:end]); ok && code != http.StatusNoContent && code != http.StatusNotModified && c.opts.Method != http.MethodHead {
			// The common case, a body of a plain Content-Length,
			// without net/http's parser.
			n = min(n, maxBody)
			if len(b)-end < n {
				if eof {
					return true, fmt.Errorf("read body: %w", io.ErrUnexpectedEOF)
				}
				return false, nil
			}
			return true, c.matchBody(b[end : end+n])
		}
		return c.judgeBody(b, eof)
	}
}

// judgeBody judges the body of the final response, which b holds from
// its status line, once it holds maxBody bytes of the body or all of it.
func (c *HTTPCheck) judgeBody(b []byte, eof bool) (bool, error) {
	resp, err := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader(b), 4096), &http.Request{Method: c.opts.Method})
	if err != nil {
		return true, c.urlError(err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	untilClose := resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && resp.Body != http.NoBody
	switch {
	case len(body) >= maxBody:
	case err == io.ErrUnexpectedEOF && !eof:
		return false, nil
	case err != nil:
		return true, fmt.Errorf("read body: %w", err)
	case untilClose && !eof:
		return false, nil
	}
	return true, c.matchBody(body)
}

// matchBody judges body, the first maxBody bytes of a response's body
// at most.
func (c *HTTPCheck) matchBody(body []byte) error {
	if c.opts.Body != "" && !bytes.Contains(body, []byte(c.opts.Body)) {
		return fmt.Errorf("body does not contain %q", c.opts.Body)
	}
	if c.bodyRe != nil && !c.bodyRe.Match(body) {
		return fmt.Errorf("body does not match %q", c.opts.BodyRegexp)
	}
	return nil
}

// contentLength returns the Content-Length of head, a response's status
// line and headers, and true when it has exactly one, a plain decimal
// number, and no Transfer-Encoding: a body framed by its length alone.
func contentLength(head []byte) (int, bool) {
	n, found := 0, false
	_, rest, _ := bytes.Cut(head, []byte("\n"))
	for name, value := range headerFields(rest) {
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, false
		case bytes.EqualFold(name, []byte("Content-Length")):
			v := bytes.TrimSpace(value)
			if found || len(v) == 0 || len(v) > 18 {
				return 0, false
			}
			for _, d := range v {
				if d < '0' || d > '9' {
					return 0, false
				}
				n = n*10 + int(d-'0')
			}
			found = true
		}
	}
	return n, found
}

// headerFields yields the name and value of each header line of
// headers (a response's head after its status line), as they are: a
// line without a colon is skipped.
func headerFields(headers []byte) iter.Seq2[[]byte, []byte] {
	return func(yield func(name, value []byte) bool) {
		for rest := headers; len(rest) > 0; {
			var h []byte
			h, rest, _ = bytes.Cut(rest, []byte("\n"))
			name, value, ok := bytes.Cut(bytes.TrimSuffix(h, []byte("\r")), []byte(":"))
			if ok && !yield(name, value) {
				return
			}
		}
	}
}

// headerEnd returns the length of the status line and headers at the
// start of b, up to the empty line that ends them, or -1 if b does not
// hold them all.
func headerEnd(b []byte) int {
	i := 0
	for first := true; ; first = false {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		line := b[i : i+j]
		i += j + 1
		if !first && (len(line) == 0 || len(line) == 1 && line[0] == '\r') {
			return i
		}
	}
}

// parseHead parses a response's status line and headers, as net/http's
// ReadResponse checks them, and returns its status code.
func parseHead(b []byte) (int, error) {
	line, rest, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	proto, status, ok := strings.Cut(string(line), " ")
	if !ok {
		return 0, fmt.Errorf("malformed HTTP response %q", line)
	}
	status = strings.TrimLeft(status, " ")
	digits, _, _ := strings.Cut(status, " ")
	code, err := strconv.Atoi(digits)
	if len(digits) != 3 || err != nil || code < 0 {
		return 0, fmt.Errorf("malformed HTTP status code %q", digits)
	}
	if _, _, ok := http.ParseHTTPVersion(proto); !ok {
		return 0, fmt.Errorf("malformed HTTP version %q", proto)
	}
	first := true
	for len(rest) > 0 {
		var h []byte
		h, rest, _ = bytes.Cut(rest, []byte("\n"))
		h = bytes.TrimSuffix(h, []byte("\r"))
		if len(h) == 0 {
			break
		}
		if h[0] == ' ' || h[0] == '\t' {
			if first {
				return 0, fmt.Errorf("malformed MIME header initial line: %q", h)
			}
			continue // a folded line
		}
		first = false
		name, _, ok := bytes.Cut(h, []byte(":"))
		if !ok || !validMethod(string(name)) {
			return 0, fmt.Errorf("malformed MIME header: missing colon: %q", h)
		}
	}
	return code, nil
}

// framed returns the length of the response at the start of b, the
// informational responses before it included, if b holds all of it and
// its connection can carry another request; 0 if more must come; -1 if
// the connection cannot be reused: the response says Connection: close
// (or is HTTP/1.0 without keep-alive), switches protocols, is framed by
// the connection's end, by a length net/http would refuse or by a
// transfer coding other than chunked, or is larger than maxResponse. It
// is called once judge has passed the response, so b holds its head.
func (c *HTTPCheck) framed(b []byte) int {
	for start := 0; ; {
		end := headerEnd(b[start:])
		if end < 0 {
			return 0
		}
		head := b[start : start+end]
		start += end
		line, rest, _ := bytes.Cut(head, []byte("\n"))
		_, status, _ := bytes.Cut(line, []byte(" "))
		status = bytes.TrimLeft(status, " ")
		code := 0
		if len(status) >= 3 {
			code, _ = strconv.Atoi(string(status[:3]))
		}
		if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
			continue
		}
		if code == http.StatusSwitchingProtocols {
			return -1
		}
		length, chunked, keep := -1, false, !bytes.HasPrefix(line, []byte("HTTP/1.0"))
		for name, value := range headerFields(rest) {
			value = bytes.TrimSpace(value)
			switch {
			case bytes.EqualFold(name, []byte("Connection")):
				for tok := range bytes.SplitSeq(value, []byte(",")) {
					switch tok = bytes.TrimSpace(tok); {
					case bytes.EqualFold(tok, []byte("close")):
						return -1
					case bytes.EqualFold(tok, []byte("keep-alive")):
						keep = true
					}
				}
			case bytes.EqualFold(name, []byte("Transfer-Encoding")):
				if chunked || !bytes.EqualFold(value, []byte("chunked")) {
					return -1
				}
				chunked = true
			case bytes.EqualFold(name, []byte("Content-Length")):
				n, err := strconv.Atoi(string(value))
				if length >= 0 || err != nil || n < 0 || value[0] == '+' {
					return -1
				}
				length = n
			}
		}
		switch {
		case !keep || chunked && length >= 0:
			return -1
		case c.opts.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified:
			return start
		case chunked:
			n := chunkedLen(b[start:])
			if n <= 0 {
				return n
			}
			return start + n
		case length < 0 || start+length > maxResponse:
			return -1
		case len(b) < start+length:
			return 0
		}
		return start + length
	}
}

// is408 reports whether b starts with the status line of a 408 Request
// Timeout response, which a server may send as it closes a kept-alive
// connection that was idle too long.
func is408(b []byte) bool {
	return len(b) >= 12 && bytes.HasPrefix(b, []byte("HTTP/1.")) && string(b[8:12]) == " 408"
}

// chunkedLen returns the length of the chunked body at the start of b,
// trailers included: 0 if b does not hold all of it, -1 if it is
// malformed or longer than maxResponse.
func chunkedLen(b []byte) int {
	i := 0
	for {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		size, _, _ := bytes.Cut(bytes.TrimSuffix(b[i:i+j], []byte("\r")), []byte(";"))
		size = bytes.TrimSpace(size)
		n, err := strconv.ParseUint(string(size), 16, 32)
		if err != nil || len(size) == 0 || n > maxResponse {
			return -1
		}
		i += j + 1
		if n == 0 {
			// Trailers, up to an empty line.
			for {
				j := bytes.IndexByte(b[i:], '\n')
				if j < 0 {
					return 0
				}
				line := b[i : i+j]
				i += j + 1
				if len(line) == 0 || len(line) == 1 && line[0] == '\r' {
					return i
				}
			}
		}
		i += int(n)
		if i > maxResponse {
			return -1
		}
		if len(b) < i+2 {
			return 0
		}
		if b[i] != '\r' || b[i+1] != '\n' {
			return -1
		}
		i += 2
	}
}
