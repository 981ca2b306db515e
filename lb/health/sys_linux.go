package health

import (
	"fmt"
	"os/exec"
	"syscall"
)

const socketOptionsSupported = true

// control sets the socket options of o on a probe's socket before it
// connects.
func (o DialOptions) control(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if o.Mark != 0 {
			if err := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(o.Mark)); err != nil {
				serr = fmt.Errorf("set mark %#x: %w", o.Mark, err)
				return
			}
		}
		if o.Device != "" {
			if err := syscall.BindToDevice(int(fd), o.Device); err != nil {
				serr = fmt.Errorf("bind to device %s: %w", o.Device, err)
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// killGroup makes cmd run in its own process group and kills the whole
// group when its context ends, so a shell's children die with it.
func killGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
