// Package healthbench is the health-check benchmark of `make bench`
// (test/vm/bench-health.sh): a workload of TCP- and HTTP-checked backends
// as a vipd configuration and an equivalent keepalived.conf, the
// listeners that answer the checks, readers of a process's CPU time and
// of a Prometheus histogram, and the report. The benchmark itself is
// TestHealthBench (build tag healthbench), which runs on the host (vipd
// alone, on a fake kernel) and in the test guest (vipd and keepalived in
// one boot).
package healthbench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"
)

// Kind is the check type of a backend.
type Kind string

// The check types of the workload.
const (
	TCP  Kind = "tcp"
	HTTP Kind = "http"
)

// Workload sizes the benchmark: TCP backends checked with a connect
// every TCPInterval and HTTP backends checked with a GET of /healthz
// every HTTPInterval, PerService backends of one kind to a service.
type Workload struct {
	TCP, HTTP                 int
	TCPInterval, HTTPInterval time.Duration
	// Timeout is every check's timeout, in whole seconds (keepalived's
	// connect_timeout has no finer unit).
	Timeout time.Duration
	// Fall is how many consecutive failures take a backend down.
	Fall int
	// PerService is the number of backends of each service.
	PerService int
}

// DefaultWorkload is the size the issue asks for: 10,000 TCP checks every
// second and 2,000 HTTP checks every 2 seconds, fall 3, 10 backends a
// service.
var DefaultWorkload = Workload{TCP: 10000, HTTP: 2000, TCPInterval: time.Second, HTTPInterval: 2 * time.Second, Timeout: time.Second, Fall: 3, PerService: 10}

// Scaled returns w with n TCP and m HTTP backends.
func (w Workload) Scaled(n, m int) Workload {
	w.TCP, w.HTTP = n, m
	return w
}

// Validate reports a workload the address plan cannot hold. A workload
// of no backends is valid: it measures vipd's agent idle.
func (w Workload) Validate() error {
	var errs []error
	if w.TCP < 0 || w.HTTP < 0 || w.TCP+w.HTTP > maxBackends {
		errs = append(errs, fmt.Errorf("%d tcp and %d http backends: want 0..%d in all", w.TCP, w.HTTP, maxBackends))
	}
	if w.PerService < 1 {
		errs = append(errs, fmt.Errorf("%d backends per service: want at least 1", w.PerService))
	}
	for _, d := range []time.Duration{w.TCPInterval, w.HTTPInterval, w.Timeout} {
		if d < time.Second || d%time.Second != 0 {
			errs = append(errs, fmt.Errorf("interval or timeout %s: want whole seconds (keepalived's unit)", d))
		}
	}
	if w.Fall < 1 {
		errs = append(errs, fmt.Errorf("fall %d: want at least 1", w.Fall))
	}
	return errors.Join(errs...)
}

// String describes w as the report's header does.
func (w Workload) String() string {
	return fmt.Sprintf("%d tcp every %s + %d http every %s (fall %d, timeout %s, %d backends a service)",
		w.TCP, w.TCPInterval, w.HTTP, w.HTTPInterval, w.Fall, w.Timeout, w.PerService)
}

// Idle reports whether w has no backends: vipd's agent alone.
func (w Workload) Idle() bool { return w.TCP+w.HTTP == 0 }

// ChecksPerSecond is the probe rate w asks for.
func (w Workload) ChecksPerSecond() float64 {
	return float64(w.TCP)/w.TCPInterval.Seconds() + float64(w.HTTP)/w.HTTPInterval.Seconds()
}

// The address plan: backend k listens on 10.77.(k/250).(k%250+1), TCP
// backends on port 8080 and HTTP ones on port 80, all local through one
// route (ip route add local 10.77.0.0/16 dev lo) in the listeners'
// namespace (see sides_test.go); service s has the VIP
// 10.100.(s/250).(s%250+1), port 80.
const (
	// BackendPrefix is the prefix the backends' addresses come from.
	BackendPrefix = "10.77.0.0/16"
	tcpPort       = 8080
	httpPort      = 80
	maxBackends   = 250 * 256
	// HealthPath is the path of the HTTP checks.
	HealthPath = "/healthz"
)

// Backend is one checked backend of the workload.
type Backend struct {
	Kind Kind
	Addr netip.AddrPort
}

// Service is one service of the workload: its VIP and its backends, all
// of one kind.
type Service struct {
	Name     string
	VIP      netip.AddrPort
	Kind     Kind
	Backends []Backend
}

// Backends returns the backends of w: the TCP ones, then the HTTP ones.
func (w Workload) Backends() []Backend {
	out := make([]Backend, 0, w.TCP+w.HTTP)
	for k := range w.TCP + w.HTTP {
		kind, port := TCP, uint16(tcpPort)
		if k >= w.TCP {
			kind, port = HTTP, httpPort
		}
		ip := netip.AddrFrom4([4]byte{10, 77, byte(k / 250), byte(k%250 + 1)})
		out = append(out, Backend{Kind: kind, Addr: netip.AddrPortFrom(ip, port)})
	}
	return out
}

