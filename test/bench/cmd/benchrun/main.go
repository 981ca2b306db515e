// Command benchrun is the guest side of vipd's control-plane benchmark
// (test/vm/bench.sh, `make bench`). In one boot of the test guest it
// measures, for each size N services x M backends:
//
//  1. cold programming, empty table to every object in the kernel, of
//     `ipvsadm -R`, keepalived and vipd, each in a network namespace of its
//     own (a fresh IPVS table: see flush below);
//  2. vipd: one backend's weight changed in the file, from the file's
//     rename to the kernel's return from vipd's IPVS set command (a
//     kretprobe: see kprobe.go), and the operations vipd applied for it
//     (its log has one "applied" line per operation), in each layout of
//     vipd's configuration: one file, or a main file including the
//     services from files of 100 services each (the change rewrites one);
//  3. keepalived: the same change applied by SIGHUP, polled every 5 ms;
//  4. vipd's peak RSS and CPU time;
//
// and, to explain them, how long reading the table takes with 1, 2 and 4
// sockets and what each step of a reload costs in this guest. It prints a
// table between BENCH-TABLE-BEGIN and BENCH-TABLE-END and the results as
// JSON between BENCH-JSON-BEGIN and BENCH-JSON-END.
//
// Completion is read from the kernel: the last service of the fixture
// (every tool writes it last) with all its backends, then a full read of
// the table compared line by line with the fixture; a tool whose table
// does not match then is timed by full reads instead (marked "bound").
//
// The kernel's flush pathology: deleted destinations stay on a per-
// namespace list that every destination add searches, so re-adding a large
// table right after flushing it is several times slower for a couple of
// minutes. Each tool therefore programs a namespace of its own; the table
// is flushed (ipvsadm -C) after each run so that the global service hash
// shrinks again, and the next run waits for the CPUs to be idle.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/kernel/ipvs"
	"github.com/vipd/vipd/kernel/link"
	"github.com/vipd/vipd/lb"
	"github.com/vipd/vipd/test/bench"
)

type options struct {
	sizes, changeSizes, readdSizes []size
	// memSizes are sizes at which vipd alone starts cold, for its memory.
	memSizes []size
	// soak is the number of reloads after which vipd's memory is read
	// again, at the largest change size.
	soak  int
	tools []string
	// layouts are vipd's configuration layouts, "single" and "split", in
	// order: the first is the one vipd starts cold with.
	layouts                   []string
	perFile                   int
	reps, kreps               int
	kreloadTimeout            time.Duration
	vipd, keepalived, ipvsadm string
	work                      string
	qemu                      string
}

type size struct{ N, M int }

func (s size) String() string { return fmt.Sprintf("%dx%d", s.N, s.M) }

func parseSizes(s string) ([]size, error) {
	var out []size
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		a, b, ok := strings.Cut(f, "x")
		n, err1 := strconv.Atoi(a)
		m, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || m < 1 {
			return nil, fmt.Errorf("size %q: want NxM, such as 1000x10", f)
		}
		out = append(out, size{n, m})
	}
	return out, nil
}

// parseLayouts parses the -layouts flag.
func parseLayouts(s string) ([]string, error) {
	var out []string
	for _, l := range strings.Split(s, ",") {
		if l != "single" && l != "split" || slices.Contains(out, l) {
			return nil, fmt.Errorf("-layouts %q: want single and/or split, once each", s)
		}
		out = append(out, l)
	}
	return out, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == floorFlag {
		if err := floorChild(os.Args[2:]); err != nil {
			log.Fatal(err)
		}
		return
	}
	var o options
	var sizes, changes, readd, mem, tools, layouts string
	flag.StringVar(&sizes, "sizes", "100x10,1000x10,10000x10", "sizes NxM to program cold")
	flag.StringVar(&changes, "change-sizes", "100x10,10000x10", "sizes at which to time a one-backend change")
	flag.StringVar(&readd, "readd-sizes", "1000x10", "sizes at which to time vipd re-adding a table right after a flush (the kernel's pathology)")
	flag.StringVar(&mem, "mem-sizes", "1000x100,100x1000,50000x2", "sizes at which vipd alone starts cold, for its peak RSS")
	flag.IntVar(&o.soak, "soak", 1000, "reloads after the timed changes at the largest change size, after which vipd's RSS is read again")
	flag.StringVar(&tools, "tools", "ipvsadm,keepalived,vipd", "tools to measure, in this order")
	flag.StringVar(&layouts, "layouts", "single,split", "vipd's configuration layouts in which to time the change, in this order (the first is the cold start's): single (one file), split (vipd.toml includes "+bench.IncludeDir+"/*.toml)")
	flag.IntVar(&o.perFile, "per-file", bench.PerFile, "services per file of the split layout")
	flag.IntVar(&o.reps, "reps", 100, "repetitions of vipd's one-backend change")
	flag.IntVar(&o.kreps, "kreps", 3, "repetitions of keepalived's reload")
	flag.DurationVar(&o.kreloadTimeout, "kreload-timeout", 300*time.Second, "give up on a keepalived reload after this long")
	flag.StringVar(&o.vipd, "vipd", "/payload/vipd", "vipd binary")
	flag.StringVar(&o.keepalived, "keepalived", "keepalived", "keepalived binary")
	flag.StringVar(&o.ipvsadm, "ipvsadm", "ipvsadm", "ipvsadm binary")
	flag.StringVar(&o.work, "work", "/tmp/bench", "work directory")
	flag.StringVar(&o.qemu, "qemu", "", "qemu version, for the report")
	flag.Parse()
	var err error
	for _, x := range []struct {
		s   string
		out *[]size
	}{{sizes, &o.sizes}, {changes, &o.changeSizes}, {readd, &o.readdSizes}, {mem, &o.memSizes}} {
		if *x.out, err = parseSizes(x.s); err != nil {
			log.Fatal(err)
		}
	}
	o.tools = strings.Split(tools, ",")
	if o.layouts, err = parseLayouts(layouts); err != nil {
		log.Fatal(err)
	}
	if o.perFile < 1 {
		log.Fatalf("-per-file %d: want at least 1", o.perFile)
	}
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	log.SetPrefix("bench: ")
	res := run(o)
	js, _ := json.MarshalIndent(res, "", "  ")
	fmt.Printf("BENCH-JSON-BEGIN\n%s\nBENCH-JSON-END\n", js)
	fmt.Printf("BENCH-TABLE-BEGIN\n%sBENCH-TABLE-END\n", render(res))
}

