package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipd/vipd/agent"
	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/source"
	"github.com/vipd/vipd/source/kubernetes"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// appliedIPVS is the fake kernel's IPVS that hands every batch it
// applied to the benchmark.
type appliedIPVS struct {
	lb.IPVS
	applied chan []lb.Op
}

func (a appliedIPVS) Apply(ops []lb.Op) []error {
	errs := a.IPVS.Apply(ops)
	a.applied <- ops
	return errs
}

// benchVIP is the address in the status of Service i.
func benchVIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 200, byte(i / 250), byte(1 + i%250)})
}

// benchEndpoint is the j-th address of Service i's endpoint.
func benchEndpoint(i, j int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(1 + j), byte(i / 250), byte(1 + i%250)})
}

func benchSlice(i, j int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("s%05d", i)
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{benchEndpoint(i, j).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}

// BenchmarkEndpointUpdate is the path of one EndpointSlice update through
// vipd, with n LoadBalancer Services (endpoints mode, one endpoint each,
// their addresses already in their status): client-go's fake clientset
// and informers, the source's sync, the agent's pass and the fake
// kernel's IPVS. One operation is one update at the API server until the
// kernel has the new real server.
func BenchmarkEndpointUpdate(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			objs := make([]runtime.Object, 0, 2*n)
			for i := range n {
				svc := fakeService(fmt.Sprintf("s%05d", i), map[string]string{kubernetes.AnnotationBackends: kubernetes.BackendsEndpoints},
					corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80})
				svc.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
				svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: benchVIP(i).String(), IPMode: ptr.To(corev1.LoadBalancerIPModeVIP)}}
				objs = append(objs, svc, benchSlice(i, 0))
			}
			cs := fake.NewClientset(objs...)
			// The fake's watches miss what changes between an informer's
			// list and its watch: the updates wait for the watch.
			watching := make(chan struct{})
			cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
				close(watching)
				return false, nil, nil
			})
			src, err := kubernetes.New(kubernetes.Options{Kubeconfig: "unused", DefaultClass: true, LeaderElection: ptr.To(false),
				Pools: pools("10.200.0.0/16")})
			if err != nil {
				b.Fatal(err)
			}
			kubernetes.UseClient(src, cs)

			dir := b.TempDir()
			path := filepath.Join(dir, "vipd.toml")
			text := fmt.Sprintf("[daemon]\nwatch = false\nresync_interval = \"1h\"\nmetrics_listen = \"\"\nstate_dir = %q\ncontrol_socket = %q\n",
				filepath.Join(dir, "state"), filepath.Join(dir, "vipd.sock"))
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				b.Fatal(err)
			}
			k := lbtest.New()
			applied := make(chan []lb.Op, 1024)
			a := agent.New(agent.Options{Path: path, Logger: benchLog(), KernelRelease: "6.1.0",
				OpenKernel: func(*config.Config, *slog.Logger) (lb.Kernel, func(), error) {
					kk := k.Interface()
					kk.IPVS = appliedIPVS{IPVS: kk.IPVS, applied: applied}
					return kk, func() {}, nil
				},
				Sources: []source.Source{src}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			defer func() {
				cancel()
				<-done
			}()
			// waitDest waits until the kernel has want as a real server of
			// Service i, looking after each batch applied.
			waitDest := func(i int, want netip.AddrPort, timeout time.Duration) {
				key := lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: benchVIP(i), Port: 80}
				deadline := time.After(timeout)
				for {
					if st, _ := k.Service(key); st != nil {
						if _, ok := st.Dests[want]; ok {
							return
						}
					}
					select {
					case <-applied:
					case <-deadline:
						st, _ := k.Service(key)
						b.Fatalf("%s did not reach the kernel in %v: %+v", want, timeout, st)
					}
				}
			}
			// The cold start: every Service in the kernel.
			waitDest(n-1, netip.AddrPortFrom(benchEndpoint(n-1, 0), 8080), 5*time.Minute)
			<-watching
			time.Sleep(100 * time.Millisecond) // the reactor runs just before the watch starts
			api := cs.DiscoveryV1().EndpointSlices("ns")
			b.ReportAllocs()
			b.ResetTimer()
			for u := 0; u < b.N; u++ {
				i := (u * 7919) % n
				j := 1 + u/n
				if _, err := api.Update(ctx, benchSlice(i, j), metav1.UpdateOptions{}); err != nil {
					b.Fatal(err)
				}
				waitDest(i, netip.AddrPortFrom(benchEndpoint(i, j), 8080), time.Minute)
			}
		})
	}
}

func benchSizes() []int {
	if os.Getenv("N") != "" {
		var n int
		fmt.Sscan(os.Getenv("N"), &n)
		return []int{n}
	}
	return []int{1000, 10000}
}

func benchLog() *slog.Logger {
	if os.Getenv("V") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}
