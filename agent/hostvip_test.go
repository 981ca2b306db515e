package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// countingVIPs counts the reads of the host's addresses.
type countingVIPs struct {
	vips  lb.VIPs
	reads *atomic.Int32
}

func (c countingVIPs) VIPs() ([]netip.Addr, error)  { return c.vips.VIPs() }
func (c countingVIPs) Bind(addr netip.Addr) error   { return c.vips.Bind(addr) }
func (c countingVIPs) Unbind(addr netip.Addr) error { return c.vips.Unbind(addr) }

func (c countingVIPs) HostAddrs() (map[string][]netip.Addr, error) {
	c.reads.Add(1)
	return c.vips.HostAddrs()
}

// TestReloadHostVIPs: a reload reads the host's addresses only for VIPs
// that the services it replaces did not have. A weight change reads
// none; moving a service to a VIP that is a host address reads them and
// is refused, and so is a service added on one.
func TestReloadHostVIPs(t *testing.T) {
	var reads atomic.Int32
	r := newRigWith(t, services(3, 1), func(o *Options) {
		open := o.OpenKernel
		o.OpenKernel = func(c *config.Config, l *slog.Logger) (lb.Kernel, func(), error) {
			k, done, err := open(c, l)
			k.VIPs = countingVIPs{k.VIPs, &reads}
			return k, done, err
		}
	})
	ctx := context.Background()
	r.k.SetHostAddrs("eth0", netip.MustParseAddr("198.51.100.7"))

	reads.Store(0)
	r.write(services(3, 2))
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err != nil {
		t.Fatalf("weight change: %v\n%s", err, r.log)
	}
	r.has(t, "10.0.1.1:80 masq weight=2")
	if n := reads.Load(); n != 0 {
		t.Errorf("a weight change read the host's addresses %d times, want 0", n)
	}

	moved := strings.Replace(services(3, 2), `vip = "192.0.2.12"`, `vip = "198.51.100.7"`, 1)
	r.write(moved)
	_, err := r.a.Reload(ctx, ReloadOptions{})
	if err == nil || !strings.Contains(err.Error(), `service "s2": vip 198.51.100.7 is an address of interface eth0`) {
		t.Fatalf("moving s2 to a host address: %v, want it refused", err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("a new VIP read the host's addresses %d times, want 1", n)
	}
	r.hasNot(t, "198.51.100.7")

	added := services(3, 2) + "[[service]]\nname = \"s3\"\nvip = \"198.51.100.7\"\nport = 81\nbackend = [{ address = \"10.0.9.1\" }]\n"
	r.write(added)
	if _, err := r.a.Reload(ctx, ReloadOptions{}); err == nil || !strings.Contains(err.Error(), `service "s3": vip 198.51.100.7`) {
		t.Fatalf("adding s3 on a host address: %v, want it refused", err)
	}
}

// TestReloadedVIPs: the services whose VIPs a reload checks.
func TestReloadedVIPs(t *testing.T) {
	svc := func(name, vip string) lb.VirtualService {
		vs := lb.VirtualService{Name: name}
		if vip != "" {
			vs.VIP = netip.MustParseAddr(vip)
		}
		return vs
	}
	running := &config.Config{}
	running.Spec.Services = []lb.VirtualService{svc("a", "192.0.2.1"), svc("b", "192.0.2.2"), svc("c", "192.0.2.3")}
	cfg := &config.Config{}
	cfg.Spec.Services = []lb.VirtualService{svc("a", "192.0.2.1"), svc("b", "192.0.2.2"), svc("b2", "192.0.2.9"), svc("np", ""), svc("c", "192.0.2.3")}
	names := func(svcs []lb.VirtualService) string {
		var out []string
		for _, vs := range svcs {
			out = append(out, vs.Name)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		delta config.Delta
		want  string
	}{
		{config.Delta{From: 1, OldTo: 2, NewTo: 4}, "b2"},             // b kept its VIP; b2's is new; np has none
		{config.Delta{From: 0, OldTo: 1, NewTo: 3}, "b,b2"},           // b's VIP was not a's
		{config.Delta{From: 1, OldTo: 1, NewTo: 1}, ""},               // nothing changed
		{config.Delta{Full: true, OldTo: 3, NewTo: 5}, "a,b,b2,np,c"}, // a full change checks all
	} {
		if got := names(reloadedVIPs(running, cfg, c.delta)); got != c.want {
			t.Errorf("%+v: %q, want %q", c.delta, got, c.want)
		}
	}
}
