package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vipd/vipd/monitor/check"
)

// The tests of this file look users up in this host's /etc/passwd, which
// has nobody (uid 65534, group nogroup 65534) and no vipd-check, the
// default check_user (the package creates it).

const execSvc = "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 80\nbackend = [{ address = \"10.0.0.1\" }]\n"

func TestExecCheckErrors(t *testing.T) {
	const nobody = "[daemon]\ncheck_user = \"nobody\"\n"
	for _, tt := range []struct{ name, in, want string }{
		{"relative command", nobody + execSvc + "[service.check]\ntype = \"exec\"\ncommand = \"check\"\n",
			`t.toml:10: service "s": check: exec command "check" is not an absolute path: commands are not looked up in PATH (write the full path, say /usr/bin/check)`},
		{"PATH", nobody + execSvc + "[service.check]\ntype = \"exec\"\ncommand = \"/bin/true\"\nenv = [\"PATH=/tmp\"]\n",
			`t.toml:11: service "s": check: exec env may not set PATH: vipd sets it (PATH=/usr/sbin:/usr/bin:/sbin:/bin); call programs by their full path instead`},
		{"VIPD_", nobody + execSvc + "[service.check]\ntype = \"exec\"\ncommand = \"/bin/true\"\nenv = [\"A=1\",\n  \"VIPD_BACKEND_PORT=1\"]\n",
			`t.toml:11: service "s": check: exec env may not set VIPD_BACKEND_PORT: VIPD_ variables are vipd's (VIPD_BACKEND_ADDR, VIPD_BACKEND_PORT)`},
		{"LD_PRELOAD inline", nobody + execSvc + "check = { type = \"exec\", command = \"/bin/sh\", env = [\"LD_PRELOAD=/tmp/x.so\", \"PATH=/tmp\"] }\n",
			`t.toml:8: service "s": check: exec env may not set LD_PRELOAD: loader variables (LD_*) make every program of the check load code the command does not name
t.toml:8: service "s": check: exec env may not set PATH: vipd sets it (PATH=/usr/sbin:/usr/bin:/sbin:/bin); call programs by their full path instead`},
		{"BASH_ENV in a backend's check", nobody + "[[service]]\nname = \"s\"\nvip = \"192.0.2.10\"\nport = 80\n[[service.backend]]\naddress = \"10.0.0.1\"\n[service.backend.check]\ntype = \"exec\"\ncommand = \"/bin/true\"\nenv = [\"BASH_ENV=/tmp/x\"]\n",
			`t.toml:12: service "s": backend "10.0.0.1:80": check: exec env may not set BASH_ENV: it makes a shell or the C library run or parse code the command does not name`},
		{"env twice", nobody + execSvc + "check = { type = \"exec\", command = \"/bin/true\", env = [\"A=1\", \"A=2\"] }\n",
			`t.toml:8: service "s": check: exec env sets A twice`},
		{"root", "[daemon]\ncheck_user = \"root\"\n" + execSvc,
			`t.toml:2: daemon: check_user "root": the user is root: exec checks never run as root`},
		{"uid 0", "[daemon]\ninterface = \"vipd0\"\ncheck_user = \"0:65534\"\n" + execSvc,
			`t.toml:3: daemon: check_user "0:65534": the user is root: exec checks never run as root`},
		{"root's group", "[daemon]\ncheck_user = \"nobody:root\"\n" + execSvc,
			`t.toml:2: daemon: check_user "nobody:root": the group is root: exec checks never run as root`},
		{"unknown user", "[daemon]\ncheck_user = \"vipd-nobody\"\n" + execSvc + "check = { type = \"exec\", command = \"/bin/true\" }\n",
			`t.toml:2: daemon: check_user "vipd-nobody": user "vipd-nobody": no such user; create it (useradd --system --user-group --no-create-home --shell /usr/sbin/nologin vipd-nobody), or set check_user to an existing unprivileged user`},
		{"unknown group", "[daemon]\ncheck_user = \"nobody:vipd-nogroup\"\n" + execSvc + "check = { type = \"exec\", command = \"/bin/true\" }\n",
			`t.toml:2: daemon: check_user "nobody:vipd-nogroup": group "vipd-nogroup": no such group; create it (groupadd --system vipd-nogroup), or set check_user to an existing unprivileged user`},
		{"default user missing", execSvc + "[service.check]\ntype = \"tcp\"\n[[service]]\nname = \"e\"\nvip = \"192.0.2.11\"\nport = 80\nbackend = [{ address = \"10.0.0.2\" }, { address = \"10.0.0.3\", check = { type = \"exec\", command = \"/bin/true\" } }]\n",
			`t.toml:12: service "e": check: exec checks run as check_user "vipd-check" (the default): user "vipd-check": no such user; create it (useradd --system --user-group --no-create-home --shell /usr/sbin/nologin vipd-check), or set check_user in [daemon] of t.toml to an existing unprivileged user`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tt.in))
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
		})
	}
}

