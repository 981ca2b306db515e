package healthbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Listeners answer the workload's checks: TCP backends accept a
// connection and hold it until the checker closes it, HTTP ones answer any request with 200 and
// close. Close and Open take one backend's listener away and bring it
// back, as the detection measurement kills a backend. Its methods are
// safe for concurrent use.
type Listeners struct {
	mu   sync.Mutex
	lns  map[netip.AddrPort]net.Listener
	kind map[netip.AddrPort]Kind
}

// Listen opens a listener for each of backends. The addresses must be
// local (see BackendPrefix).
func Listen(backends []Backend) (*Listeners, error) {
	l := &Listeners{lns: map[netip.AddrPort]net.Listener{}, kind: map[netip.AddrPort]Kind{}}
	for _, b := range backends {
		l.kind[b.Addr] = b.Kind
		if err := l.Open(b.Addr); err != nil {
			l.CloseAll()
			return nil, err
		}
	}
	return l, nil
}

// Open (re)opens the listener of addr.
func (l *Listeners) Open(addr netip.AddrPort) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	kind, ok := l.kind[addr]
	if !ok {
		return fmt.Errorf("%s is no backend", addr)
	}
	if _, ok := l.lns[addr]; ok {
		return nil
	}
	lc := net.ListenConfig{Control: reuseAddr}
	// Plain TCP, as a backend's server: Go listens with MPTCP where the
	// kernel has it, whose handshake costs the kernel more, on a loopback
	// in the checker's process.
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", addr.String())
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	l.lns[addr] = ln
	go serve(ln, kind)
	return nil
}

// Close closes the listener of addr: connections to it are refused.
func (l *Listeners) Close(addr netip.AddrPort) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	ln, ok := l.lns[addr]
	if !ok {
		return fmt.Errorf("%s is not listening", addr)
	}
	delete(l.lns, addr)
	return ln.Close()
}

// CloseAll closes every listener.
func (l *Listeners) CloseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, ln := range l.lns {
		ln.Close()
		delete(l.lns, a)
	}
}

// reuseAddr lets a listener closed and opened again bind at once.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// httpResponse is every HTTP check's answer.
const httpResponse = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"

// serve accepts connections on ln until it is closed.
func serve(ln net.Listener, kind Kind) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			if strings.Contains(err.Error(), "too many open files") {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		if kind == TCP {
			go hold(c)
			continue
		}
		go answer(c)
	}
}

// hold keeps c open until the checker closes it, as a server that
// waits for a request does: a server that closed at once could reset
// the connection before the checker saw it established, failing the
// check.
func hold(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, c)
}

// answer reads an HTTP request's head from c, answers 200 and closes c.
func answer(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" || line == "\n" {
			break
		}
	}
	_, _ = io.WriteString(c, httpResponse)
}

// Command protocol of the listener process (see ServeCommands): one
// command a line on its input, one answer a line on its output.
//
//	close ADDR   → "closed ADDR UNIXNANO" (when the listener was closed)
//	open ADDR    → "opened ADDR"
//
// An error answers "error TEXT".

// ServeCommands runs the command protocol over in and out until in ends.
func (l *Listeners) ServeCommands(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, arg, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		addr, err := netip.ParseAddrPort(arg)
		var reply string
		switch {
		case err != nil:
			reply = "error " + err.Error()
		case verb == "close":
			if err = l.Close(addr); err == nil {
				reply = fmt.Sprintf("closed %s %d", addr, time.Now().UnixNano())
			}
		case verb == "open":
			if err = l.Open(addr); err == nil {
				reply = "opened " + addr.String()
			}
		default:
			err = fmt.Errorf("unknown command %q", verb)
		}
		if err != nil {
			reply = "error " + err.Error()
		}
		if _, err := fmt.Fprintln(out, reply); err != nil {
			return err
		}
	}
	return sc.Err()
}
