package bfd

import (
	"fmt"
	"net"
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

	"golang.org/x/net/ipv4"

	"github.com/vipd/vipd/lb/lbtest/nstest"
)

// TestMain runs the root tests in a private network namespace.
func TestMain(m *testing.M) { nstest.Main(m) }

// The test's addresses: the speaker in the test's namespace on "fb",
// bird in the peer's on "fp", and another host there.
var (
	self4  = netip.MustParseAddr("10.98.0.1")
	bird4  = netip.MustParseAddr("10.98.0.2")
	other4 = netip.MustParseAddr("10.98.0.3")
	self6  = netip.MustParseAddr("fd00:98::1")
	bird6  = netip.MustParseAddr("fd00:98::2")
)

// birdc runs birdc on the control socket sock.
type birdc struct{ bin, sock string }

func (b birdc) run(args ...string) string {
	out, _ := exec.Command(b.bin, append([]string{"-s", b.sock}, args...)...).CombinedOutput()
	return string(out)
}

// state returns bird's state of its BFD session with addr.
func (b birdc) state(addr netip.Addr) string {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(addr.String()) + `\s+\S+\s+(\S+)`).FindStringSubmatch(b.run("show", "bfd", "sessions"))
	if m == nil {
		return ""
	}
	return m[1]
}

// setup joins the test's namespace to a peer namespace and runs bird
// there with BFD sessions to the speaker's addresses.
func setup(t *testing.T, interval time.Duration, mult int) (*nstest.Peer, birdc) {
	t.Helper()
	nstest.Need(t)
	bin := nstest.Tool(t, "bird", "/usr/sbin/bird", "bird2")
	ctl := nstest.Tool(t, "birdc", "/usr/sbin/birdc", "bird2")
	p := nstest.NewPeer(t, "fb", "fp")
	for _, a := range []string{self4.String() + "/24", self6.String() + "/64"} {
		if err := nstest.AddAddr("fb", a); err != nil {
			t.Fatal(err)
		}
	}
	p.Do(t, func() error {
		for _, a := range []string{bird4.String() + "/24", other4.String() + "/24", bird6.String() + "/64"} {
			if err := nstest.AddAddr("fp", a); err != nil {
				return err
			}
		}
		return nil
	})
	dir := t.TempDir()
	conf := fmt.Sprintf(`router id %s;
log stderr all;
protocol device {}
protocol bfd {
  interface "fp" { interval %d ms; multiplier %d; };
  neighbor %s;
  neighbor %s;
}
`, bird4, interval.Milliseconds(), mult, self4, self6)
	path := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b := birdc{bin: ctl, sock: filepath.Join(dir, "bird.ctl")}
	out := &nstest.Buffer{}
	cmd := exec.Command(bin, "-f", "-c", path, "-s", b.sock)
	cmd.Stdout, cmd.Stderr = out, out
	p.Do(t, cmd.Start)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		sessions := b.run("show", "bfd", "sessions")
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("bird's log:\n%s\nsessions:\n%s", out, sessions)
		}
	})
	eventually(t, 5*time.Second, func() bool { return strings.Contains(b.run("show", "status"), "Daemon is up") }, "bird did not start")
	return p, b
}

func eventually(t *testing.T, within time.Duration, f func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf(format, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// changes records a speaker's changes of state.
type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) add(a netip.Addr, ch Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, fmt.Sprintf("%s %s>%s %s", a, ch.From, ch.To, ch.Diag))
}

// list returns a copy of the changes.
func (c *changes) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}

func (c *changes) has(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.got, s)
}

