package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/ha/bfd"
	"github.com/vipd/vipd/ha/bgpproc"
	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestMain runs the root tests in a private network namespace.
func TestMain(m *testing.M) { nstest.Main(m) }

// needBird returns the paths of bird and birdc. Without them the test
// skips, or fails when CI is set: CI installs them (test/deps.sh).
func needBird(t *testing.T) (bird, birdc string) {
	t.Helper()
	nstest.Need(t)
	return nstest.Tool(t, "bird", "/usr/sbin/bird", "bird2"), nstest.Tool(t, "birdc", "/usr/sbin/birdc", "bird2")
}

// The test's addresses: vipd in the test's namespace on "vb", bird in the
// peer's on "vp".
var (
	vipd4 = netip.MustParseAddr("10.99.0.1")
	bird4 = netip.MustParseAddr("10.99.0.2")
	vipd6 = netip.MustParseAddr("fd00:99::1")
	bird6 = netip.MustParseAddr("fd00:99::2")
)

// birdPeer is one bgp protocol of bird's: its name, its neighbour (vipd)
// and the AS numbers.
type birdPeer struct {
	name           string
	local, remote  netip.Addr
	asn, remoteASN uint32
	password       string
	// bfd turns on BFD for the session (bird's `bfd on`).
	bfd bool
}

// bird is a bird process in the peer namespace.
type bird struct {
	t     *testing.T
	birdc string
	sock  string
	cmd   *exec.Cmd
	out   *nstest.Buffer
	done  chan struct{}
}

// newLink joins the test's namespace to a new peer namespace with the
// test's addresses.
func newLink(t *testing.T) *nstest.Peer {
	t.Helper()
	p := nstest.NewPeer(t, "vb", "vp")
	for _, a := range []string{vipd4.String() + "/24", vipd6.String() + "/64"} {
		if err := nstest.AddAddr("vb", a); err != nil {
			t.Fatal(err)
		}
	}
	p.Do(t, func() error {
		if err := nstest.AddAddr("vp", bird4.String()+"/24"); err != nil {
			return err
		}
		return nstest.AddAddr("vp", bird6.String()+"/64")
	})
	return p
}

// startBird runs bird in p's namespace with a bgp protocol for each of
// peers, importing everything into its tables.
func startBird(t *testing.T, p *nstest.Peer, peers ...birdPeer) *bird {
	t.Helper()
	var c strings.Builder
	if slices.ContainsFunc(peers, func(bp birdPeer) bool { return bp.bfd }) {
		c.WriteString("protocol bfd {\n  interface \"vp\" { interval 200 ms; multiplier 3; };\n}\n")
	}
	for _, bp := range peers {
		family := "ipv4"
		if bp.remote.Is6() {
			family = "ipv6"
		}
		fmt.Fprintf(&c, "protocol bgp %s {\n  local %s as %d;\n  neighbor %s as %d;\n  direct;\n", bp.name, bp.local, bp.asn, bp.remote, bp.remoteASN)
		fmt.Fprintf(&c, "  hold time 9;\n  keepalive time 3;\n  connect delay time 1;\n  connect retry time 1;\n  error wait time 1, 2;\n")
		if bp.password != "" {
			fmt.Fprintf(&c, "  password %q;\n", bp.password)
		}
		if bp.bfd {
			c.WriteString("  bfd on;\n")
		}
		fmt.Fprintf(&c, "  %s { import all; export none; gateway direct; };\n}\n", family)
	}
	return startBirdConf(t, p, bird4, c.String())
}

