package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/lb"
)

// TestDaemonRemovalSettings: a removed backend leaves rotation in the
// reload's pass and is deleted by a later drain pass; the drain settings
// take effect on reload.
func TestDaemonRemovalSettings(t *testing.T) {
	h := startDaemon(t, "drain_timeout = \"0s\"", twoServices)
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
	// 10.0.0.2 has an established connection: it waits for it.
	h.k.Edit(func(s *lb.State) {
		for key, svc := range s.Services {
			if key.Port == 80 {
				d := svc.Dests[netip.MustParseAddrPort("10.0.0.2:80")]
				d.ActiveConns = 1
				svc.Dests[d.Addr] = d
			}
		}
	})
	removed := strings.Replace(twoServices, `, { address = "10.0.0.2" }]`, `]`, 1)
	h.write(h.header("drain_timeout = \"0s\"") + removed)
	h.eventually("the backend out of rotation", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=0") })
	// A drain pass reads the service again (once a second).
	h.k.Reads()
	h.eventually("a drain pass", func() bool { return len(h.k.Reads()) > 0 })
	if !strings.Contains(h.k.Dump(), "10.0.0.2:80") {
		t.Fatalf("the backend with an established connection was deleted while drain = true:\n%s", h.k.Dump())
	}
	// With drain = false it goes once the grace is over, connection or
	// not.
	h.write(h.header("drain = false\ndrain_grace = \"0s\"") + removed)
	h.eventually("the backend's deletion", func() bool { return !strings.Contains(h.k.Dump(), "10.0.0.2:80") })
}