// Services returns the services of w: PerService consecutive backends of
// one kind each (the last of a kind may have fewer).
func (w Workload) Services() []Service {
	var out []Service
	bs := w.Backends()
	for len(bs) > 0 {
		n := 1
		for n < len(bs) && n < w.PerService && bs[n].Kind == bs[0].Kind {
			n++
		}
		s := len(out)
		vip := netip.AddrFrom4([4]byte{10, 100, byte(s / 250), byte(s%250 + 1)})
		out = append(out, Service{Name: fmt.Sprintf("%s-%d", bs[0].Kind, s), VIP: netip.AddrPortFrom(vip, 80), Kind: bs[0].Kind, Backends: bs[:n:n]})
		bs = bs[n:]
	}
	return out
}

// interval returns the check interval of kind.
func (w Workload) interval(k Kind) time.Duration {
	if k == HTTP {
		return w.HTTPInterval
	}
	return w.TCPInterval
}

// Daemon holds the per-run [daemon] settings of vipd's configuration.
type Daemon struct {
	// MetricsListen is where vipd serves its metrics.
	MetricsListen string
	// StateDir and ControlSocket are per run.
	StateDir, ControlSocket string
	// HalfOpen makes the TCP checks half-open (a SYN, no connection).
	HalfOpen bool
}

// WriteVipd writes w as a vipd configuration: NAT services with weighted
// round robin that quiesce a failed backend (weight 0), with one check
// per service for every backend. Jitter is off and rise is 1, as
// keepalived's checks have neither. The daemon manages no iptables
// rules, announces nothing and re-reads the kernel hourly, so that what
// it does in the measured windows is checking.
func (w Workload) WriteVipd(out io.Writer, d Daemon) error {
	bw := bufio.NewWriterSize(out, 64<<10)
	fmt.Fprintf(bw, "# vipd health-check benchmark: %s\n", w)
	fmt.Fprintf(bw, "[daemon]\ninterface = \"vipd0\"\nuplinks = []\nmanage_iptables = false\nmetrics_listen = %q\nresync_interval = \"1h\"\nwatch = false\n", d.MetricsListen)
	if d.StateDir != "" {
		fmt.Fprintf(bw, "state_dir = %q\n", d.StateDir)
	}
	if d.ControlSocket != "" {
		fmt.Fprintf(bw, "control_socket = %q\n", d.ControlSocket)
	}
	for _, s := range w.Services() {
		fmt.Fprintf(bw, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nscheduler = \"wrr\"\non_failure = \"quiesce\"\n", s.Name, s.VIP.Addr(), s.VIP.Port())
		fmt.Fprintf(bw, "check = { type = %q, interval = \"%s\", timeout = \"%s\", rise = 1, fall = %d, jitter = 0, initial = \"up\"", s.Kind, w.interval(s.Kind), w.Timeout, w.Fall)
		if s.Kind == HTTP {
			fmt.Fprintf(bw, ", path = %q, status = \"200\"", HealthPath)
		}
		if s.Kind == TCP && d.HalfOpen {
			bw.WriteString(", half_open = true")
		}
		bw.WriteString(" }\nbackend = [")
		for j, b := range s.Backends {
			if j > 0 {
				bw.WriteString(", ")
			}
			fmt.Fprintf(bw, "{ address = %q, port = %d }", b.Addr.Addr(), b.Addr.Port())
		}
		bw.WriteString("]\n")
	}
	return bw.Flush()
}

// WriteKeepalived writes w as a keepalived.conf with the same services
// and checks: delay_loop is the interval; a failed check is retried
// fall-1 times, an interval apart, before the backend goes down
// (inhibit_on_failure: weight 0, as vipd's quiesce), so that both take a
// backend down after fall failed probes an interval apart.
func (w Workload) WriteKeepalived(out io.Writer) error {
	bw := bufio.NewWriterSize(out, 64<<10)
	fmt.Fprintf(bw, "# vipd health-check benchmark: %s\n", w)
	bw.WriteString("global_defs {\n    router_id vipd_health_bench\n}\n")
	timeout := int(w.Timeout / time.Second)
	for _, s := range w.Services() {
		iv := int(w.interval(s.Kind) / time.Second)
		fmt.Fprintf(bw, "\nvirtual_server %s %d {\n    delay_loop %d\n    lb_algo wrr\n    lb_kind NAT\n    protocol TCP\n", s.VIP.Addr(), s.VIP.Port(), iv)
		for _, b := range s.Backends {
			fmt.Fprintf(bw, "    real_server %s %d {\n        weight 1\n        inhibit_on_failure\n", b.Addr.Addr(), b.Addr.Port())
			switch s.Kind {
			case TCP:
				fmt.Fprintf(bw, "        TCP_CHECK {\n            connect_timeout %d\n            retry %d\n            delay_before_retry %d\n        }\n", timeout, w.Fall-1, iv)
			case HTTP:
				fmt.Fprintf(bw, "        HTTP_GET {\n            url {\n                path %s\n                status_code 200\n            }\n            connect_timeout %d\n            retry %d\n            delay_before_retry %d\n        }\n", HealthPath, timeout, w.Fall-1, iv)
			}
			bw.WriteString("    }\n")
		}
		bw.WriteString("}\n")
	}
	return bw.Flush()
}
