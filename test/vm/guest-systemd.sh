#!/bin/bash
# guest-systemd.sh — runs INSIDE the systemd guest (systemd-test.sh): installs
# the real vipd .deb and checks, through systemctl, what an operator relies
# on. Prints "ok - ..." or "FAIL - ..." per check and ends with
#   systemd: N passed, N failed
# exiting 1 if any check failed.
#
# Payload: vipd.deb, bin/rignode, topo.sh, this script.
set -u -o pipefail
cd /payload || exit 1

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok - $*"; }
fail() { failed=$((failed + 1)); echo "FAIL - $*"; }
# check DESC CMD...: ok when CMD succeeds.
check() {
	local desc=$1
	shift
	if "$@"; then ok "$desc"; else fail "$desc"; fi
}
# eventually SECS CMD...: poll CMD every 0.2 s until it succeeds or SECS pass.
eventually() {
	local end=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS < end)) || return 1
		sleep 0.2
	done
}
section() { echo "--- $* (uptime $(cut -d' ' -f1 /proc/uptime) s)"; }
show() { systemctl show -p "$1" --value vipd; }
vipd_ready() { [[ $(show ActiveState) == active && $(show SubState) == running ]]; }
journal() { journalctl -q -o cat -u vipd --no-pager "$@"; }
# hits N: N requests from the client namespace through the VIP; prints the
# number that failed (rignode's "errors"), or "none" if rignode itself failed.
hits() {
	local out
	out=$(topo_hit "$1" "http://$VIP/" -interval 20ms) || { echo none; return; }
	sed -n 's/.*"errors":\([0-9]*\).*/\1/p' <<<"$out"
}
# weight_of BACKEND: IPVS weight of BACKEND:80 in the web service.
weight_of() { ipvsadm -Ln -t "$VIP:80" | awk -v be="$1:80" '$2 == be { print $4 }'; }
dump() {
	echo "=== systemctl status vipd"
	systemctl status --no-pager -l vipd | tail -n 20
	echo "=== journal -u vipd (last 40)"
	journal -n 40
	echo "=== ipvsadm -Ln"
	ipvsadm -Ln
}

VIP=10.0.0.10
PROBE_VIP=10.0.0.20

section "guest"
check "PID 1 is systemd" test "$(cat /proc/1/comm)" = systemd
echo "systemd: $(systemctl --version | sed -n 1p); $(systemd-analyze time 2>/dev/null | sed -n 1p)"
check "ip_vs is not loaded before the package is installed" \
	bash -c '! grep -q "^ip_vs " /proc/modules'

section "dpkg -i"
if dpkg -i /payload/vipd.deb; then ok "dpkg -i vipd.deb"; else fail "dpkg -i vipd.deb"; fi
check "postinst: systemd-modules-load loaded ip_vs (modules-load.d/vipd.conf)" grep -q '^ip_vs ' /proc/modules
check "postinst: systemd-sysctl applied net.ipv4.vs.conntrack = 1" \
	test "$(cat /proc/sys/net/ipv4/vs/conntrack 2>/dev/null)" = 1
pw=$(getent passwd vipd-check)
echo "vipd-check: $pw"
IFS=: read -r _ _ check_uid check_gid _ check_home check_shell <<<"$pw"
check "postinst: system user vipd-check exists" test -n "$pw"
check "vipd-check is a system user (uid $check_uid < 1000)" test "${check_uid:-99999}" -lt 1000
check "vipd-check has a nologin shell ($check_shell)" test "$check_shell" = /usr/sbin/nologin
check "vipd-check has no home directory ($check_home)" test ! -e "${check_home:-/x}"
check "vipd-check's group exists" test "$(getent group vipd-check | cut -d: -f3)" = "$check_gid"
if dpkg -i /payload/vipd.deb >/dev/null 2>&1; then ok "dpkg -i again (postinst is idempotent)"; else fail "dpkg -i again"; fi
check "still one vipd-check user" test "$(getent passwd | grep -c '^vipd-check:')" = 1
check "the unit is known to systemd" systemctl cat vipd.service >/dev/null
check "the unit is not started by the package" test "$(show ActiveState)" = inactive
exposure=$(systemd-analyze security --no-pager vipd.service 2>&1 | tail -n 1)
echo "exposure: $exposure"
level=$(sed -n 's/.*vipd.service: \([0-9.]*\) .*/\1/p' <<<"$exposure")
check "systemd-analyze security: exposure ${level:-?} is below 4.0 (OK)" \
	awk -v l="${level:-99}" 'BEGIN { exit !(l < 4.0) }'

