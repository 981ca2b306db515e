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
	"maps"
	"net/http"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/health"
	"github.com/vipd/vipd/source"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
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

// ReasonConflict is the reason of the Event on a Service whose virtual
// service the agent refused because another source owns its key or name.
const ReasonConflict = "Conflict"

// ReasonNoNodePorts is the reason of the Event on a Service in nodeport
// mode that has a port without a nodePort (spec.allocateLoadBalancerNodePorts
// false): that port gets no backends.
const ReasonNoNodePorts = "NoNodePorts"

// ReasonPortChange is the reason of the Event on a Service forwarded with
// droute or tunnel whose endpoints listen on another port than the
// Service's: those endpoints are left out, for those methods cannot
// change the port.
const ReasonPortChange = "PortChange"

// ReasonSNATUnavailable is the reason of the Event on a Service that asks
// for SNAT (vipd.io/snat, or its pool's snat) when vipd keeps no
// packet-filter rules ([daemon] manage_iptables off): nothing could do
// the SNAT, so the Service is not served rather than served with replies
// that bypass vipd.
const ReasonSNATUnavailable = "SNATUnavailable"

// ReasonSourceRangesUnenforceable is the reason of the Event on a Service
// with source ranges when vipd keeps no packet-filter rules ([daemon]
// manage_iptables off): nothing could enforce them, so the Service is not
// served rather than served to every source.
const ReasonSourceRangesUnenforceable = "SourceRangesUnenforceable"

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
var nodeHealthPolicy = health.Policy{Action: health.Remove, Quorum: 1}

// check returns the probe of svc's Nodes, or nil when they are not
// probed: not in nodeport mode, no NodeHealth, or nothing to probe.
func (nh *NodeHealth) check(svc *corev1.Service, st settings) *health.Spec {
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
	return &health.Spec{Kind: health.KindHTTP, Port: port, Interval: nh.Interval, Timeout: nh.Timeout, Rise: nh.Rise, Fall: nh.Fall,
		// The Node's Ready condition vouches for it until a probe says
		// otherwise, so that a restart of vipd keeps serving.
		Initial: health.Up,
		HTTP:    health.HTTPOptions{Path: path, Status: []health.StatusRange{{Lo: 200, Hi: 200}}}}
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

// ReloadPools hands the source the [[kubernetes.pool]] tables of k, as
// SetPools does: a reload of the configuration calls it.
func (s *Source) ReloadPools(k config.Kubernetes) error { return s.SetPools(PoolsOf(k)) }

// PoolsOf returns the pools of k's [[kubernetes.pool]] tables.
func PoolsOf(k config.Kubernetes) []Pool {
	var out []Pool
	for _, p := range k.Pools {
		auto := p.AutoAssign
		out = append(out, Pool{Name: p.Name, Addresses: p.Addresses, AutoAssign: &auto,
			AvoidNetworkBroadcast: p.AvoidNetworkBroadcast, Namespaces: p.Namespaces, ServiceSelector: p.ServiceSelector,
			ShareAcrossNamespaces: p.ShareAcrossNamespaces, SNAT: p.SNAT})
	}
	return out
}

// NodeHealthOf returns the Node probes of k's [kubernetes.node_health]
// table, nil when it turns them off.
func NodeHealthOf(k config.Kubernetes) *NodeHealth {
	nh := k.NodeHealth
	if !nh.Enabled {
		return nil
	}
	return &NodeHealth{Port: nh.Port, Path: nh.Path, Local: nh.Local, Interval: nh.Interval, Timeout: nh.Timeout,
		Rise: nh.Rise, Fall: nh.Fall}
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
		if cs, err = clientset.NewForConfig(cfg); err != nil {
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

// waitSynced waits until the caches are in sync, reporting why not while
// the API server cannot be reached. It returns false when ctx ends.
func (c *controller) waitSynced(ctx context.Context, synced []cache.InformerSynced) bool {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	var lost error
	for {
		if !slices.ContainsFunc(synced, func(f cache.InformerSynced) bool { return !f() }) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		case err := <-c.watchErr:
			c.lose(fmt.Errorf("kubernetes: watch: %w", err), &lost)
		case <-probe.C:
			if err := c.probe(ctx); err != nil && ctx.Err() == nil {
				c.lose(err, &lost)
			}
		}
	}
}

// probe asks the API server whether it is ready. A client without a REST
// client (client-go's fake) cannot be asked.
func (c *controller) probe(ctx context.Context) error {
	rc := c.cs.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeEvery)
	defer cancel()
	if err := rc.Get().AbsPath("/readyz").Do(pctx).Error(); err != nil {
		return fmt.Errorf("kubernetes: API server %s: %w", c.host, err)
	}
	return nil
}

// controller is the running source.
type controller struct {
	s        *Source
	cs       clientset.Interface
	host     string
	sink     source.Sink
	alloc    *Allocator
	recorder record.EventRecorder
	services interface {
		List(labels.Selector) ([]*corev1.Service, error)
	}
	slices interface {
		List(labels.Selector) ([]*discoveryv1.EndpointSlice, error)
	}
	nodes interface {
		List(labels.Selector) ([]*corev1.Node, error)
	}

	// dirty says that something changed since the last sync.
	dirty chan struct{}
	// mu guards touched and all, which the informers' handlers set:
	// touched holds the Services whose EndpointSlices changed, and all
	// says that something else changed (a Service, a Node), which needs
	// a full sync.
	mu      sync.Mutex
	touched map[string]bool
	all     bool
	// statuses holds the Services whose status alone changed.
	statuses map[string]bool
	// sliceIndex holds the EndpointSlices by Service (byService), and
	// serviceGet the Services, for a sync of a few Services.
	sliceIndex cache.Indexer
	serviceGet interface {
		Services(string) listerscorev1.ServiceNamespaceLister
	}
	// watchErr carries watch failures to the loop.
	watchErr chan error

	// lead is the context of this instance's term as leader, which ends
	// when the term does; nil while it follows. Status writes use it, so
	// that none is made after the Lease is lost.
	lead context.Context
	// restored says that the leader took the addresses back from the
	// statuses in this term.
	restored bool
	// status writes the statuses of the leader's term in the background.
	status *statusWriter
	// events holds the message of the last warning Event of each Service
	// (by "KEY address" and "KEY settings"), so that a lasting problem
	// makes one Event, not one per sync.
	events map[string]string
	// written holds the Services whose status vipd wrote.
	written map[string]bool
	// lastGood holds each Service's last valid settings.
	lastGood map[string]settings
	// published is the last snapshot the sink took, and conflicts the
	// refusals it answered.
	published *source.Snapshot
	conflicts map[string]string
	// spare is the Services of the snapshot before the published one,
	// which the sink no longer holds: syncSlices fills it in place of
	// allocating the next snapshot's (at 10,000 Services, collecting a
	// copy per update costs more than making it).
	spare []lb.VirtualService
}

func (c *controller) poke() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// pokeAll asks for a full sync: a Service or a Node changed.
func (c *controller) pokeAll() {
	c.mu.Lock()
	c.all = true
	c.mu.Unlock()
	c.poke()
}

// pokeService asks for a full sync when a Service changed, unless only its
// status did: then for a check of that status (see statusesHeld).
func (c *controller) pokeService(old, obj any) {
	o, ok := old.(*corev1.Service)
	n, ok2 := obj.(*corev1.Service)
	if !ok || !ok2 || !statusOnly(o, n) {
		c.pokeAll()
		return
	}
	c.mu.Lock()
	if c.statuses == nil {
		c.statuses = map[string]bool{}
	}
	c.statuses[n.Namespace+"/"+n.Name] = true
	c.mu.Unlock()
	c.poke()
}

// statusOnly reports whether a Service changed from o to n in its status
// alone: what vipd reads of a Service besides its status is its spec, its
// labels and annotations, and whether it is being deleted.
func statusOnly(o, n *corev1.Service) bool {
	return o.Generation == n.Generation && o.DeletionTimestamp.Equal(n.DeletionTimestamp) &&
		maps.Equal(o.Labels, n.Labels) && maps.Equal(o.Annotations, n.Annotations) &&
		slices.Equal(o.Finalizers, n.Finalizers) && equality.Semantic.DeepEqual(o.Spec, n.Spec)
}

// statusesHeld reports whether the statuses of the Services of keys say
// what this instance holds, so that their change needs no sync: only when
// it leads, and has taken the addresses back from the statuses in this
// term (a follower takes its addresses from the statuses, on a full sync).
func (c *controller) statusesHeld(keys []string) bool {
	if !c.leading() || !c.restored {
		return len(keys) == 0
	}
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		svc, err := c.serviceGet.Services(ns).Get(name)
		if err != nil || !sameAddrs(statusAddrs(svc), c.alloc.Held(key)) {
			return false
		}
	}
	return true
}