// startBirdConf runs bird in p's namespace with router id id and the
// protocols of body.
func startBirdConf(t *testing.T, p *nstest.Peer, id netip.Addr, body string) *bird {
	t.Helper()
	bin, birdc := needBird(t)
	dir := t.TempDir()
	var c strings.Builder
	fmt.Fprintf(&c, "router id %s;\nlog stderr all;\nprotocol device {}\n", id)
	c.WriteString(body)
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(c.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &bird{t: t, birdc: birdc, sock: filepath.Join(dir, "bird.ctl"), out: &nstest.Buffer{}, done: make(chan struct{})}
	b.cmd = exec.Command(bin, "-f", "-c", conf, "-s", b.sock)
	b.cmd.Stdout, b.cmd.Stderr = b.out, b.out
	p.Do(t, b.cmd.Start)
	go func() {
		b.cmd.Wait()
		close(b.done)
	}()
	t.Cleanup(func() {
		b.cmd.Process.Kill()
		<-b.done
		if t.Failed() {
			t.Logf("bird %s's config:\n%s\nbird's log:\n%s", id, c.String(), b.out.String())
		}
	})
	// The control socket answers once bird has read its config.
	b.waitFor("bird's control socket", 5*time.Second, func() (bool, string) {
		out, err := b.ctl("show status")
		return err == nil, out
	})
	return b
}

// ctl runs a birdc command.
func (b *bird) ctl(cmd string) (string, error) {
	out, err := exec.Command(b.birdc, append([]string{"-s", b.sock}, strings.Fields(cmd)...)...).CombinedOutput()
	return string(out), err
}

// waitFor polls f until it holds, failing the test with f's last
// output after within.
func (b *bird) waitFor(what string, within time.Duration, f func() (bool, string)) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, out := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %v; last:\n%s", what, within, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// established reports whether bird's protocol name is up.
func (b *bird) established(name string) (bool, string) {
	out, err := b.ctl("show protocols " + name)
	return err == nil && strings.Contains(out, "Established"), out
}

// routes returns bird's routes (`show route all`), each prefix with its
// block of lines.
func (b *bird) routes() (map[string]string, string) {
	out, err := b.ctl("show route all")
	if err != nil {
		return nil, out
	}
	m := map[string]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && (l[0] != ' ' && l[0] != '\t') && strings.Contains(f[0], "/") {
			cur = f[0]
		}
		if cur != "" {
			m[cur] += l + "\n"
		}
	}
	return m, out
}

// route waits until bird's route for prefix holds every line of want (a
// regexp each), or, with want nil, until bird has no route for prefix.
func (b *bird) route(prefix string, within time.Duration, want ...string) {
	b.t.Helper()
	what := fmt.Sprintf("bird's route %s with %q", prefix, want)
	if want == nil {
		what = fmt.Sprintf("no route %s in bird", prefix)
	}
	b.waitFor(what, within, func() (bool, string) {
		m, out := b.routes()
		if m == nil {
			return false, out
		}
		r, ok := m[prefix]
		if want == nil {
			return !ok, out
		}
		if !ok {
			return false, out
		}
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(r) {
				return false, out
			}
		}
		return true, out
	})
}

// testBGP is a [bgp] section towards the peers, with short timers.
func testBGP(peers ...PeerOptions) Options {
	for i := range peers {
		peers[i].Port, peers[i].HoldTime, peers[i].Keepalive = 179, 9*time.Second, 3*time.Second
	}
	return Options{Options: bgpproc.Options{ASN: 65001, RouterID: vipd4, Peers: peers, WithdrawWait: time.Second}}
}

// withRun returns o, the session's options, with run's logger, callback
// and timers.
func withRun(o, run Options) Options {
	o.Logger, o.OnPeer, o.ConnectRetry, o.MaxPrefixesHold = run.Logger, run.OnPeer, run.ConnectRetry, run.MaxPrefixesHold
	return o
}

func startSpeaker(t *testing.T, o Options, onPeer func(Peer)) *Speaker {
	t.Helper()
	sp, err := Start(context.Background(), withRun(o, Options{Options: bgpproc.Options{ConnectRetry: time.Second}, OnPeer: onPeer, Logger: testLogger(t)}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Stop(context.Background()) })
	return sp
}