// Results are everything one run measured.
type Results struct {
	Kernel string
	// Clocksource is the guest kernel's clock source (tsc, hpet...).
	Clocksource string
	Qemu        string
	CPUs        int
	MemMiB      int64
	Started     time.Time
	Duration    float64
	// Layouts are vipd's configuration layouts measured, in order;
	// PerFile is the split layout's services per file.
	Layouts []string
	PerFile int
	// ChangeMethod and ReloadMethod say how vipd's change and
	// keepalived's reload were timed.
	ChangeMethod, ReloadMethod string
	Sizes                      []*SizeResult
}

// SizeResult holds the figures of one size.
type SizeResult struct {
	N, M, Objects int
	Cold          map[string]*Cold
	// VipdStart is vipd's first pass as it logs it, and StartPhases what
	// it did when (seconds from the exec, by the log's clock).
	VipdStart   *pass
	StartPhases *Phases
	// VipdCPUCold is vipd's CPU time when its first pass was done.
	VipdCPUCold float64
	VipdPeakMiB float64
	VipdRSSMiB  float64
	VipdCPUAll  float64
	// MemOnly says that only vipd ran at this size, for its memory.
	MemOnly bool `json:",omitempty"`
	// Soak is vipd's memory over many reloads (see soakReloads).
	Soak *Soak `json:",omitempty"`
	// Changes are vipd's one-backend changes by layout, Reload
	// keepalived's.
	Changes map[string]*Change
	// Floor is the floor daemon's one-backend changes (see floorChild).
	Floor  *Change `json:",omitempty"`
	Reload *Change
	// Readd is vipd's cold start right after a flush of the same
	// namespace (the kernel's flush pathology), in seconds.
	Readd *float64
	// Flush is the time ipvsadm -C took after each tool's run.
	Flush map[string]float64
	// Read is Services() in seconds by number of sockets; Poll one
	// Service() query in milliseconds.
	Read map[int]float64
	Poll float64
	// Steps are the costs of a reload's steps in the single layout, and
	// ColdSteps of a cold start's, measured here one by one.
	Steps     *Steps
	ColdSteps *ColdSteps
	Notes     []string
}

// Soak is vipd's memory over many reloads of one file, each waited for
// (its "reload timing" line) before the next: RSS (VmRSS, MiB) after the
// timed changes, after the first tenth of the reloads and after all of
// them, and the peak (VmHWM) at the end.
type Soak struct {
	Layout                                 string
	Reloads                                int
	RSSBefore, RSSTenth, RSSAfter, PeakMiB float64
	Seconds, CPU                           float64
	Err                                    string `json:",omitempty"`
}

// Phases is a cold start by vipd's log, in seconds since the exec: the
// configuration read and the kernel opened ("starting"), the first
// operation, each kind of operation's first and last, the pass's end.
type Phases struct {
	Starting, FirstOp, Reconciled float64
	Kinds                         map[string]KindPhase
}

// KindPhase is one kind of operation in a cold start.
type KindPhase struct {
	N           int
	First, Last float64
}

// ColdSteps are the costs, in seconds, of a cold start's steps, each
// measured alone in the guest with vipd's packages: parsing the file,
// the desired state, the plan from an empty table, binding the VIPs,
// applying the IPVS operations in batches as the reconciler does (into a
// fresh namespace), and writing the log lines of the applied operations
// as a pass does (one per operation up to lb.LogEachMax, else one per run
// of a kind).
type ColdSteps struct {
	Parse, Desired, Plan, BindVIPs, ApplyIPVS, Log float64
	VIPs, IPVSOps                                  int
}

// Cold is one tool's cold programming.
type Cold struct {
	Seconds float64
	// Bound is set when completion was timed by full reads of the table
	// rather than by the last object (an upper bound).
	Bound bool
	Err   string `json:",omitempty"`
}

// Change is a series of timed one-backend changes.
type Change struct {
	// Layout is vipd's configuration layout; File the file the change
	// rewrites (relative to the configuration's directory) and FileBytes
	// its size (vipd).
	Layout    string `json:",omitempty"`
	File      string `json:",omitempty"`
	FileBytes int    `json:",omitempty"`
	// StartOps is what vipd's start applied to the table left by its run
	// in the previous layout: 0 when the two describe the same table and
	// the previous series ended on the fixture's weight (vipd).
	StartOps *int      `json:",omitempty"`
	MS       []float64 // file write to kernel, milliseconds
	Ops      []int     `json:",omitempty"` // operations applied per change (vipd)
	TookMS   []float64 `json:",omitempty"` // the pass's own duration as logged (vipd)
	// PreMS is the time from the write to the pass's start (the pass's
	// end as read from the log, less its duration): the watcher's
	// debounce, the parse and the reload's checks (vipd).
	PreMS []float64 `json:",omitempty"`
	// Timing is vipd's own account of each reload ("reload timing"
	// lines), in milliseconds by step: read, wait, parse, apply, total;
	// Parsed the services each parsed, Full how many parsed the whole
	// configuration, and Files how many named each file (vipd).
	Timing map[string][]float64 `json:",omitempty"`
	Parsed []int                `json:",omitempty"`
	Full   int                  `json:",omitempty"`
	Files  map[string]int       `json:",omitempty"`
	// Stray counts events of the probe that were not the first set
	// command after a change's rename (vipd).
	Stray  int `json:",omitempty"`
	Failed int
	Err    string `json:",omitempty"`
}

// Steps are the costs, in milliseconds, of what a reload does at one
// size, each measured alone in the guest: vipd's watcher reads the file
// as soon as the rename is reported; the daemon parses again only the
// services whose text changed (config.ParseFrom) and runs a pass over
// those services alone (lb.Reconciler.ReconcileDelta: the desired state
// of the change, a read of each changed service, the plan, the
// operations).
type Steps struct {
	Read, Parse, Pass float64
}

