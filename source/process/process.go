// Package process runs a source in a program of its own: the daemon
// starts the program (vipd-kubernetes), hands it its options over an
// inherited socket, and turns its messages into the agent's Sink calls.
// The program parses what tenants write (Kubernetes objects) in its own
// memory and without the daemon's capabilities; when it dies, the
// source reports it, the agent keeps its last snapshot programmed, and
// the program starts again after a backoff.
//
// The wire is frames of JSON over a Unix stream socket (fd 3 in the
// child): a 4-byte big-endian length, then a Message. A socket rather
// than the child's stdin and stdout keeps its stdout free, so that a
// library that prints cannot corrupt the stream; stdout and stderr go
// to the daemon's logger. Each end sends a hello first (Version and
// Schema); the parent then sends the options.
package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/program"
	"github.com/vipd/vipd/source"
)

// The defaults of SourceOptions.
const (
	DefaultBackoff      = time.Second
	DefaultMaxBackoff   = 30 * time.Second
	DefaultHealthy      = time.Minute
	DefaultStartTimeout = 30 * time.Second
	DefaultStopGrace    = 5 * time.Second
	DefaultMaxLine      = 4096
	DefaultPingInterval = 10 * time.Second
)

// pingMisses is how many pings in a row a child may leave unanswered, a
// PingInterval each, before the source takes it for hung.
const pingMisses = 3

// SourceOptions configure a Source.
type SourceOptions struct {
	// Name is the source's name (default "kubernetes").
	Name string
	// Program is the path of the program; Args its arguments after
	// its name, and Env what it gets besides the daemon's environment.
	Program string
	Args    []string
	Env     []string
	// NamePrefix, when not empty, is how the names of the child's
	// services begin ("k8s/"): a publish with another name is refused,
	// so that the child cannot name a service as another source does.
	NamePrefix string
	// Options are the child's options. Their pools are replaced by
	// ReloadPools.
	Options Options
	// Logger logs the source's life and the child's logs; nil
	// discards.
	Logger *slog.Logger
	// MaxFrame bounds the frames (zero: DefaultMaxFrame); MaxLine the
	// lines of the child's output the logger takes (zero:
	// DefaultMaxLine; the rest of a longer line is dropped).
	MaxFrame, MaxLine int
	// Backoff is the wait before the first restart of a child that
	// died, doubling at each restart up to MaxBackoff; a child that ran
	// Healthy resets it. Zero means the defaults.
	Backoff, MaxBackoff, Healthy time.Duration
	// StartTimeout bounds the wait for the child's hello; StopGrace
	// the wait for its exit once asked to stop, before it is killed.
	StartTimeout, StopGrace time.Duration
	// PingInterval is how often the source pings the running child: a
	// child that leaves three pings in a row unanswered (stopped, or
	// wedged so that it neither reads nor writes its socket) is killed
	// and started again, as one that died. Zero means the default.
	PingInterval time.Duration
}

// Source runs the child program as a source.Source.
type Source struct {
	opts SourceOptions
	log  *slog.Logger
	// repool wakes the running child's loop for pending pools.
	repool chan struct{}

	// mu guards pools (those a started child gets: the last a child
	// took), pending (handed by ReloadPools, not sent yet) and counts
	// (the pools' addresses, from the last publish).
	mu      sync.Mutex
	pools   []Pool
	pending []Pool
	counts  []PoolCount
}

// New checks opts and returns the source; the program starts with Run.
// It refuses a program that is not an executable file.
func New(opts SourceOptions) (*Source, error) {
	if opts.Name == "" {
		opts.Name = "kubernetes"
	}
	fi, err := os.Stat(opts.Program)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("%s is not an executable file", opts.Program)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.Backoff, DefaultBackoff)
	def(&opts.MaxBackoff, DefaultMaxBackoff)
	def(&opts.Healthy, DefaultHealthy)
	def(&opts.StartTimeout, DefaultStartTimeout)
	def(&opts.StopGrace, DefaultStopGrace)
	def(&opts.PingInterval, DefaultPingInterval)
	if opts.MaxLine <= 0 {
		opts.MaxLine = DefaultMaxLine
	}
	if opts.MaxFrame <= 0 {
		opts.MaxFrame = DefaultMaxFrame
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{opts: opts, log: log, repool: make(chan struct{}, 1), pools: opts.Options.Pools}, nil
}

// Name returns the source's name.
func (s *Source) Name() string { return s.opts.Name }

// ReloadPools hands the running child the [[kubernetes.pool]] tables of
// k; a child that refuses them keeps its pools, and the refusal is
// logged. A child started later gets the last pools a child took, then
// these.
func (s *Source) ReloadPools(k config.Kubernetes) error {
	pools := PoolsOf(k)
	if len(pools) == 0 {
		return errors.New("no pools: add a [[kubernetes.pool]]")
	}
	s.mu.Lock()
	s.pending = pools
	s.mu.Unlock()
	select {
	case s.repool <- struct{}{}:
	default:
	}
	return nil
}