section "topology"
# shellcheck source=topo.sh
source /payload/topo.sh
topo_nat 2 || { fail "topo_nat 2"; echo "systemd: $passed passed, $failed failed"; exit 1; }

# The exec checks: one reports who it runs as; one overruns its timeout and
# must be killed by vipd.
mkdir -p /usr/local/lib/vipd-test
cat >/usr/local/lib/vipd-test/identity <<'SH'
#!/bin/sh
# Written in vipd's private /tmp; the test reads it through /proc/PID/root.
f=/tmp/vipd-check-identity
{
	echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) cwd=$(pwd)"
	grep -E '^(Cap(Inh|Prm|Eff|Amb)|NoNewPrivs):' /proc/self/status
	echo "PATH=$PATH"
	echo "backend=$VIPD_BACKEND_ADDR:$VIPD_BACKEND_PORT"
} >"$f.$$" && mv -f "$f.$$" "$f"
SH
cat >/usr/local/lib/vipd-test/hang <<'SH'
#!/bin/sh
# Counts its starts, then overruns any timeout.
echo start >>/tmp/vipd-check-hang
exec /bin/sleep 60
SH
chmod 0755 /usr/local/lib/vipd-test/identity /usr/local/lib/vipd-test/hang

write_config() { # write_config WEIGHT_OF_BE2
	cat >/etc/vipd/vipd.toml <<TOML
# vipd-systemd test: a NAT service over two backends.
[daemon]
uplinks = ["lb-c"]
on_stop = "keep"
watch = false

[[service]]
name = "web"
vip = "$VIP"
port = 80
scheduler = "wrr"
check = { type = "http", path = "/healthz", interval = "1s", timeout = "1s", rise = 1, fall = 2 }
backend = [{ address = "10.0.2.11" }, { address = "10.0.2.12", weight = $1 }]

[[service]]
name = "probe"
vip = "$PROBE_VIP"
port = 8080
scheduler = "rr"

[[service.backend]]
address = "10.0.2.11"
check = { type = "exec", command = "/usr/local/lib/vipd-test/identity", interval = "1s", timeout = "2s" }

[[service.backend]]
address = "10.0.2.12"
check = { type = "exec", command = "/usr/local/lib/vipd-test/hang", interval = "1s", timeout = "1s" }
TOML
}
write_config 1

section "systemctl start"
# A drop-in shortens the shipped WatchdogSec=30s to keep the emulated run
# short (the watchdog section); the mechanism is the same. It must be in
# place before the start: a running service keeps the timeout it started with.
mkdir -p /etc/systemd/system/vipd.service.d
printf '[Service]\nWatchdogSec=10s\n' >/etc/systemd/system/vipd.service.d/watchdog.conf
systemctl daemon-reload
if systemctl enable vipd 2>/dev/null; then ok "systemctl enable vipd"; else fail "systemctl enable vipd"; fi
check "enabled: started at boot by multi-user.target" test "$(systemctl is-enabled vipd)" = enabled
# A local user holds the flock of the lock path vipd used before (in the
# world-writable /run/lock) and tries the new one: neither keeps vipd out.
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
netns=$(stat -L -c %i /proc/self/ns/net)
nobody flock --nonblock "/run/lock/vipd-net-$netns.lock" sleep 600 &
squatter=$!
check "a local user holds /run/lock/vipd-net-$netns.lock" eventually 5 test -e "/run/lock/vipd-net-$netns.lock"
if systemctl start vipd; then ok "systemctl start vipd"; else fail "systemctl start vipd"; fi
check "ActiveState=active SubState=running" vipd_ready
check "WatchdogSec is the drop-in's 10s ($(show WatchdogUSec))" test "$(show WatchdogUSec)" = 10s
status=$(show StatusText)
echo "StatusText: $status"
check "StatusText is set (READY sent with a status)" test -n "$status"
check "both web backends up (weight 1)" eventually 20 bash -c "[[ \$(ipvsadm -Ln -t $VIP:80 | awk '\$1 == \"->\" && \$4 == 1' | wc -l) == 2 ]]"
check "VIP on vipd0" bash -c "ip -4 addr show dev vipd0 | grep -q ' $VIP/'"
e=$(hits 20)
check "20 requests through the VIP, $e failed" test "$e" = 0
pid1=$(show MainPID)
echo "vipd MainPID $pid1"

