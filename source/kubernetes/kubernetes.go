// Package kubernetes is the Kubernetes source: vipd as the LoadBalancer
// implementation of a cluster. It watches Services, EndpointSlices and
// Nodes through the API server, gives each LoadBalancer Service it serves
// an address from its pools, writes that address into the Service's
// status, and hands the agent one virtual service per Service port and
// address.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	checkdesc "github.com/vipd/vipd/monitor/check"
	"github.com/vipd/vipd/source"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// The backend modes.
const (
	// BackendsNodePort balances to the Ready Nodes' internal addresses
	// at the Service port's nodePort; with externalTrafficPolicy Local,
	// only to Nodes that have a ready endpoint of the Service.
	BackendsNodePort = "nodeport"
	// BackendsEndpoints balances to the pods' addresses at their target
	// ports, from the EndpointSlices: for routed pod networks.
	BackendsEndpoints = "endpoints"
)

// Options configure the source: one [kubernetes] section.
type Options struct {
	// Kubeconfig is the path of a kubeconfig file; empty means the
	// in-cluster configuration (a pod's service account).
	Kubeconfig string `toml:"kubeconfig"`
	// LoadBalancerClass is the spec.loadBalancerClass of the Services
	// vipd serves.
	LoadBalancerClass string `toml:"load_balancer_class"`
	// DefaultClass makes vipd also serve the Services that have no
	// spec.loadBalancerClass: the cluster's default load balancer.
	DefaultClass bool `toml:"default_class"`
	// Namespaces restricts vipd to Services in these namespaces; empty
	// means every namespace.
	Namespaces []string `toml:"namespaces"`
	// ServiceSelector is a label selector ("app=web,tier!=db") a Service
	// must match to be served; empty means every Service.
	ServiceSelector string `toml:"service_selector"`
	// Backends is the backend mode of Services that do not pick one with
	// the vipd.io/backends annotation: "nodeport" (the default) or
	// "endpoints".
	Backends string `toml:"backends"`
	// Pools are the addresses vipd hands out.
	Pools []Pool `toml:"pool"`
	// MetalLBAnnotations reads MetalLB's Service annotations as vipd's
	// own (see metallb.go).
	MetalLBAnnotations bool `toml:"metallb_annotations"`
	// NoPacketFilter says that vipd keeps no packet-filter rules
	// ([daemon] manage_iptables off), so that nothing can enforce a
	// Service's source ranges: such a Service gets an Event, and the
	// agent does not serve it.
	NoPacketFilter bool `toml:"-"`

	// LeaderElection lets several vipd instances (an HA pair) serve one
	// cluster: they elect a leader through a Lease, and only the leader
	// allocates addresses and writes status and Events; every instance
	// publishes the Services at the addresses their status shows. Nil
	// means on; off, the one instance allocates and writes.
	LeaderElection *bool `toml:"leader_election"`
	// LeaseNamespace and LeaseName name the Lease (coordination.k8s.io);
	// the defaults are DefaultLeaseNamespace and DefaultLeaseName.
	LeaseNamespace string `toml:"lease_namespace"`
	LeaseName      string `toml:"lease_name"`
	// Identity is this instance's name in the Lease, unique among the
	// instances; the default is the hostname.
	Identity string `toml:"identity"`
	// LeaseDuration is how long the others wait after the leader's last
	// renewal before they take over (whole seconds); RenewDeadline how
	// long the leader tries to renew before it stops leading; RetryPeriod
	// how often each instance tries. Zero means DefaultLeaseDuration,
	// DefaultRenewDeadline and DefaultRetryPeriod.
	LeaseDuration time.Duration `toml:"lease_duration"`
	RenewDeadline time.Duration `toml:"renew_deadline"`
	RetryPeriod   time.Duration `toml:"retry_period"`

	// APIQPS and APIBurst are the client's rate limit on its requests to
	// the API server: a steady rate per second and a burst. Status
	// writes have one limiter, Events another, so that the Events of a
	// start never delay the statuses. Zero means DefaultAPIQPS and
	// DefaultAPIBurst.
	APIQPS   float64 `toml:"api_qps"`
	APIBurst int     `toml:"api_burst"`

	// NodeHealth, when not nil, probes the Nodes of nodeport-mode
	// Services as cloud load balancers do; nil probes nothing.
	NodeHealth *NodeHealth `toml:"-"`

	// Logger logs what the source does; nil discards.
	Logger *slog.Logger `toml:"-"`
}