// pollInterval is how often keepalived's reload is polled: it takes
// 0.15-13 s, and each query takes the IPVS mutex.
const pollInterval = 5 * time.Millisecond

func run(o options) *Results {
	res := &Results{Kernel: kernelRelease(), Clocksource: clocksource(), Qemu: o.qemu, CPUs: numCPU(), MemMiB: memMiB(), Started: time.Now(),
		Layouts: o.layouts, PerFile: o.perFile, ChangeMethod: setMethod,
		ReloadMethod: fmt.Sprintf("from CLOCK_MONOTONIC right before the rename (the SIGHUP follows it) to a query of the service showing the new weight, polled every %v", pollInterval)}
	var tr *setTracer
	if len(o.changeSizes) > 0 && slices.Contains(o.tools, "vipd") {
		// Defined now, so that a guest without kprobe events fails before
		// anything ran; armed only before the first change (see kprobe.go).
		var err error
		if tr, err = newSetTracer(commOf(o.vipd)); err != nil {
			log.Fatalf("vipd's change is timed by a kretprobe through tracefs, and it cannot be set up: %v", err)
		}
		defer func() {
			if err := tr.close(); err != nil {
				log.Printf("stopping the trace reader: %v", err)
			}
		}()
		log.Printf("kretprobe %s/%s on %s defined (comm %q, trace_clock mono), not armed", probeGroup, probeEvent, probeFunc, commOf(o.vipd))
	}
	// First every cold start, with the probe not armed: an armed
	// kretprobe runs on every IPVS command of every tool.
	files := map[size]*fixtureFiles{}
	for _, sz := range o.sizes {
		r := &SizeResult{N: sz.N, M: sz.M, Cold: map[string]*Cold{}, Changes: map[string]*Change{}, Flush: map[string]float64{}, Read: map[int]float64{}}
		res.Sizes = append(res.Sizes, r)
		ff, err := runSize(o, sz, r, false)
		if err != nil {
			r.Notes = append(r.Notes, "error: "+err.Error())
			log.Printf("%s: %v", sz, err)
		}
		files[sz] = ff
	}
	if slices.Contains(o.tools, "vipd") {
		for _, sz := range o.memSizes {
			if slices.Contains(o.sizes, sz) {
				continue
			}
			r := &SizeResult{N: sz.N, M: sz.M, MemOnly: true, Cold: map[string]*Cold{}, Changes: map[string]*Change{}, Flush: map[string]float64{}, Read: map[int]float64{}}
			res.Sizes = append(res.Sizes, r)
			if _, err := runSize(o, sz, r, true); err != nil {
				r.Notes = append(r.Notes, "error: "+err.Error())
				log.Printf("%s: %v", sz, err)
			}
		}
	}
	// Then vipd's changes, timed by the probe.
	if tr != nil {
		var last size
		for _, sz := range o.sizes {
			if slices.Contains(o.changeSizes, sz) && files[sz] != nil {
				last = sz
			}
		}
		for i, sz := range o.sizes {
			ff := files[sz]
			if !slices.Contains(o.changeSizes, sz) || ff == nil {
				continue
			}
			soak := 0
			if sz == last {
				soak = o.soak
			}
			waited := quiesce(60 * time.Second)
			log.Printf("%s: vipd's changes (waited %.1fs for idle CPUs)", sz, waited.Seconds())
			if err := runVipdChanges(o, ff, res.Sizes[i], tr, soak); err != nil {
				res.Sizes[i].Notes = append(res.Sizes[i].Notes, "vipd changes: "+err.Error())
				log.Printf("%s: vipd changes: %v", sz, err)
			}
		}
	}
	res.Duration = time.Since(res.Started).Seconds()
	return res
}

// fixtureFiles are the files of one size.
type fixtureFiles struct {
	f                        *bench.Fixture
	dir                      string
	restore, keepalived      string
	want                     []string
	last                     lb.ServiceKey
	changeSvc, changeBackend int
	changeKey                lb.ServiceKey
	changeAddr               netip.AddrPort
	kaliveVariant            [2][]byte // weight 2, weight 1
	// layouts are vipd's configuration by layout; "single" is always
	// there (the cold-start steps read it).
	layouts map[string]*layoutFiles
}

// layoutFiles are vipd's configuration of one size in one layout.
type layoutFiles struct {
	name string // "single" or "split"
	dir  string
	// main is the file vipd runs with, changed the file the change
	// rewrites, and variants its content with weight 2 and weight 1.
	main, changed string
	variants      [2][]byte
	// write writes the fixture's own files (weight 1).
	write func() error
}

