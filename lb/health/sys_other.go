//go:build !linux

package health

import (
	"errors"
	"os/exec"
	"syscall"
)

const socketOptionsSupported = false

func (o DialOptions) control(_, _ string, _ syscall.RawConn) error {
	return errors.New("socket marks and devices need Linux")
}

// killGroup leaves exec.Cmd's default of killing only the process.
func killGroup(*exec.Cmd) {}
