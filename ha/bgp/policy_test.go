package bgp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"

	"github.com/vipd/vipd/ha/bgpproc"
	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// The two-router tests' addresses: vipd (AS 65100) in the test's
// namespace, router A (AS 65001) behind "xa", router B (AS 65002) behind
// "xb".
var (
	vipdA   = netip.MustParseAddr("10.98.1.1")
	routerA = netip.MustParseAddr("10.98.1.2")
	vipdB   = netip.MustParseAddr("10.98.2.1")
	routerB = netip.MustParseAddr("10.98.2.2")
	vip     = netip.MustParsePrefix("192.0.2.10/32")
)

// twoRouters joins the test's namespace to router A's and router B's.
func twoRouters(t *testing.T) (a, b *nstest.Peer) {
	t.Helper()
	a = nstest.NewPeer(t, "xa", "pa")
	b = nstest.NewPeer(t, "xb", "pb")
	for _, l := range []struct {
		p          *nstest.Peer
		link, peer string
		local, rem netip.Addr
	}{{a, "xa", "pa", vipdA, routerA}, {b, "xb", "pb", vipdB, routerB}} {
		if err := nstest.AddAddr(l.link, l.local.String()+"/24"); err != nil {
			t.Fatal(err)
		}
		l.p.Do(t, func() error { return nstest.AddAddr(l.peer, l.rem.String()+"/24") })
	}
	return a, b
}

// routerConf is a bird router of AS asn at local with a session to vipd
// (protocol "vipd", AS 65100, at remote) that sends the n static routes
// of static (prefix(i) for i < n) and takes whatever vipd sends.
func routerConf(local, remote netip.Addr, asn uint32, n int, prefix func(int) string) string {
	var c strings.Builder
	c.WriteString("protocol static own {\n  ipv4;\n")
	for i := range n {
		fmt.Fprintf(&c, "  route %s blackhole;\n", prefix(i))
	}
	c.WriteString("}\n")
	fmt.Fprintf(&c, `protocol bgp vipd {
  local %s as %d;
  neighbor %s as 65100;
  direct;
  hold time 9;
  keepalive time 3;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 2;
  ipv4 { import all; export where proto = "own"; gateway direct; };
}
`, local, asn, remote)
	return c.String()
}

// aPrefix and bPrefix are the routes router A and router B send.
func aPrefix(i int) string { return fmt.Sprintf("100.%d.%d.0/24", 64+i/256, i%256) }
func bPrefix(i int) string { return fmt.Sprintf("172.16.%d.0/24", i) }

// fromVipd returns the prefixes bird has from its protocol vipd.
func (b *bird) fromVipd() ([]string, string) {
	out, err := b.ctl("show route protocol vipd")
	if err != nil {
		return nil, out
	}
	var ps []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && l[0] != ' ' && l[0] != '\t' && strings.Contains(f[0], "/") {
			ps = append(ps, f[0])
		}
	}
	slices.Sort(ps)
	return ps, out
}

// table returns the prefixes of one of the speaker's IPv4 tables: the
// global RIB (name "") or a peer's adj-rib-in.
func (sp *Speaker) table(t *testing.T, typ api.TableType, name string) []string {
	t.Helper()
	var ps []string
	err := sp.s.ListPath(context.Background(), &api.ListPathRequest{TableType: typ, Name: name,
		Family: &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}},
		func(d *api.Destination) { ps = append(ps, d.Prefix) })
	if err != nil {
		t.Fatalf("list %v %s: %v", typ, name, err)
	}
	slices.Sort(ps)
	return ps
}

// captureLogger is testLogger that also keeps what it writes.
func captureLogger(t *testing.T) (*slog.Logger, *nstest.Buffer) {
	buf := &nstest.Buffer{}
	return slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, buf), &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// TestBirdTwoRouters: vipd between two eBGP routers of different ASes
// (a top-of-rack pair). Router A sends 1,001 routes, router B 10. vipd's
// RIB holds none of them (its import policy takes nothing a peer sends),
// B learns vipd's VIP and nothing of A's, A the VIP and nothing of B's
// (its export policy sends only the host routes vipd itself announces):
// vipd is no transit path.
func TestBirdTwoRouters(t *testing.T) {
	pa, pb := twoRouters(t)
	ra := startBirdConf(t, pa, routerA, routerConf(routerA, vipdA, 65001, 1001, aPrefix))
	rb := startBirdConf(t, pb, routerB, routerConf(routerB, vipdB, 65002, 10, bPrefix))
	cfg := testBGP(PeerOptions{Address: routerA, ASN: 65001, MaxPrefixes: 2000}, PeerOptions{Address: routerB, ASN: 65002})
	cfg.ASN, cfg.RouterID = 65100, vipdA
	sp := startSpeaker(t, cfg, nil)
	for _, r := range []*bird{ra, rb} {
		r.waitFor("bird's session up", 20*time.Second, func() (bool, string) { return r.established("vipd") })
	}
	if err := sp.Set(map[netip.Prefix]Attrs{vip: {}}); err != nil {
		t.Fatal(err)
	}
	// Every route of A's reached vipd: its adj-rib-in (what a peer sent,
	// before the import policy) holds them, bounded by max_prefixes.
	ra.waitFor("A's 1001 routes at vipd", 20*time.Second, func() (bool, string) {
		n := len(sp.table(t, api.TableType_ADJ_IN, routerA.String()))
		return n == 1001, fmt.Sprintf("%d routes in vipd's adj-rib-in from A", n)
	})
	rb.waitFor("B's 10 routes at vipd", 5*time.Second, func() (bool, string) {
		n := len(sp.table(t, api.TableType_ADJ_IN, routerB.String()))
		return n == 10, fmt.Sprintf("%d routes in vipd's adj-rib-in from B", n)
	})
	for _, r := range []*bird{ra, rb} {
		r.route(vip.String(), 5*time.Second, `unicast \[vipd `, `BGP\.as_path: 65100\n`)
	}
	// What vipd would pass on has had the time to arrive.
	time.Sleep(2 * time.Second)
	if got := sp.table(t, api.TableType_GLOBAL, ""); !slices.Equal(got, []string{vip.String()}) {
		t.Errorf("vipd's RIB holds %d routes (%s), want only its own %s", len(got), summary(got), vip)
	}
	for _, c := range []struct {
		name string
		r    *bird
	}{{"A", ra}, {"B", rb}} {
		got, out := c.r.fromVipd()
		if !slices.Equal(got, []string{vip.String()}) {
			t.Errorf("router %s learned %d routes from vipd (%s), want only %s:\n%.2000s", c.name, len(got), summary(got), vip, out)
		}
	}
}

