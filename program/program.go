// Package program starts the programs the daemon runs beside itself
// (vipd-kubernetes, vipd-bgp), each with a socket to the daemon as its
// file descriptor 3, in a process group of its own, killed when the
// daemon dies.
package program

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Child is a running program.
type Child struct {
	// Conn is the daemon's end of the program's socket.
	Conn net.Conn
	// Cmd is the program's command, started.
	Cmd *exec.Cmd

	exited chan struct{}
	err    error
}

// Options say how to start a program.
type Options struct {
	// Program is the program's path; Args its arguments.
	Program string
	Args    []string
	// Env is added to the daemon's environment (Environ).
	Env []string
	// Output receives the program's standard output and error; the
	// caller may close its copy once Start returns.
	Output *os.File
}

// Start starts a program with a socket to it as its file descriptor 3.
func Start(opts Options) (*Child, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	parentEnd, childEnd := os.NewFile(uintptr(fds[0]), "daemon"), os.NewFile(uintptr(fds[1]), "program")
	defer childEnd.Close()
	conn, err := net.FileConn(parentEnd)
	parentEnd.Close()
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	cmd := exec.Command(opts.Program, opts.Args...)
	cmd.Env = append(Environ(), opts.Env...)
	cmd.Stdout, cmd.Stderr = opts.Output, opts.Output
	cmd.ExtraFiles = []*os.File{childEnd}
	// The program dies with the thread that started it, which stays
	// alive until the program exits; its own process group keeps a
	// terminal's Ctrl-C for the daemon, which stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	c := &Child{Conn: conn, Cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine, after
		// the program.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		conn.Close()
		return nil, fmt.Errorf("start: %w", err)
	}
	return c, nil
}

// Exited is closed when the program has exited.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Err is the program's exit status, once Exited is closed: nil for a
// clean exit.
func (c *Child) Err() error { return c.err }

// Environ returns the daemon's environment but systemd's notification
// and watchdog variables, which are the daemon's alone.
func Environ() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "NOTIFY_SOCKET" || name == "WATCHDOG_USEC" || name == "WATCHDOG_PID"
	})
}

// connFD is the file descriptor of a program's socket to the daemon.
const connFD = 3

// Socket returns a program's socket to the daemon, which Start passes
// as its file descriptor 3; name says which program, for the error of
// one started by hand.
func Socket(name string) (*os.File, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(connFD, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return nil, fmt.Errorf("file descriptor %d is not a socket: %s is started by vipd run", connFD, name)
	}
	return os.NewFile(connFD, "vipd"), nil
}
