package kubernetes

import "net/http"

// WrapTransport makes s wrap its transport to the API server with wrap,
// so that a test sees the requests the source makes.
func WrapTransport(s *Source, wrap func(http.RoundTripper) http.RoundTripper) { s.wrap = wrap }
