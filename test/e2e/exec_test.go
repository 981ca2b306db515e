//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// execCheckScript records what an exec check's command sees in
// $OUTDIR/<backend address>, with bash builtins alone (the guest has no id
// in the check's PATH): the Uid, Gid, Groups, Cap* and NoNewPrivs lines of
// its /proc status, its working directory, and its exported variables.
// "end" is the last line, so a reader can tell a file written whole.
const execCheckScript = `#!/bin/bash
f=$OUTDIR/$VIPD_BACKEND_ADDR
{
	while IFS= read -r l; do
		case $l in Uid:*|Gid:*|Groups:*|Cap*|NoNewPrivs:*) echo "$l";; esac
	done </proc/$$/status
	echo "cwd: $(pwd)"
	for n in $(compgen -e); do echo "env $n=${!n}"; done
	echo end
} >"$f"
`

// TestVipdExecCheckUser: vipd runs exec checks as check_user (the default,
// vipd-check, which the guest's /etc/passwd has, as the package creates
// it), with no capabilities, no_new_privs and the fixed environment plus
// the configured variables; a check_user that does not exist is refused
// at reload with the file and line; and a vipd that cannot switch users
// refuses to start.
func TestVipdExecCheckUser(t *testing.T) {
	tp := NewTopo(t, "nat 2")
	d := newDaemon(t)
	cu, err := user.Lookup("vipd-check")
	if err != nil {
		t.Fatalf("the guest has no vipd-check user (test/vm/initramfs.sh): %v", err)
	}
	// The script is root's; its output directory the check user's.
	dir := filepath.Join(d.dir, "exec")
	out := filepath.Join(dir, "out")
	for _, p := range []string{d.dir, dir, out} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var uid, gid int
	fmt.Sscan(cu.Uid, &uid)
	fmt.Sscan(cu.Gid, &gid)
	if err := os.Chown(out, uid, gid); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "check.sh")
	if err := os.WriteFile(script, []byte(execCheckScript), 0o755); err != nil {
		t.Fatal(err)
	}
	check := fmt.Sprintf("[service.check]\ntype = \"exec\"\ncommand = %q\nenv = [\"OUTDIR=%s\", \"EXTRA=yes\"]\ninterval = \"1s\"\ntimeout = \"10s\"\n", script, out)
	cfg := d.header(tp.LBIf, "") + service("web", tp.VIP, 80, check, tp.BackendIPs...)
	d.write(cfg)
	d.start()
	be := tp.BackendIPs[0]
	Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool { return weightOf(t, be) == 1 }, "the exec check never passed")
	var saw string
	Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		b, err := os.ReadFile(filepath.Join(out, be))
		saw = string(b)
		return err == nil && strings.HasSuffix(saw, "end\n")
	}, "the check's command wrote nothing to %s", out)
	t.Logf("the check's command saw:\n%s", saw)
	got := map[string]string{}
	env := map[string]string{}
	for _, l := range strings.Split(saw, "\n") {
		if kv, ok := strings.CutPrefix(l, "env "); ok {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
			continue
		}
		k, v, _ := strings.Cut(l, ":")
		got[k] = strings.Join(strings.Fields(v), " ")
	}
	zero := "0000000000000000"
	for k, want := range map[string]string{
		"Uid": strings.Repeat(cu.Uid+" ", 3) + cu.Uid, "Gid": strings.Repeat(cu.Gid+" ", 3) + cu.Gid, "Groups": cu.Gid,
		"CapInh": zero, "CapPrm": zero, "CapEff": zero, "CapAmb": zero, "NoNewPrivs": "1", "cwd": "/",
	} {
		if got[k] != want {
			t.Errorf("%s: %q, want %q", k, got[k], want)
		}
	}
	for k, want := range map[string]string{
		"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "LANG": "C",
		"VIPD_BACKEND_ADDR": be, "VIPD_BACKEND_PORT": "80", "OUTDIR": out, "EXTRA": "yes",
	} {
		if env[k] != want {
			t.Errorf("environment: %s=%q, want %q", k, env[k], want)
		}
	}
	// vipd's own environment (the guest sets VIPD_VM=1 for every
	// process, vipd included) does not reach the check: what is there is
	// the above and what bash itself exports.
	for k := range env {
		switch k {
		case "PATH", "HOME", "LANG", "VIPD_BACKEND_ADDR", "VIPD_BACKEND_PORT", "OUTDIR", "EXTRA", "PWD", "OLDPWD", "SHLVL", "_":
		default:
			t.Errorf("environment has %s=%s", k, env[k])
		}
	}

	// A check_user that does not exist: the reload is refused, naming
	// the line, and the checks go on as they were.
	d.write(strings.Replace(cfg, "[daemon]\n", "[daemon]\ncheck_user = \"vipd-nobody\"\n", 1))
	r := d.reload(false)
	if r.Err == nil || !strings.Contains(r.Stdout+r.Stderr, d.path+`:2: daemon: check_user "vipd-nobody": user "vipd-nobody": no such user; create it (useradd --system --user-group --no-create-home --shell /usr/sbin/nologin vipd-nobody)`) {
		t.Errorf("reload with an unknown check_user: %s", r)
	}
	if weightOf(t, be) != 1 {
		t.Errorf("the backend left after a refused reload")
	}
	d.write(cfg)
	d.stop()

	// vipd running as another user than check_user, without the
	// capabilities to switch, refuses to start rather than run the
	// checks as itself. (nobody cannot reach /payload: it runs a copy.)
	if err := os.Chmod(d.path, 0o644); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(vipdBin())
	if err != nil {
		t.Fatal(err)
	}
	vipd := filepath.Join(dir, "vipd")
	if err := os.WriteFile(vipd, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(vipd, "run", "-c", d.path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534}}}
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "exec checks: vipd runs as uid 65534, gid 65534 without CAP_SETUID, CAP_SETGID, CAP_KILL, so it cannot run exec checks as vipd-check (uid "+cu.Uid) {
		t.Errorf("vipd as nobody: %v\n%s", err, b)
	}
}
