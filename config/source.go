package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vipd/vipd/lb"
)

// CheckSourceService reports the first way vs, a service that a source
// other than the file made (the Kubernetes source, say), is not one vipd
// can program; the agent refuses such a service as a conflict of its
// source, so that one source's mistake does not fail every pass. It is the
// one definition of what a source's service must be: the same rules the
// validator applies to the file's services key by key (with the file, the
// line and the key in its errors), on the typed form, sharing its
// predicates where the forms allow (knownScheduler); and a source makes
// no NodePort services.
func CheckSourceService(vs *lb.VirtualService) error {
	k := vs.Service.Key
	switch {
	case vs.Name == "":
		return errors.New("no name")
	case vs.NodePort:
		return errors.New("a source cannot make NodePort services")
	case k.FWMark == 0 && (!k.Addr.IsValid() || k.Addr != vs.VIP):
		return fmt.Errorf("key %s does not have the vip %s", k, vs.VIP)
	case k.FWMark == 0 && (k.Port == 0 || k.Proto == 0):
		return fmt.Errorf("key %s has no port or protocol", k)
	case vs.VIP.IsValid() && lb.FamilyOf(vs.VIP) != k.Family:
		return fmt.Errorf("key %s is not of the vip's family %s", k, lb.FamilyOf(vs.VIP))
	case !knownScheduler(vs.Service.Scheduler):
		return fmt.Errorf("unknown scheduler %q", vs.Service.Scheduler)
	}
	seen := make(map[netip.AddrPort]bool, len(vs.Backends))
	for _, b := range vs.Backends {
		if !b.Addr.IsValid() || seen[b.Addr] || b.Weight < 0 || b.Forward < lb.Masq || b.Forward > lb.Tunnel {
			return fmt.Errorf("backend %s: invalid or repeated", b.Addr)
		}
		seen[b.Addr] = true
	}
	return nil
}

// knownScheduler reports whether IPVS has the scheduler name.
func knownScheduler(name string) bool { return slices.Contains(lb.Schedulers, name) }
