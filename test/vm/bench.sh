#!/usr/bin/env bash
# bench.sh — `make bench`: vipd's control plane against `ipvsadm -R` and
# keepalived, in ONE boot of the test guest (issue 8).
#
#   test/vm/bench.sh
#
# 1. installs keepalived on the host when it is missing: initramfs.sh copies
#    a host's keepalived (and its libraries) into the guest's base image,
#    and the fixture tests run `keepalived -t` with it;
# 2. prepare.sh; builds vipd and test/bench/cmd/benchrun, static;
# 3. boots one guest that runs guest-bench.sh (benchrun), streaming the
#    console here;
# 4. writes the table and the JSON results to $VIPD_BENCH_OUT.txt/.json
#    and prints the table.
#
# Environment (defaults in brackets):
#   VIPD_BENCH_SIZES         sizes NxM [100x10,1000x10,10000x10]
#   VIPD_BENCH_CHANGE_SIZES  one-backend change at [100x10,10000x10]
#   VIPD_BENCH_READD_SIZES   vipd re-adding right after a flush at [1000x10]
#   VIPD_BENCH_MEM_SIZES     vipd alone, cold, for its memory, at
#                            [1000x100,100x1000,50000x2]; "none" for none
#   VIPD_BENCH_SOAK          reloads after the timed changes at the largest
#                            change size, for vipd's memory [1000]
#   VIPD_BENCH_REPS          vipd changes per size [100]
#   VIPD_BENCH_KREPS         keepalived reloads per size [3]
#   VIPD_BENCH_TOOLS         [ipvsadm,keepalived,vipd]
#   VIPD_BENCH_LAYOUTS       vipd's configuration layouts for the change, the
#                            first also for the cold start [single,split];
#                            split needs a vipd with `include`
#   VIPD_BENCH_PER_FILE      services per file of the split layout [100]
#   VIPD_BENCH_TIMEOUT       whole guest, seconds [3600]
#   VIPD_BENCH_MEM           guest memory, MiB [2048]
#   VIPD_BENCH_OUT           output path without extension
#                            [bin/bench/bench-DATE]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

t0=$(now)
if ! command -v keepalived >/dev/null; then
	log "installing keepalived on the host (the guest image takes it from there)"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends keepalived >/dev/null
fi
"$VM_DIR/prepare.sh" >/dev/null

payload=$(mktemp -d /tmp/vipd-bench-payload.XXXXXX)
trap 'rm -rf "$payload"' EXIT
cd "$REPO_ROOT"
export CGO_ENABLED=0
go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.version=$(git describe --always --dirty 2>/dev/null || echo devel)" -o "$payload/vipd" ./cmd/vipd
go build -trimpath -ldflags '-s -w' -o "$payload/benchrun" ./test/bench/cmd/benchrun
cp "$VM_DIR/guest-bench.sh" "$payload/"
qemu=$(qemu-system-x86_64 --version | sed -n 1p)
echo "$qemu" >"$payload/qemu-version"
log "built vipd and benchrun in $(elapsed "$t0") s"

envs=()
for v in VIPD_BENCH_SIZES VIPD_BENCH_CHANGE_SIZES VIPD_BENCH_READD_SIZES VIPD_BENCH_MEM_SIZES VIPD_BENCH_SOAK VIPD_BENCH_REPS \
	VIPD_BENCH_KREPS VIPD_BENCH_TOOLS VIPD_BENCH_LAYOUTS VIPD_BENCH_PER_FILE; do
	[[ -z ${!v:-} ]] || envs+=(--env "$v=${!v}")
done
out=${VIPD_BENCH_OUT:-$REPO_ROOT/bin/bench/bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$(dirname "$out")"
logfile=$out.console.log

load0=$(cut -d' ' -f1 /proc/loadavg)
others0=$(pgrep -c -f '^qemu-system' || true)
rc=0
"$VM_DIR/run.sh" --verbose --mem "${VIPD_BENCH_MEM:-2048}" --timeout "${VIPD_BENCH_TIMEOUT:-3600}" \
	--log "$logfile" --payload "$payload" "${envs[@]}" -- bash /payload/guest-bench.sh || rc=$?

clean=$(mktemp)
tr -d '\r' <"$logfile" >"$clean"
sed -n '/^BENCH-TABLE-BEGIN$/,/^BENCH-TABLE-END$/{/^BENCH-TABLE-/d;p}' "$clean" >"$out.txt"
sed -n '/^BENCH-JSON-BEGIN$/,/^BENCH-JSON-END$/{/^BENCH-JSON-/d;p}' "$clean" >"$out.json"
rm -f "$clean"
if [[ ! -s $out.txt ]]; then
	echo "bench: no results (guest exit $rc); console log: $logfile" >&2
	exit 1
fi
{
	echo "host: $(uname -r), $(nproc) CPUs; $qemu"
	echo "host load (1 min) $load0 before the boot, $(cut -d' ' -f1 /proc/loadavg) after; other guests running at the start: $others0"
} >>"$out.txt"
echo
cat "$out.txt"
echo
echo "bench: results in $out.txt and $out.json (console log $logfile); $(elapsed "$t0") s in all"
exit "$rc"