// pokeSlice asks for a sync of the Service of the EndpointSlice obj.
func (c *controller) pokeSlice(obj any) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		// A tombstone: the slice was deleted while the watch was down.
		c.pokeAll()
		return
	}
	key, _ := sliceService(es)
	c.mu.Lock()
	if len(key) > 0 {
		if c.touched == nil {
			c.touched = map[string]bool{}
		}
		c.touched[key[0]] = true
	}
	c.mu.Unlock()
	c.poke()
}

// takeTouched returns, and forgets, the Services whose EndpointSlices
// changed since the last call, those whose status alone changed, and
// whether anything else changed.
func (c *controller) takeTouched() (keys, statuses []string, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys, statuses, all = slices.Sorted(maps.Keys(c.touched)), slices.Sorted(maps.Keys(c.statuses)), c.all
	c.touched, c.statuses, c.all = nil, nil, false
	return keys, statuses, all
}

// byService names the index of the EndpointSlices by their Service's key.
const byService = "service"

// sliceService is the index function of byService.
func sliceService(obj any) ([]string, error) {
	es, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := es.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{es.Namespace + "/" + name}, nil
}

// probeEvery is how often the source asks the API server whether it is
// ready: client-go's watches retry a refused connection silently, so a
// stopped API server shows only here.
const probeEvery = 3 * time.Second

// leading reports whether this instance holds the Lease (or elects no
// leader).
func (c *controller) leading() bool { return c.lead != nil && c.lead.Err() == nil }

