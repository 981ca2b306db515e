package config

import (
	"context"
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
	_, sum, err := LoadSum(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(WatchOptions{Path: path, Debounce: 30 * time.Millisecond}, sum)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	return w
}

func next(t *testing.T, w *Watcher) Change {
	t.Helper()
	select {
	case ch := <-w.Changes():
		return ch
	case <-time.After(5 * time.Second):
		t.Fatal("no change reported")
	}
	return Change{}
}

func quiet(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case ch := <-w.Changes():
		t.Fatalf("unexpected change: %+v", ch)
	case <-time.After(300 * time.Millisecond):
	}
}

func port(t *testing.T, ch Change) int {
	t.Helper()
	if ch.Err != nil {
		t.Fatalf("change has error: %v", ch.Err)
	}
	return int(ch.Config.Spec.Services[0].Service.Key.Port)
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
	if p := port(t, next(t, w)); p != 81 {
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

	// A broken file is reported once with its position, and the same
	// bytes written again are not re-reported.
	bad := "[[service]]\nvip = \"192.0.2.1\"\nport = 80\nbackend = [{ address = \"10.0.0.1\", weight = -1 }]\n"
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	ch := next(t, w)
	if ch.Err == nil || !strings.Contains(ch.Err.Error(), "vipd.toml:4:") {
		t.Fatalf("err = %v, want one at vipd.toml:4", ch.Err)
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
