//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// extraClient makes a client namespace ns on a link of its own to the LB
// (subnet 10.0.i.0/24 and fd00:i::/64, the client at .2 and ::2), removed
// when the test ends. It returns the client's IPv4 and IPv6 addresses.
func extraClient(t *testing.T, ns, link string, i int) (string, string) {
	t.Helper()
	t.Cleanup(func() {
		ShExec(fmt.Sprintf("ip link del %s 2>/dev/null; ip netns del %s 2>/dev/null", link, ns))
	})
	Sh(t, fmt.Sprintf(`
ip netns add %[1]s
ip -n %[1]s link set lo up
ip link add %[2]s type veth peer name eth0 netns %[1]s
ip addr add 10.0.%[3]d.1/24 dev %[2]s
ip addr add fd00:%[3]d::1/64 dev %[2]s nodad
ip link set %[2]s up
ip -n %[1]s addr add 10.0.%[3]d.2/24 dev eth0
ip -n %[1]s addr add fd00:%[3]d::2/64 dev eth0 nodad
ip -n %[1]s link set eth0 up
ip -n %[1]s route add default via 10.0.%[3]d.1
ip -n %[1]s -6 route add default via fd00:%[3]d::1
ip netns exec %[1]s busybox ping -c 1 -W 2 10.0.%[3]d.1 >/dev/null
ip netns exec %[1]s busybox ping -c 1 -W 2 fd00:%[3]d::1 >/dev/null
`, ns, link, i))
	return fmt.Sprintf("10.0.%d.2", i), fmt.Sprintf("fd00:%d::2", i)
}

// hitFrom sends n requests, each on a new connection, from namespace ns,
// each given timeout.
func hitFrom(t *testing.T, ns, url string, n int, timeout time.Duration) Hits {
	t.Helper()
	out := Run(t, "ip", "netns", "exec", ns, Payload()+"/bin/rignode", "hit", "-n", fmt.Sprint(n), "-timeout", timeout.String(), url)
	var h Hits
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		t.Fatalf("rignode hit printed %q: %v", out, err)
	}
	return h
}

// TestVipdAllow: a file service's allow list, enforced in the real kernel
// in front of real IPVS, IPv4 and IPv6. Three clients in three namespaces:
// a is admitted throughout, b never, c only for a while. While a keeps
// long-lived connections and a stream of new ones going, reloads widen
// the list to c, narrow it back (and rewrite a's entry as an address),
// then lift it: not one of a's requests fails, b is refused until the
// list goes, c is admitted exactly while listed, and a port of the same
// VIP without a list stays open to everyone.
func TestVipdAllow(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	extraClient(t, "vipd-cb", "lb-cb", 5)
	c4, c6 := extraClient(t, "vipd-cc", "lb-cc", 6)
	d := newDaemon(t)
	cfg := func(allow4, allow6 string) string {
		return d.header(tp.LBIf, "") +
			service("web", tp.VIP, 80, allow4, tp.BackendIPs...) +
			service("web6", tp.VIP6, 80, allow6, tp.BackendIP6...) +
			service("open", tp.VIP, 8080, "", tp.BackendIPs...)
	}
	web4, web6, open := HTTPURL(tp.VIP, 80, "/"), HTTPURL(tp.VIP6, 80, "/"), HTTPURL(tp.VIP, 8080, "/")
	const refused = 700 * time.Millisecond
	admitted := func(stage, name, ns string, urls ...string) {
		t.Helper()
		for _, u := range urls {
			if h := hitFrom(t, ns, u, 4, 3*time.Second); h.OK != 4 {
				t.Errorf("%s: %s (%s) to %s: %+v, want admitted", stage, name, ns, u, h)
			}
		}
	}
	denied := func(stage, name, ns string, urls ...string) {
		t.Helper()
		for _, u := range urls {
			if h := hitFrom(t, ns, u, 2, refused); h.OK != 0 || h.Errors != 2 {
				t.Errorf("%s: %s (%s) to %s: %+v, want refused", stage, name, ns, u, h)
			} else if e := strings.ToLower(strings.Join(h.ErrorSamples, " ")); !strings.Contains(e, "timeout") || strings.Contains(e, "refused") || strings.Contains(e, "reset") {
				t.Errorf("%s: %s to %s failed otherwise than by a drop: %v", stage, name, u, h.ErrorSamples)
			}
		}
	}
	reload := func(stage, allow4, allow6 string) {
		t.Helper()
		d.write(cfg(allow4, allow6))
		if r := d.reload(false); r.Err != nil {
			t.Fatalf("%s: reload:\n%s", stage, r)
		}
	}

	a4 := `allow = ["10.0.1.0/24", "192.0.2.0/24"]`
	a6 := `allow = ["fd00:1::/64"]`
	d.write(cfg(a4, a6))
	d.start()
	stage := "allow a"
	admitted(stage, "a", tp.ClientNS, web4, web6, open)
	denied(stage, "b", "vipd-cb", web4, web6)
	denied(stage, "c", "vipd-cc", web4, web6)
	admitted(stage, "b", "vipd-cb", open)
	mustContain(t, "ipset vipd-allowed-4", Run(t, "ipset", "list", "vipd-allowed-4"), tp.VIP+",tcp:80,10.0.1.0/24")
	mustContain(t, "ipset vipd-restricted-6", Run(t, "ipset", "list", "vipd-restricted-6"), tp.VIP6+",tcp:80")
	mustContain(t, "iptables-save", Run(t, "iptables-save", "-t", "filter"), "vipd drop sources a service does not allow")
	mustNotContain(t, "ipset vipd-restricted-4", Run(t, "ipset", "list", "vipd-restricted-4"), ",tcp:8080")

	// a's traffic goes on through every reload that follows.
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 4, LongEvery: 200 * time.Millisecond, Short: 2, ShortEvery: 50 * time.Millisecond})

	stage = "widen to c"
	reload(stage, fmt.Sprintf(`allow = ["10.0.1.0/24", "192.0.2.0/24", %q]`, c4), fmt.Sprintf(`allow = ["fd00:1::/64", %q]`, c6))
	admitted(stage, "c", "vipd-cc", web4, web6)
	denied(stage, "b", "vipd-cb", web4, web6)

	stage = "narrow to a's address"
	reload(stage, `allow = ["10.0.1.2"]`, `allow = ["fd00:1::2"]`)
	denied(stage, "c", "vipd-cc", web4, web6)
	denied(stage, "b", "vipd-cb", web4, web6)
	admitted(stage, "a", tp.ClientNS, web4, web6)
	mustNotContain(t, "ipset vipd-allowed-4", Run(t, "ipset", "list", "vipd-allowed-4"), "10.0.1.0/24", c4)

	stage = "lift"
	reload(stage, "", "")
	admitted(stage, "b", "vipd-cb", web4, web6)
	admitted(stage, "c", "vipd-cc", web4, web6)
	mustNotContain(t, "ipset vipd-restricted-4", Run(t, "ipset", "list", "vipd-restricted-4"), tp.VIP)

	l.finish(t, "a, through every reload")
}