// EachPool calls f with the addresses of each pool and family, as the
// child's last publish counted them.
func (s *Source) EachPool(f func(pool, family string, total, inUse, free float64)) {
	s.mu.Lock()
	counts := s.counts
	s.mu.Unlock()
	for _, c := range counts {
		f(c.Pool, c.Family, c.Total, c.InUse, c.Free)
	}
}

// fatalError is the error the child's source stopped with: the source
// cannot go on, and Run returns it.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Run runs the child until ctx ends, starting it again when it dies.
// It returns nil when ctx ends, and the child's error when its source
// cannot go on (it cannot start: a kubeconfig that does not load, say).
func (s *Source) Run(ctx context.Context, sink source.Sink) error {
	backoff := s.opts.Backoff
	for {
		start := time.Now()
		err := s.runChild(ctx, sink)
		if ctx.Err() != nil {
			return nil
		}
		if fe, ok := errors.AsType[*fatalError](err); ok {
			return fmt.Errorf("%s: %w", s.opts.Name, fe.err)
		}
		if time.Since(start) >= s.opts.Healthy {
			backoff = s.opts.Backoff
		}
		err = fmt.Errorf("%s: the provider %s failed, restarting in %s: %w", s.opts.Name, s.opts.Program, backoff, err)
		sink.Report(err)
		s.log.Warn("the provider process failed", "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
}

// read is one message of the child, or the error that ended its
// messages.
type read struct {
	m   *Message
	err error
}

// runChild starts the child and serves it until it dies or ctx ends.
func (s *Source) runChild(ctx context.Context, sink source.Sink) (err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	child, err := program.Start(program.Options{Program: s.opts.Program, Args: s.opts.Args, Env: s.opts.Env, Output: outW})
	outW.Close()
	if err != nil {
		outR.Close()
		return err
	}
	conn, cmd := child.Conn, child.Cmd
	defer conn.Close()
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		s.logLines(outR)
		outR.Close()
	}()
	// stop asks the child to stop (its socket closes, SIGTERM), kills
	// it after the grace, and waits for it and its output.
	stopped := false
	var exitErr error
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(s.opts.StopGrace)
		select {
		case <-child.Exited():
			t.Stop()
		case <-t.C:
			cmd.Process.Kill()
			<-child.Exited()
		}
		exitErr = child.Err()
		<-logged
	}
	defer stop()

	c := NewConn(conn, conn, s.opts.MaxFrame)
	reads := make(chan read)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			m, err := c.Read()
			select {
			case reads <- read{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// exited explains an end of the messages: the child's exit status.
	exitedWith := func(err error) error {
		stop()
		if errors.Is(err, io.EOF) {
			if exitErr == nil {
				return errors.New("exited")
			}
			return exitErr
		}
		if exitErr != nil {
			return fmt.Errorf("%w (%v)", err, exitErr)
		}
		return err
	}

	if err := c.Write(hello()); err != nil {
		return exitedWith(err)
	}
	t := time.NewTimer(s.opts.StartTimeout)
	defer t.Stop()
	select {
	case r := <-reads:
		if r.err != nil {
			return exitedWith(fmt.Errorf("read its hello: %w", r.err))
		}
		if err := checkHello(r.m); err != nil {
			return exitedWith(err)
		}
	case <-t.C:
		return exitedWith(fmt.Errorf("no hello in %s", s.opts.StartTimeout))
	case <-ctx.Done():
		return nil
	}
	s.mu.Lock()
	opts := s.opts.Options
	opts.Pools = s.pools
	s.mu.Unlock()
	if err := c.Write(&Message{Type: TypeOptions, Options: &opts}); err != nil {
		return exitedWith(err)
	}
	s.log.Info("the provider process started", "program", s.opts.Program, "pid", cmd.Process.Pid)
	select {
	case s.repool <- struct{}{}:
	default:
	}
	// base is the last snapshot the sink took from this child, the base
	// of its deltas, and index its services' positions by name.
	var base *source.Snapshot
	var index map[string]int
	// sent are the pools sent and not yet answered, in order; the last
	// goes to the next child when this one dies first.
	var sent [][]Pool
	defer func() {
		s.mu.Lock()
		if len(sent) > 0 && s.pending == nil {
			s.pending = sent[len(sent)-1]
		}
		s.mu.Unlock()
	}()
	// pinged is the last ping's number, answered the last answer's, and
	// missed how many ticks in a row found the last ping unanswered.
	// Ticks are counted as the loop takes them, so that a sink slow to
	// take a snapshot (the loop waits for it) delays no answer into a
	// miss: an answer read in between resets the count.
	ping := time.NewTicker(s.opts.PingInterval)
	defer ping.Stop()
	var pinged, answered uint64
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ping.C:
			if answered < pinged {
				missed++
			} else {
				missed = 0
			}
			if missed >= pingMisses {
				return exitedWith(fmt.Errorf("it answered no ping for %d intervals of %s: taken for hung", missed, s.opts.PingInterval))
			}
			pinged++
			if err := c.Write(&Message{Type: TypePing, Ping: &Ping{Seq: pinged}}); err != nil {
				return exitedWith(err)
			}
		case <-s.repool:
			s.mu.Lock()
			pools := s.pending
			s.pending = nil
			s.mu.Unlock()
			if pools == nil {
				continue
			}
			sent = append(sent, pools)
			if err := c.Write(&Message{Type: TypePools, Pools: pools}); err != nil {
				return exitedWith(err)
			}
		case r := <-reads:
			if r.err != nil {
				return exitedWith(r.err)
			}
			m := r.m
			switch m.Type {
			case TypePublish:
				snap, err := m.Publish.Snapshot(base, index)
				if err == nil {
					err = s.checkNames(snap)
				}
				if err != nil {
					return exitedWith(fmt.Errorf("refused its publish: %w", err))
				}
				s.mu.Lock()
				s.counts = m.Publish.Counts
				s.mu.Unlock()
				conflicts, err := sink.Publish(ctx, snap)
				ans := &Published{Seq: m.Publish.Seq, Conflicts: conflicts}
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					ans.Error = err.Error()
				}
				if err == nil {
					// The base of the next delta: the names and their
					// order change only with a whole snapshot.
					if !m.Publish.Delta {
						index = make(map[string]int, len(snap.Services))
						for i := range snap.Services {
							index[snap.Services[i].Name] = i
						}
					}
					base = &snap
				}
				if err := c.Write(&Message{Type: TypePublished, Published: ans}); err != nil {
					return exitedWith(err)
				}
			case TypeReport:
				sink.Report(m.Report.err())
			case TypePong:
				if m.Pong.Seq > pinged {
					return exitedWith(fmt.Errorf("it answered ping %d, which was not sent", m.Pong.Seq))
				}
				answered = max(answered, m.Pong.Seq)
			case TypePoolsResult:
				if len(sent) == 0 {
					return exitedWith(errors.New("it answered pools it was not sent"))
				}
				pools := sent[0]
				sent = sent[1:]
				if err := m.PoolsResult.err(); err != nil {
					s.log.Error("the new pools are not applied", "err", err)
					continue
				}
				s.mu.Lock()
				s.pools = pools
				s.mu.Unlock()
			case TypeFatal:
				stop()
				return &fatalError{m.Fatal.err()}
			default:
				return exitedWith(fmt.Errorf("it sent a %s message", m.Type))
			}
		}
	}
}

