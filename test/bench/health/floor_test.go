//go:build linux

package healthbench

import (
	"strings"
	"testing"
	"time"
)

// floorOnce runs one probe of b on a floor loop and returns its result.
func floorOnce(t *testing.T, b Backend, timeout time.Duration) error {
	t.Helper()
	l, err := newFloorLoop(timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	l.start(b, floorRequest(b), time.Now())
	for end := time.Now().Add(timeout + 5*time.Second); l.counts.Probes == 0 && time.Now().Before(end); {
		l.wait(time.Now().Add(10 * time.Millisecond))
	}
	if l.counts.Probes != 1 || len(l.ops) != 0 {
		t.Fatalf("%s %s: %d probes ended, %d under way", b.Kind, b.Addr, l.counts.Probes, len(l.ops))
	}
	return l.counts.First
}

func TestFloorProbe(t *testing.T) {
	tcp := Backend{TCP, freeAddr(t)}
	httpb := Backend{HTTP, freeAddr(t)}
	l, err := Listen([]Backend{tcp, httpb})
	if err != nil {
		t.Fatal(err)
	}
	defer l.CloseAll()
	for _, b := range []Backend{tcp, httpb} {
		if err := floorOnce(t, b, time.Second); err != nil {
			t.Errorf("%s %s: %v", b.Kind, b.Addr, err)
		}
	}
	// An HTTP probe of a TCP listener, which answers nothing, times out.
	if err := floorOnce(t, Backend{HTTP, tcp.Addr}, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("http probe of a silent listener: %v", err)
	}
	// A closed listener refuses.
	if err := l.Close(tcp.Addr); err != nil {
		t.Fatal(err)
	}
	if err := floorOnce(t, tcp, time.Second); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("probe of a closed listener: %v", err)
	}
}

func TestRunFloor(t *testing.T) {
	tcp := Backend{TCP, freeAddr(t)}
	httpb := Backend{HTTP, freeAddr(t)}
	down := Backend{TCP, freeAddr(t)}
	l, err := Listen([]Backend{tcp, httpb})
	if err != nil {
		t.Fatal(err)
	}
	defer l.CloseAll()
	w := DefaultWorkload
	w.TCPInterval, w.HTTPInterval = 20*time.Millisecond, 40*time.Millisecond
	stop := make(chan struct{})
	time.AfterFunc(500*time.Millisecond, func() { close(stop) })
	c := RunFloor(w, []Backend{tcp, httpb, down}, stop)
	// Two TCP backends every 20 ms and one HTTP every 40 ms for 0.5 s:
	// about 60 probes, half of the TCP ones to the backend that refuses.
	if c.Probes < 20 || c.Failures < 5 || c.Failures > c.Probes/2+2 {
		t.Errorf("%d probes, %d failed (first: %v)", c.Probes, c.Failures, c.First)
	}
	if c.First == nil || !strings.Contains(c.First.Error(), down.Addr.String()) {
		t.Errorf("first failure %v, want one of %s", c.First, down.Addr)
	}
}