// loop syncs after every change until ctx ends, and reports whether the
// source is in step with the API server. Each term of leadership comes
// from elected.
func (c *controller) loop(ctx context.Context, elected <-chan context.Context) error {
	const retry = 2 * time.Second
	timer := time.NewTimer(0)
	defer timer.Stop()
	probe := time.NewTicker(probeEvery)
	defer probe.Stop()
	c.sink.Report(nil)
	c.status = newStatusWriter(c.writeStatus)
	defer c.status.stop()
	if c.lead != nil {
		c.status.begin(ctx, c.lead)
	}
	var lost error
	for {
		// full says that this round syncs everything: only a change of
		// EndpointSlices alone lets it sync the Services they touch.
		full := true
		var termEnd <-chan struct{}
		if c.lead != nil {
			termEnd = c.lead.Done()
		}
		select {
		case <-ctx.Done():
			return nil
		case term := <-elected:
			c.s.log.Info("kubernetes: leading: allocating addresses and writing status", "identity", c.s.opts.Identity)
			c.lead = term
			c.status.begin(ctx, term)
			// Take the addresses back from the statuses, as at a start,
			// and say again what is wrong.
			c.restored = false
			clear(c.events)
			c.conflicts = nil
		case <-termEnd:
			if ctx.Err() != nil {
				return nil
			}
			c.s.log.Warn("kubernetes: lost the lease: following, from the statuses", "identity", c.s.opts.Identity)
			c.lead = nil
			// The writes of the term are dropped: the next leader takes
			// its addresses from the statuses, and so does this
			// instance should it lead again.
			c.status.end()
		case <-c.dirty:
			full = false
		case <-c.s.repool:
			// New pools: a full sync applies them.
		case <-c.status.ready:
			if c.statusResults() {
				timer.Reset(retry)
			}
			continue
		case <-timer.C:
		case err := <-c.watchErr:
			c.lose(fmt.Errorf("kubernetes: watch: %w", err), &lost)
			continue
		case <-probe.C:
			err := c.probe(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				c.lose(err, &lost)
				continue
			}
			if lost == nil {
				continue
			}
			// The informers relist on their own once the server is
			// back; sync in case they missed nothing.
			c.s.log.Info("kubernetes: API server back", "after", lost)
			lost = nil
			c.sink.Report(nil)
		}
		keys, statuses, all := c.takeTouched()
		all = all || !c.statusesHeld(statuses)
		again, synced, err := false, false, error(nil)
		if !full && !all {
			again, synced, err = c.syncSlices(ctx, keys)
		}
		if !synced && err == nil {
			again, err = c.sync(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.s.log.Warn("kubernetes: sync failed; retrying", "err", err)
			again = true
		}
		if again {
			timer.Reset(retry)
		}
	}
}

// lose reports that the source is out of step, once per error.
func (c *controller) lose(err error, lost *error) {
	if *lost != nil && (*lost).Error() == err.Error() {
		return
	}
	*lost = err
	c.s.log.Warn("kubernetes: out of step with the API server; the last state stays programmed", "err", err)
	c.sink.Report(err)
}

// served reports whether vipd serves svc.
func (c *controller) served(svc *corev1.Service) bool {
	o := &c.s.opts
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	if len(o.Namespaces) > 1 && !slices.Contains(o.Namespaces, svc.Namespace) {
		return false
	}
	if !c.s.selector.Matches(labels.Set(svc.Labels)) {
		return false
	}
	if svc.Spec.LoadBalancerClass == nil {
		return o.DefaultClass
	}
	return o.LoadBalancerClass != "" && *svc.Spec.LoadBalancerClass == o.LoadBalancerClass
}

func keyOf(svc *corev1.Service) string { return svc.Namespace + "/" + svc.Name }

// statusAddrs returns the addresses of svc's status.
func statusAddrs(svc *corev1.Service) []netip.Addr {
	var out []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if a, err := netip.ParseAddr(in.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// sync brings allocation, status and the published snapshot in line with
// the caches, and queues the status writes of the leader (statusWriter).
// It returns true when something should be tried again later: a publish
// that failed, a refused service. A status write that fails asks for
// its retry when its result comes back (statusResults).
func (c *controller) sync(ctx context.Context) (bool, error) {
	c.s.fullSyncs.Add(1)
	all, err := c.services.List(labels.Everything())
	if err != nil {
		return false, err
	}
	// Oldest first, so that on a restart an address two statuses claim
	// stays with the older Service.
	slices.SortFunc(all, func(a, b *corev1.Service) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(keyOf(a), keyOf(b))
	})
	var served []*corev1.Service
	present := map[string]*corev1.Service{}
	for _, svc := range all {
		present[keyOf(svc)] = svc
		if c.served(svc) {
			served = append(served, svc)
		}
	}
	leading := c.leading()
	repooled := c.s.takePools()
	if !leading || !c.restored {
		if err := c.restore(served, leading); err != nil {
			return false, err
		}
		c.restored = leading
	} else if repooled {
		if err := c.reallocate(served); err != nil {
			return false, err
		}
	}

	// Services no longer served: release their addresses, clear the
	// status vipd wrote.
	servedKeys := map[string]bool{}
	for _, svc := range served {
		servedKeys[keyOf(svc)] = true
	}
	for _, key := range slices.Sorted(maps.Keys(c.written)) {
		if servedKeys[key] {
			continue
		}
		c.alloc.Release(key)
		delete(c.lastGood, key)
		for _, what := range warnings {
			delete(c.events, key+" "+what)
		}
		svc := present[key]
		if !leading {
			// The leader clears the status; should this instance lead
			// before it has, it will.
			if svc == nil || len(svc.Status.LoadBalancer.Ingress) == 0 {
				delete(c.written, key)
			}
			continue
		}
		if svc == nil {
			// Deleted, or out of the selector: get it to be sure.
			got, err := c.cs.CoreV1().Services(strings.SplitN(key, "/", 2)[0]).Get(ctx, strings.SplitN(key, "/", 2)[1], metav1.GetOptions{})
			if err != nil {
				c.status.forget(key)
				delete(c.written, key)
				continue
			}
			svc = got
		}
		// The status is cleared through the status writer, as it is
		// written: one writer per Service keeps its writes in order, and
		// releasing thousands of Services (a change of class) does not
		// hold the loop up either. The Service stays written until the
		// clear lands (statusResults), or until no write of it, in
		// flight or not yet echoed, can still put an address there.
		if len(svc.Status.LoadBalancer.Ingress) > 0 || c.status.unsettled(key, svc) {
			c.status.want(key, svc, nil)
			continue
		}
		c.status.forget(key)
		delete(c.written, key)
	}
	// Addresses in the status of Services vipd does not serve (another
	// load balancer's, or its own from before a restart that vipd could
	// not clear) are never handed out.
	foreign := map[netip.Addr]string{}
	for _, svc := range all {
		if !servedKeys[keyOf(svc)] && !c.written[keyOf(svc)] {
			for _, a := range statusAddrs(svc) {
				foreign[a] = keyOf(svc)
			}
		}
	}
	c.alloc.SetForeign(foreign)
	// Services that vanished before vipd wrote their status.
	for _, key := range c.alloc.keys() {
		if !servedKeys[key] {
			c.alloc.Release(key)
		}
	}

	snap := source.Snapshot{}
	idx := c.indexSlices()
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return false, err
	}
	if leading {
		c.assign(served)
	}
	counts := c.alloc.counts()
	c.s.poolsMu.Lock()
	c.s.counts = counts
	c.s.poolsMu.Unlock()
	for _, svc := range served {
		key := keyOf(svc)
		held := c.alloc.Held(key)
		if len(held) == 0 {
			// Served but given nothing (refused, or what its status
			// shows no longer fits): the status must not show an
			// address vipd does not serve to it.
			if leading && c.written[key] && (len(svc.Status.LoadBalancer.Ingress) > 0 || c.status.unsettled(key, svc)) {
				c.status.want(key, svc, nil)
			}
			continue
		}
		if leading {
			// Queued unless the status, or a write queued or made,
			// says so already.
			c.status.want(key, svc, held)
		}
		c.written[key] = true
		st, serr := c.settingsOf(svc)
		c.warn(svc, "settings", serr)
		c.warn(svc, "nodeports", noNodePorts(svc, st))
		vss, hs := c.servicesOf(svc, held, st, nodes, idx[key])
		for _, vs := range vss {
			if h, ok := hs[vs.Name]; ok {
				if snap.Health == nil {
					snap.Health = map[string]config.ServiceHealth{}
				}
				snap.Health[vs.Name] = h
			}
		}
		snap.Services = append(snap.Services, vss...)
	}
	slices.SortFunc(snap.Services, func(a, b lb.VirtualService) int { return strings.Compare(a.Name, b.Name) })
	// The statuses are written in the background (statusWriter): the
	// data plane need not wait for the API server to take thousands of
	// status writes at a start, nor an EndpointSlice change after it.
	var conflicts []source.Conflict
	if c.published == nil || !reflect.DeepEqual(*c.published, snap) || len(c.conflicts) > 0 {
		conflicts, err = c.sink.Publish(ctx, snap)
		c.spare = nil
		if err != nil {
			return true, fmt.Errorf("publish: %w", err)
		}
		c.published = &snap
		c.noteConflicts(present, conflicts)
	}
	// The sink takes a refused service at a later Publish, once its owner
	// lets go of it: ask again.
	return len(conflicts) > 0, nil
}

// assign gives each served Service (oldest first) the addresses it asks
// for, and warns of what it cannot get. An address that a Service lets go
// of while it keeps others (a change of its ipFamilyPolicy, its pool or
// its request) goes to an older Service that waits for one in a second
// pass; a Service deleted lets go of its addresses before the first.
func (c *controller) assign(served []*corev1.Service) {
	errs := make([]error, len(served))
	for pass := 0; pass < 2; pass++ {
		waiting, released := false, false
		for i, svc := range served {
			key := keyOf(svc)
			before := c.alloc.Held(key)
			w, err := wantOf(c.asked(svc))
			if err == nil {
				_, err = c.alloc.Assign(key, w)
			}
			errs[i] = err
			after := c.alloc.Held(key)
			released = released || waiting && slices.ContainsFunc(before, func(a netip.Addr) bool { return !slices.Contains(after, a) })
			waiting = waiting || err != nil
		}
		if !released {
			break
		}
	}
	for i, svc := range served {
		c.warn(svc, "address", errs[i])
	}
}

// syncSlices brings the published snapshot in line with the
// EndpointSlices of the Services of keys, when nothing but EndpointSlices
// changed since the last sync: it maps those Services alone, and
// publishes the last snapshot with their virtual services replaced,
// naming the ones that changed (source.Snapshot.Changed), so that the
// work of an update does not grow with the number of Services. synced is
// false when it cannot, having published nothing: before the first full
// sync, while refusals wait, or when a Service is health checked or its
// virtual services are not the ones published; the caller then runs a
// full sync (sync), which is always right.
func (c *controller) syncSlices(ctx context.Context, keys []string) (again, synced bool, err error) {
	if c.published == nil || len(c.conflicts) > 0 {
		return false, false, nil
	}
	if len(keys) == 0 {
		return false, true, nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return false, false, err
	}
	services := c.published.Services
	var out []lb.VirtualService
	var changed []string
	present := map[string]*corev1.Service{}
	for _, key := range keys {
		ns, name, _ := strings.Cut(key, "/")
		svc, err := c.serviceGet.Services(ns).Get(name)
		if err != nil || !c.served(svc) {
			// Gone or not served: the change of the Service asks for a
			// full sync of its own.
			continue
		}
		lo, hi := nameRange(services, key)
		held := c.alloc.Held(key)
		st, _ := c.settingsOf(svc)
		var vss []lb.VirtualService
		var hs map[string]config.ServiceHealth
		if len(held) > 0 {
			vss, hs = c.servicesOf(svc, held, st, nodes, c.slicesOf(key))
		}
		if hi-lo != len(vss) {
			return false, false, nil
		}
		for k := range vss {
			if services[lo+k].Name != vss[k].Name {
				return false, false, nil
			}
			// A change of a checked service's checks (a Node that comes
			// or goes) takes a full sync, which hands the checker its
			// targets.
			h, ok := hs[vss[k].Name]
			was, wasOK := c.published.Health[vss[k].Name]
			if ok != wasOK || ok && !reflect.DeepEqual(h, was) {
				return false, false, nil
			}
			if reflect.DeepEqual(services[lo+k], vss[k]) {
				continue
			}
			if out == nil {
				out = append(c.spare[:0], services...)
			}
			out[lo+k] = vss[k]
			changed = append(changed, vss[k].Name)
		}
		present[key] = svc
	}
	if len(changed) == 0 {
		return false, true, nil
	}
	snap := source.Snapshot{Services: out, Health: c.published.Health, Changed: changed}
	conflicts, err := c.sink.Publish(ctx, snap)
	c.spare = nil
	if err != nil {
		return true, true, fmt.Errorf("publish: %w", err)
	}
	c.spare = services
	c.published = &snap
	c.noteConflicts(present, conflicts)
	return len(conflicts) > 0, true, nil
}

// nameRange returns where the virtual services of the Service of key are
// in services, sorted by name: [lo, hi).
func nameRange(services []lb.VirtualService, key string) (lo, hi int) {
	prefix := "k8s/" + key + "/"
	lo, _ = slices.BinarySearchFunc(services, prefix, func(vs lb.VirtualService, p string) int { return strings.Compare(vs.Name, p) })
	hi = lo
	for hi < len(services) && strings.HasPrefix(services[hi].Name, prefix) {
		hi++
	}
	return lo, hi
}

// slicesOf returns the EndpointSlices of the Service of key.
func (c *controller) slicesOf(key string) []*discoveryv1.EndpointSlice {
	objs, _ := c.sliceIndex.ByIndex(byService, key)
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, es)
		}
	}
	return out
}

