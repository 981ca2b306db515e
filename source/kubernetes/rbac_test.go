package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/source/kubernetes"
	"github.com/vipd/vipd/source/kubernetes/apitest"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

const (
	exampleRBAC   = "../../examples/kubernetes/rbac.yaml"
	exampleConfig = "../../examples/kubernetes/vipd.toml"
)

// permission is one verb on one resource ("services/status") of one API
// group ("" for core).
type permission struct{ group, resource, verb string }

func (p permission) String() string {
	if p.group == "" {
		return p.verb + " " + p.resource
	}
	return p.verb + " " + p.resource + "." + p.group
}

// requests records the permission each request of the source used and
// the permissions the API server refused. A watch that streams the
// initial list (sendInitialEvents, client-go's WatchList) counts as a
// list too: it stands in for one, and the client falls back to a list
// where the API server cannot stream.
type requests struct {
	mu      sync.Mutex
	used    map[permission]int
	refused map[permission]int
	next    http.RoundTripper
}

func (r *requests) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.via(r.next).RoundTrip(req)
}

// via returns a transport that records in r what goes through next: a
// source wraps each of its clients' transports.
func (r *requests) via(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(req)
		r.record(req, resp, err)
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (r *requests) record(req *http.Request, resp *http.Response, err error) {
	p, ok := permissionOf(req)
	if !ok || err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used[p]++
	if p.verb == "watch" && req.URL.Query().Get("sendInitialEvents") == "true" {
		r.used[permission{p.group, p.resource, "list"}]++
	}
	if resp.StatusCode == http.StatusForbidden {
		r.refused[p]++
	}
}

func (r *requests) snapshot() (used, refused map[permission]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.used), maps.Clone(r.refused)
}

// permissionOf returns the verb and resource of an API request, as the
// API server's authorizer sees them; false for paths outside the API
// (/readyz).
func permissionOf(req *http.Request) (permission, bool) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var p permission
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		p.group = parts[1]
		parts = parts[3:]
	default:
		return p, false
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 {
		return p, false
	}
	p.resource = parts[0]
	named := len(parts) >= 2
	if len(parts) >= 3 {
		p.resource += "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case named:
			p.verb = "get"
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			p.verb = "watch"
		default:
			p.verb = "list"
		}
	case http.MethodPost:
		p.verb = "create"
	case http.MethodPut:
		p.verb = "update"
	case http.MethodPatch:
		p.verb = "patch"
	case http.MethodDelete:
		p.verb = "delete"
	default:
		p.verb = strings.ToLower(req.Method)
	}
	return p, true
}

// applyRBAC creates the objects of the example's rbac.yaml as the admin
// and returns the permissions its roles grant.
func applyRBAC(t *testing.T, cs *clientset.Clientset) []permission {
	t.Helper()
	data, err := os.ReadFile(exampleRBAC)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxOf(t)
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var granted []permission
	grant := func(rules []rbacv1.PolicyRule) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						granted = append(granted, permission{g, res, v})
					}
				}
			}
		}
	}
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", exampleRBAC, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			grant(o.Rules)
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			grant(o.Rules)
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", exampleRBAC, obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return granted
}

