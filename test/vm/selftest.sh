#!/usr/bin/env bash
# selftest.sh — prove the rig's failure paths fail (6 guest boots, ~45 s).
#
#   test/vm/selftest.sh
#
# A rig that cannot fail is worse than none. This checks that:
#   1. the guest command's exit status comes back, and a command that prints
#      a fake exit marker cannot fake it (run.sh must return 7); the same
#      command checks that the guest panics on a soft lockup and on an RCU
#      stall (a locked-up vCPU then ends the run instead of hanging it);
#   2. a test with a deliberately wrong expectation (VIPD_E2E_EXPECT_FAIL=1)
#      makes e2e.sh exit non-zero and report the failed test;
#   3. a kernel panic (sysrq 'c') makes run.sh fail with "KERNEL PANIC" and the
#      console tail, promptly (the guest reboots on panic; qemu -no-reboot exits);
#   4. a hanging command makes run.sh fail with "TIMEOUT" at its --timeout
#      (20 s; within 40 s, with the other checks' guests beside it);
#   5. a boot that fails before /init is retried once, then reported;
#   and no qemu process of ours is left behind.
# Checks 3–5 boot guests that do no work (they panic, sleep or never start),
# so they run alongside 1 and 2; their verdicts are printed in order.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
"$VM_DIR/prepare.sh" >/dev/null
out=$(mktemp -d /tmp/vipd-vm-selftest.XXXXXX)
trap 'rm -rf "$out"' EXIT
failures=0
pass() { printf 'selftest: PASS %s\n' "$*"; }
fail() { printf 'selftest: FAIL %s\n' "$*"; failures=$((failures + 1)); }
# Guests booted here carry this word on their kernel command line, so leftover
# qemus of ours can be told from guests that others run at the same time.
tag="VIPD_SELFTEST=$$"
export VIPD_VM_APPEND=$tag # run.sh adds it to every kernel command line
qemus() { pgrep -fc "qemu-system-x86_64 .*$tag" || true; }

# 3–5 run in the background; each writes its verdict to $out/N.verdict.
verdict() { printf '%s\n' "$*" >"$out/$check.verdict"; }
check3() {
	local check=3 rc=0 ts secs
	ts=$(now)
	"$VM_DIR/run.sh" --timeout 120 -- bash -c 'echo c >/proc/sysrq-trigger; sleep 60' >"$out/3.out" 2>&1 || rc=$?
	secs=$(elapsed "$ts")
	if ((rc == 125)) && grep -q 'FAILED: KERNEL PANIC' "$out/3.out" &&
		grep -q 'Kernel panic - not syncing: sysrq triggered crash' "$out/3.out" &&
		grep -q 'last 80 console lines' "$out/3.out"; then
		verdict "PASS kernel panic fails run.sh (exit 125, console tail shown, ${secs} s)"
	else
		verdict "FAIL kernel panic: exit $rc"
	fi
}
check4() {
	local check=4 rc=0 ts secs
	ts=$(now)
	"$VM_DIR/run.sh" --timeout 20 -- sleep 100000 >"$out/4.out" 2>&1 || rc=$?
	secs=$(elapsed "$ts")
	if ((rc == 124)) && grep -q 'FAILED: TIMEOUT' "$out/4.out" &&
		awk -v s="$secs" 'BEGIN { exit !(s < 40) }'; then
		verdict "PASS hang fails run.sh at its timeout (exit 124, ${secs} s)"
	else
		verdict "FAIL hang: exit $rc after ${secs} s"
	fi
}
check5() {
	local check=5 rc=0
	"$VM_DIR/run.sh" --timeout 60 --boot-retries 1 --append rdinit=/nonexistent -- true >"$out/5.out" 2>&1 || rc=$?
	if ((rc == 125)) && (($(grep -c 'boot did not reach /init' "$out/5.out") == 1)) &&
		grep -q 'FAILED: KERNEL PANIC' "$out/5.out"; then
		verdict "PASS a boot that fails before /init is retried once, then fails run.sh (exit 125)"
	else
		verdict "FAIL early boot failure: exit $rc"
	fi
}
check4 &
bg4=$!
check3 &
bg3=$!
check5 &
bg5=$!

# 1. Exit status, and a fake marker printed by the command is ignored; the
# panic settings are in force (exit 9 if not).
rc=0
"$VM_DIR/run.sh" --quiet --timeout 120 -- bash -c 'echo "VIPD-VM-EXIT=0 token=fake"
	for s in softlockup_panic panic_on_rcu_stall; do [ "$(cat /proc/sys/kernel/$s)" = 1 ] || exit 9; done
	exit 7' >"$out/1.out" 2>&1 || rc=$?
if ((rc == 7)); then pass "exit status 7 comes back (fake marker ignored; panics on lockups and RCU stalls)"; else
	fail "exit status: want 7, got $rc"; tail -n 20 "$out/1.out"; fi

# 2. A wrong expectation in an e2e test fails the run.
rc=0
VIPD_E2E_EXPECT_FAIL=1 VIPD_E2E_RUN='^TestRigNAT$' VIPD_E2E_QUIET=1 \
	VIPD_E2E_LOG="$out/2.log" "$VM_DIR/e2e.sh" >"$out/2.out" 2>&1 || rc=$?
if ((rc != 0)) && grep -q -- '--- FAIL: TestRigNAT' "$out/2.out" &&
	grep -q 'e2e: 0 passed, 1 failed' "$out/2.out" &&
	grep -q 'per-backend answers = .*want map' "$out/2.log"; then
	pass "a deliberately wrong expectation fails e2e.sh (exit $rc)"
else
	fail "VIPD_E2E_EXPECT_FAIL=1 did not fail the run as expected (exit $rc)"
	tail -n 30 "$out/2.out"
fi

wait "$bg3" "$bg4" "$bg5" || true
for n in 3 4 5; do
	v=$(cat "$out/$n.verdict" 2>/dev/null || echo "FAIL check $n left no verdict")
	printf 'selftest: %s\n' "$v"
	if [[ $v != PASS* ]]; then
		failures=$((failures + 1))
		tail -n 30 "$out/$n.out" 2>/dev/null || true
	fi
done

if (($(qemus) > 0)); then fail "a qemu process was left running"; else pass "no qemu left running"; fi

echo "selftest: $((6 - failures)) passed, $failures failed ($(elapsed "$t0") s)"
((failures == 0))
