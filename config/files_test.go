package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fast runs f and fails the test unless f returns within two seconds: a
// read that blocks on a FIFO fails the test instead of hanging the suite.
func fast[T any](t *testing.T, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(2 * time.Second):
		t.Fatal("the read did not return within 2s: it blocks")
	}
	panic("unreachable")
}

// load runs Load, failing the test if it blocks.
func load(t *testing.T, path string) (*Config, error) {
	t.Helper()
	type result struct {
		cfg *Config
		err error
	}
	r := fast(t, func() result { cfg, err := Load(path); return result{cfg, err} })
	return r.cfg, r.err
}

// describe writes a change without its data, which may be large.
func describe(ch Change) string {
	return fmt.Sprintf("{File:%s Data:%d bytes Removed:%v Err:%v}", ch.File, len(ch.Data), ch.Removed, ch.Err)
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err's text, with the test's directory written D,
// is want.
func wantErr(t *testing.T, dir string, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want %q", want)
	}
	if got := strings.ReplaceAll(err.Error(), dir, "D"); got != want {
		t.Fatalf("error:\n%s\nwant:\n%s", got, want)
	}
}

// TestLoadIncludedNotRegular refuses, at the include line and naming the
// file, what an include pattern matches that is not a regular file: a
// FIFO (at start and on a reload of every file, without blocking), a
// directory, a symbolic link to a FIFO; a symbolic link to a regular file
// is read.
func TestLoadIncludedNotRegular(t *testing.T) {
	dir, main := includeTree(t)
	writeFile(t, main, "# vipd\ninclude = [\"d/*.toml\"]\n")
	writeFile(t, filepath.Join(dir, "elsewhere", "b.toml"), svcConfig(81))
	if err := os.Symlink("../elsewhere/b.toml", filepath.Join(dir, "d", "b.toml")); err != nil {
		t.Fatal(err)
	}
	cfg, err := load(t, main)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.Spec.Services); n != 2 || cfg.Spec.Services[1].Service.Key.Port != 81 {
		t.Fatalf("services = %+v; want port 80 and, through the symbolic link, 81", cfg.Spec.Services)
	}

	fifo := filepath.Join(dir, "d", "c.toml")
	mkfifo(t, fifo)
	_, err = load(t, main)
	wantErr(t, dir, err, "D/vipd.toml:2: read included file: D/d/c.toml: not a regular file (a FIFO)")

	// SIGHUP and "vipd reload" read every file again.
	type result struct {
		cfg *Config
		err error
	}
	r := fast(t, func() result { c, _, err := Reload(cfg); return result{c, err} })
	if r.cfg != nil {
		t.Fatal("Reload returned a configuration with a FIFO included")
	}
	wantErr(t, dir, r.err, "D/vipd.toml:2: read included file: D/d/c.toml: not a regular file (a FIFO)")

	// Every bad file is listed, each at the include line.
	if err := os.Mkdir(filepath.Join(dir, "d", "a-dir.toml"), 0o755); err != nil {
		t.Fatal(err)
	}
	mkfifo(t, filepath.Join(dir, "elsewhere", "fifo"))
	if err := os.Symlink("../elsewhere/fifo", filepath.Join(dir, "d", "e.toml")); err != nil {
		t.Fatal(err)
	}
	_, err = load(t, main)
	wantErr(t, dir, err, "D/vipd.toml:2: read included file: D/d/a-dir.toml: not a regular file (a directory)\n"+
		"D/vipd.toml:2: read included file: D/d/c.toml: not a regular file (a FIFO)\n"+
		"D/vipd.toml:2: read included file: D/d/e.toml: not a regular file (a FIFO)")

	// The include patterns of a changed main file are read the same way.
	r = fast(t, func() result {
		c, _, err := ParseFrom(cfg, main, []byte("include = [\"d/c.toml\"]\n"))
		return result{c, err}
	})
	wantErr(t, dir, r.err, "D/vipd.toml:1: read included file: D/d/c.toml: not a regular file (a FIFO)")
}

