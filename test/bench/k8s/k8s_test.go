//go:build k8sbench

// Package k8s is the Kubernetes benchmark (test/vm/bench-k8s.sh, part of
// make bench): in the qemu guest, N LoadBalancer Services with one
// endpoint each in a real etcd and kube-apiserver; vipd (endpoints mode),
// then kube-proxy of the same release in IPVS mode, program them; the
// benchmark times EndpointSlice updates at the API server until the
// change is in IPVS, and the programs' CPU and RSS.
package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/source/kubernetes/apitest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestKubernetesBench(t *testing.T) {
	if os.Getenv("VIPD_VM") != "1" {
		t.Fatal("the Kubernetes benchmark runs only in the test guest (test/vm/bench-k8s.sh)")
	}
	var sizes []int
	for _, s := range strings.Split(os.Getenv("VIPD_BENCH_K8S_SIZES"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && n > 0 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		sizes = []int{1000}
	}
	samples := envInt("VIPD_BENCH_K8S_SAMPLES", 30)
	var results []Result
	for _, n := range sizes {
		t.Run(strconv.Itoa(n), func(t *testing.T) { results = append(results, runSize(t, n, samples)...) })
	}
	js, _ := json.MarshalIndent(results, "", "  ")
	fmt.Printf("BENCH-K8S-TABLE-BEGIN\n%sBENCH-K8S-TABLE-END\nBENCH-K8S-JSON-BEGIN\n%s\nBENCH-K8S-JSON-END\n", Table(results), js)
}

// runSize measures vipd, then kube-proxy, with n Services.
func runSize(t *testing.T, n, samples int) []Result {
	converge := time.Duration(envInt("VIPD_BENCH_K8S_CONVERGE_S", 3600)) * time.Second
	// deadline bounds the whole size: the creation of the Services, and
	// each system's convergence.
	deadline := time.Now().Add(time.Duration(envInt("VIPD_BENCH_K8S_DEADLINE_S", 6*3600)) * time.Second)
	limit := func() time.Duration { return max(0, min(converge, time.Until(deadline))) }
	srv := apitest.Start(t)
	cfg := rest.CopyConfig(srv.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	sh(t, "ip link add k8snode type dummy && ip addr add 10.0.9.1/32 dev k8snode && ip link set k8snode up")
	t.Cleanup(func() { exec.Command("ip", "link", "del", "k8snode").Run() })
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Bench",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.9.1"}, {Type: corev1.NodeHostName, Address: "node1"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var created atomic.Int64
	parallel(n, 8, func(i int) {
		if time.Now().After(deadline) {
			return
		}
		defer created.Add(1)
		name := fmt.Sprintf("s%05d", i)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Annotations: map[string]string{"vipd.io/backends": "endpoints"}},
			// No node ports: both systems balance to the endpoints, and
			// the node-port range (2,768 ports) is smaller than 10,000
			// Services.
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, AllocateLoadBalancerNodePorts: ptr.To(false),
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		for {
			_, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
			if err == nil || strings.Contains(err.Error(), "already exists") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("create %s: %v (given up at the deadline)", name, err)
				return
			}
			t.Logf("create %s: %v; again", name, err)
			time.Sleep(time.Second)
		}
		createSlice(t, cs, i)
	})
	t.Logf("%d Services and EndpointSlices created in %v", created.Load(), time.Since(start).Round(time.Second))
	if int(created.Load()) < n {
		t.Logf("NOT RUN: only %d of %d Services created in %.0f s", created.Load(), n, time.Since(start).Seconds())
		note := fmt.Sprintf("not run: the API server took %.0f s to create %d of the %d Services (VIPD_BENCH_K8S_DEADLINE_S)",
			time.Since(start).Seconds(), created.Load(), n)
		return []Result{{System: "vipd", Services: n, Note: note}, {System: "kube-proxy", Services: n, Note: note}}
	}

	ipv, err := ipvs.New(ipvs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ipv.Close()

	// vipd.
	dir := t.TempDir()
	conf := fmt.Sprintf(`[daemon]
uplinks = ["k8snode"]
state_dir = %q
control_socket = %q
metrics_listen = ""

[kubernetes]
kubeconfig = %q
default_class = true
backends = "endpoints"
leader_election = false

[[kubernetes.pool]]
name = "bench"
addresses = ["10.200.0.0/16"]
`, filepath.Join(dir, "state"), filepath.Join(dir, "vipd.sock"), srv.Kubeconfig)
	if err := os.WriteFile(filepath.Join(dir, "vipd.toml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	vipd := startProc(t, dir, "vipd", "/payload/vipd", "run", "-c", filepath.Join(dir, "vipd.toml"))
	vres := Result{System: "vipd", Services: n}
	// vips are the Services' addresses, from the statuses vipd writes:
	// the updates of both systems are timed on them.
	var vips []netip.Addr
	if waitIPVS(t, ipv, n, vipd, start, time.Since(start)+limit(), &vres) {
		t.Logf("vipd: every Service in IPVS after %.1f s", vres.ColdSync)
		vips = waitStatuses(t, cs, n, vipd)
		t.Logf("vipd: every Service has its status after %.1f s", time.Since(start).Seconds())
		measure(t, cs, ipv, vips, samples, 2, vipd, &vres, max(time.Minute, limit()), deadline)
	}
	logRow(t, vres)
	vipd.logTail(t, "msg=reconciled", 40)
	vipd.stop(t)
	sh(t, "ipvsadm -C; ip link del vipd0 2>/dev/null; true")

	// kube-proxy, IPVS mode, against the same API server.
	start = time.Now()
	kp := startProc(t, dir, "kube-proxy", filepath.Join(apitest.AssetsDir(), "kube-proxy"),
		"--kubeconfig="+srv.Kubeconfig, "--proxy-mode=ipvs", "--hostname-override=node1",
		"--cluster-cidr=10.244.0.0/16", "--healthz-bind-address=127.0.0.1:10256",
		"--metrics-bind-address=127.0.0.1:10249", "--v=2")
	kres := Result{System: "kube-proxy", Services: n}
	if waitIPVS(t, ipv, n, kp, start, time.Since(start)+limit(), &kres) {
		t.Logf("kube-proxy: every Service in IPVS after %.1f s", kres.ColdSync)
	}
	if kres.Converged && vips == nil {
		kres.Note = "no updates timed: vipd, which gives the Services their addresses, did not converge"
	} else if kres.Converged {
		measure(t, cs, ipv, vips, samples, 3, kp, &kres, max(time.Minute, limit()), deadline)
	}
	logRow(t, kres)
	kp.stop(t)
	sh(t, "ipvsadm -C; ip link del kube-ipvs0 2>/dev/null; true")
	return []Result{vres, kres}
}

// logRow logs r as soon as it is measured: a run that ends early keeps
// the systems measured before.
func logRow(t *testing.T, r Result) {
	js, _ := json.Marshal(r)
	t.Logf("BENCH-K8S-ROW %s", js)
}

// setSlice makes Service i's EndpointSlice hold k endpoints: 10.J.x.y:8080
// for J = 1..k.
func setSlice(t *testing.T, cs *kubernetes.Clientset, i, k int) {
	name := fmt.Sprintf("s%05d", i)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for j := 1; j <= k; j++ {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{epAddr(j, i).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node1")})
	}
	api := cs.DiscoveryV1().EndpointSlices("default")
	for {
		old, err := api.Get(context.Background(), es.Name, metav1.GetOptions{})
		if err == nil {
			es.ResourceVersion = old.ResourceVersion
			_, err = api.Update(context.Background(), es, metav1.UpdateOptions{})
		} else {
			_, err = api.Create(context.Background(), es, metav1.CreateOptions{})
		}
		if err == nil {
			return
		}
		t.Logf("slice %s: %v; again", es.Name, err)
		time.Sleep(time.Second)
	}
}

// createSlice creates Service i's EndpointSlice with one endpoint, as
// setSlice does, with one request where setSlice makes two.
func createSlice(t *testing.T, cs *kubernetes.Clientset, i int) {
	name := fmt.Sprintf("s%05d", i)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{epAddr(1, i).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}, NodeName: ptr.To("node1")}},
	}
	_, err := cs.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{})
	if err != nil {
		setSlice(t, cs, i, 1)
	}
}

