package config

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"

	"github.com/vipd/vipd/monitor/check"
)

// LookupUser's errors wrap these when the user or the group does not
// exist.
var (
	ErrUnknownUser  = errors.New("no such user")
	ErrUnknownGroup = errors.New("no such group")
)

// LookupUser resolves an identity spec (see check.ParseUserSpec) with os/user,
// which reads /etc/passwd and /etc/group (and, when vipd is built with
// cgo, the C library's name services). A user given by name takes its
// primary group unless the spec names one; a numeric user that has no
// passwd entry needs an explicit group. Identities that resolve to uid or
// gid 0 are refused.
func LookupUser(spec string) (check.User, error) {
	name, group, err := check.ParseUserSpec(spec)
	if err != nil {
		return check.User{}, err
	}
	u := check.User{Name: spec}
	var primary string
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		u.UID = uint32(n)
		if pw, err := user.LookupId(strconv.FormatUint(n, 10)); err == nil {
			primary = pw.Gid
		}
	} else {
		pw, err := user.Lookup(name)
		if err != nil {
			return check.User{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
		}
		uid, err := strconv.ParseUint(pw.Uid, 10, 32)
		if err != nil {
			return check.User{}, fmt.Errorf("user %q has uid %q, not a number", name, pw.Uid)
		}
		u.UID, primary = uint32(uid), pw.Gid
	}
	switch {
	case group != "":
		if n, err := strconv.ParseUint(group, 10, 32); err == nil {
			u.GID = uint32(n)
			break
		}
		gr, err := user.LookupGroup(group)
		if err != nil {
			return check.User{}, fmt.Errorf("group %q: %w", group, ErrUnknownGroup)
		}
		gid, err := strconv.ParseUint(gr.Gid, 10, 32)
		if err != nil {
			return check.User{}, fmt.Errorf("group %q has gid %q, not a number", group, gr.Gid)
		}
		u.GID = uint32(gid)
	case primary != "":
		gid, err := strconv.ParseUint(primary, 10, 32)
		if err != nil {
			return check.User{}, fmt.Errorf("user %q has gid %q, not a number", name, primary)
		}
		u.GID = uint32(gid)
	default:
		return check.User{}, fmt.Errorf("uid %s has no passwd entry: name its group too (\"%s:GROUP\")", name, name)
	}
	if u.UID == 0 {
		return check.User{}, fmt.Errorf("user %q is uid 0 (root): exec checks never run as root", name)
	}
	if u.GID == 0 {
		return check.User{}, fmt.Errorf("%q has gid 0 (root's group): exec checks never run with it; name another group (\"%s:GROUP\")", spec, name)
	}
	return u, nil
}
