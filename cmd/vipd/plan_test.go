package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/config"
	"github.com/vipd/vipd/lb"
)

// TestPlanRemovesLikeTheDaemon: "vipd plan FILE" plans a removal with the
// daemon's drain settings. A removed backend that still has an
// established connection waits at weight 0 (drain = true), and a backend
// removed from the file goes to weight 0 first: the daemon's plan and the
// file's plan say the same, line for line.
func TestPlanRemovesLikeTheDaemon(t *testing.T) {
	h := startDaemon(t, "watch = false", twoServices)
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.4:443") })
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
	h.write(h.header("watch = false") + removed)
	if rep, err := control.Call(h.socket, "POST", "/v1/reload"); err != nil || rep.Error != "" {
		t.Fatalf("reload = %+v %v", rep, err)
	}
	h.eventually("the backend out of rotation", func() bool { return strings.Contains(h.k.Dump(), "10.0.0.2:80 masq weight=0") })

	// The file now also removes 10.0.0.4; the daemon has not read it.
	h.write(h.header("watch = false") + strings.Replace(removed, `, { address = "10.0.0.4" }]`, `]`, 1))
	rep, err := control.Call(h.socket, "GET", "/v1/plan")
	if err != nil || rep.Error != "" {
		t.Fatalf("daemon plan = %+v %v", rep, err)
	}
	daemon := strings.Join(rep.Planned, "\n")

	cfg, err := config.Load(h.path)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := planOn(context.Background(), cfg, h.k.Interface())
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, op := range ops {
		lines = append(lines, op.String())
	}
	file := strings.Join(lines, "\n")

	const want = "drain backend tcp 192.0.2.11:443 -> 10.0.0.4:443 (weight 1 -> 0, 0 active, 0 inactive)"
	if daemon != want {
		t.Errorf("the daemon plans\n%s\nwant\n%s", daemon, want)
	}
	if file != daemon {
		t.Errorf("vipd plan FILE plans\n%s\nthe daemon plans\n%s", file, daemon)
	}
}
