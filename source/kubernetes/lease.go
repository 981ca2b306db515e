package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// The defaults of leader election: the Lease and the durations of
// Kubernetes' own components (kube-controller-manager, kube-scheduler).
const (
	DefaultLeaseNamespace = "kube-system"
	DefaultLeaseName      = "vipd"
	DefaultLeaseDuration  = 15 * time.Second
	DefaultRenewDeadline  = 10 * time.Second
	DefaultRetryPeriod    = 2 * time.Second
)

// errNotLeading is why a status write was not made: the instance does not
// hold the Lease (any more).
var errNotLeading = errors.New("not the leader")

// electing reports whether the instances elect a leader.
func (o *Options) electing() bool { return o.LeaderElection == nil || *o.LeaderElection }

// leaseDefaults fills in and checks the options of leader election.
func (s *Source) leaseDefaults() error {
	o := &s.opts
	if !o.electing() {
		return nil
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = DefaultLeaseNamespace
	}
	if o.LeaseName == "" {
		o.LeaseName = DefaultLeaseName
	}
	if o.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("kubernetes: identity: set it, or fix the hostname: %w", err)
		}
		if host == "" {
			return errors.New("kubernetes: identity: set it: the hostname is empty")
		}
		o.Identity = host
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if errs := validation.IsDNS1123Label(o.LeaseNamespace); len(errs) > 0 {
		return fmt.Errorf("kubernetes: lease_namespace %q: %s", o.LeaseNamespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(o.LeaseName); len(errs) > 0 {
		return fmt.Errorf("kubernetes: lease_name %q: %s", o.LeaseName, strings.Join(errs, "; "))
	}
	// The Lease keeps its duration in whole seconds: a fraction would be
	// cut off, and the others could take over before the leader gives up.
	if o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0 {
		return fmt.Errorf("kubernetes: lease_duration %s must be a whole number of seconds, at least 1s", o.LeaseDuration)
	}
	if o.RetryPeriod < 0 {
		return fmt.Errorf("kubernetes: retry_period %s must be positive", o.RetryPeriod)
	}
	if o.RenewDeadline >= o.LeaseDuration {
		return fmt.Errorf("kubernetes: renew_deadline %s must be shorter than lease_duration %s", o.RenewDeadline, o.LeaseDuration)
	}
	if float64(o.RenewDeadline) <= leaderelection.JitterFactor*float64(o.RetryPeriod) {
		return fmt.Errorf("kubernetes: renew_deadline %s must be longer than %g × retry_period %s", o.RenewDeadline, leaderelection.JitterFactor, o.RetryPeriod)
	}
	return nil
}

// elect runs for the Lease until ctx ends, again after each loss: it
// sends the context of each term to elected, which ends when the term
// does. When ctx ends it gives the Lease up, so that another instance
// takes over at its next try rather than after lease_duration.
func (c *controller) elect(ctx context.Context, cs clientset.Interface, elected chan<- context.Context) {
	o := &c.s.opts
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(c.s.log.Handler()))
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.LeaseNamespace, Name: o.LeaseName},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity},
	}
	cfg := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            o.LeaseNamespace + "/" + o.LeaseName,
		LeaseDuration:   o.LeaseDuration,
		RenewDeadline:   o.RenewDeadline,
		RetryPeriod:     o.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(term context.Context) {
				select {
				case elected <- term:
				case <-term.Done():
				}
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				c.s.log.Info("kubernetes: leader elected", "leader", id, "identity", o.Identity, "lease", o.LeaseNamespace+"/"+o.LeaseName)
			},
		},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(cfg)
		if err != nil {
			// New checked the options.
			c.s.log.Error("kubernetes: leader election", "err", err)
			return
		}
		le.Run(ctx)
	}
}
