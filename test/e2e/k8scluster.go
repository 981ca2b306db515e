//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes/apitest"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The guest's Kubernetes tests share one etcd and kube-apiserver: under
// the guest's emulation each takes 30-50 s to start. The first test that
// asks for the cluster starts it; TestMain stops it (stopSharedCluster).
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

// leaseKept says whether a Lease is the API server's own (its identity
// leases in kube-system), which a reset leaves.
func leaseKept(ns string) bool { return ns == "kube-system" || ns == "kube-node-lease" }

// resetCluster deletes every object the tests and vipd make (Services
// but default/kubernetes, EndpointSlices, Events, Leases outside
// kube-system and kube-node-lease, Nodes, namespaces but the API
// server's own: each stripped of its finalizers, as there is no
// namespace controller), then checks that the cluster is at the
// baseline. It returns what it deleted, as "KIND NAMESPACE/NAME".
func resetCluster(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	var deleted []string
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		n := ns.Name
		svcs, err := cs.CoreV1().Services(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			return deleted, fmt.Errorf("listing Services of %s: %w", n, err)
		}
		for _, s := range svcs.Items {
			if n == "default" && s.Name == "kubernetes" {
				continue
			}
			if len(s.Finalizers) > 0 {
				s.Finalizers = nil
				if _, err := cs.CoreV1().Services(n).Update(ctx, &s, metav1.UpdateOptions{}); err != nil {
					return deleted, fmt.Errorf("removing the finalizers of Service %s/%s: %w", n, s.Name, err)
				}
			}
			if err := cs.CoreV1().Services(n).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
				return deleted, fmt.Errorf("deleting Service %s/%s: %w", n, s.Name, err)
			}
			deleted = append(deleted, "Service "+n+"/"+s.Name)
		}
		ess, err := cs.DiscoveryV1().EndpointSlices(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			return deleted, fmt.Errorf("listing EndpointSlices of %s: %w", n, err)
		}
		for _, es := range ess.Items {
			if n == "default" && es.Labels[discoveryv1.LabelServiceName] == "kubernetes" {
				continue
			}
			if err := cs.DiscoveryV1().EndpointSlices(n).Delete(ctx, es.Name, metav1.DeleteOptions{}); err != nil {
				return deleted, fmt.Errorf("deleting EndpointSlice %s/%s: %w", n, es.Name, err)
			}
			deleted = append(deleted, "EndpointSlice "+n+"/"+es.Name)
		}
		evs, err := cs.CoreV1().Events(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			return deleted, fmt.Errorf("listing Events of %s: %w", n, err)
		}
		if len(evs.Items) > 0 {
			if err := cs.CoreV1().Events(n).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				return deleted, fmt.Errorf("deleting the Events of %s: %w", n, err)
			}
			deleted = append(deleted, fmt.Sprintf("%d Events in %s", len(evs.Items), n))
		}
		if !leaseKept(n) {
			ls, err := cs.CoordinationV1().Leases(n).List(ctx, metav1.ListOptions{})
			if err != nil {
				return deleted, fmt.Errorf("listing Leases of %s: %w", n, err)
			}
			for _, l := range ls.Items {
				if err := cs.CoordinationV1().Leases(n).Delete(ctx, l.Name, metav1.DeleteOptions{}); err != nil {
					return deleted, fmt.Errorf("deleting Lease %s/%s: %w", n, l.Name, err)
				}
				deleted = append(deleted, "Lease "+n+"/"+l.Name)
			}
		}
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return deleted, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, nd := range nodes.Items {
		if err := cs.CoreV1().Nodes().Delete(ctx, nd.Name, metav1.DeleteOptions{}); err != nil {
			return deleted, fmt.Errorf("deleting Node %s: %w", nd.Name, err)
		}
		deleted = append(deleted, "Node "+nd.Name)
	}
	for _, ns := range nss.Items {
		if slices.Contains(baseNamespaces, ns.Name) {
			continue
		}
		if ns.DeletionTimestamp == nil {
			if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
				return deleted, fmt.Errorf("deleting namespace %s: %w", ns.Name, err)
			}
		}
		// No namespace controller empties it and drops its finalizer:
		// its objects are gone (above), so the finalizer goes here.
		cur, err := cs.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
		if err != nil {
			return deleted, fmt.Errorf("reading namespace %s: %w", ns.Name, err)
		}
		cur.Spec.Finalizers = nil
		if _, err := cs.CoreV1().Namespaces().Finalize(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return deleted, fmt.Errorf("finalizing namespace %s: %w", ns.Name, err)
		}
		deleted = append(deleted, "Namespace "+ns.Name)
	}
	// Deletions of objects without finalizers are done when the call
	// returns; a namespace goes once finalized. Wait for the baseline.
	var left []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		if left, err = clusterLeftovers(ctx, cs); err == nil && len(left) == 0 {
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
	return deleted, fmt.Errorf("the cluster is not at its baseline after the reset: %s", strings.Join(left, ", "))
}

// clusterLeftovers lists what differs from the baseline: objects the
// tests or vipd made, namespaces beyond the API server's own.
func clusterLeftovers(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	var left []string
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for _, ns := range nss.Items {
		if !slices.Contains(baseNamespaces, ns.Name) {
			left = append(left, "Namespace "+ns.Name)
		}
	}
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Services: %w", err)
	}
	for _, s := range svcs.Items {
		if s.Namespace != "default" || s.Name != "kubernetes" {
			left = append(left, "Service "+s.Namespace+"/"+s.Name)
		}
	}
	ess, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	for _, es := range ess.Items {
		if es.Namespace != "default" || es.Labels[discoveryv1.LabelServiceName] != "kubernetes" {
			left = append(left, "EndpointSlice "+es.Namespace+"/"+es.Name)
		}
	}
	evs, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Events: %w", err)
	}
	for _, ev := range evs.Items {
		left = append(left, "Event "+ev.Namespace+"/"+ev.Name)
	}
	ls, err := cs.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Leases: %w", err)
	}
	for _, l := range ls.Items {
		if !leaseKept(l.Namespace) {
			left = append(left, "Lease "+l.Namespace+"/"+l.Name)
		}
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, nd := range nodes.Items {
		left = append(left, "Node "+nd.Name)
	}
	return left, nil
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
