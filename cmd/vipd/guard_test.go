package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/control"

	"github.com/vipd/vipd/lb/lbtest"
)

// svcText is the text of n services named prefix-0…, on VIP vip, ports
// from 80, two backends each.
func svcText(prefix, vip string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "[[service]]\nname = \"%s-%d\"\nvip = \"%s\"\nport = %d\nbackend = [{ address = \"10.1.%d.1\" }, { address = \"10.1.%d.2\" }]\n\n",
			prefix, i, vip, 80+i, i, i)
	}
	return b.String()
}

// TestDaemonGuardIncluded: the reload guard holds for each included file
// as for the main file. A truncated included file that holds a third of
// the services is refused, naming the file; editing a file, renaming a
// service and deleting a file still apply; --force overrides.
func TestDaemonGuardIncluded(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, lbtest.New())
	a := filepath.Join(dir, "services.d", "a.toml")
	b := filepath.Join(dir, "services.d", "b.toml")
	c := filepath.Join(dir, "services.d", "c.toml")
	writeAt(t, a, svcText("a", "192.0.2.10", 3))
	writeAt(t, b, svcText("b", "192.0.2.11", 3))
	writeAt(t, c, svcText("c", "192.0.2.12", 3))
	h.write("include = [\"services.d/*.toml\"]\n" + h.header(""))
	h.run()
	h.eventually("initial programming", func() bool { return strings.Contains(h.k.Dump(), "192.0.2.12:82") })
	good := h.k.Dump()

	// b.toml truncated to nothing: a third of the services, under the
	// guard's half of the whole, but all of the file's.
	writeAt(t, b, "")
	h.eventually("the guard", h.logHas("services.d/b.toml: the change removes 3 of 3 services and 6 of 6 backends of that file"))
	// Truncated after its first service.
	writeAt(t, b, svcText("b", "192.0.2.11", 1))
	h.eventually("the guard again", func() bool {
		return strings.Count(h.log.String(), "services.d/b.toml: the change removes 2 of 3 services") == 1
	})
	if got := h.k.Dump(); got != good {
		t.Fatalf("a truncated included file changed the kernel:\n%s\nwant\n%s", got, good)
	}
	// Forced, the truncated file applies.
	rep, err := control.Call(h.socket, "POST", "/v1/reload?force=1")
	if err != nil || rep.Error != "" {
		t.Fatalf("forced reload: %+v %v", rep, err)
	}
	h.eventually("the forced removal", func() bool { return !strings.Contains(h.k.Dump(), "192.0.2.11:82") })

	// An edit that removes one of a file's three services applies; so
	// does renaming a service (its address stays).
	writeAt(t, a, svcText("a", "192.0.2.10", 2))
	h.eventually("the edit", func() bool { return !strings.Contains(h.k.Dump(), "192.0.2.10:82") })
	writeAt(t, a, strings.ReplaceAll(svcText("a", "192.0.2.10", 2), `"a-`, `"renamed-`))
	h.eventually("the rename", func() bool { return strings.Count(h.log.String(), "file="+a+" ") == 2 })

	// Deleting a file removes all its services on purpose.
	if err := os.Remove(c); err != nil {
		t.Fatal(err)
	}
	h.eventually("the deletion", func() bool { return !strings.Contains(h.k.Dump(), "192.0.2.12:") })
	if n := strings.Count(h.log.String(), "reload_guard"); n != 2 {
		t.Errorf("the guard refused %d reloads, want 2:\n%s", n, h.log)
	}
}
