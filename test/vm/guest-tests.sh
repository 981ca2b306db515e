#!/bin/bash
# guest-tests.sh — runs INSIDE the guest (e2e.sh puts it in the payload).
#
# Runs every test binary listed in /payload/tests/list ("DIR BINARY" lines),
# each in its own directory (which holds the package's testdata, like
# 'go test' does), with -test.v. After each one it prints
#   VIPD-E2E-RESULT <DIR> rc=<rc> secs=<seconds>
# and resets the network state (topo_down) so binaries do not see each other's
# leftovers. Exits 1 if any binary failed.
#
# Environment (from e2e.sh through the kernel command line):
#   VIPD_E2E_RUN           -test.run pattern for every binary (default: all)
#   VIPD_E2E_TEST_TIMEOUT  -test.timeout per binary (default 25m)
#   VIPD_E2E_COUNT         -test.count for every binary (default 1)
set -u
fail=0
while read -r dir bin; do
	[[ -n $dir ]] || continue
	echo
	echo "=== vipd-e2e: $dir ($bin)"
	args=(-test.v "-test.timeout=${VIPD_E2E_TEST_TIMEOUT:-25m}")
	[[ -z ${VIPD_E2E_RUN:-} ]] || args+=("-test.run=$VIPD_E2E_RUN")
	[[ -z ${VIPD_E2E_COUNT:-} ]] || args+=("-test.count=$VIPD_E2E_COUNT")
	start=$EPOCHREALTIME
	(cd "/payload/tests/$dir" && "./$bin" "${args[@]}")
	rc=$?
	secs=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
	echo "VIPD-E2E-RESULT $dir rc=$rc secs=$secs"
	((rc == 0)) || fail=1
	bash -c 'source /payload/topo.sh && topo_down' >/dev/null 2>&1
done </payload/tests/list
exit "$fail"
