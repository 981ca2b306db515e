package config

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestErrorsQuoteNoSecret includes, through a symlink in services.d, a
// file that is not vipd's (a credentials file): the errors name the file,
// the line and the key, never the values the file holds.
func TestErrorsQuoteNoSecret(t *testing.T) {
	const secret = "s3cr3t"
	cases := []struct{ text, want string }{
		{`password = "s3cr3t-value"`, `:1: unknown key "password"`},
		{"# db\npassword = trues3cr3t-value", `:2: password: `},
		{"password = falses3cr3t", `:1: password: `},
		{"pin = 0s3cr3t", `:1: `},
		{"pin = 00123456", `:1: pin: `},
		{"pin = 1_s3cr3t", `:1: pin: `},
		{"token = 1.s3cr3t", `:1: token: `},
		{"token = 0xs3cr3t", `:1: token: `},
		{"token = 99999999999999999999999", `:1: token: `},
		{"token = 1e99999", `:1: token: `},
		{"when = 1979-05-27T99:99:99", `:1: when: `},
		{"s3cr3t-value", `:1: `},
		{"aws_secret_access_key: s3cr3t", `:1: `},
		{"export TOKEN=s3cr3t", `:1: `},
		{"[client]\nuser = \"admin\"\npassword = 's3cr3t\n", `:3: `},
		{"password = \"\\q s3cr3t\"", `:1: password: `},
		{"password = \"\\uZZZZs3cr3t\"", `:1: password: `},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			dir := t.TempDir()
			creds := filepath.Join(dir, "credentials")
			writeFile(t, creds, c.text+"\n")
			link := filepath.Join(dir, "services.d", "db.toml")
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(creds, link); err != nil {
				t.Fatal(err)
			}
			main := filepath.Join(dir, "vipd.toml")
			writeFile(t, main, "include = [\"services.d/*.toml\"]\n")
			_, err := Load(main)
			if err == nil {
				t.Fatal("loaded")
			}
			msg := err.Error()
			if strings.Contains(msg, secret) || strings.Contains(msg, "123456") || strings.Contains(msg, "99999") {
				t.Errorf("%q: the error quotes the file's content: %s", c.text, msg)
			}
			if !strings.Contains(msg, link+c.want) {
				t.Errorf("%q: error %q does not contain %q", c.text, msg, link+c.want)
			}
		})
	}
}

// TestErrorsBounded gives a file with a huge value and one with a great
// many errors: each message, and all of them together, stay small.
func TestErrorsBounded(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "x = 0"+strings.Repeat("7", 1<<20)+"\n")
	_, err := Load(main)
	if err == nil {
		t.Fatal("loaded")
	}
	if n := len(err.Error()); n > 1024 {
		t.Errorf("one error of a huge line is %d bytes: %.200s...", n, err)
	}

	var b strings.Builder
	for i := range 100000 {
		fmt.Fprintf(&b, "k%d = 1\n", i)
	}
	writeFile(t, main, b.String())
	_, err = Load(main)
	if err == nil {
		t.Fatal("loaded")
	}
	msg := err.Error()
	if n := strings.Count(msg, "\n") + 1; n > MaxErrors+1 {
		t.Errorf("%d lines of errors, want at most %d and a count", n, MaxErrors+1)
	}
	if !strings.Contains(msg, fmt.Sprintf("and up to %d more unknown keys", 100000-MaxErrors)) {
		t.Errorf("no count of the errors left out: ...%s", msg[max(0, len(msg)-200):])
	}
	// The errors kept are bounded too, not only those printed.
	if errs, ok := err.(Errors); !ok || len(errs) > MaxErrors+1 {
		t.Errorf("%d errors kept, want at most %d", len(errs), MaxErrors+1)
	}

	// Many errors that are not unknown keys: the first MaxErrors and a
	// count.
	b.Reset()
	for i := range 1000 {
		fmt.Fprintf(&b, "[[service]]\nname = \"s%d\"\nvip = \"192.0.2.1\"\nport = %d\nbackend = [{ address = \"10.0.0.1\" }]\nscheduler = \"nope\"\n", i, i+1)
	}
	writeFile(t, main, b.String())
	_, err = Load(main)
	if err == nil {
		t.Fatal("loaded")
	}
	msg = err.Error()
	if n := strings.Count(msg, "\n") + 1; n != MaxErrors+1 || !strings.Contains(msg, "... and ") {
		t.Errorf("%d lines of errors, want %d with a count: ...%s", n, MaxErrors+1, msg[max(0, len(msg)-200):])
	}
}

// TestErrorsMemory reads an included file of 4 MiB of unknown keys: what
// the parse allocates stays a bounded multiple of the file's size (the
// decoder's own cost), not that and an error for each key.
func TestErrorsMemory(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	writeFile(t, main, "include = [\"services.d/*.toml\"]\n")
	var b strings.Builder
	for i := 0; b.Len() < 4<<20; i++ {
		fmt.Fprintf(&b, "k%d = 1\n", i)
	}
	writeFile(t, filepath.Join(dir, "services.d", "x.toml"), b.String())
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Load(main)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("loaded")
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d bytes read, %d allocated, %d lines of errors", b.Len(), alloc, strings.Count(err.Error(), "\n")+1)
	// Before the errors were bounded: 117 times the file, and 358,785
	// lines; now about 90 times (the decoder's and the position index's
	// cost), and 101 lines.
	if limit := uint64(100 * b.Len()); alloc > limit {
		t.Errorf("%d bytes allocated for %d bytes of file, more than %d", alloc, b.Len(), limit)
	}
	if n := strings.Count(err.Error(), "\n") + 1; n > MaxErrors+1 {
		t.Errorf("%d lines of errors, want at most %d", n, MaxErrors+1)
	}
}
