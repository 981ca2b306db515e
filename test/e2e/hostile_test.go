//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// TestVipdRefusesForeignInterface: an existing dummy that is not vipd's
// (kube-proxy's kube-ipvs0, with its service addresses) named as vipd's
// interface is refused at start, saying how to fix it, and left as it
// was: its addresses and the IPVS service on them survive.
func TestVipdRefusesForeignInterface(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	Sh(t, "ip link add kube-ipvs0 type dummy && ip addr add 10.96.0.1/32 dev kube-ipvs0 && ipvsadm -A -t 10.96.0.1:443 -s rr")
	t.Cleanup(func() { ShExec("ipvsadm -D -t 10.96.0.1:443; ip link del kube-ipvs0") })
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, `interface = "kube-ipvs0"`) + service("web", tp.VIP, 80, "", tp.BackendIPs...))
	r := Exec(vipdBin(), "run", "-c", d.path)
	if r.Err == nil {
		t.Fatalf("vipd ran on kube-proxy's interface:\n%s", r)
	}
	mustContain(t, "vipd run", r.Stderr+r.Stdout, `interface kube-ipvs0 is not vipd's`, `10.96.0.1`, `ip link set dev kube-ipvs0 alias vipd`)
	mustContain(t, "kube-ipvs0", Run(t, "ip", "-o", "addr", "show", "dev", "kube-ipvs0"), "10.96.0.1/32")
	mustContain(t, "ipvsadm", Run(t, "ipvsadm", "-Ln"), "10.96.0.1:443")
	mustNotContain(t, "ipvsadm", Run(t, "ipvsadm", "-Ln"), tp.VIP+":80")
}

// TestVipdRefusesHostAddressVIP: a VIP that is the LB's own uplink
// address is refused by vipd check and by vipd run, naming the service
// and the interface, with nothing programmed; --offline checks the files
// alone.
func TestVipdRefusesHostAddressVIP(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	d.write(d.header(tp.LBIf, "") + service("ssh-box", tp.LBIP, 80, "", tp.BackendIPs...))
	want := `service "ssh-box": vip ` + tp.LBIP + ` is an address of interface ` + tp.LBIf
	r := Exec(vipdBin(), "check", d.path)
	if r.Err == nil {
		t.Fatalf("vipd check passed a host address as a VIP:\n%s", r)
	}
	mustContain(t, "vipd check", r.Stderr, want)
	if r := Exec(vipdBin(), "check", "--offline", d.path); r.Err != nil {
		t.Errorf("vipd check --offline:\n%s", r)
	}
	r = Exec(vipdBin(), "run", "-c", d.path)
	if r.Err == nil {
		t.Fatalf("vipd ran with a host address as a VIP:\n%s", r)
	}
	mustContain(t, "vipd run", r.Stderr+r.Stdout, want)
	if out := Run(t, "ipvsadm", "-Ln"); strings.Contains(out, tp.LBIP+":80") {
		t.Errorf("a refused start programmed the service:\n%s", out)
	}
}
