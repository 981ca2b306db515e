package process

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/monitor/check"
	"github.com/vipd/vipd/source"
)

// bigSnapshot is what the Kubernetes source publishes for services
// Service ports on nodes Nodes in nodeport mode, each Node probed.
func bigSnapshot(services, nodes int) source.Snapshot {
	snap := source.Snapshot{Health: map[string]config.ServiceHealth{}}
	for i := range services {
		vip := netip.AddrFrom4([4]byte{192, 0, byte(2 + i/250), byte(1 + i%250)})
		vs := lb.VirtualService{Name: fmt.Sprintf("k8s/ns%d/svc%d/http/tcp", i%20, i), VIP: vip, Announce: true,
			Service: lb.Service{Key: lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: vip, Port: 80}, Scheduler: "wrr"}}
		h := config.ServiceHealth{Policy: check.Policy{Action: check.Remove, Quorum: 1}, Checks: map[netip.AddrPort]*check.Spec{}}
		for n := range nodes {
			addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(n / 250), byte(1 + n%250)}), uint16(30000+i%2000))
			vs.Backends = append(vs.Backends, lb.Destination{Addr: addr, Weight: 1, Forward: lb.Masq})
			h.Checks[addr] = &check.Spec{Kind: check.KindHTTP, Port: 10256, Initial: check.Up, Interval: 2 * time.Second,
				HTTP: check.HTTPOptions{Path: "/healthz", Status: []check.StatusRange{{Lo: 200, Hi: 200}}}}
		}
		snap.Services = append(snap.Services, vs)
		snap.Health[vs.Name] = h
	}
	return snap
}

// BenchmarkPublishWire sends a snapshot from a child's end to a
// parent's over a Unix socket and decodes it there, as a publish does:
// the cost the process boundary adds to each publish, which the source
// in the daemon's process did not pay (its peer: zero). It reports the
// frame's size.
func BenchmarkPublishWire(b *testing.B) {
	for _, size := range []struct {
		services, nodes int
		delta           bool
	}{{100, 10, false}, {1000, 10, false}, {1000, 50, false}, {1000, 50, true}} {
		name := fmt.Sprintf("services=%d/nodes=%d", size.services, size.nodes)
		if size.delta {
			name += "/one-changed"
		}
		b.Run(name, func(b *testing.B) {
			snap := bigSnapshot(size.services, size.nodes)
			var base *source.Snapshot
			var index map[string]int
			if size.delta {
				base = &snap
				index = map[string]int{}
				for i, vs := range snap.Services {
					index[vs.Name] = i
				}
				snap.Changed = []string{snap.Services[500].Name}
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			pf, cf := os.NewFile(uintptr(fds[0]), "p"), os.NewFile(uintptr(fds[1]), "c")
			pc, _ := net.FileConn(pf)
			cc, _ := net.FileConn(cf)
			pf.Close()
			cf.Close()
			defer pc.Close()
			defer cc.Close()
			child, parent := NewConn(cc, cc, 0), NewConn(pc, pc, 0)
			var frame int
			errs := make(chan error, 1)
			b.ResetTimer()
			for i := range b.N {
				go func() {
					p, err := PublishOf(uint64(i), snap, nil, size.delta)
					if err == nil {
						err = child.Write(&Message{Type: TypePublish, Publish: p})
					}
					errs <- err
				}()
				m, err := parent.Read()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.Publish.Snapshot(base, index); err != nil {
					b.Fatal(err)
				}
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			p, _ := PublishOf(0, snap, nil, size.delta)
			data, _ := jsonSize(&Message{Type: TypePublish, Publish: p})
			frame = data
			b.ReportMetric(float64(frame)/(1<<20), "frame-MiB")
		})
	}
}

// jsonSize returns the size of m's frame.
func jsonSize(m *Message) (int, error) {
	var n countWriter
	err := NewConn(nil, &n, 1<<40).Write(m)
	return int(n), err
}

// countWriter counts what is written.
type countWriter int

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}