// serviceAccountKubeconfig mints a token of the ServiceAccount
// kube-system/vipd through the TokenRequest API and writes a kubeconfig
// with it.
func serviceAccountKubeconfig(t *testing.T, srv *apitest.Server, cs *clientset.Clientset) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts("kube-system").CreateToken(ctxOf(t), "vipd",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.LoadFromFile(srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := admin.Contexts[admin.CurrentContext]
	kc := clientcmdapi.NewConfig()
	kc.Clusters["cluster"] = admin.Clusters[ctx.Cluster]
	kc.AuthInfos["vipd"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["vipd"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "vipd"}
	kc.CurrentContext = "vipd"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// exampleOptions returns the source's options from the example's
// [kubernetes] section, as the daemon makes them.
func exampleOptions(t *testing.T) kubernetes.Options {
	t.Helper()
	cfg, err := config.Load(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Kubernetes
	opts := kubernetes.Options{
		LoadBalancerClass: k.LoadBalancerClass, DefaultClass: k.DefaultClass, Namespaces: k.Namespaces,
		ServiceSelector: k.ServiceSelector, Backends: k.Backends, LeaderElection: &k.LeaderElection,
		LeaseNamespace: k.LeaseNamespace, LeaseName: k.LeaseName, Identity: "rbac-a",
		LeaseDuration: k.LeaseDuration, RenewDeadline: k.RenewDeadline, RetryPeriod: k.RetryPeriod,
	}
	for _, p := range k.Pools {
		opts.Pools = append(opts.Pools, kubernetes.Pool{Name: p.Name, Addresses: p.Addresses, AutoAssign: ptr.To(p.AutoAssign),
			AvoidNetworkBroadcast: p.AvoidNetworkBroadcast, Namespaces: p.Namespaces, ServiceSelector: p.ServiceSelector,
			ShareAcrossNamespaces: p.ShareAcrossNamespaces})
	}
	return opts
}

// TestRBAC runs the source with the example's vipd.toml, as the example's
// ServiceAccount (a token from the TokenRequest API) with only the
// permissions of the example's rbac.yaml, against a real API server that
// authorizes with RBAC: it allocates, writes status and Events, reads
// Nodes and EndpointSlices and leads through the Lease; the API server
// refuses none of its requests, and it uses every verb the roles grant.
// Without one of them (services/status update) it fails.
func TestRBAC(t *testing.T) {
	srv := apitest.Start(t)
	admin := clientset.NewForConfigOrDie(srv.Config)
	e := &env{srv: srv, cs: admin}
	granted := applyRBAC(t, admin)
	kubeconfig := serviceAccountKubeconfig(t, srv, admin)

	ns := e.namespace(t)
	e.node(t, "rbac-n1", true, "10.0.3.1")
	opts := exampleOptions(t)
	opts.Kubeconfig = kubeconfig
	if testing.Verbose() {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	src, err := kubernetes.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	rec := &requests{used: map[permission]int{}, refused: map[permission]int{}}
	kubernetes.WrapTransport(src, func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	sink := &fakeSink{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	class := ptr.To(opts.LoadBalancerClass)
	web := lbService(ns, "web", port("http", corev1.ProtocolTCP, 80))
	web.Spec.LoadBalancerClass = class
	web = e.create(t, web)
	e.waitStatus(t, ns, "web", "192.0.2.65")
	pods := lbService(ns, "pods", port("http", corev1.ProtocolTCP, 80))
	pods.Spec.LoadBalancerClass = class
	pods.Annotations = map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints}
	e.create(t, pods)
	e.slice(t, ns, "pods", "pods-1", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
		ep{addr: "10.244.3.1", ready: true, serving: true})
	e.waitStatus(t, ns, "pods", "192.0.2.66")
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/pods/http/tcp tcp 192.0.2.66:80 -> 10.244.3.1:8080/1
k8s/%[1]s/web/http/tcp tcp 192.0.2.65:80 -> 10.0.3.1:%[2]d/1`, ns, web.Spec.Ports[0].NodePort))
	e.waitHolder(t, opts.LeaseNamespace, "rbac-a")

	// A warning, its end, and the same warning again: the Event's count
	// goes to 2 (a patch).
	bad := func(s *corev1.Service) { s.Annotations = map[string]string{kubernetes.AnnotationScheduler: "bogus"} }
	e.update(t, ns, "web", bad)
	e.waitEvent(t, ns, "web", kubernetes.ReasonBadAnnotation, `unknown scheduler "bogus"`)
	e.update(t, ns, "web", func(s *corev1.Service) { s.Annotations = nil })
	waitSnap(t, sink, fmt.Sprintf(`
k8s/%[1]s/pods/http/tcp tcp 192.0.2.66:80 -> 10.244.3.1:8080/1
k8s/%[1]s/web/http/tcp tcp 192.0.2.65:80 -> 10.0.3.1:%[2]d/1`, ns, web.Spec.Ports[0].NodePort))
	e.update(t, ns, "web", bad)
	deadline := time.Now().Add(timeout)
	for {
		evs, err := admin.CoreV1().Events(ns).List(ctxOf(t), metav1.ListOptions{FieldSelector: "involvedObject.name=web,reason=" + kubernetes.ReasonBadAnnotation})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) == 1 && evs.Items[0].Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the repeated warning: %+v", evs.Items)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A deleted Service whose status vipd wrote: vipd gets it to be sure.
	if err := admin.CoreV1().Services(ns).Delete(ctxOf(t), "pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, sink, fmt.Sprintf(`k8s/%[1]s/web/http/tcp tcp 192.0.2.65:80 -> 10.0.3.1:%[2]d/1`, ns, web.Spec.Ports[0].NodePort))
	// A renewal of the Lease (an update) comes within the retry period.
	deadline = time.Now().Add(timeout)
	for {
		used, _ := rec.snapshot()
		if used[permission{"coordination.k8s.io", "leases", "update"}] > 0 && used[permission{"", "services", "get"}] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Lease update or Service get: %v", used)
		}
		time.Sleep(50 * time.Millisecond)
	}

	used, refused := rec.snapshot()
	if len(refused) > 0 {
		t.Errorf("the API server refused %v", refused)
	}
	var unused, extra []string
	for _, g := range granted {
		if used[g] == 0 {
			unused = append(unused, g.String())
		}
	}
	for p := range used {
		if !slices.Contains(granted, p) {
			extra = append(extra, p.String())
		}
	}
	if len(unused) > 0 {
		t.Errorf("the roles grant what vipd never used: %v (used: %v)", unused, used)
	}
	if len(extra) > 0 {
		t.Errorf("vipd used what the roles do not grant: %v", extra)
	}

	// Without services/status update, a new Service gets no address: the
	// write is refused.
	role, err := admin.RbacV1().ClusterRoles().Get(ctxOf(t), "vipd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "services/status") })
	if _, err := admin.RbacV1().ClusterRoles().Update(ctxOf(t), role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	late := lbService(ns, "late", port("http", corev1.ProtocolTCP, 80))
	late.Spec.LoadBalancerClass = class
	e.create(t, late)
	statusWrite := permission{"", "services/status", "update"}
	deadline = time.Now().Add(timeout)
	for {
		if _, refused := rec.snapshot(); refused[statusWrite] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("without services/status update, no write was refused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.waitStatus(t, ns, "late", "")
}
