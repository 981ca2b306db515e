// Package bench generates the fixtures of vipd's control-plane benchmark
// (test/vm/bench.sh, `make bench`): N services of M backends each, as an
// equivalent vipd configuration, ipvsadm restore file and keepalived.conf,
// so that vipd, `ipvsadm -R` and keepalived program the same IPVS table.
//
// Every service is TCP, weighted round robin, NAT (masquerading), with
// backends of weight 1 on port 8080; services share VIPs, PortsPerVIP
// ports each, so that vipd binds N/PortsPerVIP addresses rather than N.
// The one-backend change the benchmark times is a weight.
package bench

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
)

// Spec sizes a fixture.
type Spec struct {
	// Services and Backends are N and M: N services of M backends.
	Services, Backends int
	// PortsPerVIP is how many services share a VIP (ports 80, 81, ...);
	// zero means 10.
	PortsPerVIP int
	// Scheduler is the IPVS scheduler of every service; empty means wrr.
	Scheduler string
}

// Fixture is one benchmark configuration: every service with its
// backends, in order.
type Fixture struct {
	Spec
	Services []Service
}

// Service is one virtual service of a fixture.
type Service struct {
	Name     string
	VIP      netip.Addr
	Port     uint16
	Backends []Backend
}

// Backend is one real server of a service.
type Backend struct {
	Addr   netip.AddrPort
	Weight int
}

// The address plan: VIPs from 10.100.0.1, backends from 172.16.0.1 (a
// /12 holds a million), backend port 8080, service ports from 80.
var (
	vipBase     = netip.MustParseAddr("10.100.0.1")
	backendBase = netip.MustParseAddr("172.16.0.1")
)

const (
	basePort    = 80
	backendPort = 8080
)

// New returns the fixture of spec.
func New(spec Spec) (*Fixture, error) {
	if spec.PortsPerVIP == 0 {
		spec.PortsPerVIP = 10
	}
	if spec.Scheduler == "" {
		spec.Scheduler = "wrr"
	}
	switch {
	case spec.Services < 1 || spec.Backends < 0:
		return nil, fmt.Errorf("fixture: %d services of %d backends: want at least 1 service", spec.Services, spec.Backends)
	case spec.PortsPerVIP < 1 || spec.PortsPerVIP > 1000:
		return nil, fmt.Errorf("fixture: %d ports per VIP: want 1 to 1000", spec.PortsPerVIP)
	case spec.Services*spec.Backends > 1<<20-2:
		return nil, fmt.Errorf("fixture: %d backends in all: the address plan holds 1,048,574", spec.Services*spec.Backends)
	case (spec.Services+spec.PortsPerVIP-1)/spec.PortsPerVIP > 1<<16:
		return nil, fmt.Errorf("fixture: more than 65,536 VIPs")
	}
	f := &Fixture{Spec: spec, Services: make([]Service, spec.Services)}
	backend := backendBase
	for i := range f.Services {
		s := &f.Services[i]
		s.Name = fmt.Sprintf("s%d", i)
		s.VIP = add(vipBase, i/spec.PortsPerVIP)
		s.Port = uint16(basePort + i%spec.PortsPerVIP)
		s.Backends = make([]Backend, spec.Backends)
		for j := range s.Backends {
			s.Backends[j] = Backend{Addr: netip.AddrPortFrom(backend, backendPort), Weight: 1}
			backend = backend.Next()
		}
	}
	return f, nil
}

// add returns a + n for an IPv4 address.
func add(a netip.Addr, n int) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// WithWeight returns a copy of f in which backend j of service i has the
// given weight: the one-backend change. Only that service is copied.
func (f *Fixture) WithWeight(i, j, weight int) *Fixture {
	g := *f
	g.Services = slices.Clone(f.Services)
	g.Services[i].Backends = slices.Clone(f.Services[i].Backends)
	g.Services[i].Backends[j].Weight = weight
	return &g
}

