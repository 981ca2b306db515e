package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/lb"
)

// Apply implements lb.IPVS. It encodes each operation as one
// generic netlink request with its own sequence number and NLM_F_ACK,
// sends the requests many to a datagram (the kernel handles each message
// of a datagram in turn, and acknowledges each), then matches the
// acknowledgements to the operations. An operation that fails, to encode
// or in the kernel, fails alone, with an error that names the operation
// and the usual cause of its errno; the others apply.
func (i *IPVS) Apply(ops []lb.Op) []error {
	errs := make([]error, len(ops))
	i.mu.Lock()
	defer i.mu.Unlock()
	b := &i.scratch
	b.reset()
	defer b.trim()
	for x, op := range ops {
		if err := b.add(i.family, x, op); err != nil {
			errs[x] = opError(op, err)
		}
	}
	if len(b.reqs) == 0 {
		return errs
	}
	if i.conns == nil {
		for _, r := range b.reqs {
			errs[r.op] = opError(ops[r.op], errClosed)
		}
		return errs
	}
	i.res = slices.Grow(i.res[:0], len(b.reqs))[:len(b.reqs)]
	for n, err := range exchange(i.conns[0], b.buf, b.reqs, max(i.chunk, 1), i.res) {
		if err != nil {
			errs[b.reqs[n].op] = opError(ops[b.reqs[n].op], err)
		}
	}
	clear(i.res)
	return errs
}

// errClosed is the error of calls on a closed adapter.
var errClosed = errors.New("ipvs adapter is closed")

// chunkFor returns how many requests go in one datagram for a socket
// with receive buffer rcvbuf: all their acknowledgements must fit in it
// at once, since the kernel queues them while it handles the datagram
// and drops those that do not fit. An acknowledgement takes well under
// 2 KiB of buffer (an skb of about 800 bytes).
func chunkFor(rcvbuf int) int {
	return min(max(rcvbuf/2048, 8), maxChunk)
}

// maxChunk bounds the requests of one datagram; beyond a few hundred the
// saving in system calls is nil.
const maxChunk = 256

// batch holds encoded requests back to back.
type batch struct {
	buf  []byte
	reqs []request
}

// reset empties b, keeping its memory.
func (b *batch) reset() { b.buf, b.reqs = b.buf[:0], b.reqs[:0] }

// trim lets go of memory beyond what a usual batch needs (the
// reconciler's batches of a thousand backends take about 110 KiB), so
// that one large batch is not held for the daemon's life.
func (b *batch) trim() {
	if cap(b.buf) > maxKeptBuf {
		b.buf = nil
	}
	if cap(b.reqs) > maxKeptReqs {
		b.reqs = nil
	}
}

// maxKeptBuf and maxKeptReqs bound the batch an adapter keeps between
// calls.
const (
	maxKeptBuf  = 1 << 20
	maxKeptReqs = 4096
)

// request is one encoded operation in a batch's buffer.
type request struct {
	op         int // index of the operation
	start, end int // bytes of buf
}

// add encodes op, the x-th operation, as one request.
func (b *batch) add(family uint16, x int, op lb.Op) error {
	start := len(b.buf)
	buf, err := appendOp(b.buf, family, op)
	if err != nil {
		b.buf = b.buf[:start]
		return err
	}
	b.buf = buf
	b.reqs = append(b.reqs, request{op: x, start: start, end: len(buf)})
	return nil
}

// appendOp appends the request for op, with sequence number 0 (exchange
// sets it).
func appendOp(b []byte, family uint16, op lb.Op) ([]byte, error) {
	switch op.Kind {
	case lb.OpAddService, lb.OpUpdateService:
		ms, err := toKernelService(op.Service)
		if err != nil {
			return b, err
		}
		k, err := toKernelKey(op.Service.Key)
		if err != nil {
			return b, err
		}
		cmd := uint8(cmdNewService)
		if op.Kind == lb.OpUpdateService {
			cmd = cmdSetService
		}
		b, start := beginRequest(b, family, unix.NLM_F_ACK, 0, cmd)
		return endRequest(appendServiceAttr(b, k, ms), start), nil
	case lb.OpDeleteService:
		k, err := toKernelKey(op.Service.Key)
		if err != nil {
			return b, err
		}
		b, start := beginRequest(b, family, unix.NLM_F_ACK, 0, cmdDelService)
		return endRequest(appendKeyAttr(b, k), start), nil
	case lb.OpAddDest, lb.OpUpdateDest, lb.OpDrainDest, lb.OpDeleteDest:
		k, err := toKernelKey(op.Service.Key)
		if err != nil {
			return b, err
		}
		d, full, cmd := op.Dest, true, uint8(cmdSetDest)
		switch op.Kind {
		case lb.OpAddDest:
			cmd = cmdNewDest
		case lb.OpDeleteDest:
			// Only the address matters; any forwarding method converts.
			d, full, cmd = lb.Destination{Addr: op.Dest.Addr, Forward: lb.Masq}, false, cmdDelDest
		}
		kd, err := toKernelDest(d)
		if err != nil {
			return b, err
		}
		b, start := beginRequest(b, family, unix.NLM_F_ACK, 0, cmd)
		return endRequest(appendDestAttr(appendKeyAttr(b, k), kd, full), start), nil
	}
	return b, fmt.Errorf("%s is not an ipvs operation", op.Kind)
}

