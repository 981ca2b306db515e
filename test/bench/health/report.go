package healthbench

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Targets of the issue.
const (
	// TargetHostCPU is the most of one core vipd may use on the host for
	// the TCP-only workload (10,000 checks a second).
	TargetHostCPU = 10.0
	// TargetRatio is how many times less CPU than keepalived vipd uses
	// in the same boot.
	TargetRatio = 3.0
)

// Peer is what was measured of one checker under one workload.
type Peer struct {
	// Name is "vipd", "vipd-halfopen" (vipd with half-open TCP checks)
	// or "keepalived".
	Name string
	// CPU is the checker's CPU, in % of one core, over each second of
	// the window; CPUMean over the whole window.
	CPU     []float64
	CPUMean float64
	// Sys and SysMean are the part of CPU spent in the kernel (the
	// process's system time): in the "one" layout, both ends of every
	// handshake on the loopback.
	Sys     []float64
	SysMean float64
	// Switches is the context switches of the checker's threads per
	// second (a thread's every wake-up is one), over each second of the
	// window; SwitchesMean over the whole window.
	Switches     []float64
	SwitchesMean float64
	// RSS is the checker's resident set size in MiB, sampled each second
	// of the window.
	RSS []float64
	// RSSAnon, RSSFile and RSSShmem split the RSS at the window's end,
	// in MiB: anonymous memory (heap, stacks), file-backed pages (the
	// executable's and libraries' touched pages), and shared memory
	// (those pages too where the files are on a RAM file system, as in
	// the guest).
	RSSAnon, RSSFile, RSSShmem float64
	// Lateness holds the lateness histogram's observations in the window
	// (vipd_health_check_lateness_seconds), nil for a checker that
	// exports none.
	Lateness []Bucket
	// Probes is the probe rate in the window, 0 if the checker does not
	// say.
	Probes float64
	// Failures is, for vipd, the probes that failed in the window; for
	// keepalived, the backends at weight 0 at its end. Every backend
	// listens then: any is a failure of the checker (a timeout, say).
	Failures float64
	// InFlight is, for vipd, its probes in flight (running or waiting
	// for a slot) at the window's end; ListenersCPU the listener
	// process's CPU over the window, in % of one core: the other half of
	// every check on a loopback.
	InFlight, ListenersCPU float64
	// GoMem is, for vipd, its Go runtime's memory at the window's end,
	// from its go_memstats_* metrics; nil for a checker that exports
	// none.
	GoMem *GoMem
	// DetectTCP and DetectHTTP are the detection latencies, in ms: from
	// a backend's listener closed to its weight 0.
	DetectTCP, DetectHTTP []float64
}

// Result is one run of the benchmark: peers measured under one workload
// in one place.
type Result struct {
	// Where says where it ran: "host (fake kernel)" or "guest".
	Where    string
	Workload Workload
	// Window is the CPU window, in seconds.
	Window float64
	Peers  []Peer
	// Detection is where the detection latency ends (vipd applying weight
	// 0, or the kernel's table showing it).
	Detection string
	// Sides describes the layout of checker and backends.
	Sides string
	// HugePages is the kernel's transparent huge page mode
	// (/sys/kernel/mm/transparent_hugepage/enabled), which decides how
	// much of a heap counts in a resident set.
	HugePages string
}

// isVipd reports whether a peer's name is one of vipd's runs.
func isVipd(name string) bool { return name == "vipd" || strings.HasPrefix(name, "vipd-") }

