package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/vipd/vipd/source"
)

// Provider is the child's source: source/kubernetes.Source, adapted to
// the wire's pools and counts.
type Provider interface {
	// Run runs the source until ctx ends, as source.Source's.
	Run(ctx context.Context, sink source.Sink) error
	// SetPools hands the running source new pools.
	SetPools(pools []Pool) error
	// Counts returns the pools' addresses.
	Counts() []PoolCount
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Conn is the child's end of the connection to the parent.
	Conn io.ReadWriter
	// Log is where the child logs, as JSON lines that the parent logs
	// again (the child's stderr).
	Log io.Writer
	// Open returns the provider of the parent's options, logging to
	// log.
	Open func(opts Options, log *slog.Logger) (Provider, error)
	// MaxFrame bounds the frames (zero: DefaultMaxFrame).
	MaxFrame int
}

// Serve is the child's side: it greets the parent, takes its options,
// opens the provider and runs it until ctx ends or the parent closes the
// connection, forwarding its sink's calls. It returns the provider's
// error, which it has also sent the parent as fatal.
func Serve(ctx context.Context, opts ServeOptions) error {
	c := NewConn(opts.Conn, opts.Conn, opts.MaxFrame)
	if err := c.Write(hello()); err != nil {
		return err
	}
	m, err := c.Read()
	if err != nil {
		return fmt.Errorf("read the parent's hello: %w", err)
	}
	if err := checkHello(m); err != nil {
		return err
	}
	if m, err = c.Read(); err != nil {
		return fmt.Errorf("read the options: %w", err)
	}
	if m.Type != TypeOptions {
		return fmt.Errorf("the parent sent %q before the options", m.Type)
	}
	log := slog.New(slog.NewJSONHandler(opts.Log, &slog.HandlerOptions{Level: slog.Level(m.Options.LogLevel)}))
	s := &sink{c: c, replies: map[uint64]chan *Published{}}
	p, err := opts.Open(*m.Options, log)
	if err != nil {
		s.send(&Message{Type: TypeFatal, Fatal: resultOf(err)})
		return err
	}
	s.p = p

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The reader's error is there before it cancels the source.
	readDone := make(chan error, 1)
	go func() {
		readDone <- s.read(ctx)
		cancel()
	}()
	err = p.Run(ctx, s)
	cancel()
	if err != nil {
		s.send(&Message{Type: TypeFatal, Fatal: resultOf(err)})
		return err
	}
	select {
	case err := <-readDone:
		return err
	default:
		return nil
	}
}

// sink is the child's source.Sink: it forwards to the parent.
type sink struct {
	c *Conn
	p Provider
	// wmu serializes writes.
	wmu sync.Mutex
	// mu guards seq and replies, the publishes waiting for the
	// parent's answer.
	mu      sync.Mutex
	seq     uint64
	replies map[uint64]chan *Published
	// taken says that the parent's sink took the last publish: the
	// next may be a delta. Publish is not called concurrently.
	taken bool
}

// send writes m.
func (s *sink) send(m *Message) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.c.Write(m)
}

// read reads the parent's messages until the connection ends, when it
// cancels the source (the parent is gone or stopping), or a message is
// wrong.
func (s *sink) read(ctx context.Context) error {
	for {
		m, err := s.c.Read()
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read from the parent: %w", err)
		}
		switch m.Type {
		case TypePublished:
			s.mu.Lock()
			ch := s.replies[m.Published.Seq]
			delete(s.replies, m.Published.Seq)
			s.mu.Unlock()
			if ch == nil {
				return fmt.Errorf("the parent answered publish %d, which is not waiting", m.Published.Seq)
			}
			ch <- m.Published
		case TypePing:
			if err := s.send(&Message{Type: TypePong, Pong: m.Ping}); err != nil {
				return err
			}
		case TypePools:
			err := s.p.SetPools(m.Pools)
			if err := s.send(&Message{Type: TypePoolsResult, PoolsResult: resultOf(err)}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("the parent sent a %s message", m.Type)
		}
	}
}

// Publish sends snap and waits for the parent's answer.
func (s *sink) Publish(ctx context.Context, snap source.Snapshot) ([]source.Conflict, error) {
	s.mu.Lock()
	s.seq++
	seq := s.seq
	ch := make(chan *Published, 1)
	s.replies[seq] = ch
	s.mu.Unlock()
	drop := func() {
		s.mu.Lock()
		delete(s.replies, seq)
		s.mu.Unlock()
	}
	p, err := PublishOf(seq, snap, s.p.Counts(), s.taken)
	if err != nil {
		drop()
		return nil, err
	}
	if err := s.send(&Message{Type: TypePublish, Publish: p}); err != nil {
		drop()
		return nil, err
	}
	s.taken = false
	select {
	case r := <-ch:
		if r.Error != "" {
			return r.Conflicts, errors.New(r.Error)
		}
		s.taken = true
		return r.Conflicts, nil
	case <-ctx.Done():
		drop()
		return nil, ctx.Err()
	}
}

// Report sends err.
func (s *sink) Report(err error) {
	// A report that cannot be sent is lost with the connection, whose
	// end stops the source.
	_ = s.send(&Message{Type: TypeReport, Report: resultOf(err)})
}
