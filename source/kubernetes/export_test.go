package kubernetes

import (
	"net/http"

	clientset "k8s.io/client-go/kubernetes"
)

// WrapTransport makes s wrap its transport to the API server with wrap,
// so that a test sees the requests the source makes.
func WrapTransport(s *Source, wrap func(http.RoundTripper) http.RoundTripper) { s.wrap = wrap }

// UseClient makes s talk to cs (client-go's fake clientset) in place of
// the API server of its kubeconfig.
func UseClient(s *Source, cs clientset.Interface) { s.client = cs }

// FullSyncs returns how many full syncs s made.
func FullSyncs(s *Source) int64 { return s.fullSyncs.Load() }
