//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes/apitest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The guest's Kubernetes tests share one etcd and kube-apiserver: under
// the guest's emulation a start takes 30 s to over 2 minutes, by the
// host's load. The first test that asks for the cluster starts it;
// TestMain stops it (stopSharedCluster).
// Each test starts from the baseline (resetCluster, before the test and
// again at its end): no Nodes, no Services but default/kubernetes, no
// EndpointSlices, Events or Leases, no namespaces but the API server's
// own. The tests never run at the same time, and each stops its vipd
// before the cluster is reset, so no vipd sees another test's objects.
var shared struct {
	mu      sync.Mutex
	tb      *clusterTB
	srv     *apitest.Server
	cs      *kubernetes.Clientset // the tests'
	reset   *kubernetes.Clientset // resetCluster's, not rate limited
	starter string                // the test that started it
	err     string                // why it did not start, for the tests after
}

// clusterTB is the testing.TB apitest.Start sees for the shared cluster.
// While the cluster starts it is the starting test (its failures fail
// that test); the cluster's files and its stop belong to the package's
// run, not to that test: TestMain stops it.
type clusterTB struct {
	testing.TB // the starting test, while it starts; nil after

	dir      string
	cleanups []func()
	failed   bool // set by stopSharedCluster: a test failed
}

// Helper does nothing: the starting test is not the caller to blame.
func (c *clusterTB) Helper() {}

// Cleanup keeps f for stopSharedCluster.
func (c *clusterTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

// TempDir returns the cluster's directory, removed by stopSharedCluster.
func (c *clusterTB) TempDir() string { return c.dir }

// Failed reports whether a test of the run failed: apitest then prints
// the end of etcd's and kube-apiserver's logs when it stops them.
func (c *clusterTB) Failed() bool {
	if c.TB != nil {
		return c.TB.Failed()
	}
	return c.failed
}

// Logf logs to the starting test while it starts, else to stderr.
func (c *clusterTB) Logf(format string, args ...any) {
	if c.TB != nil {
		c.TB.Logf(format, args...)
		return
	}
	fmt.Fprintf(os.Stderr, "shared cluster: "+format+"\n", args...)
}

// sharedCluster returns the shared cluster, starting it on first use.
// A start that failed fails every later test at once, naming the test
// where it failed.
func sharedCluster(t *testing.T) (*apitest.Server, *kubernetes.Clientset) {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.err != "" {
		t.Fatalf("the shared etcd and kube-apiserver did not start (in %s): %s", shared.starter, shared.err)
	}
	if shared.srv != nil {
		return shared.srv, shared.cs
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(apitest.AssetsDir(), bin)); err != nil {
			t.Fatalf("no %s in the guest (test/vm/e2e.sh puts it in /payload/k8s with VIPD_E2E_K8S=1): %v", bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "vipd-e2e-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	tb := &clusterTB{TB: t, dir: dir}
	shared.tb, shared.starter = tb, t.Name()
	// apitest.Start ends this goroutine when it fails (t.Fatal): the
	// deferred check then stops what did start and keeps the reason.
	ok := false
	defer func() {
		tb.TB = nil
		if !ok {
			shared.err = "see that test's log"
			runCleanups(tb)
		}
	}()
	start := time.Now()
	srv := apitest.Start(tb)
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatalf("a client of the shared kube-apiserver: %v", err)
	}
	// client-go's default limit, 5 requests a second, would make each
	// reset take seconds.
	rc := rest.CopyConfig(srv.Config)
	rc.QPS, rc.Burst = 1000, 1000
	reset, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatalf("a client of the shared kube-apiserver: %v", err)
	}
	ok = true
	shared.srv, shared.cs, shared.reset = srv, cs, reset
	t.Logf("etcd and kube-apiserver ready in %v (shared by the Kubernetes tests that follow)", time.Since(start).Round(100*time.Millisecond))
	return srv, cs
}

// stopSharedCluster stops the shared cluster, if it was started, and
// removes its files; failed says whether a test failed (the logs' ends
// are then printed).
func stopSharedCluster(failed bool) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.tb == nil {
		return
	}
	shared.tb.failed = failed
	runCleanups(shared.tb)
	shared.tb, shared.srv, shared.cs, shared.reset = nil, nil, nil, nil
}

func runCleanups(tb *clusterTB) {
	for _, f := range slices.Backward(tb.cleanups) {
		f()
	}
	tb.cleanups = nil
	os.RemoveAll(tb.dir)
}

// baseNamespaces are the namespaces kube-apiserver makes itself.
var baseNamespaces = []string{"default", "kube-node-lease", "kube-public", "kube-system"}

// leftover is an object the tests or vipd made: its kind, namespace
// (none for Nodes and Namespaces) and name, and whether it has
// finalizers.
type leftover struct {
	kind, ns, name string
	finalizers     bool
}

func (o leftover) String() string {
	if o.ns == "" {
		return o.kind + " " + o.name
	}
	return o.kind + " " + o.ns + "/" + o.name
}