// rel returns path relative to the layout's directory when it is inside.
func (lf *layoutFiles) rel(path string) string {
	if r, err := filepath.Rel(lf.dir, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}

// newLayouts prepares vipd's configuration of f in each layout wanted
// (and the single one) in subdirectories of ff.dir, and writes it.
func newLayouts(o options, ff *fixtureFiles, d bench.Daemon) error {
	f := ff.f
	single := &layoutFiles{name: "single", dir: filepath.Join(ff.dir, "single")}
	single.main = filepath.Join(single.dir, "vipd.toml")
	single.changed = single.main
	single.write = func() error {
		var b bytes.Buffer
		if err := f.WriteTOML(&b, d); err != nil {
			return err
		}
		return os.WriteFile(single.main, b.Bytes(), 0o644)
	}
	for i, w := range []int{2, 1} {
		var b bytes.Buffer
		if err := f.WithWeight(ff.changeSvc, ff.changeBackend, w).WriteTOML(&b, d); err != nil {
			return err
		}
		single.variants[i] = b.Bytes()
	}
	ff.layouts = map[string]*layoutFiles{"single": single}
	if slices.Contains(o.layouts, "split") {
		split := &layoutFiles{name: "split", dir: filepath.Join(ff.dir, "split")}
		split.main = filepath.Join(split.dir, "vipd.toml")
		parts := f.Parts(o.perFile)
		part := parts[ff.changeSvc/o.perFile]
		split.changed = filepath.Join(split.dir, part.Name)
		split.write = func() error {
			_, err := f.WriteSplit(split.dir, d, o.perFile)
			return err
		}
		for i, w := range []int{2, 1} {
			var b bytes.Buffer
			if err := f.WithWeight(ff.changeSvc, ff.changeBackend, w).WriteServices(&b, part); err != nil {
				return err
			}
			split.variants[i] = b.Bytes()
		}
		ff.layouts["split"] = split
	}
	for _, lf := range ff.layouts {
		if err := os.MkdirAll(lf.dir, 0o755); err != nil {
			return err
		}
		if err := lf.write(); err != nil {
			return err
		}
	}
	return nil
}

// runSize programs size sz cold with each tool (vipd alone with memOnly)
// and returns its fixture's files.
func runSize(o options, sz size, r *SizeResult, memOnly bool) (*fixtureFiles, error) {
	f, err := bench.New(bench.Spec{Services: sz.N, Backends: sz.M})
	if err != nil {
		return nil, err
	}
	r.Objects = f.Objects()
	dir := filepath.Join(o.work, sz.String())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ff := &fixtureFiles{f: f, dir: dir, want: f.Table(), changeSvc: sz.N / 2, changeBackend: sz.M / 2}
	last := f.Services[len(f.Services)-1]
	ff.last = lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: last.VIP, Port: last.Port}
	cs := f.Services[ff.changeSvc]
	ff.changeKey = lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: cs.VIP, Port: cs.Port}
	ff.changeAddr = cs.Backends[ff.changeBackend].Addr
	// Both layouts share the daemon's state and socket: vipd started on
	// another layout adopts the table its previous run left.
	d := bench.Daemon{StateDir: filepath.Join(dir, "vipd-state"), ControlSocket: filepath.Join(dir, "vipd.sock")}
	if err := newLayouts(o, ff, d); err != nil {
		return nil, err
	}
	for i, w := range []int{2, 1} {
		var k bytes.Buffer
		if err := f.WithWeight(ff.changeSvc, ff.changeBackend, w).WriteKeepalived(&k); err != nil {
			return nil, err
		}
		ff.kaliveVariant[i] = k.Bytes()
	}
	ff.restore, ff.keepalived = filepath.Join(dir, "ipvsadm.rules"), filepath.Join(dir, "keepalived.conf")
	for path, write := range map[string]func(io.Writer) error{
		ff.restore:    f.WriteRestore,
		ff.keepalived: f.WriteKeepalived,
	} {
		fh, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		if err := write(fh); err != nil {
			return nil, err
		}
		fh.Close()
	}
	log.Printf("%s: %d objects; fixtures in %s", sz, r.Objects, dir)
	change := slices.Contains(o.changeSizes, sz)
	tools := o.tools
	if memOnly {
		tools = []string{"vipd"}
	}
	for _, tool := range tools {
		waited := quiesce(60 * time.Second)
		log.Printf("%s: %s (waited %.1fs for idle CPUs)", sz, tool, waited.Seconds())
		var err error
		switch tool {
		case "ipvsadm":
			err = runIpvsadm(o, ff, r)
		case "keepalived":
			err = runKeepalived(o, ff, r, change)
		case "vipd":
			err = runVipd(o, ff, r, slices.Contains(o.readdSizes, sz), memOnly)
		default:
			err = fmt.Errorf("unknown tool %q", tool)
		}
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("%s: %v", tool, err))
			log.Printf("%s: %s: %v", sz, tool, err)
		}
	}
	return ff, nil
}

// coldTimeout bounds one cold programming run.
func coldTimeout(objects int) time.Duration {
	return time.Minute + time.Duration(objects)*5*time.Millisecond
}

