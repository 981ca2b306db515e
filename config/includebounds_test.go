package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIncludedBounded refuses include patterns that match more files, or
// more bytes together, than the limits: each file alone is fine.
func TestIncludedBounded(t *testing.T) {
	t.Run("size", func(t *testing.T) {
		dir := t.TempDir()
		main := filepath.Join(dir, "vipd.toml")
		writeFile(t, main, "include = [\"services.d/*.toml\"]\n")
		comment := strings.Repeat("# "+strings.Repeat("x", 98)+"\n", (15<<20)/100)
		for i := range 5 {
			writeFile(t, filepath.Join(dir, "services.d", fmt.Sprintf("%d.toml", i)), comment)
		}
		_, err := Load(main)
		if !errors.Is(err, ErrTooMany) && (err == nil || !strings.Contains(err.Error(), "more than 67108864 bytes (64 MiB) together")) {
			t.Fatalf("Load: %v, want the included files refused as too large together", err)
		}
		if !strings.Contains(err.Error(), main+":1: ") {
			t.Errorf("error %q does not name the include line", err)
		}
		// Four are fine; a fifth that the watcher sees appear is not.
		fifth := filepath.Join(dir, "services.d", "4.toml")
		if err := os.Remove(fifth); err != nil {
			t.Fatal(err)
		}
		base, err := Load(main)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ParseFrom(base, fifth, []byte(comment)); !errors.Is(err, ErrTooMany) && (err == nil || !strings.Contains(err.Error(), "64 MiB")) {
			t.Errorf("ParseFrom of a fifth file: %v, want it refused", err)
		}
	})
	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		main := filepath.Join(dir, "vipd.toml")
		writeFile(t, main, "include = [\"services.d/*.toml\"]\n")
		if err := os.MkdirAll(filepath.Join(dir, "services.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range MaxIncludedFiles + 1 {
			if err := os.WriteFile(filepath.Join(dir, "services.d", fmt.Sprintf("%d.toml", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		_, err := Load(main)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d files match the include patterns, the limit is %d", MaxIncludedFiles+1, MaxIncludedFiles)) {
			t.Fatalf("Load: %v, want too many files refused", err)
		}
	})
}
