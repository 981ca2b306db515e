package config

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// logBuffer is a log sink safe for the watcher's goroutine.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

const (
	logFailed    = "watching the configuration files failed"
	logRecovered = "watching the configuration files again"
)

// state waits for the watch's next reported state.
func state(t *testing.T, states <-chan error) error {
	t.Helper()
	select {
	case err := <-states:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no watch state reported within 5s")
	}
	return nil
}

// noState checks that the watch reports no state for a while.
func noState(t *testing.T, states <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-states:
		t.Fatalf("watch state reported again: %v", err)
	case <-time.After(d):
	}
}

// TestWatchRetriesRemovedDirectory: the directory of included files
// removed, its file's removal is reported and its watch is retried, with
// one log line and one report, until the directory is back; then a file
// made meanwhile and a change made afterwards are reported.
func TestWatchRetriesRemovedDirectory(t *testing.T) {
	dir, main := includeTree(t)
	d := filepath.Join(dir, "d")
	a := filepath.Join(d, "a.toml")
	var logs logBuffer
	states := make(chan error, 16)
	w := startWatcherOpts(t, WatchOptions{Path: main, Include: []string{filepath.Join(d, "*.toml")},
		Debounce: 30 * time.Millisecond, Retry: 20 * time.Millisecond, MaxRetry: 80 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), OnWatch: func(err error) { states <- err }})
	if err := state(t, states); err != nil {
		t.Fatalf("start: %v", err)
	}

	if err := os.RemoveAll(d); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != a || !ch.Removed {
		t.Fatalf("change = %+v, want a.toml removed", ch)
	}
	if err := state(t, states); err == nil || !strings.Contains(err.Error(), d) {
		t.Fatalf("state after the removal = %v, want the directory's failure", err)
	}
	// Tries at 20, 40, 80, 80, ... ms fail without a word.
	noState(t, states, 500*time.Millisecond)
	quiet(t, w)

	writeFile(t, a, svcConfig(85))
	if err := state(t, states); err != nil {
		t.Fatalf("state after the directory came back = %v, want watching", err)
	}
	if ch := next(t, w); ch.File != a || port(t, ch) != 85 {
		t.Fatalf("change = %+v, want the new a.toml", ch)
	}
	writeFile(t, a+".tmp", svcConfig(86))
	if err := os.Rename(a+".tmp", a); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != a || port(t, ch) != 86 {
		t.Fatalf("change = %+v, want the edit made after the watch resumed", ch)
	}
	if f, r := logs.count(logFailed), logs.count(logRecovered); f != 1 || r != 1 {
		t.Errorf("log has %d failure and %d recovery lines, want 1 and 1:\n%s", f, r, logs.b.String())
	}

	// The main file's directory too: renamed away and back.
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := state(t, states); err == nil {
		t.Fatal("no failure reported for the renamed directory")
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	if err := state(t, states); err != nil {
		t.Fatalf("state after the rename back = %v", err)
	}
	writeFile(t, main+".tmp", "# back\ninclude = [\"d/*.toml\"]\n")
	if err := os.Rename(main+".tmp", main); err != nil {
		t.Fatal(err)
	}
	for {
		// The rename may also report the included file, read again.
		ch := next(t, w)
		if ch.File == main {
			if !strings.HasPrefix(string(ch.Data), "# back") {
				t.Fatalf("change = %+v", ch)
			}
			break
		}
	}
	// And the directory below it, which the rename took along.
	writeFile(t, a+".tmp", svcConfig(88))
	if err := os.Rename(a+".tmp", a); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != a || port(t, ch) != 88 {
		t.Fatalf("change = %+v, want the edit in the directory below", ch)
	}
}

// TestWatchRetriesFailures: inotify that cannot be had, or a directory
// that cannot be watched (out of watches), is tried again after 20, 40,
// then 50 ms (the maximum), until it works; a change made afterwards is
// reported.
func TestWatchRetriesFailures(t *testing.T) {
	for _, tc := range []struct {
		name          string
		inotify, adds int // failures
	}{
		{"inotify", 3, 0},
		{"add", 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, main := includeTree(t)
			d := filepath.Join(dir, "d")
			a := filepath.Join(d, "a.toml")
			var (
				mu    sync.Mutex
				tries []time.Time
			)
			try := func() int {
				mu.Lock()
				defer mu.Unlock()
				tries = append(tries, time.Now())
				return len(tries)
			}
			opts := WatchOptions{Path: main, Include: []string{filepath.Join(d, "*.toml")},
				Debounce: 30 * time.Millisecond, Retry: 20 * time.Millisecond, MaxRetry: 50 * time.Millisecond}
			if tc.inotify > 0 {
				opts.newFS = func() (*fsnotify.Watcher, error) {
					if try() <= tc.inotify {
						return nil, syscall.EMFILE
					}
					return fsnotify.NewWatcher()
				}
			} else {
				opts.add = func(fw *fsnotify.Watcher, dir string) error {
					if dir == d && try() <= tc.adds {
						return syscall.ENOSPC
					}
					return fw.Add(dir)
				}
			}
			var logs logBuffer
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			states := make(chan error, 16)
			opts.OnWatch = func(err error) { states <- err }
			data, err := os.ReadFile(a)
			if err != nil {
				t.Fatal(err)
			}
			mainData, err := os.ReadFile(main)
			if err != nil {
				t.Fatal(err)
			}
			w := NewWatcher(opts, []Text{{File: main, Data: mainData}, {File: a, Data: data}})
			if err := state(t, states); err == nil {
				t.Fatal("NewWatcher reported no failure")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go w.Run(ctx)
			if err := state(t, states); err != nil {
				t.Fatalf("state = %v, want watching", err)
			}
			writeFile(t, a+".tmp", svcConfig(87))
			if err := os.Rename(a+".tmp", a); err != nil {
				t.Fatal(err)
			}
			if ch := next(t, w); ch.File != a || port(t, ch) != 87 {
				t.Fatalf("change = %+v, want the edit made after the watch came up", ch)
			}
			noState(t, states, 200*time.Millisecond)

			mu.Lock()
			defer mu.Unlock()
			fails := tc.inotify + tc.adds
			if len(tries) != fails+1 {
				t.Fatalf("%d tries, want %d failures and a success", len(tries), fails)
			}
			wait := 20 * time.Millisecond
			for i := 1; i < len(tries); i++ {
				if gap := tries[i].Sub(tries[i-1]); gap < wait-time.Millisecond {
					t.Errorf("try %d came %v after the one before, want at least %v", i+1, gap, wait)
				}
				wait = min(2*wait, 50*time.Millisecond)
			}
			if f, r := logs.count(logFailed), logs.count(logRecovered); f != 1 || r != 1 {
				t.Errorf("log has %d failure and %d recovery lines, want 1 and 1:\n%s", f, r, logs.b.String())
			}
		})
	}
}