// opError words the failure of op: the operation, then the usual cause
// of the kernel's error.
func opError(op lb.Op, err error) error {
	switch op.Kind {
	case lb.OpAddService:
		return fmt.Errorf("add service %s: %w", op.Service.Key, explainService(err, op.Service.Scheduler))
	case lb.OpUpdateService:
		return fmt.Errorf("update service %s: %w", op.Service.Key, explainService(err, op.Service.Scheduler))
	case lb.OpDeleteService:
		return fmt.Errorf("delete service %s: %w", op.Service.Key, explainService(err, ""))
	case lb.OpAddDest:
		return fmt.Errorf("add backend %s -> %s: %w", op.Service.Key, op.Dest.Addr, explainDest(err))
	case lb.OpUpdateDest, lb.OpDrainDest:
		return fmt.Errorf("update backend %s -> %s: %w", op.Service.Key, op.Dest.Addr, explainDest(err))
	case lb.OpDeleteDest:
		return fmt.Errorf("delete backend %s -> %s: %w", op.Service.Key, op.Dest.Addr, explainDest(err))
	}
	return fmt.Errorf("%s: %w", op, err)
}

// exchange sends the requests of buf, chunk to a datagram, reads their
// acknowledgements and sets each request's result in res, which must be
// as long as reqs, and returns res. Requests must lie back to back in
// buf. A request whose acknowledgement never comes (the socket failed, or
// its receive buffer overflowed) fails with an error saying so: the
// kernel may or may not have applied it.
func exchange(t transport, buf []byte, reqs []request, chunk int, res []error) []error {
	clear(res)
	// One chunk's state, which the handler of its acknowledgements
	// shares: allocated once per call, not per datagram.
	c := &chunkAcks{res: res}
	handle := c.handle
	for lo := 0; lo < len(reqs); lo += chunk {
		hi := min(lo+chunk, len(reqs))
		for x := lo; x < hi; x++ {
			seq := t.nextSeq()
			if x == lo {
				c.first = seq
			}
			binary.NativeEndian.PutUint32(buf[reqs[x].start+8:], seq)
		}
		if err := t.send(buf[reqs[lo].start:reqs[hi-1].end]); err != nil {
			for x := lo; x < hi; x++ {
				res[x] = fmt.Errorf("send to the kernel: %w", err)
			}
			continue
		}
		c.start(lo, hi-lo)
		for c.pending > 0 {
			err := t.recv(false, handle)
			if err != nil {
				if errors.Is(err, unix.ENOBUFS) {
					err = fmt.Errorf("acknowledgement lost (netlink receive buffer overrun; the kernel may have applied it): %w", err)
				} else {
					err = fmt.Errorf("no acknowledgement from the kernel: %w", err)
				}
				for idx, ok := range c.acked {
					if !ok {
						res[lo+idx] = err
					}
				}
				break
			}
		}
	}
	return res
}

// chunkAcks matches the acknowledgements of one datagram's requests,
// numbered from first, to their results in res from lo.
type chunkAcks struct {
	res     []error
	lo      int
	first   uint32
	acked   []bool
	pending int
	buf     [maxChunk]bool
}

// start begins a chunk of n requests whose results start at res[lo].
func (c *chunkAcks) start(lo, n int) {
	c.lo, c.pending = lo, n
	if n <= len(c.buf) {
		c.acked = c.buf[:n]
		clear(c.acked)
	} else {
		c.acked = make([]bool, n)
	}
}

// handle records the result an acknowledgement of the chunk carries, and
// ignores any other message.
func (c *chunkAcks) handle(m message) error {
	idx := m.seq - c.first
	if m.typ != unix.NLMSG_ERROR || idx >= uint32(len(c.acked)) || c.acked[idx] {
		return nil // not an answer to this chunk
	}
	ok, err := ackError(m.data)
	if !ok {
		err = errors.New("short acknowledgement from the kernel")
	}
	c.res[c.lo+int(idx)] = err
	c.acked[idx] = true
	c.pending--
	return nil
}