func startSpeaker(t *testing.T, cfg Config, c *changes) *Speaker {
	t.Helper()
	sp, err := Start(Options{Peers: []PeerOptions{{Address: bird4, Config: cfg}, {Address: bird6, Config: cfg}},
		Logger: testLogger(t), OnChange: c.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.Stop)
	return sp
}

// TestBird: the speaker and bird bring IPv4 and IPv6 sessions up; when
// the path goes silent, each side detects the silence within its detection
// time; when it is back the sessions come up again; a stop tells bird
// the sessions are administratively down.
func TestBird(t *testing.T) {
	_, b := setup(t, 100*time.Millisecond, 3)
	c := &changes{}
	cfg := Config{Interval: 100 * time.Millisecond, DetectMult: 3}
	sp := startSpeaker(t, cfg, c)
	for _, a := range []netip.Addr{bird4, bird6} {
		eventually(t, 10*time.Second, func() bool { s, _ := sp.State(a); return s == Up }, "the session with %s did not come up", a)
	}
	for _, a := range []netip.Addr{self4, self6} {
		eventually(t, 2*time.Second, func() bool { return b.state(a) == "Up" }, "bird's session with %s is not up", a)
	}
	// Let the poll sequences end and the fast interval run a while:
	// the sessions stay up.
	time.Sleep(time.Second)
	if !strings.Contains(b.run("show", "bfd", "sessions"), "0.100") {
		t.Errorf("bird does not use the 100 ms interval:\n%s", b.run("show", "bfd", "sessions"))
	}
	if got := c.list(); slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "up>down") }) {
		t.Fatalf("a session flapped: %v", got)
	}

	// The path goes silent (the link keeps its carrier, as a dead
	// node's switch port does): both sides see silence. bird's detection time is
	// our multiplier times our interval, 300 ms.
	cut := time.Now()
	lift := silence(t, "fb")
	eventually(t, 2*time.Second, func() bool { return b.state(self4) == "Down" }, "bird's session with %s did not go down", self4)
	birdTook := time.Since(cut)
	eventually(t, 2*time.Second, func() bool { return c.has(bird4.String() + " up>down control detection time expired") },
		"the speaker did not see bird's silence: %v", c.list())
	t.Logf("silence: bird saw the session down after %v (detection time 300 ms)", birdTook.Round(time.Millisecond))
	if birdTook > 1500*time.Millisecond {
		t.Errorf("bird took %v to see the session down, want about 300 ms", birdTook)
	}
	lift()
	for _, a := range []netip.Addr{bird4, bird6} {
		eventually(t, 15*time.Second, func() bool { s, _ := sp.State(a); return s == Up }, "the session with %s did not come back", a)
	}

	// A stop: bird hears AdminDown.
	sp.Stop()
	eventually(t, 2*time.Second, func() bool { return b.state(self4) == "Down" }, "bird's session did not go down on a stop")
	if st := sp.Stats(); st.Unknown+st.LowTTL+st.Malformed+st.WrongDisc != 0 || st.Sent == 0 || st.Received == 0 {
		t.Errorf("stats %+v: bird's packets were dropped", st)
	}
}

// sendFrom sends b to the speaker from src in the peer namespace with
// TTL ttl, from a BFD source port.
func sendFrom(t *testing.T, p *nstest.Peer, src netip.Addr, ttl int, b []byte) {
	t.Helper()
	p.Do(t, func() error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 50000)),
			net.UDPAddrFromAddrPort(netip.AddrPortFrom(self4, Port)))
		if err != nil {
			return err
		}
		defer c.Close()
		if err := ipv4.NewConn(c).SetTTL(ttl); err != nil {
			return err
		}
		_, err = c.Write(b)
		return err
	})
}

