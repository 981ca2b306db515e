#!/bin/bash
# guest-bench.sh — runs INSIDE the guest for bench.sh (`make bench`).
#
# Runs /payload/benchrun (test/bench/cmd/benchrun): vipd, `ipvsadm -R` and
# keepalived programming the same fixtures, each in a network namespace of
# its own. Parameters arrive as environment variables from the kernel
# command line (bench.sh sets them):
#   VIPD_BENCH_SIZES         sizes NxM to program cold (comma-separated)
#   VIPD_BENCH_CHANGE_SIZES  sizes at which to time a one-backend change
#   VIPD_BENCH_READD_SIZES   sizes at which to time re-adding after a flush
#   VIPD_BENCH_MEM_SIZES     sizes at which vipd alone starts, for its memory
#                            ("none": no such size)
#   VIPD_BENCH_SOAK          reloads for vipd's memory after the changes
#   VIPD_BENCH_REPS          repetitions of vipd's change
#   VIPD_BENCH_KREPS         repetitions of keepalived's reload
#   VIPD_BENCH_TOOLS         tools to measure, in order
#   VIPD_BENCH_LAYOUTS       vipd's configuration layouts (single, split)
#   VIPD_BENCH_PER_FILE      services per file of the split layout
# vipd's change is timed by a kretprobe through tracefs (benchrun mounts
# it and fails when kprobe events are missing), armed once, after every
# cold start, and never disarmed.
set -u
keepalived=$(command -v keepalived || true)
if [[ -z $keepalived ]]; then
	echo "guest-bench: no keepalived in the guest image (install keepalived on the host and run test/vm/prepare.sh)"
	exit 1
fi
ulimit -n 65536
args=(
	-vipd /payload/vipd -keepalived "$keepalived" -work /tmp/bench
	-qemu "$(cat /payload/qemu-version 2>/dev/null)"
)
[[ -z ${VIPD_BENCH_SIZES:-} ]] || args+=(-sizes "$VIPD_BENCH_SIZES")
[[ -z ${VIPD_BENCH_CHANGE_SIZES:-} ]] || args+=(-change-sizes "$VIPD_BENCH_CHANGE_SIZES")
[[ -z ${VIPD_BENCH_READD_SIZES:-} ]] || args+=(-readd-sizes "$VIPD_BENCH_READD_SIZES")
case ${VIPD_BENCH_MEM_SIZES:-} in
"") ;;
none) args+=(-mem-sizes "") ;;
*) args+=(-mem-sizes "$VIPD_BENCH_MEM_SIZES") ;;
esac
[[ -z ${VIPD_BENCH_SOAK:-} ]] || args+=(-soak "$VIPD_BENCH_SOAK")
[[ -z ${VIPD_BENCH_REPS:-} ]] || args+=(-reps "$VIPD_BENCH_REPS")
[[ -z ${VIPD_BENCH_KREPS:-} ]] || args+=(-kreps "$VIPD_BENCH_KREPS")
[[ -z ${VIPD_BENCH_TOOLS:-} ]] || args+=(-tools "$VIPD_BENCH_TOOLS")
[[ -z ${VIPD_BENCH_LAYOUTS:-} ]] || args+=(-layouts "$VIPD_BENCH_LAYOUTS")
[[ -z ${VIPD_BENCH_PER_FILE:-} ]] || args+=(-per-file "$VIPD_BENCH_PER_FILE")
exec /payload/benchrun "${args[@]}"
