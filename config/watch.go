package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// Path is the configuration file.
	Path string
	// Debounce waits this long after the last change of a burst before
	// reading the file; zero means 200ms.
	Debounce time.Duration
	// Poll, if nonzero, also re-reads the file this often, for file
	// systems where inotify misses changes.
	Poll   time.Duration
	Logger *slog.Logger
}

// Change is a new version of the configuration file: either a valid
// configuration or the errors that make it invalid.
type Change struct {
	Config *Config
	Err    error
	// Sum identifies the bytes read.
	Sum [sha256.Size]byte
}

// Watcher reports changes of a configuration file. It watches the file's
// directory rather than the file, so that editors' atomic renames, symlink
// swaps (Kubernetes ConfigMap mounts swap a "..data" symlink) and
// truncate-then-write all count, and it reports the same bytes only once:
// a broken file is not re-parsed and re-reported until it changes.
type Watcher struct {
	opts WatchOptions
	log  *slog.Logger
	w    *fsnotify.Watcher
	last [sha256.Size]byte
	out  chan Change
}

// NewWatcher starts watching. sum is the checksum of the bytes the caller
// already runs (from Sum), so that an unchanged file reports nothing.
func NewWatcher(opts WatchOptions, sum [sha256.Size]byte) (*Watcher, error) {
	if opts.Debounce <= 0 {
		opts.Debounce = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch config: %w", err)
	}
	dir := filepath.Dir(opts.Path)
	if err := fw.Add(dir); err != nil {
		fw.Close()
		return nil, fmt.Errorf("watch config directory %s: %w", dir, err)
	}
	return &Watcher{opts: opts, log: opts.Logger, w: fw, last: sum, out: make(chan Change, 1)}, nil
}

// Changes returns the channel on which Run delivers changes.
func (w *Watcher) Changes() <-chan Change { return w.out }

// Run watches until ctx ends, then closes the watcher and the channel.
func (w *Watcher) Run(ctx context.Context) {
	defer close(w.out)
	defer w.w.Close()
	var (
		debounce = time.NewTimer(time.Hour)
		poll     <-chan time.Time
	)
	debounce.Stop()
	if w.opts.Poll > 0 {
		t := time.NewTicker(w.opts.Poll)
		defer t.Stop()
		poll = t.C
	}
	// A change between the caller's read and the start of the watch
	// raised no event: compare once now.
	w.check(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if w.relevant(ev) {
				debounce.Reset(w.opts.Debounce)
			}
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			w.log.Warn("config watch error", "err", err)
		case <-poll:
			w.check(ctx)
		case <-debounce.C:
			w.check(ctx)
		}
	}
}

// relevant reports whether ev may change what Path reads: an event on the
// file itself, or on anything in its directory when Path is a symlink
// (a ConfigMap's "..data" swap changes no event name we could match).
func (w *Watcher) relevant(ev fsnotify.Event) bool {
	if filepath.Clean(ev.Name) == filepath.Clean(w.opts.Path) {
		return true
	}
	fi, err := os.Lstat(w.opts.Path)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0 || errors.Is(err, fs.ErrNotExist)
}

// check reads the file and reports it if its bytes are new.
func (w *Watcher) check(ctx context.Context) {
	data, err := os.ReadFile(w.opts.Path)
	if errors.Is(err, fs.ErrNotExist) {
		// Mid-rename, or deleted: the running configuration stays. A
		// rename completes with another event.
		return
	}
	var ch Change
	if err != nil {
		ch.Err = fmt.Errorf("read config: %w", err)
		ch.Sum = sha256.Sum256([]byte(err.Error()))
	} else {
		ch.Sum = sha256.Sum256(data)
		if bytes.Equal(ch.Sum[:], w.last[:]) {
			return
		}
		ch.Config, ch.Err = Parse(w.opts.Path, data)
	}
	w.last = ch.Sum
	select {
	case w.out <- ch:
	case <-ctx.Done():
	}
}

// LoadSum is Load that also returns the checksum of the bytes read, for
// NewWatcher.
func LoadSum(path string) (*Config, [sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(path, data)
	return cfg, sha256.Sum256(data), err
}