// Check returns an error for every figure a peer lacks: a benchmark
// that could not measure a peer fails rather than print a partial table.
func (r *Result) Check(peers ...string) error {
	var errs []error
	for _, name := range peers {
		i := slices.IndexFunc(r.Peers, func(p Peer) bool { return p.Name == name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%s: not measured", name))
			continue
		}
		p := r.Peers[i]
		if len(p.CPU) == 0 || len(p.RSS) == 0 {
			errs = append(errs, fmt.Errorf("%s: no CPU or RSS samples", name))
		}
		if r.Workload.TCP > 0 && len(p.DetectTCP) == 0 {
			errs = append(errs, fmt.Errorf("%s: no tcp detection sample", name))
		}
		if r.Workload.HTTP > 0 && len(p.DetectHTTP) == 0 {
			errs = append(errs, fmt.Errorf("%s: no http detection sample", name))
		}
		if isVipd(name) && len(p.Lateness) == 0 && !r.Workload.Idle() {
			errs = append(errs, fmt.Errorf("%s: no lateness histogram", name))
		}
	}
	return errors.Join(errs...)
}

// Percentile returns the p-th percentile (0-100) of xs by nearest rank,
// NaN for none.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// peer returns the named peer, or nil.
func (r *Result) peer(name string) *Peer {
	for i := range r.Peers {
		if r.Peers[i].Name == name {
			return &r.Peers[i]
		}
	}
	return nil
}

// CPURatio returns keepalived's mean CPU over that of the vipd run
// named vipd, and false unless both were measured.
func (r *Result) CPURatio(vipd string) (float64, bool) {
	v, k := r.peer(vipd), r.peer("keepalived")
	if v == nil || k == nil || v.CPUMean <= 0 {
		return 0, false
	}
	return k.CPUMean / v.CPUMean, true
}

// WriteTable writes r as the report's table: one row per figure and
// peer with n, p50 and p99, then the ratios and the targets.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s: %s; %.0f checks/s; CPU window %.0f s\n", r.Where, r.Workload, r.Workload.ChecksPerSecond(), r.Window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "peer\tfigure\tn\tp50\tp99\tmean/bound\t")
	f := func(x float64, prec int) string {
		if math.IsNaN(x) {
			return "-"
		}
		return fmt.Sprintf("%.*f", prec, x)
	}
	for _, p := range r.Peers {
		fmt.Fprintf(tw, "%s\tcpu %% of one core (per s)\t%d\t%s\t%s\tmean %s\t\n", p.Name, len(p.CPU), f(Percentile(p.CPU, 50), 1), f(Percentile(p.CPU, 99), 1), f(p.CPUMean, 1))
		fmt.Fprintf(tw, "%s\tof which in the kernel %%\t%d\t%s\t%s\tmean %s\t\n", p.Name, len(p.Sys), f(Percentile(p.Sys, 50), 1), f(Percentile(p.Sys, 99), 1), f(p.SysMean, 1))
		fmt.Fprintf(tw, "%s\tcontext switches per s\t%d\t%s\t%s\tmean %s\t\n", p.Name, len(p.Switches), f(Percentile(p.Switches, 50), 0), f(Percentile(p.Switches, 99), 0), f(p.SwitchesMean, 0))
		fmt.Fprintf(tw, "%s\trss MiB (per s)\t%d\t%s\t%s\tmax %s\t\n", p.Name, len(p.RSS), f(Percentile(p.RSS, 50), 1), f(Percentile(p.RSS, 99), 1), f(Percentile(p.RSS, 100), 1))
		if p.Lateness != nil {
			n := p.Lateness[len(p.Lateness)-1].Count
			fmt.Fprintf(tw, "%s\tcheck lateness ms\t%.0f\t%s\t%s\t%s probes/s\t\n", p.Name, n, f(1000*Quantile(p.Lateness, 0.5), 2), f(1000*Quantile(p.Lateness, 0.99), 2), f(p.Probes, 0))
		} else if r.Workload.Idle() {
			fmt.Fprintf(tw, "%s\tcheck lateness ms\t-\t-\t-\tno checks\t\n", p.Name)
		} else {
			fmt.Fprintf(tw, "%s\tcheck lateness ms\t-\t-\t-\tnot exported\t\n", p.Name)
		}
		for _, d := range []struct {
			kind Kind
			ms   []float64
		}{{TCP, p.DetectTCP}, {HTTP, p.DetectHTTP}} {
			if len(d.ms) == 0 {
				continue
			}
			bound := float64(r.Workload.Fall) * r.Workload.interval(d.kind).Seconds() * 1000
			fmt.Fprintf(tw, "%s\tdetection %s ms\t%d\t%s\t%s\tfall x interval %.0f\t\n", p.Name, d.kind, len(d.ms), f(Percentile(d.ms, 50), 0), f(Percentile(d.ms, 99), 0), bound)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, p := range r.Peers {
		if !isVipd(p.Name) {
			continue
		}
		if ratio, ok := r.CPURatio(p.Name); ok {
			notes = append(notes, fmt.Sprintf("cpu keepalived/%s (means): %.1fx (target >= %.0fx: %s)", p.Name, ratio, TargetRatio, verdict(ratio >= TargetRatio)))
		}
		if strings.HasPrefix(r.Where, "host") && r.Workload.HTTP == 0 && r.Workload.TCP >= 10000 {
			notes = append(notes, fmt.Sprintf("%s cpu, mean: %.1f%% of one core (target <= %.0f%%: %s)", p.Name, p.CPUMean, TargetHostCPU, verdict(p.CPUMean <= TargetHostCPU)))
		}
	}
	for _, p := range r.Peers {
		what := "probes failed in the window"
		if p.Name == "keepalived" {
			what = "backends at weight 0 after the window"
		}
		notes = append(notes, fmt.Sprintf("%s: %.0f %s (every backend listening); the listener process used %.1f%% of one core in its window", p.Name, p.Failures, what, p.ListenersCPU))
		if p.CPUMean > 0 {
			notes = append(notes, fmt.Sprintf("%s: %.0f%% of its CPU in the kernel", p.Name, 100*p.SysMean/p.CPUMean))
		}
		if p.RSSAnon+p.RSSFile+p.RSSShmem > 0 {
			notes = append(notes, fmt.Sprintf("%s: rss at the window's end %.1f MiB anonymous, %.1f MiB file-backed, %.1f MiB shared (files on a RAM file system count here)", p.Name, p.RSSAnon, p.RSSFile, p.RSSShmem))
		}
		if isVipd(p.Name) {
			notes = append(notes, fmt.Sprintf("%s: %.0f probes in flight at the window's end", p.Name, p.InFlight))
		}
		if m := p.GoMem; m != nil {
			notes = append(notes, fmt.Sprintf("%s: Go memory at the window's end: heap %.1f MiB allocated (GC goal %.1f), %.1f MiB of spans in use, %.1f MiB free and not returned to the kernel; stacks %.1f MiB; all the runtime holds %.1f MiB",
				p.Name, m.HeapAlloc/(1<<20), m.NextGC/(1<<20), m.HeapInuse/(1<<20), (m.HeapIdle-m.HeapReleased)/(1<<20), m.StackInuse/(1<<20), (m.Sys-m.HeapReleased)/(1<<20)))
		}
	}
	notes = append(notes, "detection: from the listener closed to "+r.Detection)
	if r.Sides != "" {
		notes = append(notes, r.Sides)
	}
	if r.HugePages != "" {
		notes = append(notes, "transparent huge pages: "+r.HugePages)
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// GoMem is a Go program's memory, in bytes, from its go_memstats_*
// metrics.
type GoMem struct {
	HeapAlloc, NextGC, HeapInuse, HeapIdle, HeapReleased, StackInuse, Sys float64
}

// GoMemOf returns the Go memory s reports, nil when it has no
// go_memstats_sys_bytes.
func GoMemOf(s *Scrape) *GoMem {
	v := s.Values
	if _, ok := v["go_memstats_sys_bytes"]; !ok {
		return nil
	}
	return &GoMem{HeapAlloc: v["go_memstats_heap_alloc_bytes"], NextGC: v["go_memstats_next_gc_bytes"], HeapInuse: v["go_memstats_heap_inuse_bytes"],
		HeapIdle: v["go_memstats_heap_idle_bytes"], HeapReleased: v["go_memstats_heap_released_bytes"], StackInuse: v["go_memstats_stack_inuse_bytes"],
		Sys: v["go_memstats_sys_bytes"]}
}
