package ipvs

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestReadConnections reads a connection table in the kernel's format:
// IPv4 and IPv6, persistence templates, a firewall-mark template (which it
// leaves out) and a persistence engine's trailing fields.
func TestReadConnections(t *testing.T) {
	f, err := os.Open("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	err = ReadConnections(f, func(c Connection) bool {
		got = append(got, fmt.Sprintf("%s %s %s %s %s %s", c.Proto, c.Client, c.Virtual, c.Backend, c.State, c.Expires))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"tcp 10.0.3.2:45278 10.0.3.10:80 10.0.3.3:80 ESTABLISHED 14m59s",
		"tcp 10.0.3.2:45280 10.0.3.10:80 10.0.3.4:80 CLOSE_WAIT 58s",
		"udp 10.0.3.2:54321 10.0.3.10:53 10.0.3.5:53 UDP 4m57s",
		"tcp 10.0.3.2:0 10.0.3.10:80 10.0.3.3:80 NONE 5m59s",
		"sctp 10.0.3.2:8080 10.0.3.10:8080 10.0.3.3:8080 ESTABLISHED 14m59s",
		"tcp [fd00:0:0:3::2]:45278 [fd00:0:0:3::a]:80 [fd00:0:0:3::3]:80 FIN_WAIT 1m38s",
		"tcp 10.0.3.2:45282 10.0.3.10:80 10.0.3.3:80 ESTABLISHED 14m59s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestReadConnectionsStops stops at the first connection fn declines.
func TestReadConnectionsStops(t *testing.T) {
	f, err := os.Open("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	if err := ReadConnections(f, func(Connection) bool { n++; return n < 2 }); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("fn called %d times, want 2", n)
	}
}

// TestReadConnectionsBad names the line of a malformed entry.
func TestReadConnectionsBad(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"TCP 0A000302 B0DE\n", "line 1: 3 fields"},
		{"Pro FromIP\nTCP 0A00030Z B0DE 0A00030A 0050 0A000303 0050 ESTABLISHED 1\n", `line 2: address "0A00030Z"`},
		{"TCP 0A000302 B0DEF 0A00030A 0050 0A000303 0050 ESTABLISHED 1\n", `line 1: port "B0DEF"`},
		{"TCP 10.0.3.22 B0DE 0A00030A 0050 0A000303 0050 ESTABLISHED 1\n", `line 1: address "10.0.3.22": not an IPv4 or IPv6 address`},
		{"TCP 0A000302 B0DE 0A00030A 0050 0A000303 0050 ESTABLISHED -1\n", `line 1: expiry "-1"`},
		{"TCP " + strings.Repeat("0", 600) + "\n", "line 1: bufio.Scanner: token too long"},
	} {
		err := ReadConnections(strings.NewReader(tc.in), func(Connection) bool { return true })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.in, err, tc.want)
		}
	}
}

// connectionTable returns a table of n TCP connections in the kernel's
// format, one in a hundred established, the others in TIME_WAIT: a
// synchronized backup's table under short requests.
func connectionTable(n int) string {
	var b strings.Builder
	b.WriteString("Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData\n")
	for i := range n {
		st := "TIME_WAIT"
		if i%100 == 0 {
			st = "ESTABLISHED"
		}
		fmt.Fprintf(&b, "TCP 0A000302 %04X 0A000364 0050 0A00030C 0050 %-11s %7d\n", 20000+i, st, 100)
	}
	return b.String()
}

// TestReadConnectionsAllocs: reading a table allocates nothing per
// connection (its buffer and scanner only), whatever its size.
func TestReadConnectionsAllocs(t *testing.T) {
	for _, n := range []int{10, 1000} {
		table := connectionTable(n)
		got := 0
		allocs := testing.AllocsPerRun(10, func() {
			got = 0
			if err := ReadConnections(strings.NewReader(table), func(Connection) bool { got++; return true }); err != nil {
				t.Fatal(err)
			}
		})
		if got != n || allocs > 3 {
			t.Errorf("%d connections: read %d, %.0f allocations", n, got, allocs)
		}
	}
}

// BenchmarkReadConnections reads a table of 1,312 connections (a
// synchronized backup's in the HA benchmark, its tenth takeover).
func BenchmarkReadConnections(b *testing.B) {
	table := connectionTable(1312)
	for b.Loop() {
		if err := ReadConnections(strings.NewReader(table), func(Connection) bool { return true }); err != nil {
			b.Fatal(err)
		}
	}
}
