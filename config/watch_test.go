package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func svcConfig(port int) string {
	return "[[service]]\nvip = \"192.0.2.1\"\nport = " + strconv.Itoa(port) + "\nbackend = [{ address = \"10.0.0.1\" }]\n"
}

func startWatcher(t *testing.T, path string) *Watcher {
	t.Helper()
	return startWatcherOpts(t, WatchOptions{Path: path, Debounce: 30 * time.Millisecond})
}

func startWatcherOpts(t *testing.T, opts WatchOptions) *Watcher {
	t.Helper()
	data, err := os.ReadFile(opts.Path)
	if err != nil {
		t.Fatal(err)
	}
	current := []Text{{File: opts.Path, Data: data}}
	incl, err := readIncluded(opts.Path, opts.Include)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range incl {
		current = append(current, f.Text)
	}
	// NewWatcher reports the state of the watch before it returns.
	var (
		started  error
		reported bool
	)
	report := opts.OnWatch
	opts.OnWatch = func(err error) {
		if !reported {
			started, reported = err, true
		}
		if report != nil {
			report(err)
		}
	}
	w := NewWatcher(opts, current)
	if !reported || started != nil {
		t.Fatalf("the watch did not start: reported %v, %v", reported, started)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	return w
}

func next(t *testing.T, w *Watcher) Change {
	t.Helper()
	return within(t, w, 5*time.Second)
}

func within(t *testing.T, w *Watcher, d time.Duration) Change {
	t.Helper()
	select {
	case ch := <-w.Changes():
		return ch
	case <-time.After(d):
		t.Fatalf("no change reported within %v", d)
	}
	return Change{}
}

// whole returns the change that reports text, a file written in place in
// more than one write. The writes of a burst normally make one change,
// but on a loaded machine the time between two of them (a sync, a
// descheduled test) can exceed the debounce; a change reported meanwhile
// must hold what was written so far, a prefix of text.
func whole(t *testing.T, w *Watcher, text string) Change {
	t.Helper()
	for {
		ch := next(t, w)
		switch {
		case ch.Err == nil && string(ch.Data) == text:
			return ch
		case ch.Err == nil && strings.HasPrefix(text, string(ch.Data)):
			t.Logf("a change mid-write (%d of %d bytes), the machine being slow", len(ch.Data), len(text))
		default:
			t.Fatalf("change %q (err %v) is not the text written, nor a part of it", ch.Data, ch.Err)
		}
	}
}

func quiet(t *testing.T, w *Watcher) {
	t.Helper()
	quietFor(t, w, 300*time.Millisecond)
}

func quietFor(t *testing.T, w *Watcher, d time.Duration) {
	t.Helper()
	select {
	case ch := <-w.Changes():
		t.Fatalf("unexpected change: %+v", ch)
	case <-time.After(d):
	}
}

// port parses a change and returns its first service's port.
func port(t *testing.T, ch Change) int {
	t.Helper()
	if ch.Err != nil {
		t.Fatalf("change has error: %v", ch.Err)
	}
	cfg, err := Parse("vipd.toml", ch.Data)
	if err != nil {
		t.Fatalf("change does not parse: %v", err)
	}
	return int(cfg.Spec.Services[0].Service.Key.Port)
}

func TestWatchEdits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, []byte(svcConfig(80)), 0o644); err != nil {
		t.Fatal(err)
	}
	w := startWatcher(t, path)

	// Unrelated files in the directory change nothing.
	if err := os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	quiet(t, w)

	// Truncate, then write in two steps: one change after the burst.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := svcConfig(81)
	f.WriteString(cfg[:10])
	f.Sync()
	f.WriteString(cfg[10:])
	f.Close()
	if p := port(t, whole(t, w, cfg)); p != 81 {
		t.Fatalf("port = %d, want 81", p)
	}

	// An editor's atomic rename.
	tmp := filepath.Join(dir, ".vipd.toml.swp")
	if err := os.WriteFile(tmp, []byte(svcConfig(82)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if p := port(t, next(t, w)); p != 82 {
		t.Fatalf("port = %d, want 82", p)
	}

	// A broken file is reported once, and the same bytes written again
	// are not re-reported.
	bad := "[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\", weight = -1 }]\n"
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	ch := next(t, w)
	if ch.Err != nil || string(ch.Data) != bad {
		t.Fatalf("change = %q, %v; want the broken bytes", ch.Data, ch.Err)
	}
	if _, err := Parse(path, ch.Data); err == nil || !strings.Contains(err.Error(), "vipd.toml:4:") {
		t.Fatalf("err = %v, want one at vipd.toml:4", err)
	}
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	quiet(t, w)

	// Writing back the last good bytes is a change again.
	if err := os.WriteFile(path, []byte(svcConfig(82)), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := port(t, next(t, w)); p != 82 {
		t.Fatalf("port = %d, want 82", p)
	}
}

// TestWatchConfigMap swaps a ConfigMap-style "..data" symlink.
func TestWatchConfigMap(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, port int) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "vipd.toml"), []byte(svcConfig(port)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("..v1", 80)
	if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "vipd.toml")
	if err := os.Symlink("..data/vipd.toml", path); err != nil {
		t.Fatal(err)
	}
	w := startWatcher(t, path)

	mk("..v2", 90)
	if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if p := port(t, next(t, w)); p != 90 {
		t.Fatalf("port = %d, want 90", p)
	}
}