// NodeHealth is how the source probes the Nodes that nodeport-mode
// Services balance to. A Service with externalTrafficPolicy Cluster has
// each Node probed at Port and Path (kube-proxy's health server: 10256,
// /healthz); one with Local at its spec.healthCheckNodePort, /healthz,
// where kube-proxy answers 200 while the Node has a ready endpoint of the
// Service and 503 when it has none. A probe passes on 200 alone. The
// probes of one Node are shared by every Service that asks the same of
// it. A Node that fails leaves the Service (removed, drained as any
// backend); when every Node fails, the Service keeps them all (quorum 1),
// for that is more likely the probe's fault than every Node's.
type NodeHealth struct {
	// Port is the health port of every Node for Cluster Services; zero
	// probes them not.
	Port uint16
	// Path is the request path at Port.
	Path string
	// Local probes Local Services at their healthCheckNodePort; without
	// it they are probed as Cluster ones.
	Local bool
	// Interval, Timeout, Rise and Fall are the probes' timing, as a
	// check's (zero: the health package's defaults).
	Interval, Timeout time.Duration
	Rise, Fall        int
}

// kubeProxyHealthzPath is where kube-proxy serves a Service's health at
// its healthCheckNodePort.
const kubeProxyHealthzPath = "/healthz"

// nodeHealthPolicy is what a failed Node probe does: the Node leaves the
// Service, unless every Node fails.
var nodeHealthPolicy = checkdesc.Policy{Action: checkdesc.Remove, Quorum: 1}

// check returns the probe of svc's Nodes, or nil when they are not
// probed: not in nodeport mode, no NodeHealth, or nothing to probe.
func (nh *NodeHealth) check(svc *corev1.Service, st settings) *checkdesc.Spec {
	if nh == nil || st.mode != BackendsNodePort {
		return nil
	}
	port, path := nh.Port, nh.Path
	if nh.Local && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && svc.Spec.HealthCheckNodePort > 0 &&
		svc.Spec.HealthCheckNodePort < 65536 {
		port, path = uint16(svc.Spec.HealthCheckNodePort), kubeProxyHealthzPath
	}
	if port == 0 {
		return nil
	}
	return &checkdesc.Spec{Kind: checkdesc.KindHTTP, Port: port, Interval: nh.Interval, Timeout: nh.Timeout, Rise: nh.Rise, Fall: nh.Fall,
		// The Node's Ready condition vouches for it until a probe says
		// otherwise, so that a restart of vipd keeps serving.
		Initial: checkdesc.Up,
		HTTP:    checkdesc.HTTPOptions{Path: path, Status: []checkdesc.StatusRange{{Lo: 200, Hi: 200}}}}
}

// The default rate limit of the requests to the API server: client-go's
// own (5 per second, bursts of 10) makes a start at 1,000 Services take
// minutes of status writes; these are kube-scheduler's.
const (
	DefaultAPIQPS   = 50
	DefaultAPIBurst = 100
)

// statusWorkers is how many status writes are in flight at once: a write
// is a round trip, so that one at a time could not reach the rate limit.
const statusWorkers = 8

// Source is the Kubernetes source.
type Source struct {
	opts     Options
	log      *slog.Logger
	selector labels.Selector
	pools    []Pool
	// wrap, when set, wraps the transport to the API server (tests).
	wrap func(http.RoundTripper) http.RoundTripper
	// client, when set, is the API server's client, in place of the
	// kubeconfig's (tests: client-go's fake clientset).
	client clientset.Interface
	// fullSyncs counts the full syncs (tests).
	fullSyncs atomic.Int64
	// poolsMu guards nextPools, the pools SetPools hands the running
	// source, which its loop takes at its next sync; repool wakes it.
	poolsMu   sync.Mutex
	nextPools []Pool
	repool    chan struct{}
	// counts are the pools' addresses after the last full sync
	// (EachPool), guarded by poolsMu.
	counts []PoolCount
}

