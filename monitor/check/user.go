package check

import (
	"fmt"
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
