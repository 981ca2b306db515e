package check

import (
	"strings"
	"testing"
)

func TestParseUserSpec(t *testing.T) {
	for _, tt := range []struct{ spec, user, group, err string }{
		{"vipd-check", "vipd-check", "", ""},
		{"nobody:nogroup", "nobody", "nogroup", ""},
		{"65534:65534", "65534", "65534", ""},
		{"svc$", "svc$", "", ""},
		{"", "", "", "the user is empty"},
		{"nobody:", "", "", "the group is empty"},
		{"root", "", "", "the user is root: exec checks never run as root"},
		{"0", "", "", "the user is root"},
		{"000", "", "", "the user is root"},
		{"nobody:root", "", "", "the group is root"},
		{"nobody:0", "", "", "the group is root"},
		{"-x", "", "", "is not a user or group name"},
		{"a b", "", "", "is not a user or group name"},
		{"a:b:c", "", "", "is not a user or group name"},
	} {
		u, g, err := ParseUserSpec(tt.spec)
		if tt.err == "" && (err != nil || u != tt.user || g != tt.group) {
			t.Errorf("%q: %q %q %v", tt.spec, u, g, err)
		}
		if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("%q: %v, want an error containing %q", tt.spec, err, tt.err)
		}
	}
}
