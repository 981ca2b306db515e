package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits by default after the last
// write to the file before it reads it.
const DefaultDebounce = 100 * time.Millisecond

// DefaultRetry and DefaultMaxRetry are the waits before a failed watch is
// tried again: 100 ms first, so that a directory replaced by a rename or
// an rm -r and mkdir is watched again at once, doubling up to 30 s, so
// that one gone for good costs a system call every half minute. There is
// no jitter: one vipd per host retries, against its own kernel.
const (
	DefaultRetry    = 100 * time.Millisecond
	DefaultMaxRetry = 30 * time.Second
)

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// Path is the main configuration file.
	Path string
	// Include holds the include patterns of the configuration
	// (Config.Include): the files that match them are watched too.
	Include []string
	// Debounce waits this long after the last write of a burst before
	// reading a file; zero means DefaultDebounce. It is for writers that
	// change a file in place (truncate, then write in pieces), whose file
	// is whole only once they stop. A file renamed into place, or a
	// symlink swapped (a Kubernetes ConfigMap), is whole at once and read
	// without waiting.
	Debounce time.Duration
	// Poll, if nonzero, also reads every file this often, for file
	// systems where inotify misses changes.
	Poll time.Duration
	// Retry is the wait before a failed watch is tried again; it
	// doubles after each failure up to MaxRetry. Zero means
	// DefaultRetry and DefaultMaxRetry.
	Retry, MaxRetry time.Duration
	// OnWatch, if set, is told the state of the watch: once by
	// NewWatcher (nil when every directory is watched), then at each
	// change: the error when watching fails (a watched directory removed
	// or renamed, inotify out of watches), nil when it works again.
	OnWatch func(err error)
	Logger  *slog.Logger

	// newFS and add, when set by tests, stand for fsnotify.NewWatcher
	// and (*fsnotify.Watcher).Add.
	newFS func() (*fsnotify.Watcher, error)
	add   func(fw *fsnotify.Watcher, dir string) error
}

// Change is a new version of one file of the configuration: the bytes
// read, or the error that reading it returned, or its removal. Parsing
// them is the receiver's business (see ParseFrom and ParseRemoved). The
// receiver must not modify Data.
type Change struct {
	// File is the file that changed: the main file or an included one.
	File string
	Data []byte
	// Removed says that File, an included file, is gone; Data is nil.
	Removed bool
	// Err is a read error; Data is nil then.
	Err error
	// Seen is when the watcher started reading the file, right after
	// the event (or the debounce) that made it look; Read is how long
	// reading and comparing took.
	Seen time.Time
	Read time.Duration
}

// Watcher reports changes of the files of a configuration, one file at a
// time: a change of one included file reads that file alone. It watches
// the files' directories rather than the files, so that editors' atomic
// renames, symlink swaps (Kubernetes ConfigMap mounts swap a "..data"
// symlink) and truncate-then-write all count, and it reports the same
// bytes only once: bytes equal to those last reported (or given to
// NewWatcher) are not reported again, so a broken file is reported once
// until it changes.
type Watcher struct {
	opts WatchOptions
	log  *slog.Logger
	// w is the inotify watcher, nil while one cannot be made; dirs are
	// the directories to watch, watched those it watches.
	w       *fsnotify.Watcher
	dirs    []string
	watched map[string]bool
	// failed is the failure of the watch, nil while every directory is
	// watched; since is when it began. retry fires when the watch is to
	// be tried again, after wait.
	failed error
	since  time.Time
	retry  *time.Timer
	wait   time.Duration
	// last holds the bytes last reported of each file, lastErr the read
	// error last reported.
	last    map[string][]byte
	lastErr map[string]string
	// pending holds the files to read when the debounce fires.
	pending map[string]bool
	out     chan Change
}