section "writable paths"
# What vipd's mount namespace lets it write (nsenter: root, vipd's mounts).
writable() { nsenter -t "$pid1" -m -- sh -c "touch $1/.vipd-test-w && rm -f $1/.vipd-test-w" 2>/dev/null; }
for d in /run/vipd /var/lib/vipd; do
	check "vipd may write $d" writable "$d"
done
not_writable() { ! writable "$1"; }
for d in /run /run/lock /run/systemd /etc /etc/vipd /var/lib /usr /root; do
	check "vipd may not write $d" not_writable "$d"
done
lock=/run/vipd/lock/vipd-net-$netns.lock
mode() { stat -c '%a %U:%G %F' "$1"; }
echo "lock: $lock: $(mode "$lock" 2>&1); $(mode /run/vipd/lock 2>&1); /run/vipd $(mode /run/vipd 2>&1)"
check "the network namespace lock is $lock, root's, 0600" test "$(mode "$lock")" = "600 root:root regular file"
check "its directory /run/vipd/lock is root's, 0700" test "$(mode /run/vipd/lock)" = "700 root:root directory"
check "/run/vipd is root's, 0755" test "$(mode /run/vipd)" = "755 root:root directory"
check "vipd holds it (the pid in it is vipd's)" test "$(cat "$lock")" = "$pid1"
check "a local user cannot open it" bash -c "! setpriv --reuid=65534 --regid=65534 --clear-groups flock --nonblock $lock true"
check "a local user cannot plant a link there" \
	bash -c "! setpriv --reuid=65534 --regid=65534 --clear-groups ln -s /etc/vipd/vipd.toml /run/vipd/lock/x"
kill "$squatter" 2>/dev/null
wait "$squatter" 2>/dev/null
check "no permission or read-only errors in vipd's journal" \
	bash -c "! journalctl -q -o cat -u vipd | grep -Ei 'permission denied|read-only file system|operation not permitted'"

section "exec checks"
idfile=/proc/$pid1/root/tmp/vipd-check-identity
if eventually 20 test -s "$idfile"; then
	echo "the exec check saw:"
	sed 's/^/    /' "$idfile"
	check "exec check runs as vipd-check (uid $check_uid gid $check_gid, no other group)" \
		grep -q "^uid=$check_uid gid=$check_gid groups=$check_gid " "$idfile"
	for c in CapInh CapPrm CapEff CapAmb; do
		check "exec check has no capabilities ($c = 0)" grep -Eq "^$c:\s+0+$" "$idfile"
	done
	check "exec check gets its backend in VIPD_BACKEND_*" grep -q '^backend=10.0.2.11:8080$' "$idfile"
	check "exec check has the fixed PATH" grep -qx 'PATH=/usr/sbin:/usr/bin:/sbin:/bin' "$idfile"
	check "exec check has NoNewPrivs (the unit's NoNewPrivileges)" grep -Eq '^NoNewPrivs:\s+1$' "$idfile"
else
	fail "the exec check never ran (no $idfile)"
fi
# The sleeping check overruns its 1 s timeout every second: vipd must kill
# each one (CAP_KILL over another user's process when checks run as vipd-check).
sleep 6
starts=$(wc -l <"/proc/$pid1/root/tmp/vipd-check-hang" 2>/dev/null || echo 0)
left=$(pgrep -c -u vipd-check -x sleep || true)
check "the overrunning exec check was started again and again ($starts times)" test "$starts" -ge 3
check "each overrunning exec check is killed ($left left running, at most 1)" test "${left:-0}" -le 1

section "systemctl reload"
write_config 3
if out=$(systemctl reload vipd 2>&1); then ok "systemctl reload vipd (weight 1 -> 3)"; else fail "systemctl reload vipd: $out"; fi
check "ipvsadm shows the new weight 3 of 10.0.2.12" eventually 10 test "$(weight_of 10.0.2.12)" = 3
check "same main PID after reload" test "$(show MainPID)" = "$pid1"
cp /etc/vipd/vipd.toml /tmp/good.toml
printf '[[service]]\nname = "web"\nvip = "%s"\nport = = 80\n' "$VIP" >>/etc/vipd/vipd.toml
if out=$(systemctl reload vipd 2>&1); then
	fail "systemctl reload with a broken file succeeded"
else
	ok "systemctl reload with a broken file fails (exit $?)"