// TestBird: vipd's speaker and bird2 over eBGP (IPv4) and iBGP (IPv6):
// the sessions come up, the routes arrive with their attributes, a
// withdrawn route goes and comes back, a change of attributes is sent,
// and a graceful stop marks the routes GRACEFUL_SHUTDOWN, then withdraws
// them while the sessions are still up, then ends the sessions.
func TestBird(t *testing.T) {
	p := newLink(t)
	br := startBird(t, p,
		birdPeer{name: "vipd4", local: bird4, remote: vipd4, asn: 65000, remoteASN: 65001},
		birdPeer{name: "vipd6", local: bird6, remote: vipd6, asn: 65001, remoteASN: 65001})
	var mu sync.Mutex
	var events []Peer
	cfg := testBGP(PeerOptions{Address: bird4, ASN: 65000}, PeerOptions{Address: bird6, ASN: 65001})
	cfg.GracefulShutdown, cfg.GracefulShutdownWait, cfg.WithdrawWait = true, time.Second, 2*time.Second
	sp := startSpeaker(t, cfg, func(p Peer) {
		mu.Lock()
		events = append(events, p)
		mu.Unlock()
	})
	br.waitFor("bird's sessions up", 20*time.Second, func() (bool, string) {
		ok4, out4 := br.established("vipd4")
		ok6, out6 := br.established("vipd6")
		return ok4 && ok6, out4 + out6
	})
	br.waitFor("vipd's sessions up", 5*time.Second, func() (bool, string) {
		ps := sp.Peers()
		return len(ps) == 2 && ps[0].Established() && ps[1].Established(), fmt.Sprint(ps)
	})
	mu.Lock()
	if len(events) == 0 || !events[len(events)-1].Established() {
		t.Errorf("OnPeer reported %v, ending in no established session", events)
	}
	mu.Unlock()

	web := Attrs{Communities: []uint32{65000<<16 | 100, 0xFFFFFF01}, LargeCommunities: []LargeCommunity{{Global: 4200000001, Local1: 1, Local2: 2}},
		MED: 10, HasMED: true}
	v6 := Attrs{LocalPref: 300, HasLocalPref: true, Communities: []uint32{65001<<16 | 6}}
	routes := map[netip.Prefix]Attrs{
		netip.MustParsePrefix("192.0.2.10/32"):      web,
		netip.MustParsePrefix("192.0.2.11/32"):      {},
		netip.MustParsePrefix("2001:db8:10::a/128"): v6,
	}
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.10/32", 5*time.Second, `unicast \[vipd4 `, `via 10\.99\.0\.1 on vp`, `BGP\.as_path: 65001\n`,
		`BGP\.next_hop: 10\.99\.0\.1\n`, `BGP\.med: 10\n`, `BGP\.community: \(65000,100\) \(65535,65281\)\n`,
		`BGP\.large_community: \(4200000001, 1, 2\)\n`, `BGP\.origin: IGP`)
	br.route("192.0.2.11/32", 5*time.Second, `unicast \[vipd4 `, `BGP\.next_hop: 10\.99\.0\.1\n`)
	br.route("2001:db8:10::a/128", 5*time.Second, `unicast \[vipd6 `, `via fd00:99::1 on vp`, `BGP\.local_pref: 300\n`,
		`BGP\.community: \(65001,6\)\n`, `BGP\.as_path: *\n`)
	if ps := sp.Peers(); ps[0].Routes != 2 || ps[1].Routes != 1 {
		t.Errorf("routes per peer: %v", ps)
	} else if ps[0].BFD != "" || ps[0].BFDStatus != nil {
		t.Errorf("a peer without BFD has a BFD status: %q %+v", ps[0].BFD, ps[0].BFDStatus)
	}
	if m, _ := br.routes(); strings.Contains(m["192.0.2.11/32"], "BGP.community") || strings.Contains(m["192.0.2.11/32"], "BGP.med") {
		t.Errorf("a route without attributes has some:\n%s", m["192.0.2.11/32"])
	}

	// A route withdrawn and back; the others untouched.
	delete(routes, netip.MustParsePrefix("192.0.2.11/32"))
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.11/32", 5*time.Second)
	br.route("192.0.2.10/32", time.Second, `BGP\.med: 10\n`)
	routes[netip.MustParsePrefix("192.0.2.11/32")] = Attrs{MED: 5, HasMED: true}
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.11/32", 5*time.Second, `BGP\.med: 5\n`)
	// A change of attributes is an update.
	web.MED = 20
	routes[netip.MustParsePrefix("192.0.2.10/32")] = web
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.10/32", 5*time.Second, `BGP\.med: 20\n`)
	if got := sp.Routes(); len(got) != 3 || !got[netip.MustParsePrefix("192.0.2.10/32")].Equal(web) {
		t.Errorf("Routes() = %v", got)
	}

	// The graceful stop, watched from bird: GRACEFUL_SHUTDOWN first,
	// then no route while the sessions are up, then the sessions end.
	stopped := make(chan time.Time, 1)
	go func() {
		sp.Stop(context.Background())
		stopped <- time.Now()
	}()
	br.route("192.0.2.10/32", 3*time.Second, `BGP\.community: \(65000,100\) \(65535,0\) \(65535,65281\)\n`)
	br.route("192.0.2.11/32", time.Second, `BGP\.community: \(65535,0\)\n`)
	br.route("2001:db8:10::a/128", time.Second, `BGP\.community: \(65001,6\) \(65535,0\)\n`)
	br.route("192.0.2.10/32", 3*time.Second)
	br.route("2001:db8:10::a/128", time.Second)
	if up, out := br.established("vipd4"); !up {
		t.Errorf("the session ended before the wait after the withdrawal:\n%s", out)
	}
	select {
	case <-stopped:
		t.Error("Stop returned before its withdraw_wait")
	default:
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return")
	}
	br.waitFor("bird's sessions down", 5*time.Second, func() (bool, string) {
		ok4, out4 := br.established("vipd4")
		ok6, out6 := br.established("vipd6")
		return !ok4 && !ok6, out4 + out6
	})
	if err := sp.Set(routes); err == nil {
		t.Error("Set after Stop: no error")
	}
}

