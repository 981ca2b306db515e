package main

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pass is one reconciliation pass as vipd logs it: a "reconciled" line,
// with the "applied" lines (one per operation) logged since the previous
// pass.
type pass struct {
	Why     string
	Applied int // operations applied, counted from the applied lines
	Logged  int // the applied= field of the reconciled line
	Failed  int
	Took    time.Duration
	// At is when the driver read the line, CLOCK_MONOTONIC in ns.
	At int64 `json:"-"`
}

// vipdLog reads vipd's log from a pipe, keeps a copy in a file, and
// reports passes.
type vipdLog struct {
	passes chan pass
	// timings are the "reload timing" lines.
	timings chan reloadTiming
	mu      sync.Mutex
	errors  []string
	// last are the last lines read, for a daemon that exits.
	last []string
	done chan struct{}
	// start is the timeline of the first pass, by the log's own clock;
	// it is complete once the first pass is reported.
	start Timeline
}

// Timeline is what a first pass did when, by vipd's log: when vipd said
// it was starting (configuration read, kernel opened), when it logged its
// first and last operation of each kind, and when the pass ended.
type Timeline struct {
	Starting, Reconciled time.Time
	Kinds                map[string]*Span
}

// Span is the operations of one kind in a pass.
type Span struct {
	N           int
	First, Last time.Time
}

// timingFields are the durations of vipd's "reload timing" line.
var timingFields = []string{"read", "wait", "parse", "apply", "total"}

// reloadTiming is one "reload timing" line: milliseconds by duration
// field, the file read (when vipd names one: with included files, the one
// that changed), the services parsed, and whether the parse was full.
type reloadTiming struct {
	MS     map[string]float64
	File   string
	Parsed int
	Full   bool
}

// timing returns the next "reload timing" line, waiting up to timeout.
func (l *vipdLog) timing(timeout time.Duration) (reloadTiming, bool) {
	select {
	case t := <-l.timings:
		return t, true
	case <-time.After(timeout):
		return reloadTiming{}, false
	}
}

func newVipdLog(r io.Reader, copyTo string) (*vipdLog, error) {
	f, err := os.Create(copyTo)
	if err != nil {
		return nil, err
	}
	l := &vipdLog{passes: make(chan pass, 1024), timings: make(chan reloadTiming, 1024), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		defer f.Close()
		w := bufio.NewWriterSize(f, 1<<20)
		defer w.Flush()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		applied := 0
		first := true
		l.start.Kinds = map[string]*Span{}
		for sc.Scan() {
			line := sc.Text()
			now := monoNow()
			w.WriteString(line)
			w.WriteByte('\n')
			l.mu.Lock()
			l.last = append(l.last[max(len(l.last)-4, 0):], line)
			l.mu.Unlock()
			var at time.Time
			if first {
				at, _ = time.Parse(time.RFC3339Nano, field(" "+line, "time"))
			}
			switch {
			case strings.Contains(line, " msg=applied "):
				// A large pass logs one line per kind with its count
				// and duration instead of one per operation.
				n, first0 := 1, at
				if c := field(line, "count"); c != "" {
					n, _ = strconv.Atoi(c)
					took, _ := time.ParseDuration(field(line, "took"))
					first0 = at.Add(-took)
				}
				applied += n
				if first {
					k := field(line, "op")
					sp := l.start.Kinds[k]
					if sp == nil {
						sp = &Span{First: first0}
						l.start.Kinds[k] = sp
					}
					sp.N += n
					sp.Last = at
				}
			case first && strings.Contains(line, " msg=starting "):
				l.start.Starting = at
			case strings.Contains(line, " msg=reconciled "):
				if first {
					l.start.Reconciled = at
					first = false
				}
				p := pass{Why: field(line, "why"), Applied: applied, At: now}
				p.Logged, _ = strconv.Atoi(field(line, "applied"))
				p.Failed, _ = strconv.Atoi(field(line, "failed"))
				p.Took, _ = time.ParseDuration(field(line, "took"))
				applied = 0
				w.Flush()
				select {
				case l.passes <- p:
				default:
				}
			case strings.Contains(line, ` msg="reload timing" `):
				t := reloadTiming{MS: map[string]float64{}, File: field(line, "file"), Full: field(line, "full") == "true"}
				t.Parsed, _ = strconv.Atoi(field(line, "services_parsed"))
				for _, k := range timingFields {
					if d, err := time.ParseDuration(field(line, k)); err == nil {
						t.MS[k] = float64(d.Microseconds()) / 1000
					}
				}
				select {
				case l.timings <- t:
				default:
				}
			case strings.Contains(line, "level=ERROR"):
				l.mu.Lock()
				if len(l.errors) < 20 {
					l.errors = append(l.errors, line)
				}
				l.mu.Unlock()
			}
		}
	}()
	return l, nil
}

// field returns the value of key=value in a logfmt line, unquoted.
func field(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if u, err := strconv.QuotedPrefix(v); err == nil {
			s, _ := strconv.Unquote(u)
			return s
		}
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// next waits for the next pass whose reason is why, or for the next pass
// when why is empty.
func (l *vipdLog) next(why string, timeout time.Duration) (pass, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case p := <-l.passes:
			if why == "" || p.Why == why {
				return p, true
			}
		case <-deadline:
			return pass{}, false
		case <-l.done:
			return pass{}, false
		}
	}
}

// drain discards the passes and "reload timing" lines read and not yet
// taken (those of a series of changes that stopped early), and returns
// how many there were.
func (l *vipdLog) drain() int {
	n := 0
	for {
		select {
		case <-l.passes:
		case <-l.timings:
		default:
			return n
		}
		n++
	}
}

// tail returns the last lines read (up to five).
func (l *vipdLog) tail() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.last...)
}

func (l *vipdLog) firstErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errors...)
}
