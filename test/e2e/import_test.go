//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The import's equivalence on the real kernel: keepalived (or ipvsadm -R)
// programs a table, "vipd import" turns the same configuration into
// vipd's, and vipd programs it from a cleared kernel: the two tables are
// equal, or differ exactly where the import reported an issue. "vipd
// plan" of the import against the table keepalived left plans no IPVS
// operation.

// ipvsOps matches the plan's IPVS operations.
var ipvsOps = regexp.MustCompile(`(?m)^(add|update|delete|drain) (service|backend) .*$`)

// table returns the kernel's IPVS table as ipvsadm -Sn saves it, sorted.
func table(t *testing.T) []string {
	t.Helper()
	var out []string
	for l := range strings.SplitSeq(Run(t, "ipvsadm", "-Sn"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	slices.Sort(out)
	return out
}

// importDaemon is the [daemon] table the imported configurations run with.
func importDaemon(dir string) string {
	return fmt.Sprintf("[daemon]\nstate_dir = %q\ncontrol_socket = %q\nmetrics_listen = \"\"\non_stop = \"clean\"\nresync_interval = \"2s\"\n",
		filepath.Join(dir, "state"), filepath.Join(dir, "vipd.sock"))
}

// vipdImport runs vipd import with args and returns the configuration and
// the issues.
func vipdImport(t *testing.T, args ...string) (string, string) {
	t.Helper()
	r := Exec(vipdBin(), append([]string{"import"}, append(args, "--allow-partial")...)...)
	if r.Err != nil {
		t.Fatalf("%s: %v\n%s", r.Cmd, r.Err, r.Stderr)
	}
	return r.Stdout, r.Stderr
}

// planIPVS returns the IPVS operations vipd plan finds for cfg against
// the live kernel.
func planIPVS(t *testing.T, cfg string) []string {
	t.Helper()
	r := Exec(vipdBin(), "plan", cfg)
	if r.Err != nil || strings.Contains(r.Stderr, "planning from an empty kernel") {
		t.Fatalf("vipd plan could not plan against the kernel: %v\n%s", r.Err, r.Stderr)
	}
	return ipvsOps.FindAllString(r.Stdout, -1)
}

// runVipd programs cfg with vipd from a cleared kernel and returns the
// table it leaves.
func runVipd(t *testing.T, cfg string) []string {
	t.Helper()
	Run(t, "ipvsadm", "-C")
	d := newDaemon(t)
	d.write(cfg)
	d.start()
	got := table(t)
	d.stop()
	Run(t, "ipvsadm", "-C")
	return got
}

// diff returns the lines of a not in b.
func diff(a, b []string) []string {
	var out []string
	for _, l := range a {
		if !slices.Contains(b, l) {
			out = append(out, l)
		}
	}
	return out
}

// stripChecks removes the blocks of keys from a keepalived configuration:
// checkers (so that every real server is up without live backends) and
// what the check-only keepalived does not run.
func stripChecks(conf string, keys ...string) string {
	var out []string
	depth := 0
	for l := range strings.SplitSeq(conf, "\n") {
		f := strings.Fields(l)
		if depth == 0 && len(f) > 0 && slices.Contains(keys, f[0]) && strings.Contains(l, "{") {
			depth = 1
			continue
		}
		if depth > 0 {
			code, _, _ := strings.Cut(l, "#")
			code, _, _ = strings.Cut(code, "!")
			depth += strings.Count(code, "{") - strings.Count(code, "}")
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// keepalivedTable runs keepalived's checker alone on conf with
// --dont-release-ipvs, waits for its table to settle and stops it with
// SIGTERM, which then leaves the table: the switch-over of docs/migrating.md.
func keepalivedTable(t *testing.T, bin, conf, dir string) []string {
	t.Helper()
	Run(t, "ipvsadm", "-C")
	cmd := exec.Command(bin, "--dont-fork", "--log-console", "--log-detail", "--check", "--dont-release-ipvs", "--use-file", conf,
		"--pid", filepath.Join(dir, "k.pid"), "--checkers_pid", filepath.Join(dir, "c.pid"), "--vrrp_pid", filepath.Join(dir, "v.pid"))
	var log lockedBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	kill := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	var last []string
	stable := 0
	deadline := time.Now().Add(60 * time.Second)
	for stable < 4 {
		select {
		case <-done:
			t.Fatalf("keepalived exited:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			kill()
			t.Fatalf("keepalived's table did not settle:\n%s\n%s", strings.Join(last, "\n"), log.String())
		}
		time.Sleep(250 * time.Millisecond)
		cur := table(t)
		if len(cur) > 0 && slices.Equal(cur, last) {
			stable++
		} else {
			stable = 0
		}
		last = cur
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		kill()
		t.Fatalf("keepalived did not stop on SIGTERM:\n%s", log.String())
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // a straggling child
	if got := table(t); !slices.Equal(got, last) {
		t.Fatalf("keepalived --dont-release-ipvs changed the table when it stopped:\n%s\n%s", strings.Join(got, "\n"), log.String())
	}
	return last
}

// TestImportKeepalivedSamples: every sample of Debian's keepalived with
// virtual servers, checkers removed, programs the same table through
// keepalived and through vipd's import, but where the import said so.
func TestImportKeepalivedSamples(t *testing.T) {
	bin, err := exec.LookPath("keepalived")
	if err != nil {
		t.Fatal("no keepalived in the guest image: install keepalived on the host (test/deps.sh) and run test/vm/prepare.sh")
	}
	files, _ := filepath.Glob(filepath.Join(Payload(), "keepalived-samples", "keepalived.conf.*"))
	if len(files) == 0 {
		t.Fatal("no keepalived samples in the payload (test/deps.sh installs them, test/vm/e2e.sh copies them)")
	}
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "\nvirtual_server ") {
			continue
		}
		n++
		t.Run(strings.TrimPrefix(filepath.Base(f), "keepalived.conf."), func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "keepalived.conf")
			stripped := stripChecks(string(data), "TCP_CHECK", "HTTP_GET", "SSL_GET", "MISC_CHECK", "UDP_CHECK", "DNS_CHECK",
				"PING_CHECK", "SMTP_CHECK", "vrrp_instance", "vrrp_sync_group", "vrrp_script", "global_defs", "static_routes")
			if err := os.WriteFile(conf, []byte(stripped), 0o644); err != nil {
				t.Fatal(err)
			}
			want := keepalivedTable(t, bin, conf, dir)

			toml, issues := vipdImport(t, "keepalived", conf)
			cfg := filepath.Join(dir, "vipd.toml")
			if err := os.WriteFile(cfg, []byte(importDaemon(dir)+toml), 0o644); err != nil {
				t.Fatal(err)
			}
			if ops := planIPVS(t, cfg); len(ops) > 0 {
				// Only what the import reported may differ.
				for _, op := range ops {
					if !explained(op, issues) {
						t.Errorf("vipd plan against keepalived's table: unexplained operation %q; issues:\n%s", op, issues)
					}
				}
			}
			got := runVipd(t, importDaemon(dir)+toml)
			missing, extra := diff(want, got), diff(got, want)
			for _, l := range append(missing, extra...) {
				if !explained(l, issues) {
					t.Errorf("table line %q differs (keepalived %d lines, vipd %d) and no issue explains it:\nkeepalived:\n%s\nvipd:\n%s\nissues:\n%s",
						l, len(want), len(got), strings.Join(want, "\n"), strings.Join(got, "\n"), issues)
				}
			}
			t.Logf("%d lines from keepalived, %d equal, %d explained by the import's issues", len(want), len(want)-len(missing), len(missing)+len(extra))
		})
	}
	if n != 16 {
		t.Errorf("%d samples with virtual servers, want 16", n)
	}
}

// explained reports whether an issue names the address a table line or a
// plan operation is about: the real server of an -a line or a backend
// operation, else the service's VIP.
func explained(line, issues string) bool {
	m := destRE.FindStringSubmatch(line)
	if m == nil {
		m = svcRE.FindStringSubmatch(line)
	}
	if m == nil {
		return false
	}
	return strings.Contains(issues, " "+m[1]+" ") || strings.Contains(issues, " "+m[1]+":")
}

var (
	destRE = regexp.MustCompile(`(?:-r|->) \[?([0-9a-f.:]+?)\]?:\d+`)
	svcRE  = regexp.MustCompile(`(?:-t|-u|--sctp-service|tcp|udp|sctp) \[?([0-9a-f.:]+?)\]?:\d+`)
)

// TestImportIpvsadmRoundTrip: a table of 1,000 services restored with
// ipvsadm -R, saved with ipvsadm -Sn and imported (from the text and
// from the kernel), is what vipd programs, and vipd plan against it plans
// no IPVS operation.
func TestImportIpvsadmRoundTrip(t *testing.T) {
	scheds := []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"}
	var b strings.Builder
	for i := range 1000 {
		s := scheds[i%len(scheds)]
		svc := fmt.Sprintf("-t 198.18.%d.%d:%d", i/250, i%250+1, 80+i%2)
		switch i % 5 {
		case 3:
			svc = fmt.Sprintf("-u 198.18.%d.%d:53", i/250, i%250+1)
		case 4:
			svc = fmt.Sprintf("-f %d", i+1)
		}
		fmt.Fprintf(&b, "-A %s -s %s", svc, s)
		if i%3 == 0 {
			fmt.Fprintf(&b, " -p %d", 60+i)
			if i%2 == 0 {
				b.WriteString(" -M 255.255.255.0")
			}
		}
		b.WriteString("\n")
		for j := range 1 + i%3 {
			port := ":8080"
			fwd := "-m"
			if j == 1 {
				fwd, port = "-g", fmt.Sprintf(":%d", 80+i%2)
				if strings.HasPrefix(svc, "-u") {
					port = ":53"
				}
			}
			if strings.HasPrefix(svc, "-f") {
				port = ":0"
			}
			fmt.Fprintf(&b, "-a %s -r 10.%d.%d.%d%s %s -w %d\n", svc, j+1, i/250, i%250+1, port, fwd, i%5)
		}
	}
	Run(t, "ipvsadm", "-C")
	t.Cleanup(func() { Exec("ipvsadm", "-C") })
	restore := exec.Command("ipvsadm", "-R")
	restore.Stdin = strings.NewReader(b.String())
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("ipvsadm -R: %v\n%s", err, out)
	}
	want := table(t)
	t.Logf("ipvsadm -R programmed %d lines", len(want))
	dir := t.TempDir()
	saved := filepath.Join(dir, "saved.txt")
	if err := os.WriteFile(saved, []byte(Run(t, "ipvsadm", "-Sn")), 0o644); err != nil {
		t.Fatal(err)
	}
	toml, issues := vipdImport(t, "ipvsadm", saved)
	if issues != "" {
		t.Fatalf("issues:\n%s", issues)
	}
	live, issues := vipdImport(t, "ipvsadm", "--live")
	if issues != "" {
		t.Fatalf("issues of --live:\n%s", issues)
	}
	if body(toml) != body(live) {
		t.Errorf("the import of ipvsadm -Sn and of the live table differ")
	}
	cfg := filepath.Join(dir, "vipd.toml")
	if err := os.WriteFile(cfg, []byte(importDaemon(dir)+toml), 0o644); err != nil {
		t.Fatal(err)
	}
	if ops := planIPVS(t, cfg); len(ops) > 0 {
		t.Errorf("vipd plan against the restored table: %d IPVS operations, want 0; first: %q", len(ops), ops[0])
	}
	got := runVipd(t, importDaemon(dir)+toml)
	if len(want) < 1000 || !slices.Equal(got, want) {
		t.Errorf("vipd's table (%d lines) differs from ipvsadm's (%d lines): missing %q, extra %q",
			len(got), len(want), firstOf(diff(want, got)), firstOf(diff(got, want)))
	}
}

// body returns the services of a configuration without comments, in
// order.
func body(toml string) string {
	var out []string
	for l := range strings.SplitSeq(toml, "\n") {
		if !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	svcs := strings.Split(strings.Join(out, "\n"), "[[service]]")
	slices.Sort(svcs)
	return strings.Join(svcs, "[[service]]")
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
