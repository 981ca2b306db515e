//go:build e2e

package e2e

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVipdRemovalUnderLoad: a backend is removed from the file and added
// back again and again while new connections arrive at more than 50 a
// second and long-lived connections stay open, by a renamed file (the
// watcher) and by SIGHUP. IPVS counts a connection whose handshake is in
// flight as inactive, and deleting its backend resets it; vipd takes the
// backend out of rotation first and deletes it in a later pass, so no
// request may fail and no connection may break. At the end, long-lived
// connections on the removed backend keep it (at weight 0) until they
// finish, and then it leaves the table.
func TestVipdRemovalUnderLoad(t *testing.T) {
	for _, via := range []string{"rename", "sighup"} {
		t.Run(via, func(t *testing.T) { removalUnderLoad(t, via) })
	}
}

func removalUnderLoad(t *testing.T, via string) {
	const cycles = 16
	tp := NewTopo(t, "nat 3")
	d := newDaemon(t)
	be := tp.BackendIPs
	// The default resync interval: the tests' 2 s keeps the main loop
	// busy re-reading iptables in the emulated guest.
	extra := `resync_interval = "30s"`
	if via == "sighup" {
		extra += "\nwatch = false"
	}
	cfg := func(all bool) string {
		backends := be[:2]
		if all {
			backends = be
		}
		return d.header(tp.LBIf, extra) + service("web", tp.VIP, 80, `scheduler = "rr"`, backends...)
	}
	apply := func(all bool) {
		d.write(cfg(all))
		if via == "sighup" {
			if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
	}
	gone := be[2] + ":80"
	row := regexp.MustCompile(`-> ` + regexp.QuoteMeta(gone) + `\s+Masq\s+(\d+)\s+(\d+)\s+(\d+)`)
	// weight is the removed backend's weight in the kernel, -1 when it is
	// not in the table.
	weight := func() int {
		m := row.FindStringSubmatch(Run(t, "ipvsadm", "-Ln", "-t", tp.VIP+":80"))
		if m == nil {
			return -1
		}
		w, _ := strconv.Atoi(m[1])
		return w
	}
	waitWeight := func(want int, what string, i int) {
		t.Helper()
		Eventually(t, 20*time.Second, 20*time.Millisecond, func() bool { return weight() == want }, "cycle %d: %s (weight %d):\n%s", i, what, want, d.logSince())
	}

	// The long-lived clients connect while the third backend is out, so
	// that they stay on the kept backends and it can leave each time.
	d.write(cfg(false))
	d.start()
	l := startLoadWith(t, tp, loadOptions{Port: 80, Long: 20, LongEvery: 200 * time.Millisecond, Short: 12, ShortEvery: 100 * time.Millisecond})
	time.Sleep(time.Second)
	start := time.Now()
	var took []time.Duration // from each removal to the backend's deletion
	for i := 1; i <= cycles; i++ {
		apply(true)
		waitWeight(1, "added back", i)
		// New connections reach it, and some are still being set up
		// when it leaves.
		time.Sleep(400 * time.Millisecond)
		removed := time.Now()
		apply(false)
		waitWeight(-1, "left the table", i)
		took = append(took, time.Since(removed))
	}
	slices.Sort(took)
	t.Logf("%s: %d removals in %v; removal to deletion min %v, median %v, max %v", via, cycles, time.Since(start).Round(time.Millisecond),
		took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))

	// Every removal took the backend out of rotation in one pass and
	// deleted it in a later one.
	drains, deletes := 0, 0
	for _, pass := range passes(d.logSince()) {
		drain := strings.Contains(pass, "drain backend tcp "+tp.VIP+":80 -> "+gone)
		del := strings.Contains(pass, "delete backend tcp "+tp.VIP+":80 -> "+gone)
		if drain && del {
			t.Errorf("one pass drained and deleted %s:\n%s", gone, pass)
		}
		if drain {
			drains++
		}
		if del {
			deletes++
		}
	}
	if drains != cycles || deletes != cycles {
		t.Errorf("%d drains and %d deletions of %s, want %d of each", drains, deletes, gone, cycles)
	}

	// Long-lived connections on the backend keep it, at weight 0, until
	// they finish; then it leaves.
	apply(true)
	waitWeight(1, "added back for the long-lived connections", cycles+1)
	var on *load
	for try := 1; on == nil; try++ {
		if try > 10 {
			t.Fatalf("no long-lived connection reached %s in 10 tries", gone)
		}
		l2 := startLoadWith(t, tp, loadOptions{Port: 80, Long: 3, LongEvery: 200 * time.Millisecond})
		Eventually(t, 10*time.Second, 20*time.Millisecond, func() bool {
			l2.mu.Lock()
			defer l2.mu.Unlock()
			return len(l2.last) == 3
		}, "the long-lived clients got no answer")
		l2.mu.Lock()
		for _, b := range l2.last {
			if b == tp.Backends[2] {
				on = l2
			}
		}
		l2.mu.Unlock()
		if on == nil {
			l2.finish(t, "long-lived connections on the kept backends")
		}
	}
	apply(false)
	waitWeight(0, "out of rotation with long-lived connections", cycles+1)
	time.Sleep(4 * time.Second) // past the grace and two drain passes
	if w := weight(); w != 0 {
		t.Errorf("the removed backend with long-lived connections has weight %d, want 0 (kept until they end)", w)
	}
	on.finish(t, "long-lived connections on the removed backend")
	waitWeight(-1, "left the table once its connections ended", cycles+1)

	l.finish(t, via+": removals under load")
	rate := float64(l.shortOK+len(l.shortErr)) / l.took.Seconds()
	t.Logf("%s: %d removals, %.0f new connections/s, %d short requests failed, %d long-lived connections broken", via, cycles+1, rate, len(l.shortErr), len(l.longErrs))
	if rate < 50 {
		t.Errorf("the load sent %.0f new connections/s; the test needs at least 50", rate)
	}
}

// passes splits a daemon's log into passes: the lines up to and including
// each "reconciled" line.
func passes(log string) []string {
	var out []string
	var b strings.Builder
	for _, line := range strings.SplitAfter(log, "\n") {
		b.WriteString(line)
		if strings.Contains(line, "msg=reconciled") {
			out = append(out, b.String())
			b.Reset()
		}
	}
	return out
}