// warnings are the subjects of a Service's warning Events, one lasting
// warning each: see warn.
var warnings = []string{"address", "settings", "nodeports", "ports", "source-ranges", "snat"}

// noNodePorts returns an error when svc is in nodeport mode and has a
// port without a nodePort, as spec.allocateLoadBalancerNodePorts false
// leaves them: that port gets no backends.
func noNodePorts(svc *corev1.Service, st settings) error {
	if st.mode != BackendsNodePort {
		return nil
	}
	var missing []string
	for _, p := range svc.Spec.Ports {
		if p.NodePort == 0 {
			name := p.Name
			if name == "" {
				name = strconv.Itoa(int(p.Port))
			}
			missing = append(missing, fmt.Sprintf("%s/%s", name, strings.ToLower(string(p.Protocol))))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	why := "it has no nodePort"
	if a := svc.Spec.AllocateLoadBalancerNodePorts; a != nil && !*a {
		why = "spec.allocateLoadBalancerNodePorts is false and it has no nodePort"
	}
	return allocErrorf(ReasonNoNodePorts, "port %s gets no backends in nodeport mode: %s (set %s: %s, or give it a nodePort)",
		strings.Join(missing, ", "), why, AnnotationBackends, BackendsEndpoints)
}

// keepPorts leaves out of vss the backends that droute or tunnel
// forwarding would reach at the wrong port (an endpoint that listens on
// another port than the Service's), and returns an error naming the
// first, with the file's message.
func keepPorts(vss []lb.VirtualService) error {
	var first error
	for i := range vss {
		vs := &vss[i]
		vs.Backends = slices.DeleteFunc(vs.Backends, func(d lb.Destination) bool {
			if d.Forward == lb.Masq || d.Addr.Port() == vs.Service.Key.Port {
				return false
			}
			if first == nil {
				first = allocErrorf(ReasonPortChange, "%s: %s forwarding cannot change the port (%d to %d): the backend sees the VIP's packet unchanged; endpoint %s left out",
					AnnotationForwarding, d.Forward, vs.Service.Key.Port, d.Addr.Port(), d.Addr)
			}
			return true
		})
	}
	return first
}

// servicesOf returns the virtual services of svc at the addresses it
// holds, with the health checking of those that have any, and warns of
// what it leaves out.
func (c *controller) servicesOf(svc *corev1.Service, held []netip.Addr, st settings, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) ([]lb.VirtualService, map[string]config.ServiceHealth) {
	vss := virtualServices(svc, held, st, nodes, eps)
	c.warn(svc, "ports", keepPorts(vss))
	c.warn(svc, "source-ranges", c.sourceRangesErr(svc))
	snat := false
	for i := range vss {
		vs := &vss[i]
		on := c.alloc.snat(vs.VIP)
		if st.snat != nil {
			on = *st.snat
		}
		// A pool's snat is for the Services that forward with masq:
		// direct routing and tunnels never see the replies.
		vs.SNAT = on && st.forward == lb.Masq
		snat = snat || vs.SNAT
	}
	if snat && c.s.opts.NoPacketFilter {
		c.warn(svc, "snat", allocErrorf(ReasonSNATUnavailable,
			"the Service asks for SNAT, and vipd keeps no packet-filter rules to do it ([daemon] manage_iptables is off): it is not served"))
		return nil, nil
	}
	c.warn(svc, "snat", nil)
	check, policy := st.check, health.Policy{}
	if check == nil {
		check, policy = c.s.opts.NodeHealth.check(svc, st), nodeHealthPolicy
	}
	if check == nil {
		return vss, nil
	}
	hs := make(map[string]config.ServiceHealth, len(vss))
	for _, vs := range vss {
		h := config.ServiceHealth{Policy: policy, Checks: make(map[netip.AddrPort]health.Spec, len(vs.Backends))}
		for _, b := range vs.Backends {
			h.Checks[b.Addr] = *check
		}
		hs[vs.Name] = h
	}
	return vss, hs
}

// settings are a Service's choices that are not about its address.
type settings struct {
	mode      string
	scheduler string
	flags     lb.SchedFlags
	// forward is the forwarding method of every backend.
	forward lb.Forward
	// check is the health check of every backend, from vipd.io/check.
	check *health.Spec
	// snat, from vipd.io/snat, says whether traffic to the backends
	// comes from the load balancer's address; nil leaves it to the pool.
	snat *bool
}

// settingsOf returns svc's backend mode and scheduler, from its
// annotations and the defaults. With a bad annotation it returns the
// Service's last valid settings (the defaults when it had none, as after
// a restart) and the error.
func (c *controller) settingsOf(svc *corev1.Service) (settings, error) {
	key := keyOf(svc)
	st, err := parseSettings(svc, c.s.opts.Backends)
	if err != nil {
		last, ok := c.lastGood[key]
		if !ok {
			last = settings{mode: c.s.opts.Backends, scheduler: config.DefaultScheduler, forward: lb.Masq}
		}
		return last, err
	}
	c.lastGood[key] = st
	return st, nil
}

// parseSettings validates svc's vipd.io/backends, vipd.io/scheduler,
// vipd.io/scheduler-flags, vipd.io/forwarding and vipd.io/check
// annotations, with the file's messages.
func parseSettings(svc *corev1.Service, defaultMode string) (settings, error) {
	st := settings{mode: defaultMode, scheduler: config.DefaultScheduler, forward: lb.Masq}
	if mode, ok := svc.Annotations[AnnotationBackends]; ok {
		if mode != BackendsNodePort && mode != BackendsEndpoints {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s %q must be %q or %q", AnnotationBackends, mode, BackendsNodePort, BackendsEndpoints)
		}
		st.mode = mode
	}
	if sched, ok := svc.Annotations[AnnotationScheduler]; ok {
		if !slices.Contains(lb.Schedulers, sched) {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: unknown scheduler %q (want one of %s)", AnnotationScheduler, sched, strings.Join(lb.Schedulers, " "))
		}
		st.scheduler = sched
	}
	if flags, ok := svc.Annotations[AnnotationSchedulerFlags]; ok {
		for _, f := range strings.Split(flags, ",") {
			f = strings.TrimSpace(f)
			flag, ok := lb.ParseSchedFlag(f)
			switch {
			case !ok:
				return settings{}, allocErrorf(ReasonBadAnnotation, "%s: unknown scheduler flag %q (want sh-fallback, sh-port, mh-fallback or mh-port)", AnnotationSchedulerFlags, f)
			case flag.Scheduler() != st.scheduler:
				return settings{}, allocErrorf(ReasonBadAnnotation, "%s: scheduler flag %q needs scheduler %q, not %q", AnnotationSchedulerFlags, f, flag.Scheduler(), st.scheduler)
			}
			st.flags |= flag
		}
	}
	if text, ok := svc.Annotations[AnnotationForwarding]; ok {
		fwd, err := config.ParseForward(text)
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: %v", AnnotationForwarding, err)
		}
		if st.mode == BackendsNodePort && fwd != lb.Masq {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: a nodeport service forwards with masq, not %s", AnnotationForwarding, fwd)
		}
		st.forward = fwd
	}
	if text, ok := svc.Annotations[AnnotationCheck]; ok {
		check, err := config.ParseCheck(text)
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: %v", AnnotationCheck, err)
		}
		// The check probes each backend's address. In endpoints mode
		// that is a pod, and a port of its own is the pod's; in
		// nodeport mode it is a Node, whose other ports are not the
		// Service's.
		if check != nil && check.Port != 0 && st.mode == BackendsNodePort {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: port %d: in nodeport mode the backends are the Nodes, and a check port would reach their other services (leave port out: the check probes the node port)", AnnotationCheck, check.Port)
		}
		st.check = check
	}
	if text, ok := svc.Annotations[AnnotationSNAT]; ok {
		on, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s %q must be \"true\" or \"false\"", AnnotationSNAT, truncate(text))
		}
		if on && st.forward != lb.Masq {
			return settings{}, allocErrorf(ReasonBadAnnotation, "%s: SNAT needs masq forwarding, not %s", AnnotationSNAT, st.forward)
		}
		st.snat = &on
	}
	return st, nil
}

