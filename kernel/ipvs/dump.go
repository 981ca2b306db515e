package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	mobyipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// defaultDumpSockets is how many sockets read destinations at once by
// default. IPVS dumps destinations one service at a time, and a socket
// runs one dump at a time (a second dump request fails with EBUSY until
// the first is read to its end), so reading 10,000 services is 10,000
// request-answer exchanges. Several sockets overlap the exchanges' system
// calls and decoding, but the kernel's part runs under the generic
// netlink and IPVS mutexes, and in the test guest more sockets read a
// large table no faster than one (the benchmark's dump results, see
// test/bench), so one is the default and Options.DumpSockets the knob for
// machines where it pays.
const defaultDumpSockets = 1

// parallelMin is the number of services below which one socket reads
// them all: starting goroutines costs more than it saves.
const parallelMin = 64

// errDumpInterrupted says the kernel's state changed during a dump.
var errDumpInterrupted = errors.New("dump interrupted")

// Services implements lb.IPVS: it returns every service in the table,
// vipd's or not, with its destinations and the kernel's counters, from
// one dump of the services and one dump of destinations per service (on
// Options.DumpSockets sockets). Its time grows with the table, nearly all
// of it the kernel's; reading one service is Service.
//
// The result is not a snapshot. The kernel answers a service dump in
// parts of at most 32 KiB (about a hundred services), and resumes each
// part by the index of the next service in a hash table that every
// network namespace shares, without marking the dump interrupted when
// that table changed in between. A service added or deleted in any
// namespace during a dump (a namespace being torn down, Docker's ingress
// namespaces, another tool) can make the dump repeat or skip services of
// this one. Services reads a repeated service once; a service missing
// from the result must be confirmed gone with Service before anything is
// done about it (lb.Reconciler does).
func (i *IPVS) Services() (map[lb.ServiceKey]*lb.ServiceState, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.conns == nil {
		return nil, fmt.Errorf("list services: %w", errClosed)
	}
	var entries []serviceEntry
	err := retryDump(func() error {
		entries = entries[:0]
		return dump(i.conns[0], i.family, cmdGetService, nil, func(data []byte) error {
			ms, st, err := parseServiceMsg(data)
			if err != nil {
				return fmt.Errorf("parse service: %w", err)
			}
			entries = append(entries, serviceEntry{ms: ms, stats: st})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	out := make(map[lb.ServiceKey]*lb.ServiceState, len(entries))
	states := make([]*lb.ServiceState, 0, len(entries))
	keys := make([]kernelKey, 0, len(entries))
	for _, e := range entries {
		s, err := fromKernelService(e.ms)
		if err != nil {
			return nil, fmt.Errorf("list services: read service %s: %w", describe(e.ms), err)
		}
		if _, repeated := out[s.Key]; repeated {
			continue // the dump sent it twice; its destinations are read once
		}
		k, err := toKernelKey(s.Key)
		if err != nil {
			return nil, fmt.Errorf("list services: service %s: %w", s.Key, err)
		}
		st := &lb.ServiceState{Service: s, Stats: e.stats}
		out[s.Key] = st
		states = append(states, st)
		keys = append(keys, k)
	}
	if err := i.readDests(keys, states); err != nil {
		return nil, err
	}
	return out, nil
}

// serviceEntry is one service of a dump.
type serviceEntry struct {
	ms    *mobyipvs.Service
	stats lb.Stats
}

// readDests fills in the destinations of the services, reading with up to
// dumpSockets sockets at once.
func (i *IPVS) readDests(keys []kernelKey, states []*lb.ServiceState) error {
	workers := 1
	if len(keys) >= parallelMin {
		workers = len(i.conns)
	}
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
		failed  atomic.Bool
	)
	for w := range workers {
		c := i.conns[w]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var req []byte
			for !failed.Load() {
				x := int(next.Add(1) - 1)
				if x >= len(keys) {
					return
				}
				st := states[x]
				st.Dests = map[netip.AddrPort]lb.Destination{}
				var err error
				req, err = readServiceDests(c, i.family, keys[x], req, st)
				if err != nil {
					errOnce.Do(func() { first = fmt.Errorf("list destinations of service %s: %w", st.Key, err) })
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// readServiceDests dumps the destinations of service k into st.Dests.
// req is a buffer for the request, returned for reuse.
func readServiceDests(t transport, family uint16, k kernelKey, req []byte, st *lb.ServiceState) ([]byte, error) {
	attrs := []rawAttr{keyAttr(k)}
	err := retryDump(func() error {
		clear(st.Dests)
		return dumpInto(t, family, cmdGetDest, &req, attrs, destsInto(st, k.family))
	})
	return req, err
}

// destsInto returns a dump's message reader that puts each destination
// of a service of family fam into st.Dests.
func destsInto(st *lb.ServiceState, fam uint16) func(data []byte) error {
	// The destinations' counters, allocated a few together.
	var stats []lb.Stats
	return func(data []byte) error {
		kd, err := parseDestMsg(data, fam)
		if err != nil {
			return fmt.Errorf("parse destination: %w", err)
		}
		d := fromKernelDest(kd)
		if len(stats) == cap(stats) {
			stats = make([]lb.Stats, 0, 8)
		}
		stats = append(stats, kd.stats)
		d.Stats = &stats[len(stats)-1]
		st.Dests[d.Addr] = d
		return nil
	}
}

// retryDump runs f again, up to 5 times in all, while the kernel says
// its state changed during the dump.
func retryDump(f func() error) error {
	var err error
	for range 5 {
		if err = f(); !errors.Is(err, errDumpInterrupted) {
			return err
		}
	}
	return err
}

// dump runs one dump request and calls fn with the payload (generic
// netlink header and attributes) of each message of the answer.
func dump(t transport, family uint16, cmd uint8, attrs []rawAttr, fn func(data []byte) error) error {
	var req []byte
	return dumpInto(t, family, cmd, &req, attrs, fn)
}

// dumpInto is dump with a caller's buffer for the request. An error of fn
// ends the dump with that error, once the kernel's answer is read to its
// end (so that the socket can run the next dump).
func dumpInto(t transport, family uint16, cmd uint8, req *[]byte, attrs []rawAttr, fn func(data []byte) error) error {
	d := dumpAnswer{seq: t.nextSeq(), family: family, fn: fn}
	*req = appendRequest((*req)[:0], family, unix.NLM_F_DUMP, d.seq, cmd, attrs...)
	if err := t.send(*req); err != nil {
		return fmt.Errorf("send to the kernel: %w", err)
	}
	for !d.done {
		if err := t.recv(true, func(m message) error { d.take(m); return nil }); err != nil {
			return fmt.Errorf("receive from the kernel: %w", err)
		}
	}
	return d.result()
}

// dumpAnswer reads the answer to one dump request, message by message.
type dumpAnswer struct {
	seq    uint32
	family uint16
	// fn is called with the payload of each message of the answer.
	fn func(data []byte) error
	// done says the answer ended; interrupted that the kernel's state
	// changed during the dump; err is the first error of the kernel or
	// of fn.
	done, interrupted bool
	err               error
}

// take reads m if it belongs to the answer.
func (d *dumpAnswer) take(m message) {
	if m.seq != d.seq || d.done {
		return // stale: an answer to an earlier request
	}
	if m.flags&unix.NLM_F_DUMP_INTR != 0 {
		d.interrupted = true
	}
	switch m.typ {
	case unix.NLMSG_DONE:
		d.done = true
		if ok, err := ackError(m.data); ok && err != nil && d.err == nil {
			d.err = err
		}
	case unix.NLMSG_ERROR:
		d.done = true
		if d.err == nil {
			d.err = unanswered(m.data)
		}
	case d.family:
		if d.err == nil {
			d.err = d.fn(m.data)
		}
	}
}

// unanswered is what an NLMSG_ERROR message that came instead of an
// answer reports: the kernel's error, or what is wrong with the message.
func unanswered(data []byte) error {
	ok, err := ackError(data)
	switch {
	case !ok:
		return errors.New("short error message from the kernel")
	case err == nil:
		return errors.New("acknowledged without an answer")
	}
	return err
}

// result is the dump's outcome once done: its first error, or
// errDumpInterrupted.
func (d *dumpAnswer) result() error {
	if d.err != nil {
		return d.err
	}
	if d.interrupted {
		return errDumpInterrupted
	}
	return nil
}

// Service returns one service with its destinations and counters, or nil
// when the table has no service with that key. It costs one exchange with
// the kernel whatever the size of the table: the service's query and the
// dump of its destinations go in one datagram, and the kernel answers
// both. A reload's pass over one changed service waits for this read
// before it writes; the kernel's work for the two requests costs more
// than the round trip saved.
func (i *IPVS) Service(key lb.ServiceKey) (*lb.ServiceState, error) {
	k, err := toKernelKey(key)
	if err != nil {
		return nil, fmt.Errorf("get service %s: %w", key, err)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.conns == nil {
		return nil, fmt.Errorf("get service %s: %w", key, errClosed)
	}
	c := i.conns[0]
	st := &lb.ServiceState{Dests: map[netip.AddrPort]lb.Destination{}}
	ms, stats, dumpErr, err := queryService(c, i.family, k, st)
	if errors.Is(err, unix.ESRCH) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get service %s: %w", key, err)
	}
	if st.Service, err = fromKernelService(ms); err != nil {
		return nil, fmt.Errorf("get service %s: read service %s: %w", key, describe(ms), err)
	}
	st.Stats = stats
	if errors.Is(dumpErr, errDumpInterrupted) {
		// The table changed under the dump: read the destinations
		// again, alone, as a whole-table read does.
		_, dumpErr = readServiceDests(c, i.family, k, nil, st)
	}
	if dumpErr != nil {
		return nil, fmt.Errorf("list destinations of service %s: %w", key, dumpErr)
	}
	return st, nil
}

// queryService sends the query of service k and the dump of its
// destinations in one datagram and reads both answers: the service and
// its counters or the query's error (ESRCH: no such service), and the
// dump's outcome, whose destinations it puts in st.Dests. The kernel runs
// the requests of a datagram in order; the dump of a missing service is
// empty.
func queryService(t transport, family uint16, k kernelKey, st *lb.ServiceState) (ms *mobyipvs.Service, stats lb.Stats, dumpErr, err error) {
	seq := t.nextSeq()
	req := appendRequest(nil, family, 0, seq, cmdGetService, keyAttr(k))
	dests := dumpAnswer{seq: t.nextSeq(), family: family, fn: destsInto(st, k.family)}
	req = appendRequest(req, family, unix.NLM_F_DUMP, dests.seq, cmdGetDest, keyAttr(k))
	if err := t.send(req); err != nil {
		return nil, lb.Stats{}, nil, fmt.Errorf("send to the kernel: %w", err)
	}
	done := false
	for !done || !dests.done {
		rerr := t.recv(true, func(m message) error {
			if m.seq != seq {
				dests.take(m)
				return nil
			}
			if done {
				return nil
			}
			switch m.typ {
			case unix.NLMSG_ERROR:
				done = true
				err = unanswered(m.data)
			case family:
				done = true
				ms, stats, err = parseServiceMsg(m.data)
			}
			return nil
		})
		if rerr != nil {
			return nil, lb.Stats{}, nil, fmt.Errorf("receive from the kernel: %w", rerr)
		}
	}
	return ms, stats, dests.result(), err
}