fi
echo "systemctl said: $out"
echo "journal said:"
journal -n 6 | sed 's/^/    /'
check "the journal says why (the file and line)" bash -c "journalctl -q -o cat -u vipd -n 20 | grep -q 'vipd.toml:[0-9]'"
check "systemctl status shows the reason" bash -c "systemctl status --no-pager -l -n 20 vipd | grep -q 'vipd.toml:[0-9]'"
check "still active after the failed reload" vipd_ready
check "the old configuration still serves (weight 3)" test "$(weight_of 10.0.2.12)" = 3
e=$(hits 20)
check "20 requests after the failed reload, $e failed" test "$e" = 0
cp /tmp/good.toml /etc/vipd/vipd.toml

section "watchdog"
restarts0=$(show NRestarts)
mkdir -p /run/vipd-test
: >/run/vipd-test/hits
(
	while [[ ! -e /run/vipd-test/stop ]]; do
		topo_hit 10 "http://$VIP/" -interval 50ms >>/run/vipd-test/hits
	done
) &
loader=$!
sleep 1
t0=$SECONDS
kill -STOP "$pid1"
echo "SIGSTOP to $pid1; WatchdogSec=$(show WatchdogUSec)"
if eventually 90 bash -c "p=\$(systemctl show -p MainPID --value vipd); [[ \$p != 0 && \$p != $pid1 ]] && [[ \$(systemctl show -p SubState --value vipd) == running ]]"; then
	ok "the watchdog restarted vipd ($((SECONDS - t0)) s after SIGSTOP)"
else
	fail "no restart within 90 s of SIGSTOP"
fi
pid2=$(show MainPID)
check "NRestarts went up ($restarts0 -> $(show NRestarts))" test "$(show NRestarts)" -gt "$restarts0"
check "the journal names the watchdog" bash -c "journalctl -q -o cat -u vipd | grep -qi 'watchdog timeout'"
sleep 3
touch /run/vipd-test/stop
wait "$loader"
reqs=$(sed -n 's/.*"ok":\([0-9]*\).*/\1/p' /run/vipd-test/hits | awk '{ s += $1 } END { print s + 0 }')
errs=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' /run/vipd-test/hits | awk '{ s += $1 } END { print s + 0 }')
echo "requests during stall and restart: $reqs ok, $errs failed"
check "requests kept flowing during the stall and restart ($reqs ok)" test "$reqs" -ge 20
check "no request failed during the stall and restart ($errs failed)" test "$errs" = 0
check "ActiveState=active after the restart" vipd_ready
check "the restarted vipd kept the configured weights" test "$(weight_of 10.0.2.12)" = 3

section "systemctl stop (on_stop = keep)"
if systemctl stop vipd; then ok "systemctl stop vipd"; else fail "systemctl stop vipd"; fi
check "ActiveState=inactive" test "$(show ActiveState)" = inactive
check "no vipd process left" bash -c '! pidof vipd'
check "the namespace lock outlives the stop (RuntimeDirectoryPreserve=yes)" test -f "$lock"
check "IPVS service still there" ipvsadm -Ln -t "$VIP:80"
check "VIP still on vipd0" bash -c "ip -4 addr show dev vipd0 | grep -q ' $VIP/'"
e=$(hits 20)
check "20 requests with vipd stopped, $e failed" test "$e" = 0

section "iptables-legacy (the xtables lock)"
# With the legacy backend iptables-restore -w takes /run/xtables.lock, the
# one file in /run the unit may write besides its own directories.
update-alternatives --quiet --set iptables /usr/sbin/iptables-legacy &&
	update-alternatives --quiet --set ip6tables /usr/sbin/ip6tables-legacy
if systemctl start vipd; then ok "systemctl start vipd with iptables-legacy"; else fail "systemctl start vipd with iptables-legacy"; fi
check "ActiveState=active SubState=running" vipd_ready
check "vipd's chains are in the legacy tables" bash -c "iptables-legacy-save | grep -q '^:VIPD-'"
check "iptables-legacy took /run/xtables.lock" test -e /run/xtables.lock
check "no permission or read-only errors in vipd's journal" \
	bash -c "! journalctl -q -o cat -u vipd | grep -Ei 'permission denied|read-only file system|operation not permitted'"
e=$(hits 20)
check "20 requests, $e failed" test "$e" = 0

((failed == 0)) || dump
echo "systemd: $passed passed, $failed failed"
((failed == 0))