// warn records a warning Event on svc about what (its "address" or its
// "settings"), once per distinct message; a nil err ends the warning.
func (c *controller) warn(svc *corev1.Service, what string, err error) {
	key := keyOf(svc) + " " + what
	if err == nil {
		delete(c.events, key)
		return
	}
	reason := "Error"
	var ae *AllocError
	if errors.As(err, &ae) {
		reason = ae.Reason
	}
	msg := reason + ": " + err.Error()
	if c.events[key] == msg {
		return
	}
	c.events[key] = msg
	c.s.log.Warn("kubernetes: "+err.Error(), "service", keyOf(svc), "reason", reason)
	c.event(svc, corev1.EventTypeWarning, reason, err.Error())
}

// event records an Event on svc when this instance leads: the others only
// log.
func (c *controller) event(svc *corev1.Service, kind, reason, msg string) {
	if c.leading() {
		c.recorder.Event(svc, kind, reason, msg)
	}
}

// noteConflicts makes an Event of each new refusal.
func (c *controller) noteConflicts(present map[string]*corev1.Service, conflicts []source.Conflict) {
	now := map[string]string{}
	for _, cf := range conflicts {
		now[cf.Service] = cf.Error()
		if c.conflicts[cf.Service] == cf.Error() {
			continue
		}
		c.s.log.Warn("kubernetes: "+cf.Error(), "service", cf.Service)
		parts := strings.SplitN(cf.Service, "/", 4)
		if len(parts) < 3 || parts[0] != "k8s" {
			continue
		}
		if svc := present[parts[1]+"/"+parts[2]]; svc != nil {
			c.event(svc, corev1.EventTypeWarning, ReasonConflict, cf.Error())
		}
	}
	c.conflicts = now
}

