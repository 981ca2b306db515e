//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
)

// Self-tests of the rig: plain ipvsadm/iptables against the real kernel, no
// vipd. If these fail, the rig (kernel, modules, topologies, tools) is
// broken, not vipd.

// TestMain runs the tests in the guest only, and stops the Kubernetes
// tests' shared etcd and kube-apiserver after them.
func TestMain(m *testing.M) {
	code := GuestMain(m)
	stopSharedCluster(code != 0)
	os.Exit(code)
}

// schedulers are all IPVS schedulers of the guest's 6.1 kernel.
var schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"}

func TestRigKernel(t *testing.T) {
	t.Cleanup(func() { ShExec("topo_down") })
	t.Run("schedulers", func(t *testing.T) {
		for _, s := range schedulers {
			Run(t, "ipvsadm", "-A", "-t", "10.0.9.1:80", "-s", s)
			Run(t, "ipvsadm", "-D", "-t", "10.0.9.1:80")
		}
	})
	t.Run("dummy", func(t *testing.T) {
		Sh(t, "ip link add rigtest0 type dummy && ip addr add 10.0.9.2/32 dev rigtest0 && ip link del rigtest0")
	})
	for _, ipt := range []string{"iptables-legacy", "iptables-nft"} {
		t.Run(ipt, func(t *testing.T) {
			Sh(t, fmt.Sprintf(`
ipset create rigtest-%[1]s hash:ip,port -exist
ipset add rigtest-%[1]s 10.0.9.1,tcp:80
%[1]s -t nat -A POSTROUTING -m ipvs --vaddr 10.0.9.1/32 --vport 80 -m comment --comment rig -j MASQUERADE
%[1]s -t filter -A INPUT -m set --match-set rigtest-%[1]s dst,dst -m conntrack --ctstate NEW -p tcp -m multiport --dports 80,443 -j ACCEPT
%[1]s -t mangle -A PREROUTING -m addrtype --dst-type LOCAL -j MARK --set-mark 1
%[1]s -t raw -A PREROUTING -p udp --dport 53 -j ACCEPT
%[1]s -t nat -S POSTROUTING | grep -q -- '--vaddr 10.0.9.1'
%[1]s -t nat -F POSTROUTING
%[1]s -t filter -F INPUT
ipset destroy rigtest-%[1]s`, ipt))
		})
	}
	t.Run("nft", func(t *testing.T) {
		Sh(t, `nft add table inet rigtest && nft add chain inet rigtest c '{ type nat hook postrouting priority 100; }' &&
nft add rule inet rigtest c ip daddr 10.0.9.1 masquerade && nft delete table inet rigtest`)
	})
}

// checkCounts fails the test unless every backend answered exactly want times.
func checkCounts(t *testing.T, h Hits, backends []string, want int) {
	t.Helper()
	exp := map[string]int{}
	for _, b := range backends {
		exp[b] = want
	}
	if h.Errors != 0 || !reflect.DeepEqual(h.Counts, exp) {
		t.Fatalf("per-backend answers = %v (errors %d: %v), want %v", h.Counts, h.Errors, h.ErrorSamples, exp)
	}
}

// checkAlternates fails the test unless consecutive answers come from
// different backends (round robin over two).
func checkAlternates(t *testing.T, h Hits) {
	t.Helper()
	for i := 1; i < len(h.Sequence); i++ {
		if h.Sequence[i] == h.Sequence[i-1] {
			t.Fatalf("answers do not alternate: %v", h.Sequence)
		}
	}
}

// addService programs one IPVS service with its real servers using ipvsadm.
// proto is "-t" or "-u"; fwd is "-m", "-g" or "-i ...".
func addService(t *testing.T, proto, vip string, port int, sched string, rips []string, fwd string) {
	t.Helper()
	Run(t, "ipvsadm", "-A", proto, HostPort(vip, port), "-s", sched)
	for _, rip := range rips {
		Run(t, "ipvsadm", append([]string{"-a", proto, HostPort(vip, port), "-r", HostPort(rip, port)}, strings.Fields(fwd)...)...)
	}
}

