#!/usr/bin/env bash
# test/vm/bench-ha.sh — the failover benchmark (part of make bench, never of
# make test): one guest boot runs TestHAFailoverBench (test/e2e/ha_bench_test.go,
# build tag habench), which fails the master of vipd's pairs and of
# keepalived's pairs again and again under load (links cut through netlink and
# with ip(8) processes, connection synchronization on and off, direct routing,
# NAT and one-arm SNAT), and prints a table, the ratios vipd/keepalived of
# takeover and preemption (p50, p99), and JSON. A subset:
#   VIPD_E2E_RUN='^TestHAFailoverBench$/^(vipd|keepalived)_nat_' test/vm/bench-ha.sh
#
#   VIPD_HA_BENCH_N   failovers per configuration (default 10)
#   VIPD_BENCH_OUT    result path without extension (default bin/bench/bench-ha-DATE)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
out=${VIPD_BENCH_OUT:-$REPO_ROOT/bin/bench/bench-ha-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$(dirname "$out")"
logfile=$out.console.log
rc=0
VIPD_GUEST_PKGS='' VIPD_E2E_TAGS=habench VIPD_E2E_RUN=${VIPD_E2E_RUN:-'^TestHAFailoverBench$'} VIPD_E2E_QUIET=1 \
	VIPD_E2E_TEST_TIMEOUT=${VIPD_HA_BENCH_TIMEOUT:-60m} VIPD_E2E_TIMEOUT=4000 VIPD_E2E_LOG=$logfile \
	"$VM_DIR/e2e.sh" || rc=$?

clean=$(mktemp)
tr -d '\r' <"$logfile" >"$clean"
sed -n '/^HA-BENCH-TABLE-BEGIN$/,/^HA-BENCH-TABLE-END$/{/^HA-BENCH-TABLE-/d;p}' "$clean" >"$out.txt"
sed -n '/^HA-BENCH-JSON-BEGIN$/,/^HA-BENCH-JSON-END$/{/^HA-BENCH-JSON-/d;p}' "$clean" >"$out.json"
rm -f "$clean"
if [[ ! -s $out.txt ]] || ((rc != 0)); then
	echo "bench-ha: failed or incomplete (e2e exit $rc); console log: $logfile" >&2
	exit 1
fi
echo "host: $(uname -r), $(nproc) CPUs; $(qemu-system-x86_64 --version | sed -n 1p); 100 ms advertisements" >>"$out.txt"
echo
cat "$out.txt"
echo
echo "bench-ha: results in $out.txt and $out.json (console log $logfile); $(elapsed "$t0") s in all"