// writeStatus sets svc's status.loadBalancer.ingress to addrs (none to
// clear it) through the status subresource, in the leader's term ctx: it
// returns errNotLeading when the term has ended. The write carries the
// resourceVersion vipd saw, so that it fails should another instance have
// written since. The status writer's workers call it.
func (c *controller) writeStatus(ctx context.Context, svc *corev1.Service, addrs []netip.Addr) error {
	if ctx == nil || ctx.Err() != nil {
		return errNotLeading
	}
	up := svc.DeepCopy()
	up.Status.LoadBalancer.Ingress = nil
	for _, a := range addrs {
		mode := corev1.LoadBalancerIPModeVIP
		up.Status.LoadBalancer.Ingress = append(up.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a.String(), IPMode: &mode})
	}
	_, err := c.cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, up, metav1.UpdateOptions{FieldManager: "vipd"})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", errNotLeading, err)
	}
	return err
}

// statusResults handles the writes the status writer made since the last
// call: it logs each, records the Event of an address assigned, and
// forgets a Service whose status it cleared. It reports whether a full
// sync must come to retry a failure: the full sync reads the Service
// again from the informer's cache, so that a write that failed on a
// conflict (another writer changed the Service) is made again from the
// newer object once the cache holds it, never from the stale one.
func (c *controller) statusResults() (again bool) {
	for _, r := range c.status.take() {
		switch {
		case r.err == nil && len(r.addrs) == 0:
			c.s.log.Info("kubernetes: released", "service", r.key)
			if len(c.alloc.Held(r.key)) == 0 {
				delete(c.written, r.key)
			}
		case r.err == nil:
			c.s.log.Info("kubernetes: assigned", "service", r.key, "addresses", joinAddrs(r.addrs))
			c.event(r.svc, corev1.EventTypeNormal, "AddressAssigned", "assigned "+joinAddrs(r.addrs))
			if r.current && !sameAddrs(c.alloc.Held(r.key), r.addrs) {
				// The Service changed while its write was in flight:
				// write what is held now.
				c.pokeAll()
			}
		case !r.current || errors.Is(r.err, errNotLeading):
			// The term ended: the next leader takes the statuses as they
			// are.
		case apierrors.IsNotFound(r.err):
			// Deleted: its deletion makes a full sync of its own.
		case len(r.addrs) == 0:
			c.s.log.Warn("kubernetes: clearing status failed", "service", r.key, "err", r.err)
			again = true
		default:
			c.s.log.Warn("kubernetes: writing status failed", "service", r.key, "err", r.err)
			again = true
		}
	}
	return again
}

// restore takes the addresses of the served Services (oldest first) back
// from their statuses into a new allocator: status is the record. The
// leader does so at the start of each term, before it hands out
// anything, and keeps the addresses that still fit what each Service
// asks for. A follower does so at every sync, and keeps every address of
// a status that is in a pool and not held by an older Service, so that
// it serves what the leader wrote.
func (c *controller) restore(served []*corev1.Service, leading bool) error {
	alloc, err := NewAllocator(c.s.pools)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	c.alloc = alloc
	for _, svc := range served {
		addrs := statusAddrs(svc)
		if len(addrs) == 0 {
			continue
		}
		c.written[keyOf(svc)] = true
		w, err := wantOf(c.asked(svc))
		lenient := Want{Families: []lb.Family{lb.IPv4, lb.IPv6}, Addrs: addrs, Labels: svc.Labels}
		switch {
		case !leading:
			// A follower serves what the leader wrote.
			lenient.SharingKey, lenient.Ports, lenient.Unchecked = w.SharingKey, w.Ports, true
			w = lenient
		case err != nil:
			// A bad request keeps what the Service holds, from
			// whichever pool is for it.
			w = lenient
		}
		kept := c.alloc.Restore(keyOf(svc), w, addrs)
		if leading {
			c.s.log.Info("kubernetes: restored", "service", keyOf(svc), "status", joinAddrs(addrs), "kept", joinAddrs(kept))
		}
	}
	return nil
}

