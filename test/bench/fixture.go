// Package bench generates the fixtures of vipd's control-plane benchmark
// (test/vm/bench.sh, `make bench`): N services of M backends each, as an
// equivalent vipd configuration, ipvsadm restore file and keepalived.conf,
// so that vipd, `ipvsadm -R` and keepalived program the same IPVS table.
// vipd's configuration comes in two layouts: one file (WriteTOML), or a
// main file that includes the services from files of 100 services each
// (WriteSplit).
//
// Every service is TCP, weighted round robin, NAT (masquerading), with
// backends of weight 1 on port 8080; services share VIPs, PortsPerVIP
// ports each, so that vipd binds N/PortsPerVIP addresses rather than N.
// The one-backend change the benchmark times is a weight.
package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
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

// WriteTOML writes f as a vipd configuration in one file: the preamble
// (a comment and the [daemon] table), then every service. The daemon
// manages no iptables rules and announces nothing (keepalived's
// virtual_server and ipvsadm do neither), exports no metrics, and re-reads
// the kernel only hourly, so that a benchmark times what it changes.
func (f *Fixture) WriteTOML(w io.Writer, d Daemon) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	f.writePreamble(bw, d, "")
	f.writeServices(bw, 0, len(f.Services))
	return bw.Flush()
}

// writePreamble writes the comment and the [daemon] table that begin a
// vipd configuration, with include, when not empty, as a top-level key
// before the table.
func (f *Fixture) writePreamble(bw *bufio.Writer, d Daemon, include string) {
	if d.Interface == "" {
		d.Interface = "vipd0"
	}
	fmt.Fprintf(bw, "# vipd benchmark fixture: %d services x %d backends\n", f.Spec.Services, f.Spec.Backends)
	if include != "" {
		fmt.Fprintf(bw, "include = [%q]\n", include)
	}
	fmt.Fprintf(bw, "[daemon]\ninterface = %q\nuplinks = []\nmanage_iptables = false\nmetrics_listen = \"\"\nresync_interval = \"1h\"\nwatch = true\n", d.Interface)
	if d.StateDir != "" {
		fmt.Fprintf(bw, "state_dir = %q\n", d.StateDir)
	}
	if d.ControlSocket != "" {
		fmt.Fprintf(bw, "control_socket = %q\n", d.ControlSocket)
	}
}

// writeServices writes services [from, to) as [[service]] blocks, each
// after a blank line.
func (f *Fixture) writeServices(bw *bufio.Writer, from, to int) {
	for _, s := range f.Services[from:to] {
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
}

// The split layout: the main file holds the preamble with an include line,
// and the services go to files of IncludeDir beside it, PerFile to a file,
// so that the file a one-backend change rewrites is the same size however
// many services there are.
const (
	// IncludeDir is the directory of the split layout's service files,
	// relative to the main file's.
	IncludeDir = "services.d"
	// PerFile is the split layout's default number of services per file.
	PerFile = 100
)

// Part is one service file of the split layout: its name relative to the
// main file's directory, and the services it holds, Services[From:To].
type Part struct {
	Name     string
	From, To int
}

// Parts divides f's services into files of perFile services each (zero
// means PerFile; the last may hold fewer), named IncludeDir/NNNN.toml from
// 0000 on, with as many digits as the last number needs (at least four),
// so that the files' lexical order, in which vipd includes them, is the
// services' order.
func (f *Fixture) Parts(perFile int) []Part {
	if perFile < 1 {
		perFile = PerFile
	}
	n := (len(f.Services) + perFile - 1) / perFile
	width := max(4, len(fmt.Sprint(n-1)))
	parts := make([]Part, n)
	for i := range parts {
		parts[i] = Part{
			Name: fmt.Sprintf("%s/%0*d.toml", IncludeDir, width, i),
			From: i * perFile,
			To:   min((i+1)*perFile, len(f.Services)),
		}
	}
	return parts
}

// WriteMain writes the split layout's main file: WriteTOML's preamble with
// the line include = ["services.d/*.toml"] before the [daemon] table, and
// no services.
func (f *Fixture) WriteMain(w io.Writer, d Daemon) error {
	bw := bufio.NewWriter(w)
	f.writePreamble(bw, d, IncludeDir+"/*.toml")
	return bw.Flush()
}

// WriteServices writes the services of part p, byte for byte as WriteTOML
// writes them: the content of p's file. The files' contents in order are
// thus WriteTOML's text after its preamble.
func (f *Fixture) WriteServices(w io.Writer, p Part) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	f.writeServices(bw, p.From, p.To)
	return bw.Flush()
}

// WriteSplit writes f in the split layout into dir: dir/vipd.toml (see
// WriteMain) and the files of Parts(perFile), in a dir/services.d made
// anew (files left from another fixture would be included too). It
// returns the parts.
func (f *Fixture) WriteSplit(dir string, d Daemon, perFile int) ([]Part, error) {
	parts := f.Parts(perFile)
	sub := filepath.Join(dir, IncludeDir)
	if err := os.RemoveAll(sub); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, p := range parts {
		b.Reset()
		if err := f.WriteServices(&b, p); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, p.Name), b.Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	b.Reset()
	if err := f.WriteMain(&b, d); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "vipd.toml"), b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return parts, nil
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
