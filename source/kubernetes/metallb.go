package kubernetes

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
)

// metallbAnnotations are MetalLB's Service annotations that
// Options.MetalLBAnnotations reads as vipd's own, so that Services move
// from MetalLB to vipd without a change: for each of vipd's, MetalLB's
// current one first, then the older metallb.universe.tf/ one.
var metallbAnnotations = []struct {
	vipd    string
	metallb []string
}{
	{AnnotationAddresses, []string{"metallb.io/loadBalancerIPs", "metallb.universe.tf/loadBalancerIPs"}},
	{AnnotationPool, []string{"metallb.io/address-pool", "metallb.universe.tf/address-pool"}},
	{AnnotationSharingKey, []string{"metallb.io/allow-shared-ip", "metallb.universe.tf/allow-shared-ip"}},
}

// withMetalLB returns svc with MetalLB's annotations copied to vipd's
// where svc has none of vipd's own: vipd's win. They are validated and
// confined as vipd's are (a sharing key is the namespace's unless the
// pool shares across namespaces). svc, the informer's, is not changed:
// the result is a shallow copy with annotations of its own.
func withMetalLB(svc *corev1.Service) *corev1.Service {
	var ann map[string]string
	for _, m := range metallbAnnotations {
		if _, ok := svc.Annotations[m.vipd]; ok {
			continue
		}
		for _, k := range m.metallb {
			if v, ok := svc.Annotations[k]; ok {
				if ann == nil {
					ann = maps.Clone(svc.Annotations)
				}
				ann[m.vipd] = v
				break
			}
		}
	}
	if ann == nil {
		return svc
	}
	out := *svc
	out.Annotations = ann
	return &out
}

// asked returns the Service whose annotations say what it asks of the
// pools: svc, or with MetalLBAnnotations svc with MetalLB's read as
// vipd's.
func (c *controller) asked(svc *corev1.Service) *corev1.Service {
	if c.s.opts.MetalLBAnnotations {
		return withMetalLB(svc)
	}
	return svc
}