func epAddr(j, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(j), byte(i / 250), byte(1 + i%250)})
}

// waitStatuses waits until the n Services have an address, and returns
// them by index.
func waitStatuses(t *testing.T, cs *kubernetes.Clientset, n int, p *proc) []netip.Addr {
	deadline := time.Now().Add(20 * time.Minute)
	for {
		p.alive(t)
		list, err := cs.CoreV1().Services("default").List(context.Background(), metav1.ListOptions{})
		if err == nil {
			vips := make([]netip.Addr, n)
			got := 0
			for _, s := range list.Items {
				i, err := strconv.Atoi(strings.TrimPrefix(s.Name, "s"))
				if err != nil || i >= n || len(s.Status.LoadBalancer.Ingress) == 0 {
					continue
				}
				vips[i] = netip.MustParseAddr(s.Status.LoadBalancer.Ingress[0].IP)
				got++
			}
			if got == n {
				return vips
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every Service has an address: %v", err)
		}
		time.Sleep(time.Second)
	}
}

func key(vip netip.Addr) lb.ServiceKey {
	return lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: 80}
}

// waitIPVS waits until each of the n Services is in IPVS: a virtual
// service on port 80 with the Service's first endpoint among its real
// servers (the endpoints tell the Services apart, so that no status need
// be written first), at most limit after start. It records the cold sync
// in r. When the limit passes first it records how many were there and
// the RSS, says so loudly, and returns false.
func waitIPVS(t *testing.T, ipv *ipvs.IPVS, n int, p *proc, start time.Time, limit time.Duration, r *Result) bool {
	last := time.Now()
	for {
		p.alive(t)
		all, err := ipv.Services()
		if err == nil {
			have := map[netip.AddrPort]bool{}
			for k, st := range all {
				if k.Port != 80 {
					continue
				}
				for d := range st.Dests {
					have[d] = true
				}
			}
			missing := 0
			for i := range n {
				if !have[netip.AddrPortFrom(epAddr(1, i), 8080)] {
					missing++
				}
			}
			if missing == 0 {
				r.Converged, r.InIPVS, r.ColdSync = true, n, time.Since(start).Seconds()
				return true
			}
			if time.Since(last) > 30*time.Second {
				t.Logf("%s: %d of %d Services not in IPVS yet after %.0f s", r.System, missing, n, time.Since(start).Seconds())
				last = time.Now()
			}
			if time.Since(start) > limit {
				r.InIPVS, r.Limit = n-missing, limit.Seconds()
				r.RSS, r.HWM = p.mem(t)
				t.Logf("%s DID NOT CONVERGE: %d of %d Services in IPVS after %.0f s", r.System, r.InIPVS, n, limit.Seconds())
				return false
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// measure times samples EndpointSlice updates (each Service's slice gets
// endpoint k) from the update at the API server until IPVS has the new
// real server, and p's CPU and RSS meanwhile.
//
// The first update may take up to firstLimit; the others end at deadline,
// and a sample that does not arrive by then ends the series (with a note:
// the samples before it stand).
func measure(t *testing.T, cs *kubernetes.Clientset, ipv *ipvs.IPVS, vips []netip.Addr, samples, k int, p *proc, r *Result, firstLimit time.Duration, deadline time.Time) {
	// update sets Service i's slice to k endpoints and waits until IPVS
	// has the last.
	update := func(i int, timeout time.Duration) time.Duration {
		want := netip.AddrPortFrom(epAddr(k, i), 8080)
		t0 := time.Now()
		setSlice(t, cs, i, k)
		for {
			st, err := ipv.Service(key(vips[i]))
			if err == nil && st != nil {
				if _, ok := st.Dests[want]; ok {
					return time.Since(t0)
				}
			}
			if time.Since(t0) > timeout {
				return -1
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	// A first update, not counted: it waits for the end of the
	// program's first full sync (kube-proxy's goes on with its ipsets
	// long after IPVS has every Service).
	warm := len(vips) - 1
	first := update(warm, firstLimit)
	if first < 0 {
		r.FirstUpdateMin = firstLimit.Seconds()
		r.Note = fmt.Sprintf("converged in %.1f s, but the first update did not reach IPVS within %.0f s after that: not measured", r.ColdSync, firstLimit.Seconds())
		r.RSS, r.HWM = p.mem(t)
		t.Logf("%s: %s", r.System, r.Note)
		return
	}
	r.FirstUpdate = first.Seconds()
	t.Logf("%s: the first update reached IPVS after %.1f s", r.System, r.FirstUpdate)
	cpu0, wall0 := p.cpu(t), time.Now()
	var lat []float64
	for s := range samples {
		i := (s * 7919) % len(vips)
		if i == warm {
			continue
		}
		d := update(i, max(0, time.Until(deadline)))
		if d < 0 {
			r.Note = fmt.Sprintf("the update of Service %d did not reach IPVS by the deadline (VIPD_BENCH_K8S_DEADLINE_S); %d updates measured before it", i, len(lat))
			t.Logf("%s: %s", r.System, r.Note)
			break
		}
		lat = append(lat, float64(d.Microseconds())/1000)
		t.Logf("%s: update %d of Service %d: %.1f ms", r.System, len(lat), i, lat[len(lat)-1])
		time.Sleep(200 * time.Millisecond)
	}
	if len(lat) == 0 {
		r.RSS, r.HWM = p.mem(t)
		return
	}
	r.CPU = (p.cpu(t) - cpu0) / time.Since(wall0).Seconds() * 100
	r.RSS, r.HWM = p.mem(t)
	slices.Sort(lat)
	r.Samples = len(lat)
	r.P50 = lat[len(lat)/2]
	r.P99 = lat[min(len(lat)-1, (len(lat)*99+99)/100-1)]
	r.Max = lat[len(lat)-1]
	t.Logf("%s, %d Services: %d updates, p50 %.1f ms, p99 %.1f ms, max %.1f ms; cpu %.1f%%, rss %.1f MB (peak %.1f)",
		r.System, len(vips), r.Samples, r.P50, r.P99, r.Max, r.CPU, r.RSS, r.HWM)
}

// proc is a started program.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("%s's log ends:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// logTail logs the last n lines of p's log that hold what: what p did
// while it was measured.
func (p *proc) logTail(t *testing.T, what string, n int) {
	b, err := os.ReadFile(p.log)
	if err != nil {
		t.Logf("%s: %v", p.log, err)
		return
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, what) {
			lines = append(lines, l)
		}
	}
	t.Logf("%s: the last %d of %d lines with %q:\n%s", p.log, min(n, len(lines)), len(lines), what, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

// alive fails the test when p has exited.
func (p *proc) alive(t *testing.T) {
	select {
	case <-p.done:
		t.Fatalf("%s exited", p.log)
	default:
	}
}

func (p *proc) stop(t *testing.T) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu returns the process's user and system time in seconds.
func (p *proc) cpu(t *testing.T) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

// mem returns VmRSS and VmHWM in MB.
func (p *proc) mem(t *testing.T) (rss, hwm float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			switch f[0] {
			case "VmRSS:":
				rss = v / 1024
			case "VmHWM:":
				hwm = v / 1024
			}
		}
	}
	return rss, hwm
}

func sh(t *testing.T, script string) {
	if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// parallel runs f(0..n-1) on w workers.
func parallel(n, w int, f func(int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
