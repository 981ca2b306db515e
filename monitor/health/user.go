package health

import (
	"errors"
	"fmt"
	"os/user"
	"strconv"
	"strings"
)

// User is the unprivileged identity exec checks run as: a user and the one
// group the command gets, with no supplementary groups.
type User struct {
	// Name is the identity as configured ("vipd-check",
	// "nobody:nogroup", "65534"), for messages.
	Name string
	UID  uint32
	GID  uint32
}

func (u User) String() string {
	return fmt.Sprintf("%s (uid %d, gid %d)", u.Name, u.UID, u.GID)
}

// ParseUserSpec checks the form of an identity spec: "user" or
// "user:group", each a name or a number. It refuses root (the name, or the
// number 0) for either part, without looking anything up.
func ParseUserSpec(spec string) (usr, group string, err error) {
	usr, group, hasGroup := strings.Cut(spec, ":")
	if err := checkIDName("user", usr); err != nil {
		return "", "", err
	}
	if hasGroup {
		if err := checkIDName("group", group); err != nil {
			return "", "", err
		}
	}
	return usr, group, nil
}

func checkIDName(what, s string) error {
	if s == "" {
		return fmt.Errorf("the %s is empty", what)
	}
	if len(s) > 64 {
		return fmt.Errorf("the %s is longer than 64 characters", what)
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' ||
			i > 0 && (r == '-' || r == '.' || r == '$' && i == len(s)-1)
		if !ok {
			return fmt.Errorf("the %s %q is not a user or group name (letters, digits, _, then also - and .)", what, s)
		}
	}
	if s == "root" || isZero(s) {
		return fmt.Errorf("the %s is root: exec checks never run as root", what)
	}
	return nil
}

// isZero reports whether s is a number that is 0 ("0", "00").
func isZero(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n == 0
}

// LookupUser's errors wrap these when the user or the group does not
// exist.
var (
	ErrUnknownUser  = errors.New("no such user")
	ErrUnknownGroup = errors.New("no such group")
)

// LookupUser resolves an identity spec (see ParseUserSpec) with os/user,
// which reads /etc/passwd and /etc/group (and, when vipd is built with
// cgo, the C library's name services). A user given by name takes its
// primary group unless the spec names one; a numeric user that has no
// passwd entry needs an explicit group. Identities that resolve to uid or
// gid 0 are refused.
func LookupUser(spec string) (User, error) {
	name, group, err := ParseUserSpec(spec)
	if err != nil {
		return User{}, err
	}
	u := User{Name: spec}
	var primary string
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		u.UID = uint32(n)
		if pw, err := user.LookupId(strconv.FormatUint(n, 10)); err == nil {
			primary = pw.Gid
		}
	} else {
		pw, err := user.Lookup(name)
		if err != nil {
			return User{}, fmt.Errorf("user %q: %w", name, ErrUnknownUser)
		}
		uid, err := strconv.ParseUint(pw.Uid, 10, 32)
		if err != nil {
			return User{}, fmt.Errorf("user %q has uid %q, not a number", name, pw.Uid)
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
			return User{}, fmt.Errorf("group %q: %w", group, ErrUnknownGroup)
		}
		gid, err := strconv.ParseUint(gr.Gid, 10, 32)
		if err != nil {
			return User{}, fmt.Errorf("group %q has gid %q, not a number", group, gr.Gid)
		}
		u.GID = uint32(gid)
	case primary != "":
		gid, err := strconv.ParseUint(primary, 10, 32)
		if err != nil {
			return User{}, fmt.Errorf("user %q has gid %q, not a number", name, primary)
		}
		u.GID = uint32(gid)
	default:
		return User{}, fmt.Errorf("uid %s has no passwd entry: name its group too (\"%s:GROUP\")", name, name)
	}
	if u.UID == 0 {
		return User{}, fmt.Errorf("user %q is uid 0 (root): exec checks never run as root", name)
	}
	if u.GID == 0 {
		return User{}, fmt.Errorf("%q has gid 0 (root's group): exec checks never run with it; name another group (\"%s:GROUP\")", spec, name)
	}
	return u, nil
}