// waitProgrammed waits until the table in a holds the fixture: first the
// last service with all its backends (cheap, polled), then a full read
// that must equal the fixture. It returns when the table was complete.
func waitProgrammed(a *ipvs.IPVS, ff *fixtureFiles, timeout time.Duration, p *proc) (time.Time, bool, error) {
	deadline := time.Now().Add(timeout)
	for {
		if time.Now().After(deadline) {
			return time.Time{}, false, fmt.Errorf("not programmed after %v", timeout)
		}
		select {
		case <-p.done:
			return time.Time{}, false, fmt.Errorf("exited before the table was complete: %v", p.err)
		default:
		}
		st, err := a.Service(ff.last)
		if err != nil {
			return time.Time{}, false, err
		}
		if st != nil && len(st.Dests) == ff.f.Spec.Backends {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t := time.Now()
	got, err := readTable(a)
	if err != nil {
		return time.Time{}, false, err
	}
	if slices.Equal(got, ff.want) {
		return t, false, nil
	}
	log.Printf("the last service is complete but the table is not (%d of %d lines): timing by full reads", len(got), len(ff.want))
	for time.Now().Before(deadline) {
		got, err := readTable(a)
		if err != nil {
			return time.Time{}, false, err
		}
		if slices.Equal(got, ff.want) {
			return time.Now(), true, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}, false, fmt.Errorf("table incomplete after %v", timeout)
}

func readTable(a *ipvs.IPVS) ([]string, error) {
	svcs, err := a.Services()
	if err != nil {
		return nil, err
	}
	return bench.SaveLines(svcs), nil
}

// flush empties a namespace's IPVS table and records how long it took.
func flush(ns *namespace, tool string, r *SizeResult, ipvsadm string) {
	t := time.Now()
	if _, err := ns.run(ipvsadm, "-C"); err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("%s: flush: %v", tool, err))
	}
	r.Flush[tool] = time.Since(t).Seconds()
}

func runIpvsadm(o options, ff *fixtureFiles, r *SizeResult) error {
	ns, err := newNamespace("ipvsadm")
	if err != nil {
		return err
	}
	defer ns.close()
	a, err := ipvs.New(ipvs.Options{NetnsPath: ns.path()})
	if err != nil {
		return err
	}
	defer a.Close()
	in, err := os.Open(ff.restore)
	if err != nil {
		return err
	}
	defer in.Close()
	cmd := exec.Command(o.ipvsadm, "-R")
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, &out, &out
	t0 := time.Now()
	if err := ns.start(cmd); err != nil {
		return err
	}
	werr := cmd.Wait()
	t1 := time.Now()
	c := &Cold{Seconds: t1.Sub(t0).Seconds()}
	r.Cold["ipvsadm"] = c
	if werr != nil {
		c.Err = fmt.Sprintf("%v: %s", werr, out.String())
	} else if got, err := readTable(a); err != nil || !slices.Equal(got, ff.want) {
		c.Err = fmt.Sprintf("table differs from the fixture after ipvsadm -R (%d of %d lines, %v)", len(got), len(ff.want), err)
	}
	log.Printf("ipvsadm -R: %.2fs %s", c.Seconds, c.Err)
	flush(ns, "ipvsadm", r, o.ipvsadm)
	return nil
}

func runKeepalived(o options, ff *fixtureFiles, r *SizeResult, change bool) error {
	ns, err := newNamespace("keepalived")
	if err != nil {
		return err
	}
	defer ns.close()
	a, err := ipvs.New(ipvs.Options{NetnsPath: ns.path()})
	if err != nil {
		return err
	}
	defer a.Close()
	logf, err := os.Create(filepath.Join(ff.dir, "keepalived.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	// -n: stay in the foreground; -C: the checker (LVS) process only, no
	// VRRP; -l -D: log details to the console, which is the log file.
	cmd := exec.Command(o.keepalived, "-n", "-C", "-l", "-D", "-f", ff.keepalived,
		"-p", filepath.Join(ff.dir, "keepalived.pid"), "-c", filepath.Join(ff.dir, "checkers.pid"))
	cmd.Stdout, cmd.Stderr = logf, logf
	t0 := time.Now()
	p, err := startIn(ns, cmd)
	if err != nil {
		return err
	}
	defer p.kill()
	t1, bound, err := waitProgrammed(a, ff, coldTimeout(r.Objects), p)
	c := &Cold{Bound: bound}
	r.Cold["keepalived"] = c
	if err != nil {
		c.Err = err.Error()
		return err
	}
	c.Seconds = t1.Sub(t0).Seconds()
	log.Printf("keepalived: %.2fs", c.Seconds)
	if change {
		r.Reload = timeChanges(o.kreps, o.kreloadTimeout, func(i int) (int64, error) {
			t, err := writeAtomic(ff.keepalived, ff.kaliveVariant[i%2])
			if err == nil {
				err = cmd.Process.Signal(syscall.SIGHUP)
			}
			return t, err
		}, func(w int, _ int64, timeout time.Duration) (int64, error) {
			return pollWeight(a, ff, w, timeout)
		}, nil)
		log.Printf("keepalived reload: %v ms", r.Reload.MS)
	}
	p.kill()
	flush(ns, "keepalived", r, o.ipvsadm)
	return nil
}

// timeChanges makes n one-backend changes, alternately to weight 2 and
// back to 1, each by apply (which returns when the change was made, by
// CLOCK_MONOTONIC in nanoseconds), and times each by wait, which returns
// when the kernel had weight w (by the same clock) or an error, which
// ends the series. after, when set, is called after each change has
// reached the kernel.
func timeChanges(n int, timeout time.Duration, apply func(i int) (int64, error), wait func(w int, t0 int64, timeout time.Duration) (int64, error), after func(c *Change, t0 int64)) *Change {
	c := &Change{}
	start := time.Now()
	for i := range n {
		if i >= 2 && time.Since(start) > changeBudget {
			c.Err = fmt.Sprintf("stopped after %d of %d changes: over the %v budget", i, n, changeBudget)
			break
		}
		want := []int{2, 1}[i%2]
		t0, err := apply(i)
		if err != nil {
			c.Err = err.Error()
			break
		}
		t1, err := wait(want, t0, timeout)
		if err != nil {
			c.Failed++
			c.Err = err.Error()
			break
		}
		c.MS = append(c.MS, float64(t1-t0)/1e6)
		if after != nil {
			after(c, t0)
		}
		// The next change must not fall in the same debounce window, and
		// the previous one's work must be over.
		time.Sleep(300 * time.Millisecond)
		quiesce(timeout)
	}
	return c
}

// changeBudget bounds the time one series of changes may take (after two
// changes), so that a slow reload cannot take the whole run.
const changeBudget = 8 * time.Minute

// pollWeight polls the changed service every pollInterval until its
// backend has weight w, and returns when it saw it (CLOCK_MONOTONIC, ns).
func pollWeight(a *ipvs.IPVS, ff *fixtureFiles, w int, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		st, err := a.Service(ff.changeKey)
		if err != nil {
			return 0, err
		}
		if st != nil {
			if d, ok := st.Dests[ff.changeAddr]; ok && d.Weight == w {
				return monoNow(), nil
			}
		}
		time.Sleep(pollInterval)
	}
	return 0, fmt.Errorf("weight %d not in the kernel after %v", w, timeout)
}

// runVipd times vipd's cold start into a fresh namespace, reads its
// resources and, unless memOnly, how long reading the table takes; at
// readd sizes it times vipd re-adding its table right after a flush; and,
// unless memOnly, it times a cold start's steps one by one.
func runVipd(o options, ff *fixtureFiles, r *SizeResult, readd, memOnly bool) error {
	ns, err := newNamespace("vipd")
	if err != nil {
		return err
	}
	defer ns.close()
	a, err := ipvs.New(ipvs.Options{NetnsPath: ns.path()})
	if err != nil {
		return err
	}
	defer a.Close()
	os.RemoveAll(filepath.Join(ff.dir, "vipd-state"))
	// The fixture's own files: earlier variants may have replaced them.
	first := ff.layouts[o.layouts[0]]
	if err := first.write(); err != nil {
		return err
	}

	p, vl, t0, err := startVipd(o, ns, first.main, filepath.Join(ff.dir, "vipd.log"))
	if err != nil {
		return err
	}
	defer p.stop(30 * time.Second)
	t1, bound, err := waitProgrammed(a, ff, coldTimeout(r.Objects), p)
	c := &Cold{Bound: bound}
	r.Cold["vipd"] = c
	if err != nil {
		c.Err = fmt.Sprintf("%v; vipd errors: %q", err, vl.firstErrors())
		return err
	}
	c.Seconds = t1.Sub(t0).Seconds()
	if p, ok := vl.next("start", time.Minute); ok {
		r.VipdStart = &p
		if p.Failed > 0 {
			c.Err = fmt.Sprintf("%d operations failed: %q", p.Failed, vl.firstErrors())
		}
		r.StartPhases = phases(vl.start, t0)
	}
	if ps, err := readProc(p.pid()); err == nil {
		r.VipdCPUCold = ps.CPU.Seconds()
	}
	log.Printf("vipd (%s layout): %.2fs (first pass %+v)", first.name, c.Seconds, r.VipdStart)
	if ps, err := readProc(p.pid()); err == nil {
		r.VipdPeakMiB = float64(ps.HWMKiB) / 1024
		r.VipdRSSMiB = float64(ps.RSSKiB) / 1024
		r.VipdCPUAll = ps.CPU.Seconds()
	}
	if !memOnly {
		measureReads(ns, a, r)
	}
	p.stop(30 * time.Second)

	if readd {
		// The pathology: flush, then the same daemon starts again at once
		// into the same namespace, with the fixture's own files.
		if err := first.write(); err != nil {
			return err
		}
		flush(ns, "vipd (before re-add)", r, o.ipvsadm)
		p, vl, t0, err := startVipd(o, ns, first.main, filepath.Join(ff.dir, "vipd-readd.log"))
		if err != nil {
			return err
		}
		t1, _, err := waitProgrammed(a, ff, 4*coldTimeout(r.Objects), p)
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("vipd re-add after flush: %v; %q", err, vl.firstErrors()))
		} else {
			s := t1.Sub(t0).Seconds()
			r.Readd = &s
			log.Printf("vipd re-add right after a flush: %.2fs", s)
		}
		p.stop(30 * time.Second)
	}
	flush(ns, "vipd", r, o.ipvsadm)
	ns.close()
	if !memOnly {
		quiesce(time.Minute)
		r.ColdSteps = measureColdSteps(o, ff)
	}
	return nil
}

