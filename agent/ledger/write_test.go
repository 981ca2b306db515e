package ledger

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vipd/vipd/lb"
)

// names lists the entries of dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// expectOnly fails unless dir holds exactly the file name with content.
func expectOnly(t *testing.T, dir, name, content string) {
	t.Helper()
	if got := names(t, dir); len(got) != 1 || got[0] != name {
		t.Errorf("directory holds %q, want only %q (no temporary file left)", got, name)
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != content {
		t.Errorf("%s = %q, want the old %q", name, data, content)
	}
}

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "drained.json")
	for _, content := range []string{"[]", `[{"backend":"10.0.0.1:80"}]`} {
		if err := WriteFile(path, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		expectOnly(t, dir, "drained.json", content)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
}

// A write that fails halfway leaves the old file as it was and no
// temporary file.
func TestWriteFileFailedWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "owned.json")
	if err := WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	err := writeFile(path, 0o600, func(f *os.File) error {
		if _, err := f.WriteString(`{"version":1,"serv`); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	expectOnly(t, dir, "owned.json", "old")
}

// A rename that fails (the target is a directory) leaves no temporary
// file.
func TestWriteFileFailedRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "owned.json")
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("new"), 0o600); err == nil {
		t.Fatal("renaming over a non-empty directory succeeded")
	}
	if got := names(t, dir); len(got) != 1 || got[0] != "owned.json" {
		t.Errorf("directory holds %q, want only owned.json", got)
	}
}

// A full file system: the ledger's Store fails with ENOSPC, the old
// ledger still loads and no temporary file is left.
func TestStoreDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=4k"); err != nil {
		t.Fatalf("mount a 4 KiB tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	f := New(Path(dir))
	old := map[lb.ServiceKey]struct{}{{Family: lb.IPv4, FWMark: 1}: {}}
	if err := f.Store(old); err != nil {
		t.Fatal(err)
	}
	oldText, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	big := map[lb.ServiceKey]struct{}{}
	for i := range 1000 {
		big[lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 80}] = struct{}{}
	}
	err = f.Store(big)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("storing %d services on a 4 KiB file system: err = %v, want ENOSPC", len(big), err)
	}
	expectOnly(t, dir, FileName, string(oldText))
	if got, err := f.Load(); err != nil || len(got) != 1 {
		t.Errorf("after the failed store the ledger loads %v, %v; want the old one", got, err)
	}
}

func TestLoadCorrupt(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"empty", "", "the file is empty"},
		{"blank", "\n  \n", "the file is empty"},
		{"truncated", `{"version":1,"services":[{"family":4,"proto":"tcp","addr":"10.0.0.1","po`, "unexpected end of JSON input"},
		{"garbage", "\x00\x00\x7fELF", "invalid character"},
		{"not a ledger", "null", "version 0, want 1"},
		{"other version", `{"version":2,"services":[]}`, "version 2, want 1"},
		{"trailing", `{"version":1,"services":[]}}`, "invalid character"},
		{"bad family", `{"version":1,"services":[{"family":5,"fwmark":3}]}`, "service 1: family 5"},
		{"bad proto", `{"version":1,"services":[{"family":4,"proto":"icmp","addr":"10.0.0.1","port":1}]}`, "service 1:"},
		{"no address", `{"version":1,"services":[{"family":4,"proto":"tcp","port":80}]}`, "service 1: address"},
		{"wrong family", `{"version":1,"services":[{"family":6,"proto":"tcp","addr":"10.0.0.1","port":80}]}`, "not an IPv6 address"},
		{"mark and address", `{"version":1,"services":[{"family":4,"fwmark":1,"addr":"10.0.0.1"}]}`, "firewall mark 1 with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := New(path).Load()
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path {
				t.Fatalf("Load = %v, %v; want a CorruptError for %s", got, err, path)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("err = %q, want one naming %s and saying %q", err, path, tc.want)
			}
		})
	}
}

// A ledger with no services is valid, and so is one vipd wrote.
func TestLoadValid(t *testing.T) {
	for text, n := range map[string]int{
		`{"version":1,"services":[]}`:   0,
		`{"version":1,"services":null}`: 0,
		`{"version":1,"services":[{"family":4,"proto":"tcp","addr":"192.0.2.1","port":80},{"family":6,"fwmark":7}]}`: 2,
	} {
		path := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := New(path).Load()
		if err != nil || len(got) != n {
			t.Errorf("Load(%s) = %v, %v; want %d services", text, got, err, n)
		}
	}
}