// summary names the first few of ps.
func summary(ps []string) string {
	if len(ps) > 5 {
		return strings.Join(ps[:5], " ") + fmt.Sprintf(" … %d more", len(ps)-5)
	}
	return strings.Join(ps, " ")
}

// TestBirdMaxPrefixes: router A sends 1,001 routes to a vipd that takes
// at most 100 from it. vipd ends the session with a Cease (Maximum Number
// of Prefixes Reached) and drops what A sent, logs it, keeps the session
// down for the hold time, then tries again (and is cut again). The
// session with router B, which sends 10, is untouched throughout: it
// keeps the VIP.
func TestBirdMaxPrefixes(t *testing.T) {
	pa, pb := twoRouters(t)
	ra := startBirdConf(t, pa, routerA, routerConf(routerA, vipdA, 65001, 1001, aPrefix))
	rb := startBirdConf(t, pb, routerB, routerConf(routerB, vipdB, 65002, 10, bPrefix))
	cfg := testBGP(PeerOptions{Address: routerA, ASN: 65001, MaxPrefixes: 100}, PeerOptions{Address: routerB, ASN: 65002})
	cfg.ASN, cfg.RouterID = 65100, vipdA
	var mu sync.Mutex
	ups := 0
	log, logs := captureLogger(t)
	const hold = 4 * time.Second
	sp, err := Start(context.Background(), withRun(cfg, Options{Options: bgpproc.Options{ConnectRetry: time.Second, MaxPrefixesHold: hold}, Logger: log,
		OnPeer: func(p Peer) {
			if p.Address == routerA && p.Established() {
				mu.Lock()
				ups++
				mu.Unlock()
			}
		}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Stop(context.Background()) })
	rb.waitFor("B's session up", 20*time.Second, func() (bool, string) { return rb.established("vipd") })
	if err := sp.Set(map[netip.Prefix]Attrs{vip: {}}); err != nil {
		t.Fatal(err)
	}
	rb.route(vip.String(), 5*time.Second, `unicast \[vipd `)
	ra.waitFor("A's session cut with a Cease", 20*time.Second, func() (bool, string) {
		return strings.Contains(ra.out.String(), "vipd: Received: Maximum number of prefixes reached"), "bird's log:\n" + ra.out.String()
	})
	cut := time.Now()
	if got := sp.table(t, api.TableType_GLOBAL, ""); !slices.Equal(got, []string{vip.String()}) {
		t.Errorf("vipd's RIB holds %d routes (%s), want only %s", len(got), summary(got), vip)
	}
	ra.waitFor("vipd's adj-rib-in from A empty", 5*time.Second, func() (bool, string) {
		n := len(sp.table(t, api.TableType_ADJ_IN, routerA.String()))
		return n == 0, fmt.Sprintf("%d routes from A after the cut", n)
	})
	if !regexp.MustCompile(`level=WARN msg="bgp: peer sent more routes than max_prefixes; session closed" peer=10\.98\.1\.2 asn=65001 max_prefixes=100 family=ipv4-unicast hold=4s`).MatchString(logs.String()) {
		t.Errorf("no warning of the cut in the log")
	}
	// Down for the hold time: A's session does not come back at once.
	time.Sleep(time.Until(cut.Add(hold - 1500*time.Millisecond)))
	if up, out := ra.established("vipd"); up {
		t.Errorf("A's session is back %v after the cut, within the hold time %v:\n%s", time.Since(cut), hold, out)
	}
	if got := sp.Peers()[0]; got.Address != routerA || got.Limited.IsZero() {
		t.Errorf("vipd's peer A: %+v, want Limited set", got)
	}
	// After it, vipd tries again, and A's routes cut it again.
	ra.waitFor("A's session up again and cut again", 20*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return ups >= 2 && strings.Count(logs.String(), "session closed") >= 2, fmt.Sprintf("A's session up %d times", ups)
	})
	// B kept its session and the VIP throughout.
	if up, out := rb.established("vipd"); !up {
		t.Errorf("B's session is down:\n%s", out)
	}
	rb.route(vip.String(), time.Second, `unicast \[vipd `)
	if strings.Contains(rb.out.String(), "Received:") {
		t.Errorf("B's session was cut:\n%s", rb.out.String())
	}
}