// clusterLeftovers lists what differs from the baseline: Services but
// default/kubernetes, EndpointSlices but its own, Events, Leases outside
// kube-system and kube-node-lease (the API server's identity leases),
// Nodes, namespaces beyond the API server's own.
func clusterLeftovers(ctx context.Context, cs kubernetes.Interface) ([]leftover, error) {
	var left []leftover
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	for _, s := range svcs.Items {
		if s.Namespace != "default" || s.Name != "kubernetes" {
			left = append(left, leftover{"Service", s.Namespace, s.Name, len(s.Finalizers) > 0})
		}
	}
	ess, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	for _, es := range ess.Items {
		if es.Namespace != "default" || es.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			left = append(left, leftover{"EndpointSlice", es.Namespace, es.Name, len(es.Finalizers) > 0})
		}
	}
	evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Events: %w", err)
	}
	for _, ev := range evs.Items {
		left = append(left, leftover{"Event", ev.Namespace, ev.Name, len(ev.Finalizers) > 0})
	}
	ls, err := cs.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Leases: %w", err)
	}
	for _, l := range ls.Items {
		if l.Namespace != "kube-system" && l.Namespace != "kube-node-lease" {
			left = append(left, leftover{"Lease", l.Namespace, l.Name, len(l.Finalizers) > 0})
		}
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, nd := range nodes.Items {
		left = append(left, leftover{"Node", "", nd.Name, len(nd.Finalizers) > 0})
	}
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if !slices.Contains(baseNamespaces, ns.Name) {
			left = append(left, leftover{"Namespace", "", ns.Name, true})
		}
	}
	return left, nil
}

// remove deletes o, first removing its finalizers (there are no
// controllers to act on them). A namespace is finalized once deleted:
// without a namespace controller it would stay Terminating; its objects
// are deleted beside it (clusterLeftovers lists them all).
func remove(ctx context.Context, cs kubernetes.Interface, o leftover) error {
	var err error
	switch o.kind {
	case "Service":
		api := cs.CoreV1().Services(o.ns)
		if o.finalizers {
			err = stripFinalizers(ctx, o, func() error {
				s, err := api.Get(ctx, o.name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				s.Finalizers = nil
				_, err = api.Update(ctx, s, metav1.UpdateOptions{})
				return err
			})
		}
		if err == nil {
			err = api.Delete(ctx, o.name, metav1.DeleteOptions{})
		}
	case "EndpointSlice":
		err = cs.DiscoveryV1().EndpointSlices(o.ns).Delete(ctx, o.name, metav1.DeleteOptions{})
	case "Event":
		err = cs.CoreV1().Events(o.ns).Delete(ctx, o.name, metav1.DeleteOptions{})
	case "Lease":
		err = cs.CoordinationV1().Leases(o.ns).Delete(ctx, o.name, metav1.DeleteOptions{})
	case "Node":
		err = cs.CoreV1().Nodes().Delete(ctx, o.name, metav1.DeleteOptions{})
	case "Namespace":
		api := cs.CoreV1().Namespaces()
		err = api.Delete(ctx, o.name, metav1.DeleteOptions{})
		if err == nil || apierrors.IsConflict(err) {
			var ns *corev1.Namespace
			if ns, err = api.Get(ctx, o.name, metav1.GetOptions{}); err == nil {
				ns.Spec.Finalizers = nil
				_, err = api.Finalize(ctx, ns, metav1.UpdateOptions{})
			}
		}
	default:
		err = fmt.Errorf("no way to delete a %s", o.kind)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting %s: %w", o, err)
	}
	return nil
}

// stripFinalizers runs update, which removes o's finalizers, again when
// it conflicts with another writer.
func stripFinalizers(ctx context.Context, o leftover, update func() error) error {
	var err error
	for range 5 {
		if err = update(); !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("removing the finalizers of %s: %w", o, err)
	}
	return nil
}

// resetCluster deletes every leftover (clusterLeftovers) at once, then
// waits until the cluster is at its baseline. It returns what it deleted.
func resetCluster(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	left, err := clusterLeftovers(ctx, cs)
	if err != nil || len(left) == 0 {
		return nil, err
	}
	deleted := make([]string, len(left))
	errs := make([]error, len(left))
	var wg sync.WaitGroup
	for i, o := range left {
		deleted[i] = o.String()
		wg.Go(func() { errs[i] = remove(ctx, cs, o) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return deleted, err
	}
	// Deletions of objects without finalizers are done when the call
	// returns, a namespace's once finalized; this proves it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, err = clusterLeftovers(ctx, cs)
		if err == nil && len(left) == 0 {
			return deleted, nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return deleted, err
	}
	names := make([]string, len(left))
	for i, o := range left {
		names[i] = o.String()
	}
	return deleted, fmt.Errorf("the cluster is not at its baseline after the reset: %s", strings.Join(names, ", "))
}

// resetFor resets the shared cluster for test t (when is "before" or
// "after" it), failing t when the cluster cannot be brought to its
// baseline, and logging what it deleted.
func resetFor(t *testing.T, when string) {
	t.Helper()
	shared.mu.Lock()
	cs := shared.reset
	shared.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	deleted, err := resetCluster(ctx, cs)
	if len(deleted) > 0 {
		t.Logf("shared cluster, %s the test: deleted %d objects in %v: %s", when, len(deleted),
			time.Since(start).Round(10*time.Millisecond), strings.Join(deleted, ", "))
	}
	if err != nil {
		t.Fatalf("shared cluster, %s the test: %v", when, err)
	}
}