// runVipdChanges starts vipd on size ff in a fresh namespace, in the
// first layout, and times its changes there; then the floor's, with vipd
// stopped; then vipd's in each other layout, restarted on the table. With
// soak > 0, soak more reloads follow the last layout's changes (see
// soakReloads).
func runVipdChanges(o options, ff *fixtureFiles, r *SizeResult, tr *setTracer, soak int) error {
	ns, err := newNamespace("vipd-changes")
	if err != nil {
		return err
	}
	defer ns.close()
	a, err := ipvs.New(ipvs.Options{NetnsPath: ns.path()})
	if err != nil {
		return err
	}
	defer a.Close()
	os.RemoveAll(filepath.Join(ff.dir, "vipd-state"))
	first := ff.layouts[o.layouts[0]]
	if err := first.write(); err != nil {
		return err
	}
	p, vl, _, err := startVipd(o, ns, first.main, filepath.Join(ff.dir, "vipd-changes.log"))
	if err != nil {
		return err
	}
	defer p.stop(30 * time.Second)
	if _, _, err := waitProgrammed(a, ff, coldTimeout(r.Objects), p); err != nil {
		return fmt.Errorf("vipd's start before the changes: %w; vipd errors: %q", err, vl.firstErrors())
	}
	if _, ok := vl.next("start", time.Minute); !ok {
		return fmt.Errorf("vipd did not log its start pass: %q", vl.tail())
	}
	quiesce(time.Minute)
	r.Changes[first.name] = vipdChanges(o, a, ff, first, vl, tr)
	if first.name == "single" {
		r.Steps = measureSteps(a, ff)
	}
	if soak > 0 && len(o.layouts) == 1 {
		r.Soak = soakReloads(p, vl, first, soak)
	}
	p.stop(30 * time.Second)
	// The floor, on the same service, in the same namespace, with vipd
	// stopped: an even number of changes leaves the fixture's weight for
	// the layouts that follow.
	r.Floor = measureFloor(o.reps, ns, a, ff, tr)
	for i, name := range o.layouts[1:] {
		lf := ff.layouts[name]
		n := 0
		if i == len(o.layouts)-2 {
			n = soak
		}
		r.Changes[name] = vipdRestarted(o, ns, a, ff, lf, r, tr, n)
		if name == "single" {
			r.Steps = measureSteps(a, ff)
		}
	}
	flush(ns, "vipd (changes)", r, o.ipvsadm)
	return nil
}

// soakReloads makes n more reloads of lf's changed file, alternately
// with the two weights, each waited for (vipd's pass and its "reload
// timing" line) before the next, and reads vipd's memory before, after a
// tenth of them and at the end: its RSS must not grow with the reloads.
func soakReloads(p *proc, vl *vipdLog, lf *layoutFiles, n int) *Soak {
	s := &Soak{Layout: lf.name}
	rss := func() (float64, procStats) {
		ps, err := readProc(p.pid())
		if err != nil {
			s.Err = err.Error()
		}
		return float64(ps.RSSKiB) / 1024, ps
	}
	var ps0 procStats
	s.RSSBefore, ps0 = rss()
	// Lines of a series that stopped early would pair each write with
	// the reload of the one before.
	time.Sleep(time.Second)
	if n := vl.drain(); n > 0 {
		log.Printf("soak: dropped %d lines of vipd's log not taken", n)
	}
	// Start with the variant the file does not hold.
	cur, _ := os.ReadFile(lf.changed)
	k := 0
	if bytes.Equal(cur, lf.variants[0]) {
		k = 1
	}
	t := time.Now()
	for i := range n {
		if _, err := writeAtomic(lf.changed, lf.variants[(i+k)%2]); err != nil {
			s.Err = err.Error()
			break
		}
		if _, ok := vl.next("", 30*time.Second); !ok {
			s.Err = fmt.Sprintf("reload %d: no pass in 30s: %q", i+1, vl.tail())
			break
		}
		if _, ok := vl.timing(5 * time.Second); !ok {
			s.Err = fmt.Sprintf("reload %d: no reload timing line: %q", i+1, vl.tail())
			break
		}
		s.Reloads++
		if s.Reloads == n/10 {
			s.RSSTenth, _ = rss()
		}
	}
	s.Seconds = time.Since(t).Seconds()
	var ps1 procStats
	s.RSSAfter, ps1 = rss()
	s.PeakMiB = float64(ps1.HWMKiB) / 1024
	s.CPU = (ps1.CPU - ps0.CPU).Seconds()
	log.Printf("soak (%s layout): %+v", lf.name, *s)
	return s
}