func TestRigNAT(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	tp.AddVIP(t)
	addService(t, "-t", tp.VIP, 80, "rr", tp.BackendIPs, "-m")
	addService(t, "-t", tp.VIP6, 80, "rr", tp.BackendIP6, "-m")
	addService(t, "-u", tp.VIP, 53, "rr", tp.BackendIPs, "-m")

	t.Run("tcp4-rr", func(t *testing.T) {
		h := tp.Hit(t, HTTPURL(tp.VIP, 80, "/"), 10, false)
		want := 5
		if ExpectFail() {
			// The rig's failure-path self-test: a deliberately wrong
			// expectation that must make the whole run fail.
			t.Logf("VIPD_E2E_EXPECT_FAIL=1: expecting %d answers per backend on purpose (wrong)", 10)
			want = 10
		}
		checkCounts(t, h, tp.Backends, want)
		checkAlternates(t, h)
	})
	t.Run("tcp6-rr", func(t *testing.T) {
		h := tp.Hit(t, HTTPURL(tp.VIP6, 80, "/"), 10, false)
		checkCounts(t, h, tp.Backends, 5)
		checkAlternates(t, h)
	})
	t.Run("udp4-rr", func(t *testing.T) {
		h := tp.Hit(t, HostPort(tp.VIP, 53), 10, true)
		checkCounts(t, h, tp.Backends, 5)
	})
	t.Run("client-address-kept", func(t *testing.T) {
		// LVS-NAT rewrites only the destination: backends see the client.
		got := whoamiClient(t, tp, HTTPURL(tp.VIP, 80, "/whoami"))
		if got != tp.ClientIP {
			t.Fatalf("backend saw client %s, want %s", got, tp.ClientIP)
		}
	})
}

// TestRigNATOneArm checks the documented SNAT recipe for backends without a
// route back through the LB: MASQUERADE on IPVS traffic + vs.conntrack=1,
// with both iptables backends.
func TestRigNATOneArm(t *testing.T) {
	tp := NewTopo(t, "nat 2 onearm")
	tp.AddVIP(t)
	addService(t, "-t", tp.VIP, 80, "rr", tp.BackendIPs, "-m")
	Run(t, "sysctl", "-w", "net.ipv4.vs.conntrack=1")
	t.Cleanup(func() { Exec("sysctl", "-w", "net.ipv4.vs.conntrack=0") })
	for _, ipt := range []string{"iptables-legacy", "iptables-nft"} {
		t.Run(ipt, func(t *testing.T) {
			rule := []string{"POSTROUTING", "-m", "ipvs", "--vaddr", tp.VIP + "/32", "--vport", "80", "-j", "MASQUERADE"}
			nat := func(op string) []string { return append([]string{"-t", "nat", op}, rule...) }
			Run(t, ipt, nat("-A")...)
			defer Run(t, ipt, nat("-D")...)
			Run(t, ipt, nat("-C")...)
			h := tp.Hit(t, HTTPURL(tp.VIP, 80, "/"), 4, false)
			checkCounts(t, h, tp.Backends, 2)
			// The backends' side of the LB (brbe 10.0.2.1) is what they see.
			if got := whoamiClient(t, tp, HTTPURL(tp.VIP, 80, "/whoami")); got != "10.0.2.1" {
				t.Fatalf("backend saw client %s, want the LB's 10.0.2.1", got)
			}
		})
	}
}

func TestRigDR(t *testing.T) {
	tp := NewTopo(t, "dr 2")
	tp.AddVIP(t)
	addService(t, "-t", tp.VIP, 80, "rr", tp.BackendIPs, "-g")
	addService(t, "-t", tp.VIP6, 80, "rr", tp.BackendIP6, "-g")
	for _, c := range []struct{ name, vip, client string }{{"v4", tp.VIP, tp.ClientIP}, {"v6", tp.VIP6, tp.ClientIP6}} {
		t.Run(c.name, func(t *testing.T) {
			h := tp.Hit(t, HTTPURL(c.vip, 80, "/"), 6, false)
			checkCounts(t, h, tp.Backends, 3)
			checkAlternates(t, h)
			if got := whoamiClient(t, tp, HTTPURL(c.vip, 80, "/whoami")); got != c.client {
				t.Fatalf("backend saw client %s, want %s", got, c.client)
			}
		})
	}
}

func TestRigTunnel(t *testing.T) {
	for _, encap := range []string{"ipip", "gue", "gre"} {
		t.Run(encap, func(t *testing.T) {
			tp := NewTopo(t, "tun 2 "+encap)
			tp.AddVIP(t)
			fwd := "-i --tun-type " + encap
			if encap == "gue" {
				fwd += " --tun-port 6080"
			}
			addService(t, "-t", tp.VIP, 80, "rr", tp.BackendIPs, fwd)
			addService(t, "-t", tp.VIP6, 80, "rr", tp.BackendIP6, fwd)
			for _, vip := range []string{tp.VIP, tp.VIP6} {
				h := tp.Hit(t, HTTPURL(vip, 80, "/"), 4, false)
				checkCounts(t, h, tp.Backends, 2)
			}
		})
	}
}

// whoamiClient asks a backend (through url) which client address it saw.
func whoamiClient(t *testing.T, tp *Topo, url string) string {
	t.Helper()
	out := tp.InClient(t, "curl", "-sS", "--max-time", "3", url)
	f := strings.Fields(out) // "be1 CLIENT:PORT LOCAL:PORT"
	if len(f) < 2 {
		t.Fatalf("unexpected /whoami answer %q", out)
	}
	host, _, err := net.SplitHostPort(f[1])
	if err != nil {
		t.Fatalf("unexpected /whoami client %q: %v", f[1], err)
	}
	return host
}