// Objects is how many IPVS objects the fixture programs: services plus
// backends.
func (f *Fixture) Objects() int { return f.Spec.Services * (1 + f.Spec.Backends) }

// Daemon holds the [daemon] settings of a benchmark's vipd configuration.
type Daemon struct {
	// Interface is vipd's dummy interface; empty means vipd0.
	Interface string
	// StateDir and ControlSocket are per run; empty means vipd's defaults.
	StateDir, ControlSocket string
}

// WriteTOML writes f as a vipd configuration. The daemon manages no
// iptables rules and announces nothing (keepalived's virtual_server and
// ipvsadm do neither), exports no metrics, and re-reads the kernel only
// hourly, so that a benchmark times what it changes.
func (f *Fixture) WriteTOML(w io.Writer, d Daemon) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	if d.Interface == "" {
		d.Interface = "vipd0"
	}
	fmt.Fprintf(bw, "# vipd benchmark fixture: %d services x %d backends\n", f.Spec.Services, f.Spec.Backends)
	fmt.Fprintf(bw, "[daemon]\ninterface = %q\nuplinks = []\nmanage_iptables = false\nmetrics_listen = \"\"\nresync_interval = \"1h\"\nwatch = true\n", d.Interface)
	if d.StateDir != "" {
		fmt.Fprintf(bw, "state_dir = %q\n", d.StateDir)
	}
	if d.ControlSocket != "" {
		fmt.Fprintf(bw, "control_socket = %q\n", d.ControlSocket)
	}
	for _, s := range f.Services {
		fmt.Fprintf(bw, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nscheduler = %q\nbackend = [", s.Name, s.VIP, s.Port, f.Spec.Scheduler)
		for j, b := range s.Backends {
			if j > 0 {
				bw.WriteString(", ")
			}
			fmt.Fprintf(bw, "{ address = %q, port = %d", b.Addr.Addr(), b.Addr.Port())
			if b.Weight != 1 {
				fmt.Fprintf(bw, ", weight = %d", b.Weight)
			}
			bw.WriteString(" }")
		}
		bw.WriteString("]\n")
	}
	return bw.Flush()
}

// WriteRestore writes f as input for `ipvsadm -R`: one line per service
// and one per backend, in order.
func (f *Fixture) WriteRestore(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	for _, s := range f.Services {
		vs := netip.AddrPortFrom(s.VIP, s.Port)
		fmt.Fprintf(bw, "-A -t %s -s %s\n", vs, f.Spec.Scheduler)
		for _, b := range s.Backends {
			fmt.Fprintf(bw, "-a -t %s -r %s -m -w %d\n", vs, b.Addr, b.Weight)
		}
	}
	return bw.Flush()
}

// WriteKeepalived writes f as a keepalived.conf: one virtual_server block
// per service with a real_server per backend and no health checks (a
// real server without checkers is up), and no VRRP.
func (f *Fixture) WriteKeepalived(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	fmt.Fprintf(bw, "# vipd benchmark fixture: %d services x %d backends\n", f.Spec.Services, f.Spec.Backends)
	bw.WriteString("global_defs {\n    router_id vipd_bench\n}\n")
	for _, s := range f.Services {
		fmt.Fprintf(bw, "\nvirtual_server %s %d {\n    lb_algo %s\n    lb_kind NAT\n    protocol TCP\n", s.VIP, s.Port, f.Spec.Scheduler)
		for _, b := range s.Backends {
			fmt.Fprintf(bw, "    real_server %s %d {\n        weight %d\n    }\n", b.Addr.Addr(), b.Addr.Port(), b.Weight)
		}
		bw.WriteString("}\n")
	}
	return bw.Flush()
}

// Table is the IPVS state a fixture describes, in the form `ipvsadm -Sn`
// saves it: one line per service and per backend, sorted.
func (f *Fixture) Table() []string {
	var b strings.Builder
	_ = f.WriteRestore(&b)
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	slices.Sort(lines)
	return lines
}