// vipdRestarted starts vipd again, with the configuration in layout lf,
// on the table its run in the first layout left; checks that after its
// start the table is still the fixture's; and times the changes in lf.
func vipdRestarted(o options, ns *namespace, a *ipvs.IPVS, ff *fixtureFiles, lf *layoutFiles, r *SizeResult, tr *setTracer, soak int) *Change {
	fail := func(err error) *Change {
		log.Printf("vipd (%s layout): %v", lf.name, err)
		return &Change{Layout: lf.name, File: lf.rel(lf.changed), FileBytes: len(lf.variants[0]), Err: err.Error()}
	}
	if err := lf.write(); err != nil {
		return fail(err)
	}
	p, vl, _, err := startVipd(o, ns, lf.main, filepath.Join(ff.dir, "vipd-"+lf.name+".log"))
	if err != nil {
		return fail(err)
	}
	defer p.stop(30 * time.Second)
	start, ok := vl.next("start", coldTimeout(r.Objects))
	if !ok {
		select {
		case <-p.done:
			return fail(fmt.Errorf("vipd exited at its start (%v): %q", p.err, vl.tail()))
		default:
			return fail(fmt.Errorf("vipd did not log its start pass: %q", vl.tail()))
		}
	}
	if got, err := readTable(a); err != nil || !slices.Equal(got, ff.want) {
		return fail(fmt.Errorf("after vipd's start the table differs from the fixture (%d of %d lines, %v)", len(got), len(ff.want), err))
	}
	log.Printf("vipd (%s layout): started on the table left by the %s layout, %d operations", lf.name, o.layouts[0], start.Applied)
	c := vipdChanges(o, a, ff, lf, vl, tr)
	c.StartOps = &start.Applied
	if soak > 0 {
		r.Soak = soakReloads(p, vl, lf, soak)
	}
	return c
}

// vipdChanges times o.reps one-backend changes of vipd's configuration
// in layout lf, each by the kernel's timestamp of vipd's set command,
// with vipd's log's account of each.
func vipdChanges(o options, a *ipvs.IPVS, ff *fixtureFiles, lf *layoutFiles, vl *vipdLog, tr *setTracer) *Change {
	if err := tr.start(); err != nil {
		return &Change{Layout: lf.name, Err: err.Error()}
	}
	stray := 0
	c := timeChanges(o.reps, 5*time.Minute, func(i int) (int64, error) {
		stray += tr.drain()
		return writeAtomic(lf.changed, lf.variants[i%2])
	}, func(w int, t0 int64, timeout time.Duration) (int64, error) {
		t, skipped, err := tr.waitSet(a, ff, w, t0, timeout)
		stray += skipped
		return t, err
	}, func(ch *Change, t0 int64) {
		// The change's pass is the next one, whatever reason vipd gives
		// ("file changed" for one file): nothing else makes passes here
		// (no health checks, an hourly resync, no drains), and the change
		// is already in the kernel.
		p, ok := vl.next("", 30*time.Second)
		if !ok {
			ch.Ops = append(ch.Ops, -1)
			return
		}
		ch.Ops = append(ch.Ops, p.Applied)
		ch.TookMS = append(ch.TookMS, float64(p.Took.Microseconds())/1000)
		ch.PreMS = append(ch.PreMS, float64(p.At-p.Took.Nanoseconds()-t0)/1e6)
		if t, ok := vl.timing(5 * time.Second); ok {
			if ch.Timing == nil {
				ch.Timing, ch.Files = map[string][]float64{}, map[string]int{}
			}
			for k, v := range t.MS {
				ch.Timing[k] = append(ch.Timing[k], v)
			}
			ch.Parsed = append(ch.Parsed, t.Parsed)
			if t.Full {
				ch.Full++
			}
			if t.File != "" {
				ch.Files[lf.rel(t.File)]++
			}
		}
	})
	if err := tr.record(false); err != nil && c.Err == "" {
		c.Err = err.Error()
	}
	c.Layout, c.File, c.FileBytes, c.Stray = lf.name, lf.rel(lf.changed), len(lf.variants[0]), stray
	log.Printf("vipd change (%s layout): %v ms, ops %v, took %v ms", lf.name, c.MS, c.Ops, c.TookMS)
	return c
}

// phases turns a first pass's timeline into seconds since t0.
func phases(tl Timeline, t0 time.Time) *Phases {
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return t.Sub(t0).Seconds()
	}
	p := &Phases{Starting: since(tl.Starting), Reconciled: since(tl.Reconciled), Kinds: map[string]KindPhase{}}
	for k, sp := range tl.Kinds {
		p.Kinds[k] = KindPhase{N: sp.N, First: since(sp.First), Last: since(sp.Last)}
		if p.FirstOp == 0 || since(sp.First) < p.FirstOp {
			p.FirstOp = since(sp.First)
		}
	}
	return p
}

// startVipd starts `vipd run -c config` in ns with its log read by a
// vipdLog that keeps a copy in logPath.
func startVipd(o options, ns *namespace, config, logPath string) (*proc, *vipdLog, time.Time, error) {
	cmd := exec.Command(o.vipd, "run", "-c", config, "--log-level", "info")
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	defer pw.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	vl, err := newVipdLog(pr, logPath)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	t0 := time.Now()
	p, err := startIn(ns, cmd)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	return p, vl, t0, nil
}

// measureReads times reading the whole table with 1, 2 and 4 sockets, and
// one service's query.
func measureReads(ns *namespace, a *ipvs.IPVS, r *SizeResult) {
	for _, n := range []int{1, 2, 4} {
		b, err := ipvs.New(ipvs.Options{NetnsPath: ns.path(), DumpSockets: n})
		if err != nil {
			r.Notes = append(r.Notes, err.Error())
			return
		}
		t := time.Now()
		_, err = b.Services()
		r.Read[n] = time.Since(t).Seconds()
		b.Close()
		if err != nil {
			r.Notes = append(r.Notes, err.Error())
		}
	}
	k := lb.ServiceKey{}
	svcs, _ := a.Services()
	for key := range svcs {
		k = key
		break
	}
	t := time.Now()
	for range 100 {
		a.Service(k)
	}
	r.Poll = float64(time.Since(t).Microseconds()) / 100 / 1000
	log.Printf("reads: %v s by sockets; one service %.2f ms", r.Read, r.Poll)
}