// TestLoadMainNotRegular refuses a main file that is a FIFO, directly or
// through a symbolic link, or a directory, and reads a symbolic link to a
// regular file.
func TestLoadMainNotRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "vipd.toml")
	mkfifo(t, fifo)
	_, err := load(t, fifo)
	wantErr(t, dir, err, "read config: D/vipd.toml: not a regular file (a FIFO)")
	if !errors.Is(err, ErrNotRegular) {
		t.Fatalf("%v is not ErrNotRegular", err)
	}

	link := filepath.Join(dir, "link.toml")
	if err := os.Symlink("vipd.toml", link); err != nil {
		t.Fatal(err)
	}
	_, err = load(t, link)
	wantErr(t, dir, err, "read config: D/link.toml: not a regular file (a FIFO)")

	_, err = load(t, dir)
	wantErr(t, dir, err, "read config: D: not a regular file (a directory)")

	_, err = load(t, "/dev/null")
	wantErr(t, dir, err, "read config: /dev/null: not a regular file (a character device)")

	writeFile(t, filepath.Join(dir, "real.toml"), svcConfig(80))
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real.toml", link); err != nil {
		t.Fatal(err)
	}
	cfg, err := load(t, link)
	if err != nil || len(cfg.Spec.Services) != 1 {
		t.Fatalf("Load through a symbolic link = %v, %v", cfg, err)
	}
}

// TestLoadSwappedForFIFO swaps a checked regular file for a FIFO before
// it is opened: the read neither blocks nor reads it.
func TestLoadSwappedForFIFO(t *testing.T) {
	dir, main := includeTree(t)
	a := filepath.Join(dir, "d", "a.toml")
	swapped := false
	testHookBeforeOpen = func(path string) {
		if path != a || swapped {
			return
		}
		swapped = true
		tmp := filepath.Join(dir, "fifo")
		mkfifo(t, tmp)
		if err := os.Rename(tmp, a); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { testHookBeforeOpen = nil })
	_, err := load(t, main)
	if !swapped {
		t.Fatal("the hook did not run before the included file was opened")
	}
	wantErr(t, dir, err, "D/vipd.toml:1: read included file: D/d/a.toml: not a regular file (a FIFO)")
}

// TestLoadTooLarge refuses a file larger than MaxFileSize, main or
// included, naming its size and the limit, without reading it.
func TestLoadTooLarge(t *testing.T) {
	dir, main := includeTree(t)
	big := filepath.Join(dir, "d", "big.toml")
	writeFile(t, big, "")
	if err := os.Truncate(big, 4*MaxFileSize); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, errIncluded := load(t, main)
	_, errMain := load(t, big)
	runtime.ReadMemStats(&after)
	wantErr(t, dir, errIncluded, "D/vipd.toml:1: read included file: D/d/big.toml: too large: 67108864 bytes, the limit is 16777216 bytes (16 MiB)")
	wantErr(t, dir, errMain, "read config: D/d/big.toml: too large: 67108864 bytes, the limit is 16777216 bytes (16 MiB)")
	if !errors.Is(errMain, ErrTooLarge) {
		t.Fatalf("%v is not ErrTooLarge", errMain)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Fatalf("refusing the file allocated %d bytes; it must not be read", n)
	}
}

// TestReadFileLimit reads a file of exactly the limit, and refuses one
// byte more, and a file that reports a size within the limit but holds
// more (as procfs files do, and as a file growing while it is read does).
func TestReadFileLimit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	writeFile(t, p, "0123456789")
	if data, err := readFileLimit(p, 10); err != nil || string(data) != "0123456789" {
		t.Fatalf("readFileLimit at the limit = %q, %v", data, err)
	}
	_, err := readFileLimit(p, 9)
	wantErr(t, dir, err, "D/f: too large: 10 bytes, the limit is 9 bytes")

	fi, err := os.Stat("/proc/self/status")
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Fatalf("/proc/self/status: %v, %v; want a regular file of size 0", fi, err)
	}
	_, err = readFileLimit("/proc/self/status", 64)
	wantErr(t, dir, err, "/proc/self/status: too large: more than 64 bytes were read, the limit is 64 bytes")
	if data, err := readFileLimit("/proc/self/status", 1<<20); err != nil || !strings.HasPrefix(string(data), "Name:") {
		t.Fatalf("readFileLimit(/proc/self/status) = %.20q, %v", data, err)
	}
}

