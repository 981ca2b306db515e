package apitest_test

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/source/kubernetes/apitest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestServer(t *testing.T) {
	s := apitest.Start(t)
	cs := kubernetes.NewForConfigOrDie(s.Config)
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != apitest.KubernetesVersion {
		t.Fatalf("server version %s, want %s", v.GitVersion, apitest.KubernetesVersion)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("no cluster IP or node port: %+v", svc.Spec)
	}

	// The kubeconfig reaches the same server, and the data survives a
	// restart of the API server.
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	s.StopAPIServer()
	if _, err := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); err == nil {
		t.Fatal("the API server answered while stopped")
	}
	if err := s.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	got, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != svc.UID {
		t.Fatalf("after restart: uid %s, want %s", got.UID, svc.UID)
	}
}

// TestMissingBinaries runs TestServer without binaries: it must fail in
// CI and skip elsewhere, saying what to run.
func TestMissingBinaries(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestServer$", "-test.v")
		cmd.Env = append(os.Environ(), "VIPD_K8S_ASSETS="+t.TempDir(), "CI="+ci)
		out, err := cmd.CombinedOutput()
		if ci == "true" {
			if err == nil || !strings.Contains(string(out), "--- FAIL: TestServer") {
				t.Errorf("CI=true: want a failure, got %v:\n%s", err, out)
			}
		} else if err != nil || !strings.Contains(string(out), "--- SKIP: TestServer") {
			t.Errorf("CI unset: want a skip, got %v:\n%s", err, out)
		}
		if !strings.Contains(string(out), "no etcd in ") || !strings.Contains(string(out), "run test/k8s/rig.sh") {
			t.Errorf("CI=%q: the message does not say what is missing and what to run:\n%s", ci, out)
		}
	}
}

// TestThreadsEnding ends threads after the rig started, as tests that
// enter a network namespace do (a goroutine that exits locked to its
// thread ends the thread): the binaries, which die with the thread that
// started them, must not.
func TestThreadsEnding(t *testing.T) {
	s := apitest.Start(t)
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine.
			for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
			}
			time.Sleep(100 * time.Millisecond)
		}()
	}
	wg.Wait()
	time.Sleep(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kubernetes.NewForConfigOrDie(s.Config).CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the API server died with a thread: %v", err)
	}
}
