package health

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"regexp"
	"strings"
)

// maxBody is how much of a response body a body match reads.
const maxBody = 64 << 10

// maxDrain bounds the rest of a body a probe with keep-alive reads to
// reuse its connection through net/http.
const maxDrain = 1 << 20

// maxRedirects bounds the redirects an http check follows.
const maxRedirects = 10

func statusOK(ranges []StatusRange, code int) bool {
	for _, r := range ranges {
		if code >= r.Lo && code <= r.Hi {
			return true
		}
	}
	return false
}

// HTTPCheck is up when an HTTP or HTTPS request to its address gets a
// response whose status (and optionally body) passes. Every probe opens a
// new connection, unless HTTPOptions.KeepAlive keeps one (at most one)
// between probes; no proxy from the environment is used.
//
// On Linux the Manager runs the probes of a plain http check that follows
// no redirects on a poller, without net/http (see pollRequest).
type HTTPCheck struct {
	client  *http.Client
	url     string // scheme://address/path
	address string // the probed address as host:port
	opts    HTTPOptions
	bodyRe  *regexp.Regexp
	ranges  string // opts.Status formatted for errors
	tls     bool

	// The poller's: the request's bytes (nil: the check cannot run on
	// the poller), where it goes and how, and the target's socket
	// address, built at the first probe.
	request []byte
	target  netip.AddrPort
	dial    DialOptions
	sa      socketAddr
	skip    int // see TCPCheck.skip
	// With KeepAlive, the poller's kept connection (see keptConn).
	keptConn
}

// idleCloser is a Prober that may hold a connection between probes (an
// http check with keep-alive): closeIdle closes it. The Manager calls it
// when it drops the check, and when Run returns.
type idleCloser interface {
	closeIdle()
}

// closeIdle closes the connection c keeps between probes, if any; a
// later probe opens a new one.
func (c *HTTPCheck) closeIdle() {
	c.closeKept()
	c.client.CloseIdleConnections()
}

// NewHTTPCheck returns a check of addr over HTTP, or HTTPS when useTLS is
// set. It reads no file: the certificates of opts.CAFile are opts.CA.
func NewHTTPCheck(addr netip.AddrPort, useTLS bool, opts HTTPOptions, dial DialOptions) (*HTTPCheck, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	scheme := "http"
	if useTLS {
		scheme = "https"
	}
	c := &HTTPCheck{
		url:     scheme + "://" + addr.String() + opts.Path,
		opts:    opts,
		address: addr.String(),
		tls:     useTLS,
		target:  addr,
		dial:    dial,
	}
	c.keptConn.init(c)
	if opts.BodyRegexp != "" {
		c.bodyRe = regexp.MustCompile(opts.BodyRegexp)
	}
	rs := make([]string, len(opts.Status))
	for i, r := range opts.Status {
		rs[i] = r.String()
	}
	c.ranges = strings.Join(rs, ",")

	d := dialerFor(dial, "tcp")
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		DisableKeepAlives:      !opts.KeepAlive,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 64 << 10,
		// One idle connection: the one the next probe reuses.
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
	}
	if useTLS {
		cfg := &tls.Config{InsecureSkipVerify: opts.InsecureSkipVerify}
		switch {
		case opts.SNI != "":
			cfg.ServerName = opts.SNI
		case opts.Host != "":
			cfg.ServerName = hostOnly(opts.Host)
		}
		switch {
		case opts.CA != nil:
			cfg.RootCAs = opts.CA.Pool()
		case opts.CAFile != "":
			return nil, fmt.Errorf("https ca file %s was not read with the configuration", opts.CAFile)
		}
		tr.TLSClientConfig = cfg
	}
	c.client = &http.Client{Transport: tr, CheckRedirect: c.checkRedirect}
	c.request = c.pollRequest()
	return c, nil
}

// hostOnly strips a port from a Host header value.
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		return h
	}
	return host
}

// checkRedirect follows redirects that stay on the backend, when asked to.
func (c *HTTPCheck) checkRedirect(req *http.Request, via []*http.Request) error {
	if !c.opts.FollowRedirects {
		return http.ErrUseLastResponse
	}
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	if req.URL.Scheme != via[0].URL.Scheme {
		return http.ErrUseLastResponse
	}
	host := req.URL.Host
	switch {
	case host == c.address:
	case c.opts.Host != "" && (strings.EqualFold(host, c.opts.Host) || strings.EqualFold(hostOnly(host), hostOnly(c.opts.Host))):
		req.URL.Host = c.address
	default:
		return http.ErrUseLastResponse
	}
	if c.opts.Host != "" {
		req.Host = c.opts.Host
	}
	return nil
}

// newRequest returns the request of a probe.
func (c *HTTPCheck) newRequest(ctx context.Context) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, c.opts.Method, c.url, nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Host = c.opts.Host
	req.Header.Set("User-Agent", "vipd-health-check")
	for name, value := range c.opts.Header {
		req.Header.Set(name, value)
	}
	if c.opts.KeepAlive {
		req.Header.Set("Connection", "keep-alive")
	}
	return req, nil
}

// Probe sends one request and judges the response. With keep-alive, a
// request that fails on a kept connection is sent once more, on a new
// one; a probe that fails closes its connection.
func (c *HTTPCheck) Probe(ctx context.Context) error {
	if !c.opts.KeepAlive {
		return c.probe(ctx, nil)
	}
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	err := c.probe(httptrace.WithClientTrace(ctx, trace), &reused)
	if err != nil && reused && ctx.Err() == nil {
		// The kept connection was dead: the transport dropped it, so
		// this request dials.
		err = c.probe(httptrace.WithClientTrace(ctx, trace), &reused)
	}
	if err != nil {
		c.client.CloseIdleConnections()
	}
	return err
}

// probe makes one attempt of Probe. With keep-alive, an error of the
// transport, before any response, or a 408 response leaves *reused as
// the trace set it; an error judging another response clears it.
func (c *HTTPCheck) probe(ctx context.Context, reused *bool) (err error) {
	req, err := c.newRequest(ctx)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	if reused != nil && (resp.StatusCode != http.StatusRequestTimeout || !*reused) {
		// Judged: not retried. A 408 on a kept connection is the
		// server's word that it closed the connection idle: retried.
		*reused = false
	}
	defer func() {
		if c.opts.KeepAlive && err == nil && !resp.Close {
			// The transport reuses a connection whose body was read
			// to its end; a long one is not worth it. A failed probe
			// closes its connection, and a body the connection's end
			// frames (resp.Close) ends with it.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
		}
		resp.Body.Close()
	}()
	if !statusOK(c.opts.Status, resp.StatusCode) {
		return fmt.Errorf("status %d not in %s", resp.StatusCode, c.ranges)
	}
	if c.opts.Body == "" && c.bodyRe == nil {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if c.opts.Body != "" && !strings.Contains(string(body), c.opts.Body) {
		return fmt.Errorf("body does not contain %q", c.opts.Body)
	}
	if c.bodyRe != nil && !c.bodyRe.Match(body) {
		return fmt.Errorf("body does not match %q", c.opts.BodyRegexp)
	}
	return nil
}
