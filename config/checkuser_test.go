package config

import (
	"errors"
	"strings"
	"testing"
)

// TestLookupUser reads this host's /etc/passwd and /etc/group: Debian's,
// where nobody is uid 65534 in group nogroup (65534) and root is uid 0.
func TestLookupUser(t *testing.T) {
	for _, tt := range []struct {
		spec     string
		uid, gid uint32
		err      string
	}{
		{spec: "nobody", uid: 65534, gid: 65534},
		{spec: "65534", uid: 65534, gid: 65534},
		{spec: "nobody:daemon", uid: 65534, gid: 1},
		{spec: "nobody:4242", uid: 65534, gid: 4242},
		{spec: "4242:4243", uid: 4242, gid: 4243},
		{spec: "4242", err: "uid 4242 has no passwd entry: name its group too (\"4242:GROUP\")"},
		{spec: "vipd-no-such-user", err: `user "vipd-no-such-user": no such user`},
		{spec: "nobody:vipd-no-such-group", err: `group "vipd-no-such-group": no such group`},
		{spec: "root", err: "the user is root"},
		{spec: "daemon:root", err: "the group is root"},
	} {
		u, err := LookupUser(tt.spec)
		if tt.err == "" && (err != nil || u.UID != tt.uid || u.GID != tt.gid || u.Name != tt.spec) {
			t.Errorf("%q: %+v %v", tt.spec, u, err)
		}
		if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%q: %v, want an error containing %q", tt.spec, err, tt.err)
		}
		if strings.Contains(tt.err, "no such user") && !errors.Is(err, ErrUnknownUser) ||
			strings.Contains(tt.err, "no such group") && !errors.Is(err, ErrUnknownGroup) {
			t.Errorf("%q: %v does not wrap the sentinel", tt.spec, err)
		}
	}
}
