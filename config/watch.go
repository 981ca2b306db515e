package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits by default after the last
// write to the file before it reads it.
const DefaultDebounce = 100 * time.Millisecond

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// Path is the configuration file.
	Path string
	// Debounce waits this long after the last write of a burst before
	// reading the file; zero means DefaultDebounce. It is for writers that
	// change the file in place (truncate, then write in pieces), whose
	// file is whole only once they stop. A file renamed into place, or a
	// symlink swapped (a Kubernetes ConfigMap), is whole at once and read
	// without waiting.
	Debounce time.Duration
	// Poll, if nonzero, also re-reads the file this often, for file
	// systems where inotify misses changes.
	Poll   time.Duration
	Logger *slog.Logger
}

// Change is a new version of the configuration file: the bytes read, or
// the error that reading it returned. Parsing them is the receiver's
// business (see ParseFrom). The receiver must not modify Data.
type Change struct {
	Data []byte
	// Err is a read error; Data is nil then.
	Err error
	// Seen is when the watcher started reading the file, right after
	// the event (or the debounce) that made it look; Read is how long
	// reading and comparing took.
	Seen time.Time
	Read time.Duration
}

// Watcher reports changes of a configuration file. It watches the file's
// directory rather than the file, so that editors' atomic renames, symlink
// swaps (Kubernetes ConfigMap mounts swap a "..data" symlink) and
// truncate-then-write all count, and it reports the same bytes only once:
// bytes equal to those last reported (or given to NewWatcher) are not
// reported again, so a broken file is reported once until it changes.
type Watcher struct {
	opts    WatchOptions
	log     *slog.Logger
	w       *fsnotify.Watcher
	last    []byte
	lastErr string
	out     chan Change
}

// NewWatcher starts watching. current holds the bytes the caller already
// runs, so that an unchanged file reports nothing; the watcher keeps it
// and does not modify it.
func NewWatcher(opts WatchOptions, current []byte) (*Watcher, error) {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
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
	return &Watcher{opts: opts, log: opts.Logger, w: fw, last: current, out: make(chan Change, 1)}, nil
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
	// raised no event: compare once now. The file may be in the middle of
	// being written: an empty one waits for the debounce.
	if !w.check(ctx, true) {
		debounce.Reset(w.opts.Debounce)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			switch w.classify(ev) {
			case eventNow:
				debounce.Stop()
				if !w.check(ctx, true) {
					// An empty new file: its writes follow.
					debounce.Reset(w.opts.Debounce)
				}
			case eventLater:
				debounce.Reset(w.opts.Debounce)
			}
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			w.log.Warn("config watch error", "err", err)
		case <-poll:
			w.check(ctx, false)
		case <-debounce.C:
			w.check(ctx, false)
		}
	}
}

type eventKind int

const (
	eventIgnore eventKind = iota
	// eventLater: the file may be half written; read it after the burst.
	eventLater
	// eventNow: the file was replaced whole; read it now.
	eventNow
)

// classify says what ev means for Path: a Create of the file itself is a
// rename into place (or a new file, read at once too); anything in the
// directory may change what Path reads when Path is a symlink (a
// ConfigMap's "..data" swap changes no event name we could match), which
// is read at once; other events on the file are writes.
func (w *Watcher) classify(ev fsnotify.Event) eventKind {
	fi, err := os.Lstat(w.opts.Path)
	switch {
	case err == nil && fi.Mode()&fs.ModeSymlink != 0:
		return eventNow
	case filepath.Clean(ev.Name) != filepath.Clean(w.opts.Path):
		if errors.Is(err, fs.ErrNotExist) {
			return eventLater
		}
		return eventIgnore
	case ev.Has(fsnotify.Create):
		return eventNow
	}
	return eventLater
}

// check reads the file and reports it if its bytes are new. With created
// (the file was just created or renamed into place, or the watch just
// started) an empty file is not reported: it is a new file whose content
// has yet to be written; check then returns false, and the caller reads
// it again after the debounce.
func (w *Watcher) check(ctx context.Context, created bool) bool {
	seen := time.Now()
	data, err := os.ReadFile(w.opts.Path)
	if errors.Is(err, fs.ErrNotExist) {
		// Mid-rename, or deleted: the running configuration stays. A
		// rename completes with another event.
		return true
	}
	var ch Change
	if err != nil {
		ch.Err = fmt.Errorf("read config: %w", err)
		if ch.Err.Error() == w.lastErr {
			return true
		}
		w.lastErr = ch.Err.Error()
	} else {
		w.lastErr = ""
		if created && len(data) == 0 {
			return false
		}
		if bytes.Equal(data, w.last) {
			return true
		}
		ch.Data = data
		w.last = data
	}
	ch.Seen, ch.Read = seen, time.Since(seen)
	select {
	case w.out <- ch:
	case <-ctx.Done():
	}
	return true
}