// TestWatchRenameIsImmediate checks that a file renamed into place is read
// at once, not after the debounce that in-place writes wait for.
func TestWatchRenameIsImmediate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, []byte(svcConfig(80)), 0o644); err != nil {
		t.Fatal(err)
	}
	w := startWatcherOpts(t, WatchOptions{Path: path, Debounce: 10 * time.Second})
	tmp := filepath.Join(dir, "vipd.toml.tmp")
	if err := os.WriteFile(tmp, []byte(svcConfig(81)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if p := port(t, within(t, w, time.Second)); p != 81 {
		t.Fatalf("port = %d, want 81", p)
	}
	// The same bytes renamed into place again are no change.
	if err := os.WriteFile(tmp, []byte(svcConfig(81)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	quiet(t, w)
}

// TestWatchNewEmptyFile checks that a file created empty is read once its
// writes are done, not at its creation.
func TestWatchNewEmptyFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(path, []byte(svcConfig(80)), 0o644); err != nil {
		t.Fatal(err)
	}
	w := startWatcherOpts(t, WatchOptions{Path: path, Debounce: 300 * time.Millisecond})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the Create is seen while the file is empty
	cfg := svcConfig(82)
	f.WriteString(cfg[:10])
	f.Sync()
	f.WriteString(cfg[10:])
	f.Close()
	if p := port(t, whole(t, w, cfg)); p != 82 {
		t.Fatalf("port = %d, want 82", p)
	}
	quiet(t, w)
}

// includeTree writes a main file that includes d/*.toml, and d/a.toml
// with one service on port 80.
func includeTree(t *testing.T) (dir, main string) {
	t.Helper()
	dir = t.TempDir()
	main = filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "include = [\"d/*.toml\"]\n")
	writeFile(t, filepath.Join(dir, "d", "a.toml"), svcConfig(80))
	return dir, main
}

// TestWatchIncluded reports each included file on its own: renamed into
// place at once, written in place after the debounce, created, removed;
// other files in the directory change nothing.
func TestWatchIncluded(t *testing.T) {
	dir, main := includeTree(t)
	a := filepath.Join(dir, "d", "a.toml")
	// A debounce long enough that a change read at once is told from a
	// debounced one even on a loaded machine.
	const debounce = time.Second
	w := startWatcherOpts(t, WatchOptions{Path: main, Include: []string{filepath.Join(dir, "d", "*.toml")}, Debounce: debounce})

	// Not matched by the pattern.
	writeFile(t, filepath.Join(dir, "d", "a.toml.tmp"), svcConfig(81))
	quietFor(t, w, debounce+300*time.Millisecond)

	// Renamed into place: read at once, before the debounce.
	if err := os.Rename(filepath.Join(dir, "d", "a.toml.tmp"), a); err != nil {
		t.Fatal(err)
	}
	ch := within(t, w, debounce-100*time.Millisecond)
	if ch.File != a || port(t, ch) != 81 {
		t.Fatalf("change = %+v", ch)
	}

	// Written in place, in two steps: one change.
	f, err := os.OpenFile(a, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := svcConfig(82)
	f.WriteString(cfg[:10])
	f.Sync()
	f.WriteString(cfg[10:])
	f.Close()
	if ch := whole(t, w, cfg); ch.File != a || port(t, ch) != 82 {
		t.Fatalf("change = %+v", ch)
	}
	quietFor(t, w, debounce+300*time.Millisecond)

	// A new file.
	b := filepath.Join(dir, "d", "b.toml")
	writeFile(t, b, svcConfig(90))
	if ch := next(t, w); ch.File != b || port(t, ch) != 90 {
		t.Fatalf("change = %+v", ch)
	}

	// A removed file.
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != b || !ch.Removed || ch.Data != nil {
		t.Fatalf("change = %+v", ch)
	}
	quiet(t, w)

	// The main file is still watched.
	writeFile(t, main+".tmp", "# main\ninclude = [\"d/*.toml\"]\n")
	if err := os.Rename(main+".tmp", main); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != main || !strings.HasPrefix(string(ch.Data), "# main") {
		t.Fatalf("change = %+v", ch)
	}
}

// TestWatchIncludedStart compares every file once when the watch starts:
// a change made between the caller's read and the watch is reported, and
// so is a file removed meanwhile.
func TestWatchIncludedStart(t *testing.T) {
	dir, main := includeTree(t)
	a := filepath.Join(dir, "d", "a.toml")
	old := filepath.Join(dir, "d", "old.toml")
	current := []Text{
		{File: main, Data: []byte("include = [\"d/*.toml\"]\n")},
		{File: a, Data: []byte(svcConfig(79))},
		{File: old, Data: []byte(svcConfig(70))},
	}
	up := errors.New("not reported")
	w := NewWatcher(WatchOptions{Path: main, Include: []string{filepath.Join(dir, "d", "*.toml")}, OnWatch: func(err error) { up = err }}, current)
	if up != nil {
		t.Fatalf("the watch did not start: %v", up)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	if ch := next(t, w); ch.File != a || port(t, ch) != 80 {
		t.Fatalf("change = %+v", ch)
	}
	if ch := next(t, w); ch.File != old || !ch.Removed {
		t.Fatalf("change = %+v", ch)
	}
	quiet(t, w)
}

// TestWatchIncludedConfigMap swaps the "..data" symlink of a directory of
// included files mounted from a ConfigMap: every file is compared, and
// the changed ones reported.
func TestWatchIncludedConfigMap(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "include = [\"d/*.toml\"]\n")
	d := filepath.Join(dir, "d")
	mk := func(name string, pa, pb int) {
		writeFile(t, filepath.Join(d, name, "a.toml"), svcConfig(pa))
		writeFile(t, filepath.Join(d, name, "b.toml"), svcConfig(pb))
	}
	mk("..v1", 80, 90)
	if err := os.Symlink("..v1", filepath.Join(d, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"a.toml", "b.toml"} {
		if err := os.Symlink("..data/"+f, filepath.Join(d, f)); err != nil {
			t.Fatal(err)
		}
	}
	w := startWatcherOpts(t, WatchOptions{Path: main, Include: []string{filepath.Join(d, "*.toml")}, Debounce: 10 * time.Second})
	mk("..v2", 80, 91)
	if err := os.Symlink("..v2", filepath.Join(d, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(d, "..data_tmp"), filepath.Join(d, "..data")); err != nil {
		t.Fatal(err)
	}
	if ch := within(t, w, time.Second); ch.File != filepath.Join(d, "b.toml") || port(t, ch) != 91 {
		t.Fatalf("change = %+v", ch)
	}
	quiet(t, w)
}