// New validates opts and returns a source; nothing reaches the API
// server before Run.
func New(opts Options) (*Source, error) {
	s := &Source{opts: opts, log: opts.Logger, pools: opts.Pools, repool: make(chan struct{}, 1)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if opts.LoadBalancerClass == "" && !opts.DefaultClass {
		return nil, errors.New("kubernetes: serves no Service: set load_balancer_class, or default_class = true")
	}
	switch opts.Backends {
	case "":
		s.opts.Backends = BackendsNodePort
	case BackendsNodePort, BackendsEndpoints:
	default:
		return nil, fmt.Errorf("kubernetes: backends %q must be %q or %q", opts.Backends, BackendsNodePort, BackendsEndpoints)
	}
	sel, err := labels.Parse(opts.ServiceSelector)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: service_selector: %w", err)
	}
	s.selector = sel
	if len(opts.Pools) == 0 {
		return nil, errors.New("kubernetes: no pools: add a [[kubernetes.pool]]")
	}
	if _, err := NewAllocator(opts.Pools); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	if nh := opts.NodeHealth; nh != nil {
		probe := (&NodeHealth{Port: 1, Path: nh.Path, Interval: nh.Interval, Timeout: nh.Timeout, Rise: nh.Rise, Fall: nh.Fall}).
			check(&corev1.Service{}, settings{mode: BackendsNodePort})
		if err := probe.Validate(); err != nil {
			return nil, fmt.Errorf("kubernetes: node_health: %w", err)
		}
	}
	if err := s.leaseDefaults(); err != nil {
		return nil, err
	}
	if s.opts.APIQPS == 0 {
		s.opts.APIQPS = DefaultAPIQPS
	}
	if s.opts.APIBurst == 0 {
		s.opts.APIBurst = DefaultAPIBurst
	}
	if !(s.opts.APIQPS > 0) || s.opts.APIBurst < 0 {
		return nil, fmt.Errorf("kubernetes: api_qps %v and api_burst %d must be positive", s.opts.APIQPS, s.opts.APIBurst)
	}
	return s, nil
}

// Name returns "kubernetes".
func (s *Source) Name() string { return "kubernetes" }

// SetPools hands the source new pools, which a running source applies at
// once, without a restart: each Service keeps the addresses it holds that
// are still in a pool for it, a Service whose address left the pools gets
// another (or waits, with an Event saying why), and Services that wait
// for an address get one from the new space. It refuses pools that New
// would refuse, and changes nothing then.
func (s *Source) SetPools(pools []Pool) error {
	if len(pools) == 0 {
		return errors.New("kubernetes: no pools: add a [[kubernetes.pool]]")
	}
	if _, err := NewAllocator(pools); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	s.poolsMu.Lock()
	s.nextPools = slices.Clone(pools)
	s.poolsMu.Unlock()
	select {
	case s.repool <- struct{}{}:
	default:
	}
	return nil
}

// EachPool calls f with the addresses of each pool and family, as the
// last full sync left them: total (those it may hand out), in use and
// free. It calls f for none before the first.
func (s *Source) EachPool(f func(pool, family string, total, inUse, free float64)) {
	s.poolsMu.Lock()
	counts := s.counts
	s.poolsMu.Unlock()
	for _, c := range counts {
		f(c.Pool, c.Family, c.Total, c.InUse, c.Free)
	}
}

// takePools makes the pools SetPools handed over the source's, and
// reports whether there were any.
func (s *Source) takePools() bool {
	s.poolsMu.Lock()
	defer s.poolsMu.Unlock()
	if s.nextPools == nil {
		return false
	}
	s.pools, s.nextPools = s.nextPools, nil
	return true
}

// restConfig loads the kubeconfig, or the in-cluster configuration.
func (s *Source) restConfig() (*rest.Config, error) {
	if s.opts.Kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: in-cluster configuration (set kubeconfig when vipd runs outside the cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.opts.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: kubeconfig %s: %w", s.opts.Kubeconfig, err)
	}
	return cfg, nil
}