// reallocate moves the leader's allocation to new pools (SetPools): each
// served Service, oldest first, keeps what it holds where it still fits
// what it asks for; an address that no longer does is let go of, with an
// Event, and assign then finds the Service another or has it wait.
func (c *controller) reallocate(served []*corev1.Service) error {
	alloc, err := NewAllocator(c.s.pools)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	prev := c.alloc
	c.alloc = alloc
	for _, svc := range served {
		key := keyOf(svc)
		held := prev.Held(key)
		if len(held) == 0 {
			continue
		}
		w, err := wantOf(c.asked(svc))
		if err != nil {
			w = Want{Families: []lb.Family{lb.IPv4, lb.IPv6}, Addrs: held, Labels: svc.Labels}
		}
		kept := alloc.Restore(key, w, held)
		var lost []netip.Addr
		for _, a := range held {
			if !slices.Contains(kept, a) {
				lost = append(lost, a)
			}
		}
		if len(lost) == 0 {
			continue
		}
		msg := fmt.Sprintf("%s left the pools for this Service (a reload changed [[kubernetes.pool]]): allocating again", joinAddrs(lost))
		c.s.log.Warn("kubernetes: "+msg, "service", key, "reason", ReasonAddressRemoved)
		c.event(svc, corev1.EventTypeWarning, ReasonAddressRemoved, msg)
	}
	return nil
}

func sameAddrs(a, b []netip.Addr) bool { return slices.Equal(a, b) }

// sliceIndex holds the EndpointSlices of each Service, by key.
type sliceIndex map[string][]*discoveryv1.EndpointSlice

func (c *controller) indexSlices() sliceIndex {
	all, _ := c.slices.List(labels.Everything())
	idx := sliceIndex{}
	for _, es := range all {
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		k := es.Namespace + "/" + name
		idx[k] = append(idx[k], es)
	}
	return idx
}

// ServiceName names the virtual service of one port and address of a
// Kubernetes Service: "k8s/NAMESPACE/NAME/PORT/PROTO", where PORT is the
// port's name, or its number when it has none; IPv6 addresses add
// "/ipv6", so that a dual-stack Service's two virtual services differ.
func ServiceName(svc *corev1.Service, p corev1.ServicePort, fam lb.Family) string {
	port := p.Name
	if port == "" {
		port = strconv.Itoa(int(p.Port))
	}
	name := fmt.Sprintf("k8s/%s/%s/%s/%s", svc.Namespace, svc.Name, port, strings.ToLower(string(p.Protocol)))
	if fam == lb.IPv6 {
		name += "/ipv6"
	}
	return name
}

// virtualServices maps a Service to its virtual services: one per port
// and address.
func virtualServices(svc *corev1.Service, addrs []netip.Addr, st settings, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) []lb.VirtualService {
	var out []lb.VirtualService
	// The Service's source ranges restrict every port of every VIP;
	// lb.Desired keeps the ranges of each VIP's family, and a VIP with
	// none of its family admits no source. A bad annotation admits none
	// at all (its error is for the caller's Event).
	allow, _ := sourceRanges(svc)
	for _, vip := range addrs {
		fam := lb.FamilyOf(vip)
		for _, p := range svc.Spec.Ports {
			proto, err := lb.ParseProto(string(p.Protocol))
			if err != nil {
				continue
			}
			vs := lb.VirtualService{
				Name: ServiceName(svc, p, fam),
				Service: lb.Service{
					Key:       lb.ServiceKey{Family: fam, Proto: proto, Addr: vip, Port: uint16(p.Port)},
					Scheduler: st.scheduler,
					Flags:     st.flags,
				},
				VIP:      vip,
				Announce: true,
				Allow:    allow,
			}
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				timeout := corev1.DefaultClientIPServiceAffinitySeconds
				if cfg := svc.Spec.SessionAffinityConfig; cfg != nil && cfg.ClientIP != nil && cfg.ClientIP.TimeoutSeconds != nil {
					timeout = *cfg.ClientIP.TimeoutSeconds
				}
				vs.Service.Persistent = uint32(timeout)
				vs.Service.Netmask = 32
				if fam == lb.IPv6 {
					vs.Service.Netmask = 128
				}
			}
			if st.mode == BackendsEndpoints {
				vs.Backends = endpointBackends(p, fam, eps, st.forward)
			} else {
				vs.Backends = nodePortBackends(svc, p, fam, nodes, eps)
			}
			out = append(out, vs)
		}
	}
	return out
}