// TestBirdMD5: a session with a TCP MD5 password comes up; one with the
// wrong password does not.
func TestBirdMD5(t *testing.T) {
	p := newLink(t)
	br := startBird(t, p,
		birdPeer{name: "vipd4", local: bird4, remote: vipd4, asn: 65000, remoteASN: 65001, password: "s3cret"},
		birdPeer{name: "vipd6", local: bird6, remote: vipd6, asn: 65000, remoteASN: 65001, password: "s3cret"})
	startSpeaker(t, testBGP(PeerOptions{Address: bird4, ASN: 65000, Password: "s3cret"},
		PeerOptions{Address: bird6, ASN: 65000, Password: "wrong"}), nil)
	br.waitFor("the session with the password up", 20*time.Second, func() (bool, string) { return br.established("vipd4") })
	// bird tries to connect every second: four seconds with the wrong
	// password are four failures.
	time.Sleep(4 * time.Second)
	if up, out := br.established("vipd6"); up {
		t.Errorf("the session with the wrong password is up:\n%s", out)
	}
}

// TestRetireAndSet: Retire withdraws every route (no GRACEFUL_SHUTDOWN
// unless configured), and a later Set announces them again.
func TestRetireAndSet(t *testing.T) {
	p := newLink(t)
	br := startBird(t, p, birdPeer{name: "vipd4", local: bird4, remote: vipd4, asn: 65000, remoteASN: 65001})
	sp := startSpeaker(t, testBGP(PeerOptions{Address: bird4, ASN: 65000}), nil)
	br.waitFor("bird's session up", 20*time.Second, func() (bool, string) { return br.established("vipd4") })
	routes := map[netip.Prefix]Attrs{netip.MustParsePrefix("192.0.2.10/32"): {}}
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.10/32", 5*time.Second, `BGP\.origin: IGP`)
	start := time.Now()
	if err := sp.Retire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Retire without graceful_shutdown waited %v", d)
	}
	br.route("192.0.2.10/32", 5*time.Second)
	if len(sp.Routes()) != 0 {
		t.Errorf("routes after Retire: %v", sp.Routes())
	}
	if err := sp.Set(routes); err != nil {
		t.Fatal(err)
	}
	br.route("192.0.2.10/32", 5*time.Second, `BGP\.origin: IGP`)
	if err := sp.Set(map[netip.Prefix]Attrs{netip.MustParsePrefix("192.0.2.0/24"): {}}); err == nil {
		t.Error("Set of a /24: no error")
	}
}

