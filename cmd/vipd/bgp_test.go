package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgp"
	"github.com/vipd/vipd/ha/bgpproc"
	"github.com/vipd/vipd/lb/lbtest"
	"github.com/vipd/vipd/monitor/status"
)

// nonZero fails t for every field of v (a struct) left zero: a field
// of ha/bgp's options the mapping forgot.
func nonZero(t *testing.T, what string, v any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		if rv.Field(i).IsZero() {
			t.Errorf("%s.%s is not mapped from the configuration", what, rv.Type().Field(i).Name)
		}
	}
}

// TestBGPOptions: every setting of the [bgp] section reaches the
// speaker's options, every key of a peer and every attribute.
func TestBGPOptions(t *testing.T) {
	c := config.BGP{Enabled: true, ASN: 65001, RouterID: netip.MustParseAddr("192.0.2.1"), ListenPort: 1179,
		GracefulShutdown: true, GracefulShutdownWait: 5 * time.Second, WithdrawWait: 2 * time.Second,
		Peers: []config.BGPPeer{{Address: netip.MustParseAddr("192.0.2.254"), ASN: 65000, Port: 179, Source: netip.MustParseAddr("192.0.2.1"),
			Password: "x", Multihop: 2, HoldTime: 9 * time.Second, Keepalive: 3 * time.Second, Passive: true, MaxPrefixes: 5,
			BFD: true, BFDInterval: 100 * time.Millisecond, BFDMultiplier: 4}}}
	o := bgpOptions(c)
	if o.ConnectRetry != 0 || o.MaxPrefixesHold != 0 || o.BFDPort != 0 {
		t.Errorf("options the configuration does not hold are set: %+v", o)
	}
	if len(o.Peers) != 1 {
		t.Fatalf("peers %+v", o.Peers)
	}
	p := o.Peers[0]
	nonZero(t, "PeerOptions", p)
	want := c.Peers[0]
	if p.Address != want.Address || p.ASN != want.ASN || p.Port != want.Port || p.Source != want.Source || p.Password != want.Password ||
		p.Multihop != want.Multihop || p.HoldTime != want.HoldTime || p.Keepalive != want.Keepalive || p.Passive != want.Passive ||
		p.MaxPrefixes != want.MaxPrefixes || p.BFD != want.BFD || p.BFDInterval != want.BFDInterval || p.BFDMultiplier != want.BFDMultiplier {
		t.Errorf("peer %+v, want %+v", p, want)
	}
	if o.ASN != c.ASN || o.RouterID != c.RouterID || o.ListenPort != c.ListenPort || o.GracefulShutdown != c.GracefulShutdown ||
		o.GracefulShutdownWait != c.GracefulShutdownWait || o.WithdrawWait != c.WithdrawWait {
		t.Errorf("options %+v from %+v", o, c)
	}
	a := config.BGPAttrs{Communities: []uint32{1}, LargeCommunities: []config.LargeCommunity{{Global: 1, Local1: 2, Local2: 3}}, LocalPref: 5, MED: 6, HasLocalPref: true, HasMED: true}
	got := bgpAttrs(a)
	nonZero(t, "Attrs", got)
	if !got.Equal(bgpproc.Attrs{Communities: []uint32{1}, LargeCommunities: []bgpproc.LargeCommunity{{Global: 1, Local1: 2, Local2: 3}}, LocalPref: 5, MED: 6, HasLocalPref: true, HasMED: true}) {
		t.Errorf("attrs %+v from %+v", got, a)
	}
	if bgp.DefaultMaxPrefixes != config.DefaultBGPMaxPrefixes {
		t.Errorf("ha/bgp's default max_prefixes %d, the configuration's %d", bgp.DefaultMaxPrefixes, config.DefaultBGPMaxPrefixes)
	}
}

// TestBFDStatus: a peer's BFD status reaches vipd status whole: every
// field mapped, the intervals in milliseconds, the diagnostic as a word,
// none without a session, and no last down before one.
func TestBFDStatus(t *testing.T) {
	since := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	st := &bfd.Status{Peer: netip.MustParseAddr("192.0.2.254"), State: bfd.Up, RemoteState: bfd.Init, Since: since, LastDown: bfd.DiagNeighborDown,
		Downs: 2, LocalDisc: 1, RemoteDisc: 2, TxInterval: 200 * time.Millisecond, RxInterval: 1500 * time.Microsecond, DetectMult: 3,
		RemoteDetectMult: 5, DetectionTime: 7500 * time.Microsecond, Packets: bfd.Counts{Received: 10, Sent: 11, LowTTL: 1, Malformed: 2, WrongDisc: 3}}
	got := agentPeer(bgp.Peer{Address: st.Peer, State: "established", BFD: "up", BFDStatus: st}).BFD
	if got == nil {
		t.Fatal("no bfd status")
	}
	nonZero(t, "status.BFD", *got)
	nonZero(t, "status.BFDDropped", got.Dropped)
	want := status.BFD{State: "up", RemoteState: "init", Since: since, Downs: 2, LastDown: "neighbor signaled session down",
		TxInterval: 200, RxInterval: 1.5, DetectMult: 3, RemoteDetectMult: 5, DetectionTime: 7.5, Received: 10, Sent: 11,
		Dropped: status.BFDDropped{TTL: 1, Malformed: 2, Discriminator: 3}}
	if *got != want {
		t.Errorf("bfd status\n got  %+v\n want %+v", *got, want)
	}
	st.LastDown = bfd.DiagNone
	if got := bfdStatus(st); got.LastDown != "" {
		t.Errorf("last down %q for a session that never went down", got.LastDown)
	}
	if got := agentPeer(bgp.Peer{State: "established"}).BFD; got != nil {
		t.Errorf("bfd status %+v for a peer without BFD", got)
	}
}

// TestBGPProgramMissing: a [bgp] section whose speaker program is not
// there fails the start, naming the key.
func TestBGPProgramMissing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vipd.toml")
	cfg := fmt.Sprintf(`[daemon]
control_socket = %q
state_dir = %q
metrics_listen = ""

[bgp]
asn = 65001
router_id = "192.0.2.1"
program = "/nonexistent/vipd-bgp"

[[bgp.peer]]
address = "192.0.2.254"
asn = 65000
`, filepath.Join(dir, "vipd.sock"), filepath.Join(dir, "state")) + twoServices
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	k := lbtest.New()
	in := launch(t, "vipd", k, launchOptions{path: path})
	// The speaker starts after the kernel is opened, before the first
	// pass: the start fails with nothing programmed.
	ready, err := in.wait()
	if ready || err == nil {
		t.Fatalf("ready=%v err=%v, want a failed start\nlog:\n%s", ready, err, in.log)
	}
	for _, w := range []string{"bgp: the speaker program /nonexistent/vipd-bgp ([bgp] program)", "no such file or directory"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error lacks %q: %v", w, err)
		}
	}
	if got := k.Dump(); got != lbtest.New().Dump() {
		t.Errorf("the failed start programmed the kernel:\n%s", got)
	}
}
