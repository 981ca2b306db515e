package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

type timedConn struct {
	*conn
	send_, recv_ time.Duration
	sends, recvs int
}

func (c *timedConn) send(b []byte) error {
	t := time.Now()
	err := c.conn.send(b)
	c.send_ += time.Since(t)
	c.sends++
	return err
}
func (c *timedConn) recv(large bool, fn func(m message) error) error {
	t := time.Now()
	err := c.conn.recv(large, fn)
	c.recv_ += time.Since(t)
	c.recvs++
	return err
}

func rus() (time.Duration, time.Duration) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func TestExpDump(t *testing.T) {
	if os.Getenv("VIPD_EXP") == "" {
		t.Skip()
	}
	tb := newTable(t)
	var ops []lb.Op
	var keys []kernelKey
	for i := range 1000 {
		s := svc(lb.ServiceKey{Family: lb.IPv4, Proto: lb.TCP, Addr: netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)}), Port: 80}, "wrr")
		ops = append(ops, lb.Op{Kind: lb.OpAddService, Service: s})
		k, _ := toKernelKey(s.Key)
		keys = append(keys, k)
		for j := range 10 {
			ops = append(ops, lb.Op{Kind: lb.OpAddDest, Service: s, Dest: dest(fmt.Sprintf("172.%d.%d.%d:80", 16+j, i>>8, i&255), lb.Masq)})
		}
	}
	noErrors(t, "write", batched(tb, ops))
	c := tb.conns[0].(*conn)
	tc := &timedConn{conn: c}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gc0 := ms.NumGC
	u0, s0 := rus()
	t0 := time.Now()
	for _, k := range keys {
		if err := dump(tc, tb.family, cmdGetDest, []*nl.RtAttr{keyAttr(k)}, func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	u1, s1 := rus()
	runtime.ReadMemStats(&ms)
	t.Logf("no parse: %v (send %v x%d, recv %v x%d) user %v sys %v gc %d", time.Since(t0), tc.send_, tc.sends, tc.recv_, tc.recvs, u1-u0, s1-s0, ms.NumGC-gc0)

	// Blocking recvfrom without the poller.
	fd := int(c.f.Fd())
	unix.SetNonblock(fd, false)
	buf := make([]byte, 65536)
	u0, s0 = rus()
	t0 = time.Now()
	nrecv := 0
	for _, k := range keys {
		req := appendRequest(nil, tb.family, unix.NLM_F_DUMP, 77, cmdGetDest, keyAttr(k))
		if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			t.Fatal(err)
		}
		for done := false; !done; {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			nrecv++
			if err != nil {
				t.Fatal(err)
			}
			parseDatagram(buf[:n], func(m message) error {
				if m.typ == unix.NLMSG_DONE {
					done = true
				}
				return nil
			})
		}
	}
	u1, s1 = rus()
	t.Logf("raw blocking: %v recvs %d user %v sys %v", time.Since(t0), nrecv, u1-u0, s1-s0)

	// Small buffer: the kernel allocates dump skbs of the largest buffer it saw... (already 64K)
	u0, s0 = rus()
	t0 = time.Now()
	got, err := tb.Services()
	u1, s1 = rus()
	t.Logf("Services: %v n=%d err=%v user %v sys %v", time.Since(t0), len(got), err, u1-u0, s1-s0)

	// Old path through nl.
	u0, s0 = rus()
	t0 = time.Now()
	for _, k := range keys {
		if _, err := tb.genl.request(cmdGetDest, unix.NLM_F_DUMP, keyAttr(k)).Execute(unix.NETLINK_GENERIC, 0); err != nil {
			t.Fatal(err)
		}
	}
	u1, s1 = rus()
	t.Logf("nl Execute: %v user %v sys %v", time.Since(t0), u1-u0, s1-s0)
}
