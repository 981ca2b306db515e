package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// maxBody is how much of a response body a body match reads.
const maxBody = 64 << 10

// maxRedirects bounds the redirects an http check follows.
const maxRedirects = 10

// HTTPOptions configure http and https checks.
type HTTPOptions struct {
	// Method is the request method; empty means GET.
	Method string
	// Path is the request path with an optional query; empty means "/".
	Path string
	// Host is the Host header, and the TLS server name unless SNI is set;
	// empty means the probed address.
	Host string
	// SNI overrides the TLS server name sent and verified.
	SNI string
	// Header adds request headers.
	Header map[string]string
	// Status lists the response codes that pass; empty means 200-399.
	// ParseStatusRanges reads the "200-399,404" form.
	Status []StatusRange
	// Body, when set, must occur in the first 64 KiB of the body.
	Body string
	// BodyRegexp, when set, must match the first 64 KiB of the body.
	BodyRegexp string
	// InsecureSkipVerify accepts any server certificate.
	InsecureSkipVerify bool
	// CAFile is a PEM file of the certificate authorities that verify the
	// server; empty means the system's. The check never reads it: CA
	// holds its content, read with the configuration.
	CAFile string
	// CA holds CAFile's certificates; a check with CAFile and no CA
	// fails to build.
	CA *CABundle
	// FollowRedirects follows up to 10 redirects that stay on the checked
	// backend (a relative location, or one naming the probed address or
	// Host with the same scheme); a redirect elsewhere is judged as the
	// response. Without it every redirect is judged as the response.
	FollowRedirects bool
}

func (o HTTPOptions) withDefaults() HTTPOptions {
	if o.Method == "" {
		o.Method = http.MethodGet
	}
	if o.Path == "" {
		o.Path = "/"
	}
	if len(o.Status) == 0 {
		o.Status = []StatusRange{{200, 399}}
	}
	return o
}

func (o HTTPOptions) validate() error {
	var errs []error
	if !validMethod(o.Method) {
		errs = append(errs, fmt.Errorf("http method %q is not a token", o.Method))
	}
	if !strings.HasPrefix(o.Path, "/") {
		errs = append(errs, fmt.Errorf("http path %q does not start with /", o.Path))
	} else if _, err := url.ParseRequestURI(o.Path); err != nil {
		errs = append(errs, fmt.Errorf("http path %q: %w", o.Path, err))
	}
	if strings.ContainsAny(o.Host, " /\r\n") {
		errs = append(errs, fmt.Errorf("http host %q is not a host name", o.Host))
	}
	for name, value := range o.Header {
		switch {
		case !validMethod(name) || strings.ContainsAny(value, "\r\n"):
			errs = append(errs, fmt.Errorf("http header %q is invalid", name))
		case strings.EqualFold(name, "Host"):
			errs = append(errs, errors.New("http header Host is set by the host option"))
		}
	}
	for _, r := range o.Status {
		if r.Lo < 100 || r.Hi > 599 || r.Lo > r.Hi {
			errs = append(errs, fmt.Errorf("http status range %s is not within 100-599", r))
		}
	}
	if o.BodyRegexp != "" {
		if _, err := regexp.Compile(o.BodyRegexp); err != nil {
			errs = append(errs, fmt.Errorf("http body regexp: %w", err))
		}
	}
	return errors.Join(errs...)
}

// validMethod reports whether s is an HTTP token, as methods and header
// names must be.
func validMethod(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// StatusRange is an inclusive range of HTTP status codes.
type StatusRange struct {
	Lo, Hi int
}

// String formats the range as "200-399", or "200" for a single code.
func (r StatusRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(r.Lo)
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// ParseStatusRanges parses a comma-separated list of codes ("204"),
// ranges ("200-399") and classes ("2xx").
func ParseStatusRanges(s string) ([]StatusRange, error) {
	var out []StatusRange
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		var r StatusRange
		var err error
		switch lo, hi, ok := strings.Cut(part, "-"); {
		case ok:
			r.Lo, err = strconv.Atoi(strings.TrimSpace(lo))
			if err == nil {
				r.Hi, err = strconv.Atoi(strings.TrimSpace(hi))
			}
		case len(part) == 3 && strings.EqualFold(part[1:], "xx") && part[0] >= '1' && part[0] <= '5':
			r.Lo = int(part[0]-'0') * 100
			r.Hi = r.Lo + 99
		default:
			r.Lo, err = strconv.Atoi(part)
			r.Hi = r.Lo
		}
		if err != nil || r.Lo < 100 || r.Hi > 599 || r.Lo > r.Hi {
			return nil, fmt.Errorf("status %q is not a code, range or class within 100-599", part)
		}
		out = append(out, r)
	}
	return out, nil
}

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
// new connection; no proxy from the environment is used.
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
}

// NewHTTPCheck returns a check of addr over HTTP, or HTTPS when useTLS is
// set. It reads no file: the certificates of opts.CAFile are opts.CA.
func NewHTTPCheck(addr netip.AddrPort, useTLS bool, opts HTTPOptions, dial DialOptions) (*HTTPCheck, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
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
	if opts.BodyRegexp != "" {
		c.bodyRe = regexp.MustCompile(opts.BodyRegexp)
	}
	rs := make([]string, len(opts.Status))
	for i, r := range opts.Status {
		rs[i] = r.String()
	}
	c.ranges = strings.Join(rs, ",")

	d := dial.dialer("tcp")
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            d.DialContext,
		DisableKeepAlives:      true,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 64 << 10,
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
			cfg.RootCAs = opts.CA.pool
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
	return req, nil
}

// Probe sends one request and judges the response.
func (c *HTTPCheck) Probe(ctx context.Context) error {
	req, err := c.newRequest(ctx)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
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
