//go:build !linux

package health

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

func dialControl(_ DialOptions, _, _ string, _ syscall.RawConn) error {
	return errors.New("socket marks and devices need Linux")
}

// runAs runs a command to its end as an exec check's user.
type runAs func(cmd *exec.Cmd) error

// newRunAs returns what runs commands as u, which must be the user vipd
// runs as: switching users is Linux only.
func newRunAs(u User) (runAs, error) {
	if err := CanRunAs(u); err != nil {
		return nil, err
	}
	return (*exec.Cmd).Run, nil
}

// CanRunAs reports whether vipd can run exec checks as u: outside Linux,
// only if it runs as u.
func CanRunAs(u User) error {
	if uint32(os.Geteuid()) != u.UID || uint32(os.Getegid()) != u.GID {
		return fmt.Errorf("vipd runs as uid %d, gid %d and cannot run exec checks as %s outside Linux: set check_user to the user vipd runs as", os.Geteuid(), os.Getegid(), u)
	}
	return nil
}