// NewWatcher starts watching. current holds the files the caller already
// runs (Config.Texts), so that unchanged files report nothing; the
// watcher keeps their data and does not modify it. A directory that
// cannot be watched (or inotify that cannot be had) is logged and tried
// again by Run, with backoff, until it can: a watch fails only for a
// while, never for good.
func NewWatcher(opts WatchOptions, current []Text) *Watcher {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRetry
	}
	if opts.MaxRetry < opts.Retry {
		opts.MaxRetry = max(DefaultMaxRetry, opts.Retry)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.newFS == nil {
		opts.newFS = fsnotify.NewWatcher
	}
	if opts.add == nil {
		opts.add = (*fsnotify.Watcher).Add
	}
	opts.Path = filepath.Clean(opts.Path)
	dirs := []string{filepath.Dir(opts.Path)}
	for _, p := range opts.Include {
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	w := &Watcher{
		opts: opts, log: opts.Logger, dirs: dirs,
		watched: map[string]bool{},
		retry:   time.NewTimer(time.Hour),
		last:    make(map[string][]byte, len(current)),
		lastErr: map[string]string{},
		pending: map[string]bool{},
		out:     make(chan Change, 1),
	}
	w.retry.Stop()
	for _, t := range current {
		w.last[filepath.Clean(t.File)] = t.Data
	}
	if err := w.setup(); err != nil {
		w.fail(err)
	} else if opts.OnWatch != nil {
		opts.OnWatch(nil)
	}
	return w
}

// setup makes the inotify watcher if there is none and watches the
// directories it does not watch yet.
func (w *Watcher) setup() error {
	if w.w == nil {
		fw, err := w.opts.newFS()
		if err != nil {
			return fmt.Errorf("watch config: %w", err)
		}
		w.w = fw
		clear(w.watched)
	}
	var errs []error
	for _, dir := range w.dirs {
		if w.watched[dir] {
			continue
		}
		if err := w.opts.add(w.w, dir); err != nil {
			errs = append(errs, fmt.Errorf("watch config directory %s: %w", dir, err))
			continue
		}
		w.watched[dir] = true
	}
	return errors.Join(errs...)
}

// fail records that watching failed with err and arms the retry. Only
// the first failure of a run of them is logged and reported.
func (w *Watcher) fail(err error) {
	if w.failed == nil {
		w.log.Error("watching the configuration files failed; retrying until it works (SIGHUP and vipd reload still reload)", "err", err)
		if w.opts.OnWatch != nil {
			w.opts.OnWatch(err)
		}
		w.since, w.wait = time.Now(), w.opts.Retry
		w.retry.Reset(w.wait)
	}
	w.failed = err
}

// lost handles the loss of the watch of dir: removed or renamed, inotify
// dropped it. The watches of directories below it go too: a renamed
// directory takes them along to its new name.
func (w *Watcher) lost(dir string) {
	for d := range w.watched {
		if d == dir || strings.HasPrefix(d, dir+string(filepath.Separator)) {
			w.w.Remove(d) // inotify may have dropped it already
			delete(w.watched, d)
		}
	}
	w.fail(fmt.Errorf("directory %s was removed or renamed", dir))
}

// again tries a failed watch again. It reports whether it works now, and
// otherwise doubles the wait before the next try.
func (w *Watcher) again(ctx context.Context) bool {
	err := w.setup()
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		w.failed = err
		w.wait = min(2*w.wait, w.opts.MaxRetry)
		w.retry.Reset(w.wait)
		return false
	}
	w.log.Info("watching the configuration files again", "after", time.Since(w.since).Round(time.Millisecond), "last_err", w.failed)
	w.failed = nil
	if w.opts.OnWatch != nil {
		w.opts.OnWatch(nil)
	}
	return true
}

// Changes returns the channel on which Run delivers changes.
func (w *Watcher) Changes() <-chan Change { return w.out }

// Run watches until ctx ends, then closes the watcher and the channel. A
// watch that fails (see NewWatcher) is tried again, after 100 ms
// doubling up to 30 s by default, until it works; once it does, every
// file is read, so that a change made meanwhile is reported.
func (w *Watcher) Run(ctx context.Context) {
	defer close(w.out)
	defer func() {
		w.retry.Stop()
		if w.w != nil {
			w.w.Close()
		}
	}()
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
	// raised no event: compare once now. A file may be in the middle of
	// being written: an empty one waits for the debounce.
	if !w.rescan(ctx, true) {
		debounce.Reset(w.opts.Debounce)
	}
	// broken drops an inotify watcher that stopped delivering.
	broken := func() {
		w.w.Close()
		w.w = nil
		w.fail(errors.New("inotify stopped delivering events"))
	}
	for {
		var (
			events <-chan fsnotify.Event
			errs   <-chan error
		)
		if w.w != nil {
			events, errs = w.w.Events, w.w.Errors
		}
		select {
		case <-ctx.Done():
			return
		case <-w.retry.C:
			if w.again(ctx) && !w.rescan(ctx, true) {
				debounce.Reset(w.opts.Debounce)
			}
		case ev, ok := <-events:
			if ctx.Err() != nil {
				// Stopped: a watcher that replaces this one reports now.
				return
			}
			if !ok {
				broken()
				continue
			}
			if dir := filepath.Clean(ev.Name); w.watched[dir] && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.lost(dir)
				continue
			}
			file, kind := w.classify(ev)
			switch kind {
			case eventNow:
				delete(w.pending, file)
				if !w.check(ctx, file, true) {
					// An empty new file: its writes follow.
					w.pending[file] = true
					debounce.Reset(w.opts.Debounce)
				}
			case eventLater:
				w.pending[file] = true
				debounce.Reset(w.opts.Debounce)
			case eventRescan:
				if !w.rescan(ctx, true) {
					debounce.Reset(w.opts.Debounce)
				}
			}
		case err, ok := <-errs:
			if !ok {
				broken()
				continue
			}
			w.log.Warn("config watch error", "err", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost: read every file.
				if !w.rescan(ctx, true) {
					debounce.Reset(w.opts.Debounce)
				}
			}
		case <-poll:
			w.rescan(ctx, false)
		case <-debounce.C:
			files := slices.Sorted(maps.Keys(w.pending))
			clear(w.pending)
			for _, f := range files {
				w.check(ctx, f, false)
			}
		}
	}
}