// Run watches the API server until ctx ends, publishing to sink the
// services of every LoadBalancer Service it serves. It publishes nothing
// before its caches are in sync, so that a start never withdraws
// services. It returns an error only when it cannot start.
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	var cfg *rest.Config
	var cs, events clientset.Interface
	var g *gate
	if s.client != nil {
		cfg, cs, events = &rest.Config{Host: "(client)"}, s.client, s.client
	} else {
		c, err := s.restConfig()
		if err != nil {
			return err
		}
		cfg = rest.CopyConfig(c)
		cfg.UserAgent = "vipd"
		cfg.QPS, cfg.Burst = float32(s.opts.APIQPS), s.opts.APIBurst
		if s.wrap != nil {
			cfg.Wrap(s.wrap)
		}
		// The informers', the probe's and the status writes' client is
		// behind the gate; the events' and the election's are not.
		g = newGate()
		gcfg := rest.CopyConfig(cfg)
		gcfg.Wrap(g.wrap)
		if cs, err = clientset.NewForConfig(gcfg); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		// Events have a client, and so a rate limiter, of their own.
		if events, err = clientset.NewForConfig(cfg); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
	}
	alloc, err := NewAllocator(s.pools)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if g != nil {
		rc := cs.Discovery().RESTClient()
		g.start(ctx, func(ctx context.Context) { _ = rc.Get().AbsPath("/readyz").Do(ctx).Error() })
	}

	ns := metav1.NamespaceAll
	if len(s.opts.Namespaces) == 1 {
		ns = s.opts.Namespaces[0]
	}
	svcFactory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.opts.ServiceSelector }))
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	svcInf := svcFactory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	nodeInf := factory.Core().V1().Nodes()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: events.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "vipd"})

	c := &controller{
		s: s, cs: cs, host: cfg.Host, sink: sink, alloc: alloc, recorder: recorder,
		services: svcInf.Lister(), slices: sliceInf.Lister(), nodes: nodeInf.Lister(),
		dirty:    make(chan struct{}, 1),
		watchErr: make(chan error, 1),
		events:   map[string]string{},
		written:  map[string]bool{},
		lastGood: map[string]settings{},
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.pokeAll() },
		UpdateFunc: func(any, any) { c.pokeAll() },
		DeleteFunc: func(any) { c.pokeAll() },
	}
	// A change of EndpointSlices alone touches their Services alone.
	sliceHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.pokeSlice(obj) },
		UpdateFunc: func(old, obj any) { c.pokeSlice(old); c.pokeSlice(obj) },
		DeleteFunc: func(obj any) { c.pokeSlice(obj) },
	}
	sliceInformer := sliceInf.Informer()
	if err := sliceInformer.AddIndexers(cache.Indexers{byService: sliceService}); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	c.sliceIndex = sliceInformer.GetIndexer()
	c.serviceGet = svcInf.Lister()
	// A change of a Service's status alone (the echo of vipd's own
	// write, as the leader writes a thousand at a start) is checked
	// against the addresses held, not synced in full.
	serviceHandler := handler
	serviceHandler.UpdateFunc = c.pokeService
	for i, inf := range []cache.SharedIndexInformer{svcInf.Informer(), sliceInformer, nodeInf.Informer()} {
		h := handler
		switch i {
		case 0:
			h = serviceHandler
		case 1:
			h = sliceHandler
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			select {
			case c.watchErr <- err:
			default:
			}
		}); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
	}
	svcFactory.Start(ctx.Done())
	factory.Start(ctx.Done())
	defer svcFactory.Shutdown()
	defer factory.Shutdown()

	s.log.Info("kubernetes: waiting for the caches", "server", cfg.Host)
	synced := []cache.InformerSynced{svcInf.Informer().HasSynced, sliceInf.Informer().HasSynced, nodeInf.Informer().HasSynced}
	if !c.waitSynced(ctx, synced) {
		return nil
	}
	if !s.opts.electing() {
		c.lead = ctx
		return c.loop(ctx, nil)
	}
	// The election starts once the caches are in sync (an instance that
	// cannot see the cluster must not lead it), and ends after the loop,
	// whose writes then are over: giving the Lease up is safe. It has a
	// client of its own, so that a burst of status writes, held back by
	// the client's rate limit, never delays a renewal.
	ecs := cs
	if s.client == nil {
		ecfg := rest.CopyConfig(cfg)
		ecfg.UserAgent = "vipd-leader-election"
		if ecs, err = clientset.NewForConfig(ecfg); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
	}
	electCtx, stopElect := context.WithCancel(context.Background())
	elected := make(chan context.Context)
	electDone := make(chan struct{})
	go func() {
		defer close(electDone)
		c.elect(electCtx, ecs, elected)
	}()
	defer func() {
		stopElect()
		<-electDone
	}()
	return c.loop(ctx, elected)
}