// checkNames refuses a snapshot with a service, health or change whose
// name does not begin with NamePrefix.
func (s *Source) checkNames(snap source.Snapshot) error {
	if s.opts.NamePrefix == "" {
		return nil
	}
	bad := func(name string) error {
		if strings.HasPrefix(name, s.opts.NamePrefix) {
			return nil
		}
		return fmt.Errorf("service %q: the name does not begin with %q", name, s.opts.NamePrefix)
	}
	for i := range snap.Services {
		if err := bad(snap.Services[i].Name); err != nil {
			return err
		}
	}
	for name := range snap.Health {
		if err := bad(name); err != nil {
			return err
		}
	}
	for _, name := range snap.Changed {
		if err := bad(name); err != nil {
			return err
		}
	}
	return nil
}

// logLines logs the child's output, line by line: its JSON log records
// at their level with their attributes, anything else as a warning.
// Lines are bounded by MaxLine.
func (s *Source) logLines(r io.Reader) {
	br := bufio.NewReaderSize(r, s.opts.MaxLine)
	for {
		line, err := br.ReadSlice('\n')
		truncated := errors.Is(err, bufio.ErrBufferFull)
		if len(line) > 0 {
			s.logLine(bytes.TrimRight(line, "\n"), truncated)
		}
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return
		}
	}
}

// logLine logs one line of the child's output.
func (s *Source) logLine(line []byte, truncated bool) {
	ctx := context.Background()
	if !truncated && len(line) > 0 && line[0] == '{' {
		var rec map[string]any
		d := json.NewDecoder(bytes.NewReader(line))
		d.UseNumber()
		if d.Decode(&rec) == nil {
			msg, _ := rec["msg"].(string)
			lvl, _ := rec["level"].(string)
			var level slog.Level
			if msg != "" && level.UnmarshalText([]byte(lvl)) == nil {
				var attrs []any
				for _, k := range slices.Sorted(maps.Keys(rec)) {
					if k != "time" && k != "level" && k != "msg" {
						attrs = append(attrs, slog.Any(k, rec[k]))
					}
				}
				s.log.Log(ctx, level, msg, attrs...)
				return
			}
		}
	}
	if truncated {
		s.log.Warn("provider output", "line", string(line), "truncated", true)
		return
	}
	s.log.Warn("provider output", "line", string(line))
}