// TestBirdBFD: with BFD on both sides, the silence of the node (a dead node:
// no NOTIFICATION, no withdrawal) takes the node's routes out of bird
// within about BFD's detection time (3 × 200 ms), not the hold time (9
// s); vipd sees BFD go down and resets its side of the BGP session; when
// the path is back, both sessions come up again and the routes return.
func TestBirdBFD(t *testing.T) {
	p := newLink(t)
	br := startBird(t, p,
		birdPeer{name: "vipd4", local: bird4, remote: vipd4, asn: 65000, remoteASN: 65001, bfd: true},
		birdPeer{name: "vipd6", local: bird6, remote: vipd6, asn: 65000, remoteASN: 65001, bfd: true})
	var mu sync.Mutex
	var bfdStates []string
	// 200 ms × 3, vipd's default: shorter, a loaded host's stalls of
	// the test or of bird take sessions down.
	cfg := testBGP(PeerOptions{Address: bird4, ASN: 65000, BFD: true, BFDInterval: 200 * time.Millisecond, BFDMultiplier: 3},
		PeerOptions{Address: bird6, ASN: 65000, BFD: true, BFDInterval: 200 * time.Millisecond, BFDMultiplier: 3})
	log, logs := captureLogger(t)
	sp, err := Start(context.Background(), withRun(cfg, Options{Options: bgpproc.Options{ConnectRetry: time.Second}, Logger: log, OnPeer: func(p Peer) {
		if p.Address == bird4 {
			mu.Lock()
			bfdStates = append(bfdStates, p.BFD)
			mu.Unlock()
		}
	}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Stop(context.Background()) })
	up := func() (bool, string) {
		ps := sp.Peers()
		ok4, out4 := br.established("vipd4")
		ok6, out6 := br.established("vipd6")
		bfdUp := func(p Peer) bool {
			return p.BFD == "up" && p.BFDStatus != nil && p.BFDStatus.State == bfd.Up && p.BFDStatus.Peer == p.Address
		}
		return ok4 && ok6 && bfdUp(ps[0]) && bfdUp(ps[1]), fmt.Sprint(ps) + out4 + out6 + must(br.ctl("show bfd sessions"))
	}
	br.waitFor("BGP and BFD up", 20*time.Second, up)
	// Peers has each BFD session's whole status: 200 ms each way once
	// up, packets both ways.
	br.waitFor("BFD at 200 ms", 5*time.Second, func() (bool, string) {
		ps := sp.Peers()
		for _, p := range ps {
			if st := p.BFDStatus; st == nil || st.TxInterval != 200*time.Millisecond || st.RxInterval != 200*time.Millisecond ||
				st.Packets.Received == 0 || st.Packets.Sent == 0 || st.Downs != 0 {
				return false, fmt.Sprintf("%+v", st)
			}
		}
		return true, ""
	})
	vip := netip.MustParsePrefix("192.0.2.10/32")
	vip6 := netip.MustParsePrefix("2001:db8:10::a/128")
	if err := sp.Set(map[netip.Prefix]Attrs{vip: {}, vip6: {}}); err != nil {
		t.Fatal(err)
	}
	br.route(vip.String(), 5*time.Second, `unicast \[vipd4 `)
	br.route(vip6.String(), 5*time.Second, `unicast \[vipd6 `)

	cut := time.Now()
	lift := silence(t, "vb")
	br.route(vip.String(), 2*time.Second)
	took := time.Since(cut)
	br.route(vip6.String(), time.Second)
	t.Logf("silence: bird dropped the node's route after %v (BFD 3 × 200 ms; hold time 9 s)", took.Round(time.Millisecond))
	// BFD, not the hold time, did it. (The guest test asserts the
	// goal, 1 s; a loaded host takes hundreds of milliseconds to run a
	// birdc.)
	if took > 3*time.Second {
		t.Errorf("bird took %v to drop the route, want well under the hold time (9 s)", took)
	}
	br.waitFor("vipd's reset of the BGP session", 2*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), `msg="bgp: BFD session down; resetting the BGP session" peer=10.99.0.2`), logs.String()
	})
	lift()
	br.waitFor("BGP and BFD up again", 20*time.Second, up)
	if st := sp.Peers()[0].BFDStatus; st.Downs == 0 || st.LastDown != bfd.DiagTimeExpired {
		t.Errorf("BFD status after the silence %+v, want a down, time expired", st)
	}
	br.route(vip.String(), 5*time.Second, `unicast \[vipd4 `)

	// bird restarts its BGP session, and with it its BFD session (a new
	// discriminator): vipd sees the old BFD session fail while its BGP
	// session is down or being set up, and leaves that alone; the
	// sessions come back and stay up.
	resets := strings.Count(logs.String(), "resetting the BGP session")
	if out, err := br.ctl("restart vipd4"); err != nil {
		t.Fatalf("birdc restart: %v: %s", err, out)
	}
	time.Sleep(time.Second)
	br.waitFor("BGP and BFD up after bird's restart", 20*time.Second, up)
	time.Sleep(3 * time.Second)
	br.waitFor("BGP and BFD up 3 s later", 10*time.Second, up)
	// At most one reset (or a few on a loaded host, where a stall
	// takes a session down): a loop would reset every few seconds.
	if n := strings.Count(logs.String(), "resetting the BGP session"); n > resets+3 {
		t.Errorf("bird's restart made vipd reset %d times", n-resets)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(bfdStates, "down") || bfdStates[len(bfdStates)-1] != "up" {
		t.Errorf("OnPeer's BFD states %v: want a down, ending up", bfdStates)
	}
}

func must(s string, _ error) string { return s }

// silence drops every packet in and out of link in the test's namespace
// (a dead node: the link keeps its carrier, so the peer learns nothing
// from the link itself), until the returned function lifts it.
func silence(t *testing.T, link string) (lift func()) {
	t.Helper()
	rules := [][]string{{"INPUT", "-i", link}, {"OUTPUT", "-o", link}}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, r := range rules {
			if out, err := exec.Command(cmd, append([]string{"-I", r[0]}, append(r[1:], "-j", "DROP")...)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", cmd, err, out)
			}
		}
	}
	var once sync.Once
	lift = func() { once.Do(func() { unsilence(t, rules) }) }
	t.Cleanup(lift)
	return lift
}

// unsilence deletes silence's rules.
func unsilence(t *testing.T, rules [][]string) {
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, r := range rules {
			if out, err := exec.Command(cmd, append([]string{"-D", r[0]}, append(r[1:], "-j", "DROP")...)...).CombinedOutput(); err != nil {
				t.Errorf("%s: %v: %s", cmd, err, out)
			}
		}
	}
}
