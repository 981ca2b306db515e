package ledger

import (
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