type eventKind int

const (
	eventIgnore eventKind = iota
	// eventLater: the file may be half written; read it after the burst.
	eventLater
	// eventNow: the file was replaced whole (or removed); read it now.
	eventNow
	// eventRescan: a ConfigMap swapped its data; read every file.
	eventRescan
)

// classify says which file ev concerns and what it means for it. For the
// main file: a Create of the file itself is a rename into place (or a new
// file, read at once too); anything in its directory may change what it
// reads when it is a symlink (a ConfigMap's "..data" swap changes no
// event name we could match), which is read at once; other events on the
// file are writes. For an included file: a Create is read at once, and so
// is a Remove or a Rename (the file may be gone); other events are
// writes. A name starting with ".." in a directory of included files (a
// ConfigMap's "..data" and its timestamped directories) reads every file.
func (w *Watcher) classify(ev fsnotify.Event) (string, eventKind) {
	name := filepath.Clean(ev.Name)
	if name == w.opts.Path {
		fi, err := os.Lstat(w.opts.Path)
		if err == nil && fi.Mode()&fs.ModeSymlink == 0 && ev.Has(fsnotify.Create) {
			return name, eventNow
		}
		if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return name, eventNow
		}
		return name, eventLater
	}
	if w.included(name) {
		if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
			return name, eventNow
		}
		return name, eventLater
	}
	dir := filepath.Dir(name)
	if dir == filepath.Dir(w.opts.Path) {
		fi, err := os.Lstat(w.opts.Path)
		switch {
		case err == nil && fi.Mode()&fs.ModeSymlink != 0:
			return w.opts.Path, eventNow
		case errors.Is(err, fs.ErrNotExist):
			return w.opts.Path, eventLater
		}
	}
	if strings.HasPrefix(filepath.Base(name), "..") && len(w.opts.Include) > 0 {
		return "", eventRescan
	}
	return "", eventIgnore
}

// included reports whether file is an included file: one matched by an
// include pattern, other than the main file.
func (w *Watcher) included(file string) bool {
	return includeRank(w.opts.Path, w.opts.Include, file) >= 0
}

// rescan reads every file of the configuration, as Parse would find them,
// and the ones last reported that are gone. With created (the watch just
// started, or a ConfigMap swapped its data) empty files wait for the
// debounce: rescan then returns false, having added them to pending.
func (w *Watcher) rescan(ctx context.Context, created bool) bool {
	ok := true
	check := func(f string) {
		if !w.check(ctx, f, created) {
			w.pending[f] = true
			ok = false
		}
	}
	check(w.opts.Path)
	found := map[string]bool{w.opts.Path: true}
	// A missing file named without wildcards is one that is gone: its
	// check below reports it.
	matches, _ := globIncluded(w.opts.Path, w.opts.Include)
	for _, m := range matches {
		found[m.File] = true
		check(m.File)
	}
	var gone []string
	for f := range w.last {
		if !found[f] {
			gone = append(gone, f)
		}
	}
	slices.Sort(gone)
	for _, f := range gone {
		check(f)
	}
	return ok
}

// check reads file and reports it if its bytes are new, or its removal if
// it is an included file that is gone. With created (the file was just
// created or renamed into place, or the watch just started) an empty file
// is not reported: it is a new file whose content has yet to be written;
// check then returns false, and the caller reads it again after the
// debounce.
func (w *Watcher) check(ctx context.Context, file string, created bool) bool {
	seen := time.Now()
	data, err := readFile(file)
	ch := Change{File: file}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// The main file mid-rename, or deleted: the running
		// configuration stays, and a rename completes with another
		// event. An included file that is gone takes its services away.
		if _, ok := w.last[file]; !ok || file == w.opts.Path {
			return true
		}
		delete(w.last, file)
		delete(w.lastErr, file)
		ch.Removed = true
	case err != nil:
		ch.Err = err
		if ch.Err.Error() == w.lastErr[file] {
			return true
		}
		w.lastErr[file] = ch.Err.Error()
	default:
		delete(w.lastErr, file)
		if created && len(data) == 0 {
			return false
		}
		if last, ok := w.last[file]; ok && bytes.Equal(data, last) {
			return true
		}
		ch.Data = data
		w.last[file] = data
	}
	ch.Seen, ch.Read = seen, time.Since(seen)
	select {
	case w.out <- ch:
	case <-ctx.Done():
	}
	return true
}
