package check

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

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
	// KeepAlive keeps the connection of a probe whose response passed
	// and ended cleanly (framed by Content-Length or chunked, without
	// Connection: close) for the next probe, at most one per check,
	// rather than opening one per probe. A probe that finds its kept
	// connection dead (reset, closed before any byte of the response,
	// a failed write) tries once more on a new connection within its
	// timeout; a probe that fails or times out closes its connection.
	// The trade-off: a kept connection no longer tests the backend's
	// accept path (a full listen queue or a wedged acceptor still
	// answers on an old connection), pins one worker of a prefork
	// server, and holds a descriptor on both ends; it saves the
	// handshake, the reset and the backend's accept of each probe.
	KeepAlive bool
}

// WithDefaults returns o with its zero fields set to their defaults.
func (o HTTPOptions) WithDefaults() HTTPOptions {
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

// Validate reports every problem of o (after defaults) at once.
func (o HTTPOptions) Validate() error {
	var errs []error
	if !ValidToken(o.Method) {
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
		case !ValidToken(name) || strings.ContainsAny(value, "\r\n"):
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

// ValidToken reports whether s is an HTTP token, as methods and header
// names must be.
func ValidToken(s string) bool {
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