// sourceRanges returns the source prefixes svc admits:
// spec.loadBalancerSourceRanges, or when that is empty the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation
// (comma separated, as cloud providers read it); nil admits every source. The API
// server validates the field; an annotation with a range that does not
// parse, or either with more ranges than config.MaxAllow, admits no
// source (a list whose one prefix is invalid, see lb.VirtualService.Allow)
// and the error says why, as cloud providers refuse such a Service.
func sourceRanges(svc *corev1.Service) ([]netip.Prefix, error) {
	const annotation = "service.beta.kubernetes.io/load-balancer-source-ranges"
	// As many as the file's allow key takes.
	const maxSourceRanges = config.MaxAllow
	ranges, from := svc.Spec.LoadBalancerSourceRanges, "spec.loadBalancerSourceRanges"
	if len(ranges) == 0 {
		v := strings.TrimSpace(svc.Annotations[annotation])
		if v == "" {
			return nil, nil
		}
		ranges, from = strings.Split(v, ","), annotation
	}
	none := []netip.Prefix{{}}
	if len(ranges) > maxSourceRanges {
		return none, allocErrorf(ReasonBadAnnotation, "%s has %d ranges, more than %d: no source is admitted", from, len(ranges), maxSourceRanges)
	}
	out := make([]netip.Prefix, 0, len(ranges))
	for _, r := range ranges {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			if len(r) > 64 {
				r = r[:64] + "..."
			}
			return none, allocErrorf(ReasonBadAnnotation, "%s: %q is not a CIDR range: no source is admitted", from, r)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// sourceRangesErr says why svc's source ranges are not what it asks
// for: a bad annotation (no source is admitted), or no packet filter to
// enforce them (the Service is not served); nil when they are.
func (c *controller) sourceRangesErr(svc *corev1.Service) error {
	ranges, err := sourceRanges(svc)
	if err != nil {
		return err
	}
	if len(ranges) > 0 && c.s.opts.NoPacketFilter {
		return allocErrorf(ReasonSourceRangesUnenforceable,
			"the Service has source ranges, and vipd keeps no packet-filter rules to enforce them ([daemon] manage_iptables is off): it is not served")
	}
	return nil
}

// nodeReady reports whether n's Ready condition is True.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// epReady reports whether an endpoint is ready (a nil Ready is), and
// epServingTerminating whether it is terminating but still serving.
func epReady(c discoveryv1.EndpointConditions) bool { return c.Ready == nil || *c.Ready }

func epServingTerminating(c discoveryv1.EndpointConditions) bool {
	return !epReady(c) && c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating
}

// nodePortBackends returns the Ready Nodes' internal addresses of family
// fam at p's nodePort, with weight 1. With externalTrafficPolicy Local it
// returns only the Nodes with a ready endpoint of the Service of family
// fam, each weighted by how many it has, so that a Node with three pods
// takes three times the connections of a Node with one; when no endpoint
// is ready, the Nodes with a serving and terminating one, weighted by
// those (KEP-1669: kube-proxy sends a Node's traffic to them then, so
// that a rollout of one replica does not go dark). Nodes labelled
// node.kubernetes.io/exclude-from-external-load-balancers are left out.
func nodePortBackends(svc *corev1.Service, p corev1.ServicePort, fam lb.Family, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) []lb.Destination {
	if p.NodePort == 0 {
		return nil
	}
	var local map[string]int
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		local = localEndpoints(fam, eps)
	}
	var out []lb.Destination
	for _, n := range nodes {
		weight := 1
		if local != nil {
			if weight = local[n.Name]; weight == 0 {
				continue
			}
		}
		if !nodeReady(n) {
			continue
		}
		if _, ok := n.Labels[corev1.LabelNodeExcludeBalancers]; ok {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || lb.FamilyOf(ip) != fam {
				continue
			}
			out = append(out, lb.Destination{Addr: netip.AddrPortFrom(ip.Unmap(), uint16(p.NodePort)), Weight: weight, Forward: lb.Masq})
			break
		}
	}
	return sortDests(out)
}

// maxNodeWeight bounds the weight of a Node: its count of local
// endpoints, beyond which the proportions no longer matter.
const maxNodeWeight = 1000

// localEndpoints counts the ready endpoints of family fam on each Node
// (those of every family when the Service has no EndpointSlice of fam:
// they still say where its pods run); when none is ready anywhere, the
// serving and terminating ones.
func localEndpoints(fam lb.Family, eps []*discoveryv1.EndpointSlice) map[string]int {
	want := discoveryv1.AddressTypeIPv4
	if fam == lb.IPv6 {
		want = discoveryv1.AddressTypeIPv6
	}
	if !slices.ContainsFunc(eps, func(es *discoveryv1.EndpointSlice) bool { return es.AddressType == want }) {
		want = ""
	}
	ready, terminating := map[string]map[string]bool{}, map[string]map[string]bool{}
	add := func(m map[string]map[string]bool, node string, addrs []string) {
		if m[node] == nil {
			m[node] = map[string]bool{}
		}
		for _, a := range addrs {
			m[node][a] = true
		}
	}
	for _, es := range eps {
		if want != "" && es.AddressType != want {
			continue
		}
		for _, ep := range es.Endpoints {
			switch {
			case ep.NodeName == nil || len(ep.Addresses) == 0:
			case epReady(ep.Conditions):
				add(ready, *ep.NodeName, ep.Addresses[:1])
			case epServingTerminating(ep.Conditions):
				add(terminating, *ep.NodeName, ep.Addresses[:1])
			}
		}
	}
	if len(ready) == 0 {
		ready = terminating
	}
	out := make(map[string]int, len(ready))
	for node, addrs := range ready {
		out[node] = min(len(addrs), maxNodeWeight)
	}
	return out
}

// endpointBackends returns the endpoints of port p of family fam,
// forwarded with fwd: ready ones with weight 1, serving and terminating
// ones with weight 0 (drained), others not at all. When none is ready,
// the serving and terminating ones get weight 1 (KEP-1669), so that a
// rollout of one replica does not go dark.
func endpointBackends(p corev1.ServicePort, fam lb.Family, eps []*discoveryv1.EndpointSlice, fwd lb.Forward) []lb.Destination {
	want := discoveryv1.AddressTypeIPv4
	if fam == lb.IPv6 {
		want = discoveryv1.AddressTypeIPv6
	}
	best := map[netip.AddrPort]int{}
	for _, es := range eps {
		if es.AddressType != want {
			continue
		}
		var port int32
		found := false
		for _, sp := range es.Ports {
			name, proto := "", corev1.ProtocolTCP
			if sp.Name != nil {
				name = *sp.Name
			}
			if sp.Protocol != nil {
				proto = *sp.Protocol
			}
			if name == p.Name && proto == p.Protocol && sp.Port != nil {
				port, found = *sp.Port, true
				break
			}
		}
		if !found {
			continue
		}
		for _, ep := range es.Endpoints {
			weight := -1
			cond := ep.Conditions
			switch {
			case epReady(cond):
				weight = 1
			case epServingTerminating(cond):
				weight = 0
			}
			if weight < 0 {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ap := netip.AddrPortFrom(ip.Unmap(), uint16(port))
				if w, ok := best[ap]; !ok || weight > w {
					best[ap] = weight
				}
			}
		}
	}
	// Without a ready endpoint, the serving and terminating ones carry
	// the traffic.
	anyReady := slices.Contains(slices.Collect(maps.Values(best)), 1)
	var out []lb.Destination
	for ap, w := range best {
		if !anyReady {
			w = 1
		}
		out = append(out, lb.Destination{Addr: ap, Weight: w, Forward: fwd})
	}
	return sortDests(out)
}

func sortDests(d []lb.Destination) []lb.Destination {
	slices.SortFunc(d, func(a, b lb.Destination) int { return a.Addr.Compare(b.Addr) })
	return d
}
