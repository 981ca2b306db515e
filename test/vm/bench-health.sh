#!/usr/bin/env bash
# test/vm/bench-health.sh — the health-check benchmark (part of make bench,
# never of make test): TestHealthBench (test/bench/health, build tag
# healthbench) twice:
#
#   1. on the host, vipd alone (its agent on a fake kernel: the host has no
#      IPVS) at full size, 10,000 TCP checks every second, then with 2,000
#      HTTP checks every 2 s beside them, against listeners on 10.77.0.0/16
#      in a private network namespace (unshare -n), with full and with
#      half-open TCP checks;
#   2. in one guest boot, vipd (full and half-open TCP checks) and
#      keepalived's checker with the same, scaled-down, checks (the
#      emulator cannot run the full size): 1,000 and 400 TCP checks, then
#      200 TCP and 40 HTTP.
#
# The checker and the backends' listeners are kept apart: the listeners in
# a network namespace of their own behind a veth, the checker pinned to
# CPU 0, the listeners and their side's receive processing to CPU 1, so
# that the kernel's work for a backend's end of each check is not charged
# to the checker (VIPD_HEALTHBENCH_SIDES=one: the layout before, one
# namespace and the loopback).
#
# Each prints a table: CPU (% of one core, per second of a window), context
# switches per second of the checker's threads (its wake-ups), RSS (and at
# the window's end its anonymous, file-backed and shared parts),
# check lateness (vipd_health_check_lateness_seconds), and detection
# latency (a listener closed -> weight 0), with n, p50, p99, and the
# ratios to the targets. It fails when a peer cannot be measured.
#
#   VIPD_HEALTHBENCH_HOST_SIZES   host workloads, TCP/HTTP (default 10000/0,10000/2000)
#   VIPD_HEALTHBENCH_GUEST_SIZES  guest workloads (default 1000/0,400/0,200/40: at 1,000/200 the
#                                 emulated checkers fall behind by seconds; 0/0 measures vipd's
#                                 agent with no checks, keepalived skipped)
#   VIPD_HEALTHBENCH_PEERS        checkers (host: vipd,vipd-halfopen; guest: those and keepalived)
#   VIPD_HEALTHBENCH_SIDES        apart (default) or one
#   VIPD_HEALTHBENCH_WINDOW       CPU window, s (default 20)
#   VIPD_HEALTHBENCH_SAMPLES      detection samples per workload (default 20 TCP, 10 HTTP)
#   VIPD_HEALTHBENCH_WHERE        host, guest or both (default both)
#   VIPD_HEALTHBENCH_GOGC         guest part: GOGC for vipd (default: the runtime's)
#   VIPD_HEALTHBENCH_CPUPROFILE   host part: the daemon writes a CPU profile of its run to
#                                 this file (go tool pprof)
#   VIPD_HEALTHBENCH_MEMPROFILE   host part: the daemon writes a heap profile to this file
#                                 as it stops
#   VIPD_BENCH_OUT                result path prefix (default bin/bench/bench-health-DATE);
#                                 tables in PREFIX-host.txt and PREFIX-guest.txt
#
# The host part keeps both cores busy for about a minute: run it on a quiet
# host (no guest beside it; it prints the load).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
out=${VIPD_BENCH_OUT:-$REPO_ROOT/bin/bench/bench-health-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$(dirname "$out")"
where=${VIPD_HEALTHBENCH_WHERE:-both}
commit=$(git -C "$REPO_ROOT" rev-parse --short HEAD)
export VIPD_HEALTHBENCH_WINDOW VIPD_HEALTHBENCH_SAMPLES VIPD_HEALTHBENCH_PEERS VIPD_HEALTHBENCH_SIDES VIPD_HEALTHBENCH_GOGC

if [[ $where == host || $where == both ]]; then
	bin=$(mktemp -d /tmp/vipd-healthbench.XXXXXX)
	trap 'rm -rf "$bin"' EXIT
	(cd "$REPO_ROOT" && CGO_ENABLED=0 go test -c -tags healthbench -o "$bin/health.test" ./test/bench/health)
	log "host: load $(cut -d' ' -f1-3 /proc/loadavg), $(pgrep -c qemu-system || true) guests running"
	{
		echo "Health-check benchmark, host part (test/vm/bench-health.sh), $(date +%F), commit $commit."
		echo "host: $(uname -r), $(nproc) CPUs, load at start $(cut -d' ' -f1-3 /proc/loadavg); listeners in another process."
	} >"$out-host.txt"
	(cd "$bin" && unshare -n env VIPD_HEALTHBENCH_NETNS=1 VIPD_HEALTHBENCH_OUT="$bin/table.txt" \
		VIPD_HEALTHBENCH_SIZES="${VIPD_HEALTHBENCH_HOST_SIZES:-10000/0,10000/2000}" \
		./health.test -test.run '^TestHealthBench$' -test.v -test.timeout 60m) || {
		echo "bench-health: the host run failed" >&2
		exit 1
	}
	cat "$bin/table.txt" >>"$out-host.txt"
	cat "$out-host.txt"
fi

if [[ $where == guest || $where == both ]]; then
	logfile=$out-guest.console.log
	rc=0
	# The emulated CPUs' time stamp counters fail the kernel's
	# synchronization check, and the guest falls back to the HPET, whose
	# every read is an emulated device access and a system call (no vDSO):
	# a tax on each clock read that a real machine, reading the TSC in the
	# vDSO, does not pay, and that falls on the checker that reads the
	# clock most (Go's runtime reads it at every scheduling step). The
	# emulator's TSC is one clock for all vCPUs: trust it.
	export VIPD_VM_APPEND="${VIPD_VM_APPEND:-tsc=reliable clocksource=tsc}"
	VIPD_GUEST_PKGS=./test/bench/health VIPD_GUEST_TAGS=healthbench VIPD_E2E_RUN='^TestHealthBench$' VIPD_E2E_QUIET=1 \
		VIPD_HEALTHBENCH_SIZES="${VIPD_HEALTHBENCH_GUEST_SIZES:-1000/0,400/0,200/40}" \
		VIPD_E2E_TEST_TIMEOUT=${VIPD_HEALTHBENCH_TIMEOUT:-40m} VIPD_E2E_TIMEOUT=3000 VIPD_E2E_LOG=$logfile \
		"$VM_DIR/e2e.sh" || rc=$?
	clean=$(mktemp)
	tr -d '\r' <"$logfile" >"$clean"
	{
		echo "Health-check benchmark, guest part (test/vm/bench-health.sh), one guest boot, $(date +%F), commit $commit."
		echo "host: $(uname -r), $(nproc) CPUs; $(qemu-system-x86_64 --version | sed -n 1p); guest: Debian 12 cloud kernel, 2 vCPUs (TCG), kernel arguments: $VIPD_VM_APPEND; keepalived $(keepalived --version 2>&1 | sed -n 1p | awk '{print $2}') (-n -C: its checker process and its parent)."
		sed -n '/^HEALTH-BENCH-TABLE-BEGIN$/,/^HEALTH-BENCH-TABLE-END$/{/^HEALTH-BENCH-TABLE-/d;p}' "$clean"
	} >"$out-guest.txt"
	if ! grep -q '^guest: ' "$out-guest.txt" || ((rc != 0)); then
		rm -f "$clean"
		echo "bench-health: the guest run failed or is incomplete (e2e exit $rc); console log: $logfile" >&2
		exit 1
	fi
	rm -f "$clean"
	cat "$out-guest.txt"
fi
echo "bench-health: results in $out-{host,guest}.txt; $(elapsed "$t0") s in all"