// TestWatchIncludedNotRegular reports a FIFO that appears among the
// included files, or replaces one, as that file's error, without
// blocking, and keeps watching: the files written next are reported.
func TestWatchIncludedNotRegular(t *testing.T) {
	dir, main := includeTree(t)
	a := filepath.Join(dir, "d", "a.toml")
	w := startWatcherOpts(t, WatchOptions{Path: main, Include: []string{filepath.Join(dir, "d", "*.toml")}, Debounce: 30 * time.Millisecond})

	fifo := filepath.Join(dir, "d", "f.toml")
	mkfifo(t, fifo)
	ch := within(t, w, 2*time.Second)
	if ch.File != fifo || ch.Data != nil || ch.Removed || !errors.Is(ch.Err, ErrNotRegular) {
		t.Fatalf("change = %s; want the FIFO's error", describe(ch))
	}
	wantErr(t, dir, ch.Err, "D/d/f.toml: not a regular file (a FIFO)")

	b := filepath.Join(dir, "d", "b.toml")
	writeFile(t, b, svcConfig(90))
	if ch := next(t, w); ch.File != b || port(t, ch) != 90 {
		t.Fatalf("change = %s", describe(ch))
	}

	// A FIFO renamed over an included file, then a good version of it.
	tmp := filepath.Join(dir, "fifo")
	mkfifo(t, tmp)
	if err := os.Rename(tmp, a); err != nil {
		t.Fatal(err)
	}
	ch = within(t, w, 2*time.Second)
	if ch.File != a || ch.Data != nil || !errors.Is(ch.Err, ErrNotRegular) {
		t.Fatalf("change = %s; want the FIFO's error", describe(ch))
	}
	writeFile(t, a+".tmp", svcConfig(83))
	if err := os.Rename(a+".tmp", a); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != a || port(t, ch) != 83 {
		t.Fatalf("change = %s", describe(ch))
	}

	// The FIFO becomes a regular file.
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	writeFile(t, fifo, svcConfig(91))
	if ch := next(t, w); ch.File != fifo || port(t, ch) != 91 {
		t.Fatalf("change = %s", describe(ch))
	}
	quiet(t, w)
}

// TestWatchIncludedTooLarge reports an oversized included file as its
// error, and its next good version.
func TestWatchIncludedTooLarge(t *testing.T) {
	dir, main := includeTree(t)
	a := filepath.Join(dir, "d", "a.toml")
	w := startWatcherOpts(t, WatchOptions{Path: main, Include: []string{filepath.Join(dir, "d", "*.toml")}, Debounce: 30 * time.Millisecond})
	tmp := filepath.Join(dir, "big")
	writeFile(t, tmp, "")
	if err := os.Truncate(tmp, MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, a); err != nil {
		t.Fatal(err)
	}
	ch := next(t, w)
	want := fmt.Sprintf("D/d/a.toml: too large: %d bytes, the limit is 16777216 bytes (16 MiB)", MaxFileSize+1)
	if ch.File != a || ch.Data != nil {
		t.Fatalf("change = %s; want the file's error", describe(ch))
	}
	wantErr(t, dir, ch.Err, want)
	writeFile(t, a+".tmp", svcConfig(84))
	if err := os.Rename(a+".tmp", a); err != nil {
		t.Fatal(err)
	}
	if ch := next(t, w); ch.File != a || port(t, ch) != 84 {
		t.Fatalf("change = %s", describe(ch))
	}
}

// TestLoadBenchFixture loads the largest configuration the project
// measures, the single file of 10,000 services of 10 backends of `make
// bench`, well within MaxFileSize.
func TestLoadBenchFixture(t *testing.T) {
	data, _ := benchFixture(t, 10000, 10)
	if len(data) > MaxFileSize/2 {
		t.Fatalf("the fixture is %d bytes; MaxFileSize (%d) leaves it less than twice that", len(data), MaxFileSize)
	}
	path := filepath.Join(t.TempDir(), "vipd.toml")
	writeFile(t, path, string(data))
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.Spec.Services); n != 10000 {
		t.Fatalf("loaded %d services; want 10000", n)
	}
}
