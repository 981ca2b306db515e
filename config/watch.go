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
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a Watcher waits by default after the last
// write to the file before it reads it.
const DefaultDebounce = 100 * time.Millisecond

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
	Poll   time.Duration
	Logger *slog.Logger
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
	w    *fsnotify.Watcher
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
// watcher keeps their data and does not modify it. The include patterns'
// directories must exist.
func NewWatcher(opts WatchOptions, current []Text) (*Watcher, error) {
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Path = filepath.Clean(opts.Path)
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch config: %w", err)
	}
	dirs := []string{filepath.Dir(opts.Path)}
	for _, p := range opts.Include {
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, dir := range dirs {
		if err := fw.Add(dir); err != nil {
			fw.Close()
			return nil, fmt.Errorf("watch config directory %s: %w", dir, err)
		}
	}
	w := &Watcher{
		opts: opts, log: opts.Logger, w: fw,
		last:    make(map[string][]byte, len(current)),
		lastErr: map[string]string{},
		pending: map[string]bool{},
		out:     make(chan Change, 1),
	}
	for _, t := range current {
		w.last[filepath.Clean(t.File)] = t.Data
	}
	return w, nil
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
	// raised no event: compare once now. A file may be in the middle of
	// being written: an empty one waits for the debounce.
	if !w.rescan(ctx, true) {
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
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			w.log.Warn("config watch error", "err", err)
		case <-poll:
			w.rescan(ctx, false)
		case <-debounce.C:
			files := make([]string, 0, len(w.pending))
			for f := range w.pending {
				files = append(files, f)
			}
			clear(w.pending)
			slices.Sort(files)
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