// TestRefusals: a packet with TTL 254 (from off the link: a router
// decremented it) cannot bring a session down, nor can one from an
// address that is no peer, nor a malformed one; the same packet with
// TTL 255 from the peer does (the checks, not luck, kept it up).
func TestRefusals(t *testing.T) {
	p, b := setup(t, 100*time.Millisecond, 3)
	c := &changes{}
	sp := startSpeaker(t, Config{Interval: 100 * time.Millisecond, DetectMult: 3}, c)
	eventually(t, 10*time.Second, func() bool { s, _ := sp.State(bird4); return s == Up }, "the session did not come up")
	// bird's discriminator and ours, from the session.
	sp.mu.Lock()
	s := sp.sessions[bird4].s
	down := (&Packet{State: AdminDown, Diag: DiagAdminDown, DetectMult: 3, MyDisc: s.remoteDisc, YourDisc: s.localDisc, DesiredMinTx: time.Second}).Marshal()
	sp.mu.Unlock()

	sendFrom(t, p, bird4, 254, down)
	eventually(t, time.Second, func() bool { return sp.Stats().LowTTL == 1 }, "the packet with TTL 254 was not counted: %+v", sp.Stats())
	sendFrom(t, p, other4, 255, down)
	eventually(t, time.Second, func() bool { return sp.Stats().Unknown == 1 }, "the packet from %s was not counted: %+v", other4, sp.Stats())
	sendFrom(t, p, bird4, 255, down[:20])
	eventually(t, time.Second, func() bool { return sp.Stats().Malformed == 1 }, "the short packet was not counted: %+v", sp.Stats())
	wrong := slices.Clone(down)
	wrong[11] ^= 0xff
	sendFrom(t, p, bird4, 255, wrong)
	eventually(t, time.Second, func() bool { return sp.Stats().WrongDisc == 1 }, "the packet for another discriminator was not counted: %+v", sp.Stats())
	time.Sleep(300 * time.Millisecond)
	if st, _ := sp.State(bird4); st != Up || c.has(bird4.String()+" up>down neighbor signaled session down") {
		t.Fatalf("a refused packet took the session down: %v %v", st, c.list())
	}
	if _, ok := sp.State(other4); ok {
		t.Fatal("a session exists for an address that is no peer")
	}
	// The drops are the session's; the stranger's packet is in no
	// session.
	if st, _ := sp.Session(bird4); st.Packets.LowTTL != 1 || st.Packets.Malformed != 1 || st.Packets.WrongDisc != 1 {
		t.Errorf("the session's counts %+v, want one of each drop", st.Packets)
	}
	if _, ok := sp.Session(other4); ok || len(sp.Sessions()) != 2 {
		t.Errorf("sessions %+v, want only bird's two", sp.Sessions())
	}

	sendFrom(t, p, bird4, 255, down)
	eventually(t, time.Second, func() bool { return c.has(bird4.String() + " up>down neighbor signaled session down") },
		"the same packet with TTL 255 from the peer did not take the session down: %v", c.list())
	_ = b
}

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

// TestBirdStatus: the sessions' status with bird as the peer: up with
// the negotiated intervals and packets both ways, none dropped; down,
// once, when bird stops (it tells the speaker its sessions go
// administratively down).
func TestBirdStatus(t *testing.T) {
	_, b := setup(t, 100*time.Millisecond, 3)
	c := &changes{}
	// vipd's interval is 200 ms: it sends at its own 200 ms; bird
	// sends at the larger of its 100 ms and the 200 ms vipd asks for.
	sp := startSpeaker(t, Config{Interval: 200 * time.Millisecond, DetectMult: 4}, c)
	for _, a := range []netip.Addr{bird4, bird6} {
		eventually(t, 10*time.Second, func() bool {
			st, _ := sp.Session(a)
			return st.State == Up && st.RemoteState == Up && st.RxInterval == 200*time.Millisecond
		}, "the session with %s is not up at 200 ms", a)
	}
	// A second at the fast interval: packets both ways.
	time.Sleep(time.Second)
	for _, st := range sp.Sessions() {
		if st.State != Up || st.TxInterval != 200*time.Millisecond || st.RemoteDetectMult != 3 || st.DetectionTime != 600*time.Millisecond ||
			st.DetectMult != 4 || st.RemoteDisc == 0 || st.Downs != 0 || st.LastDown != DiagNone {
			t.Errorf("status of %s up: %+v", st.Peer, st)
		}
		if p := st.Packets; p.Received < 3 || p.Sent < 3 || p.Dropped() != 0 {
			t.Errorf("packets of %s: %+v, want some both ways, none dropped", st.Peer, p)
		}
		if d := time.Since(st.Since); d < time.Second || d > 15*time.Second {
			t.Errorf("%s up for %v, want since it came up, over a second ago", st.Peer, d)
		}
	}

	stop := time.Now()
	if out := b.run("down"); !strings.Contains(out, "Shutdown requested") {
		t.Logf("birdc down: %s", out)
	}
	for _, a := range []netip.Addr{bird4, bird6} {
		eventually(t, 3*time.Second, func() bool { st, _ := sp.Session(a); return st.State == Down }, "the session with %s is not down after bird stopped", a)
	}
	for _, st := range sp.Sessions() {
		if st.Downs != 1 || st.Since.Before(stop) {
			t.Errorf("status of %s after bird stopped: %+v, want one down since %v", st.Peer, st, stop)
		}
		if st.LastDown != DiagNeighborDown && st.LastDown != DiagTimeExpired {
			t.Errorf("last down of %s: %v, want neighbor signaled (bird's admin down) or time expired", st.Peer, st.LastDown)
		}
	}
	t.Logf("after bird stopped: %+v", sp.Sessions())
}