// measureSteps times the steps of a one-backend reload of the single
// layout one by one, with vipd's own packages, in this guest.
func measureSteps(a *ipvs.IPVS, ff *fixtureFiles) *Steps {
	s := &Steps{}
	ms := func(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }
	// The running configuration is the fixture (weight 1); the change
	// writes weight 2, as the measured changes do.
	single := ff.layouts["single"]
	base, _, err := config.ParseFrom(nil, single.main, single.variants[1])
	if err != nil {
		log.Printf("steps: %v", err)
		return s
	}
	dir, err := os.MkdirTemp("", "steps")
	if err != nil {
		return s
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, single.variants[0], 0o644); err != nil {
		return s
	}
	t := time.Now()
	data, err := os.ReadFile(path)
	s.Read = ms(t)
	if err != nil {
		return s
	}
	t = time.Now()
	cfg, delta, err := config.ParseFrom(base, single.main, data)
	s.Parse = ms(t)
	if err != nil || delta.Full {
		log.Printf("steps: parse: %v, full %v", err, delta.Full)
		return s
	}
	r := lb.NewReconciler(lb.Options{Kernel: lb.Kernel{IPVS: a}, Dummy: cfg.Daemon.Interface})
	pass := func(from, to *config.Config, oldTo, newTo int) (*lb.Result, bool, error) {
		return r.ReconcileDelta(context.Background(), &to.Spec, lb.Delta{
			Old: from.Spec.Services[delta.From:oldTo],
			New: to.Spec.Services[delta.From:newTo],
		})
	}
	t = time.Now()
	res, ok, err := pass(base, cfg, delta.OldTo, delta.NewTo)
	s.Pass = ms(t)
	if err != nil || !ok || len(res.Applied) != 1 {
		log.Printf("steps: delta pass: ok %v, err %v, result %+v; want one operation", ok, err, res)
	}
	// Back to the file's content.
	pass(cfg, base, delta.NewTo, delta.OldTo)
	log.Printf("steps (ms): %+v", *s)
	return s
}

func numCPU() int {
	data, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(data), "processor\t:")
}

func memMiB() int64 {
	data, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n / 1024
		}
	}
	return 0
}

// percentile returns the nearest-rank percentile p of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// measureColdSteps times a cold start's steps one by one in a namespace of
// its own (see ColdSteps).
func measureColdSteps(o options, ff *fixtureFiles) *ColdSteps {
	cs := &ColdSteps{}
	since := func(t time.Time) float64 { return time.Since(t).Seconds() }
	path := ff.layouts["single"].main
	data, err := os.ReadFile(path)
	if err != nil {
		log.Printf("cold steps: %v", err)
		return nil
	}
	t := time.Now()
	cfg, err := config.Parse(path, data)
	cs.Parse = since(t)
	if err != nil {
		log.Printf("cold steps: %v", err)
		return cs
	}
	t = time.Now()
	desired := lb.Desired(&cfg.Spec, lb.Host{Dummy: cfg.Daemon.Interface})
	cs.Desired = since(t)
	t = time.Now()
	ops := lb.Plan(desired, lb.NewState(), lb.PlanOptions{})
	cs.Plan = since(t)

	ns, err := newNamespace("cold-steps")
	if err != nil {
		log.Printf("cold steps: %v", err)
		return cs
	}
	defer ns.close()
	d, err := link.New(link.Options{Interface: cfg.Daemon.Interface, NetnsPath: ns.path()})
	if err != nil {
		log.Printf("cold steps: %v", err)
		return cs
	}
	t = time.Now()
	err = d.Ensure()
	for _, op := range ops {
		if op.Kind == lb.OpBindVIP && err == nil {
			err = d.Bind(op.Addr)
			cs.VIPs++
		}
	}
	cs.BindVIPs = since(t)
	d.Close()
	if err != nil {
		log.Printf("cold steps: bind: %v", err)
	}

	a, err := ipvs.New(ipvs.Options{NetnsPath: ns.path()})
	if err != nil {
		log.Printf("cold steps: %v", err)
		return cs
	}
	defer a.Close()
	var failed int
	t = time.Now()
	for i := 0; i < len(ops); {
		j := i
		for j < len(ops) && ops[j].Kind == ops[i].Kind {
			j++
		}
		if k := ops[i].Kind; k == lb.OpAddService || k == lb.OpAddDest {
			for x := i; x < j; x += 1024 {
				for _, err := range a.Apply(ops[x:min(x+1024, j)]) {
					if err != nil {
						failed++
					}
				}
			}
			cs.IPVSOps += j - i
		}
		i = j
	}
	cs.ApplyIPVS = since(t)
	if failed > 0 {
		log.Printf("cold steps: %d IPVS operations failed", failed)
	}

	pr, pw, err := os.Pipe()
	if err == nil {
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, pr); close(drained) }()
		lg := slog.New(slog.NewTextHandler(pw, nil))
		t = time.Now()
		// As vipd's pass logs: each operation up to lb.LogEachMax, and
		// above that one line per run of a kind, with its count.
		for i := 0; i < len(ops); {
			j := i + 1
			for j < len(ops) && ops[j].Kind == ops[i].Kind {
				j++
			}
			if len(ops) <= lb.LogEachMax {
				for _, op := range ops[i:j] {
					lg.Info("applied", "op", op.Kind.String(), "detail", op.String())
				}
			} else {
				lg.Info("applied", "op", ops[i].Kind.String(), "count", j-i)
			}
			i = j
		}
		cs.Log = since(t)
		pw.Close()
		<-drained
		pr.Close()
	}
	if _, err := ns.run(o.ipvsadm, "-C"); err != nil {
		log.Printf("cold steps: %v", err)
	}
	log.Printf("cold steps (s): %+v", *cs)
	return cs
}
