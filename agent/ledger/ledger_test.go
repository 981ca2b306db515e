package ledger

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
)

func TestRoundTrip(t *testing.T) {
	f := New(filepath.Join(t.TempDir(), "sub", "owned.json"))
	got, err := f.Load()
	if err != nil || len(got) != 0 {
		t.Fatalf("missing file: %v %v", got, err)
	}
	want := map[lb.ServiceKey]struct{}{
		{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.MustParseAddr("198.51.100.1"), Port: 30080}: {},
		{Family: lb.IPv6, Proto: lb.UDP, Addr: netip.MustParseAddr("2001:db8::1"), Port: 53}:     {},
		{Family: lb.IPv6, FWMark: 7}: {},
	}
	if err := f.Store(want); err != nil {
		t.Fatal(err)
	}
	got, err = f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if err := f.Store(nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Load(); len(got) != 0 {
		t.Fatalf("after storing nothing: %v", got)
	}
}

func TestCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "owned.json")
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(path).Load()
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want one naming %s", err, path)
	}
}

func TestDrains(t *testing.T) {
	path := filepath.Join(t.TempDir(), DrainsFileName)
	if d, err := LoadDrains(path); err != nil || len(d) != 0 {
		t.Fatalf("missing file: %v %v", d, err)
	}
	in := []Drain{
		{Service: "web", Backend: netip.MustParseAddrPort("10.0.0.2:80")},
		{Backend: netip.MustParseAddrPort("10.0.0.9:80")},
		{Service: "api", Backend: netip.MustParseAddrPort("10.0.0.1:443")},
	}
	if err := StoreDrains(path, in); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	want := `[
  {
    "backend": "10.0.0.9:80"
  },
  {
    "service": "api",
    "backend": "10.0.0.1:443"
  },
  {
    "service": "web",
    "backend": "10.0.0.2:80"
  }
]`
	if string(data) != want {
		t.Errorf("stored\n%s\nwant\n%s", data, want)
	}
	out, err := LoadDrains(path)
	if err != nil || len(out) != 3 || out[1] != in[2] {
		t.Errorf("loaded %v %v", out, err)
	}
	for _, bad := range []string{"", "{}", `[{"service":"x"}]`, "[1"} {
		os.WriteFile(path, []byte(bad), 0o600)
		var ce *CorruptError
		if _, err := LoadDrains(path); !errors.As(err, &ce) {
			t.Errorf("%q: %v, want a CorruptError", bad, err)
		}
	}
}