// TestCheckUserOnlyForExecChecks: check_user is looked up only when some
// exec check runs as it.
func TestCheckUserOnlyForExecChecks(t *testing.T) {
	for _, in := range []string{
		execSvc,
		"[daemon]\ncheck_user = \"vipd-nobody\"\n" + execSvc + "check = { type = \"tcp\" }\n",
	} {
		if _, err := Parse("t.toml", []byte(in)); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func TestExecTargetsRunAsCheckUser(t *testing.T) {
	in := "[daemon]\ncheck_user = \"nobody\"\n" + execSvc +
		"check = { type = \"exec\", command = \"/usr/lib/check\", args = [\"-q\"], env = [\"HOME=/var/lib/check\"] }\n"
	cfg, err := Parse("t.toml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Daemon.CheckUser != "nobody" {
		t.Errorf("check_user = %q", cfg.Daemon.CheckUser)
	}
	targets := cfg.Targets()
	if len(targets) != 1 {
		t.Fatalf("targets = %+v", targets)
	}
	e := targets[0].Spec.Exec
	if e.User == nil || *e.User != (check.User{Name: "nobody", UID: 65534, GID: 65534}) || e.Command != "/usr/lib/check" {
		t.Errorf("exec options = %+v, user %+v", e, e.User)
	}
	if u, ok := cfg.ExecUser(); !ok || u.UID != 65534 {
		t.Errorf("ExecUser = %+v, %v", u, ok)
	}
	// The check's own Spec is left as validated: the user is the
	// daemon's setting, given to the targets.
	if cfg.Health["s"].Checks[targets[0].Backend].Exec.User != nil {
		t.Error("the service's check holds the user")
	}
	if cfg, err := Parse("t.toml", []byte(execSvc)); err != nil {
		t.Fatal(err)
	} else if _, ok := cfg.ExecUser(); ok || cfg.Daemon.CheckUser != DefaultCheckUser {
		t.Errorf("without exec checks: ExecUser %v, check_user %q", ok, cfg.Daemon.CheckUser)
	}
}

// TestCheckUserIncremental edits a configuration of included files as the
// daemon does, file by file: the first exec check that an edit adds makes
// an unknown check_user an error on that check's line, and the user
// follows edits of check_user.
func TestCheckUserIncremental(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "vipd.toml")
	inc := filepath.Join(dir, "services.d", "a.toml")
	if err := os.MkdirAll(filepath.Dir(inc), 0o755); err != nil {
		t.Fatal(err)
	}
	mainText := "include = [\"services.d/*.toml\"]\n[daemon]\nwatch = false\ncheck_user = \"vipd-nobody\"\n" + execSvc
	write := func(p, text string) []byte {
		t.Helper()
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return []byte(text)
	}
	write(inc, "[[service]]\nname = \"a\"\nvip = \"192.0.2.20\"\nport = 80\nbackend = [{ address = \"10.0.0.20\" }]\n")
	base, err := Parse(main, write(main, mainText))
	if err != nil {
		t.Fatal(err)
	}
	// An exec check in the included file: check_user must exist.
	withExec := "[[service]]\nname = \"a\"\nvip = \"192.0.2.20\"\nport = 80\nbackend = [{ address = \"10.0.0.20\" }]\n" +
		"[[service]]\nname = \"b\"\nvip = \"192.0.2.21\"\nport = 80\nbackend = [{ address = \"10.0.0.21\", check = { type = \"exec\", command = \"/bin/true\" } }]\n"
	_, _, err = ParseFrom(base, inc, []byte(withExec))
	if want := main + `:4: daemon: check_user "vipd-nobody": user "vipd-nobody": no such user`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
	// With an existing user, the edit passes and its target has the user.
	base, _, err = ParseFrom(base, main, write(main, strings.Replace(mainText, "vipd-nobody", "nobody", 1)))
	if err != nil {
		t.Fatal(err)
	}
	cfg, d, err := ParseFrom(base, inc, []byte(withExec))
	if err != nil {
		t.Fatal(err)
	}
	if d.Full {
		t.Errorf("adding a service to an included file is a full change: %+v", d)
	}
	if u, ok := cfg.ExecUser(); !ok || u.UID != 65534 {
		t.Errorf("ExecUser = %+v, %v", u, ok)
	}
	// An edit of another service keeps the count: the user stays.
	main2 := strings.Replace(mainText, "vipd-nobody", "nobody", 1) + "scheduler = \"rr\"\n"
	cfg2, d, err := ParseFrom(cfg, main, []byte(main2))
	if err != nil {
		t.Fatal(err)
	}
	if d.Full || cfg2.execN != 1 {
		t.Errorf("delta %+v, %d services with exec checks", d, cfg2.execN)
	}
	// Removing the file removes the last exec check: an unknown
	// check_user is no error then.
	cfg3, _, err := ParseRemoved(cfg2, inc)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg3.ExecUser(); ok || cfg3.execN != 0 {
		t.Errorf("after removing the exec check: ExecUser %v, %d", ok, cfg3.execN)
	}
	if _, _, err := ParseFrom(cfg3, main, []byte(mainText)); err != nil {
		t.Errorf("an unknown check_user without exec checks: %v", err)
	}
	// The default check_user, vipd-check, is missing here: the error is
	// on the line of the first exec check, in the included file.
	base, err = Parse(main, write(main, strings.Replace(mainText, "check_user = \"vipd-nobody\"\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ParseFrom(base, inc, []byte(withExec))
	if want := inc + `:10: service "b": check: exec checks run as check_user "vipd-check" (the default)`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v\nwant %s", err, want)
	}
}
