package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/kernel/ipvs"
)

// The kernel-side timestamp of vipd's change: a kretprobe on IPVS's
// generic-netlink handler of every command that changes the table
// (ip_vs_genl_set_cmd in net/netfilter/ipvs/ip_vs_ctl.c: new, edit and
// delete of services and destinations), defined through tracefs and
// enabled in a trace instance of the benchmark's own whose clock is mono,
// the kernel's CLOCK_MONOTONIC. The probe fires when the handler returns,
// with the kernel's table changed and its mutex released; the driver
// reads the events from the instance's trace_pipe. Unlike polling the
// kernel, this costs the measured daemon nothing: no netlink queries that
// compete for the guest's two CPUs and take the IPVS mutex.
//
// Arming a kretprobe patches kernel text (ftrace's trampoline, through
// text_poke_bp), and under the emulator's multi-threaded vCPUs that has
// stalled the guest (an RCU stall in text_poke_bp called from
// ftrace_update_trampoline, as the probe was armed again between two
// series). The probe is therefore defined at the start (a disabled
// probe patches nothing), armed once, with the guest idle, before the
// first series of changes, and never disarmed: between series the
// event's filter matches no process, so that its events are discarded
// in the kernel (a filter is data the event's handler reads; changing it
// patches no code). tracing_on cannot serve: once trace_pipe has been
// read, a read with tracing off returns end of file. The probe and the
// instance stay until the guest powers off.
const (
	tracefsDir    = "/sys/kernel/tracing"
	probeGroup    = "vipd_bench"
	probeEvent    = "ipvs_set"
	probeFunc     = "ip_vs_genl_set_cmd"
	traceInstance = "vipd_bench"
	// stopMarker, written to the instance's trace_marker, ends the reader.
	stopMarker = "vipd-bench: stop"
)

// setMethod describes the measurement for the report.
const setMethod = "from CLOCK_MONOTONIC right before the rename to the return of the kernel's IPVS set handler " +
	"(" + probeFunc + ") called by vipd: a kretprobe through tracefs, trace_clock mono, a comm filter; " +
	"each event verified by one query of the service showing the new weight"

// traceEvent is one line of trace_pipe: an event of the probe or a
// trace_marker write.
type traceEvent struct {
	Mono int64 // the event's timestamp, CLOCK_MONOTONIC in nanoseconds
	Comm string
	PID  int
	Name string // the event's name: probeEvent or tracing_mark_write
	Ret  int64  // the handler's return value (probe events)
	Text string // the marker's text (markers)
}

// traceLine is a trace_pipe line with the default options: task-PID,
// optionally the TGID in parentheses, [CPU], the irq-info flags, the
// timestamp in seconds, the event's name and its fields.
var traceLine = regexp.MustCompile(`^\s*(.*)-(\d+)\s+(?:\(\s*[-\d]+\)\s+)?\[(\d+)\]\s+(?:\S+\s+)?(\d+)\.(\d+):\s+(\w+):\s?(.*)$`)

// parseTraceLine parses one line of trace_pipe.
func parseTraceLine(line string) (traceEvent, error) {
	m := traceLine.FindStringSubmatch(line)
	if m == nil {
		return traceEvent{}, fmt.Errorf("unexpected trace line %q", line)
	}
	sec, err1 := strconv.ParseInt(m[4], 10, 64)
	frac, err2 := strconv.ParseInt(m[5], 10, 64)
	pid, err3 := strconv.Atoi(m[2])
	if err := errors.Join(err1, err2, err3); err != nil || len(m[5]) > 9 {
		return traceEvent{}, fmt.Errorf("trace line %q: bad timestamp or pid", line)
	}
	for range 9 - len(m[5]) {
		frac *= 10
	}
	ev := traceEvent{Mono: sec*1e9 + frac, Comm: m[1], PID: pid, Name: m[6], Text: m[7]}
	if ev.Name == probeEvent {
		ret, err := strconv.ParseInt(field(" "+m[7], "ret"), 10, 64)
		if err != nil {
			return traceEvent{}, fmt.Errorf("trace line %q: no ret", line)
		}
		ev.Ret = ret
	}
	return ev, nil
}

// setTracer owns the probe and the trace instance, and reads the events.
type setTracer struct {
	dir    string // the instance's directory
	events chan traceEvent
	done   chan struct{}
	err    error // why the reader stopped, once done is closed
	pipe   *os.File
	// armed says that the probe was armed (see arm).
	armed bool
	// filter is the event's filter while recording (the measured comm).
	filter string
}

// newSetTracer defines the probe, creates the instance with the mono
// clock and a filter for comm (the probe stays disabled until arm),
// starts reading its trace_pipe, and checks with a marker that the
// timestamps are CLOCK_MONOTONIC's. It mounts tracefs when it is not
// mounted. Without tracefs or kprobe events it fails: there is no
// fallback to polling.
func newSetTracer(comm string) (*setTracer, error) {
	if _, err := os.Stat(filepath.Join(tracefsDir, "kprobe_events")); err != nil {
		if err := unix.Mount("tracefs", tracefsDir, "tracefs", 0, ""); err != nil {
			return nil, fmt.Errorf("mount tracefs on %s: %w (the kernel needs CONFIG_TRACING)", tracefsDir, err)
		}
		if _, err := os.Stat(filepath.Join(tracefsDir, "kprobe_events")); err != nil {
			return nil, fmt.Errorf("tracefs has no kprobe_events (the kernel needs CONFIG_KPROBE_EVENTS): %w", err)
		}
	}
	def := fmt.Sprintf("r:%s/%s %s ret=$retval:s32", probeGroup, probeEvent, probeFunc)
	if err := appendTo(filepath.Join(tracefsDir, "kprobe_events"), def); err != nil {
		return nil, fmt.Errorf("define the kretprobe %q (is ip_vs loaded?): %w", def, err)
	}
	t := &setTracer{dir: filepath.Join(tracefsDir, "instances", traceInstance), events: make(chan traceEvent, 1024), done: make(chan struct{}),
		filter: fmt.Sprintf("comm == %q", comm)}
	if err := os.Mkdir(t.dir, 0o755); err != nil {
		t.removeProbe()
		return nil, fmt.Errorf("create trace instance: %w", err)
	}
	setup := []struct{ file, value string }{
		{"trace_clock", "mono"},
		{filepath.Join("events", probeGroup, probeEvent, "filter"), offFilter},
	}
	for _, s := range setup {
		if err := os.WriteFile(filepath.Join(t.dir, s.file), []byte(s.value), 0o644); err != nil {
			t.removeInstance()
			t.removeProbe()
			return nil, fmt.Errorf("trace instance: write %q to %s: %w", s.value, s.file, err)
		}
	}
	// Blocking reads, in a thread of their own: os.Open would put the file
	// in Go's poller, and poll on trace_pipe may wait for the buffer to
	// fill to buffer_percent, where a blocking read returns any event.
	fd, err := unix.Open(filepath.Join(t.dir, "trace_pipe"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.removeInstance()
		t.removeProbe()
		return nil, fmt.Errorf("open trace_pipe: %w", err)
	}
	t.pipe = os.NewFile(uintptr(fd), "trace_pipe")
	go t.read()
	if err := t.checkClock(); err != nil {
		return nil, errors.Join(err, t.close())
	}
	return t, nil
}

// offFilter is the event's filter between series: no process has this
// name.
const offFilter = `comm == "vipd-bench-off"`

// read sends the events of trace_pipe until the stop marker.
func (t *setTracer) read() {
	defer close(t.done)
	sc := bufio.NewScanner(t.pipe)
	for sc.Scan() {
		ev, err := parseTraceLine(sc.Text())
		if err != nil {
			t.err = err
			return
		}
		if ev.Name == "tracing_mark_write" && ev.Text == stopMarker {
			return
		}
		t.events <- ev
	}
	t.err = fmt.Errorf("trace_pipe ended: %w", sc.Err())
}

// checkClock writes a marker between two readings of CLOCK_MONOTONIC and
// checks that its timestamp falls between them (trace_pipe shows
// microseconds).
func (t *setTracer) checkClock() error {
	before := monoNow()
	if err := os.WriteFile(filepath.Join(t.dir, "trace_marker"), []byte("vipd-bench: clock check"), 0o644); err != nil {
		return fmt.Errorf("write trace_marker: %w", err)
	}
	after := monoNow()
	ev, err := t.next(5 * time.Second)
	if err != nil {
		return fmt.Errorf("clock check: %w", err)
	}
	if ev.Name != "tracing_mark_write" || ev.Mono < before-int64(time.Microsecond) || ev.Mono > after {
		return fmt.Errorf("clock check: marker %+v not between CLOCK_MONOTONIC %d and %d: is trace_clock mono?", ev, before, after)
	}
	return nil
}

// arm enables the probe in the instance: the one change of kernel text
// of the run. It is called once, with the guest idle, before the first
// series of changes; later calls do nothing.
func (t *setTracer) arm() error {
	if t.armed {
		return nil
	}
	if err := os.WriteFile(filepath.Join(t.dir, "events", probeGroup, probeEvent, "enable"), []byte("1"), 0o644); err != nil {
		return fmt.Errorf("arm the kretprobe: %w", err)
	}
	t.armed = true
	return nil
}

// record starts or stops the recording of the measured process's events,
// by the event's filter: the armed probe keeps firing, and its events
// are discarded in the kernel while the recording is off.
func (t *setTracer) record(on bool) error {
	v := offFilter
	if on {
		v = t.filter
	}
	if err := os.WriteFile(filepath.Join(t.dir, "events", probeGroup, probeEvent, "filter"), []byte(v), 0o644); err != nil {
		return fmt.Errorf("set the event's filter to %q: %w", v, err)
	}
	return nil
}

// start arms the probe if it is not yet armed, and starts recording.
func (t *setTracer) start() error {
	if err := t.arm(); err != nil {
		return err
	}
	return t.record(true)
}

// next returns the next event, waiting up to timeout.
func (t *setTracer) next(timeout time.Duration) (traceEvent, error) {
	select {
	case ev := <-t.events:
		return ev, nil
	case <-t.done:
		return traceEvent{}, fmt.Errorf("trace reader stopped: %w", t.err)
	case <-time.After(timeout):
		return traceEvent{}, fmt.Errorf("no event in %v", timeout)
	}
}

// drain discards the events read so far and returns how many there were.
func (t *setTracer) drain() int {
	n := 0
	for {
		select {
		case <-t.events:
			n++
		default:
			return n
		}
	}
}

// waitSet waits for vipd's first set command that returned after t0
// (CLOCK_MONOTONIC, ns), then checks once, with one query of the changed
// service, that the kernel shows weight w: a set command that did not
// make the change is an error, not a measurement. It returns the
// command's timestamp and how many earlier events it skipped.
func (t *setTracer) waitSet(a *ipvs.IPVS, ff *fixtureFiles, w int, t0 int64, timeout time.Duration) (int64, int, error) {
	deadline := time.Now().Add(timeout)
	skipped := 0
	for {
		ev, err := t.next(time.Until(deadline))
		if err != nil {
			return 0, skipped, fmt.Errorf("waiting for vipd's IPVS set command: %w", err)
		}
		if ev.Name != probeEvent || ev.Mono < t0 {
			skipped++
			continue
		}
		if ev.Ret != 0 {
			return 0, skipped, fmt.Errorf("vipd's IPVS set command failed in the kernel: %s returned %d", probeFunc, ev.Ret)
		}
		st, err := a.Service(ff.changeKey)
		if err != nil {
			return 0, skipped, fmt.Errorf("verify the weight: %w", err)
		}
		got := -1
		if st != nil {
			if d, ok := st.Dests[ff.changeAddr]; ok {
				got = d.Weight
			}
		}
		if got != w {
			return 0, skipped, fmt.Errorf("after vipd's IPVS set command (%.1f ms after the rename) the kernel shows weight %d for %s, want %d",
				float64(ev.Mono-t0)/1e6, got, ff.changeAddr, w)
		}
		return ev.Mono, skipped, nil
	}
}

// close stops the reader. A probe that was armed stays armed, and the
// instance and the probe's definition stay (removing them would disarm
// it, which patches kernel text): the guest powers off after the run.
// One that was never armed is removed with the instance.
func (t *setTracer) close() error {
	var errs []error
	if err := os.WriteFile(filepath.Join(t.dir, "trace_marker"), []byte(stopMarker), 0o644); err != nil {
		errs = append(errs, fmt.Errorf("write trace_marker: %w", err))
	} else {
		select {
		case <-t.done:
		case <-time.After(5 * time.Second):
			errs = append(errs, errors.New("the trace reader did not stop"))
		}
	}
	errs = append(errs, t.pipe.Close())
	if !t.armed {
		errs = append(errs, t.removeInstance(), t.removeProbe())
	}
	return errors.Join(errs...)
}

func (t *setTracer) removeInstance() error {
	if err := os.Remove(t.dir); err != nil {
		return fmt.Errorf("remove trace instance: %w", err)
	}
	return nil
}

func (t *setTracer) removeProbe() error {
	if err := appendTo(filepath.Join(tracefsDir, "kprobe_events"), fmt.Sprintf("-:%s/%s", probeGroup, probeEvent)); err != nil {
		return fmt.Errorf("remove the kretprobe: %w", err)
	}
	return nil
}

// appendTo writes line to a tracefs file that takes commands appended
// (kprobe_events: opening it for writing without O_APPEND would delete
// every probe).
func appendTo(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// monoNow returns CLOCK_MONOTONIC in nanoseconds, the clock of the trace
// instance's timestamps.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// commOf is the comm the kernel gives a process started from path: its
// base name, cut to TASK_COMM_LEN-1 bytes.
func commOf(path string) string {
	c := filepath.Base(path)
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}
