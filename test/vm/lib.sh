# shellcheck shell=bash
# Common settings for the host-side scripts of the real-kernel rig.
# Sourced by prepare.sh, initramfs.sh, run.sh, selftest.sh, e2e.sh, demo.sh.
# Not for the guest: the guest side is guest-init.sh and topo.sh.

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$VM_DIR/../.." && pwd)

# Everything downloaded or built lives outside the repo so that fresh clones
# on the same machine (CI) reuse it. A fresh machine fills it on first use.
VIPD_VM_CACHE=${VIPD_VM_CACHE:-/var/cache/vipd-vm}

# Written by prepare.sh: KVER, VMLINUZ, MODDIR, BASE_INITRD.
VM_STATE_FILE=$VIPD_VM_CACHE/state.env

log() { printf '[vm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[vm] ERROR: %s\n' "$*" >&2; exit 1; }

# now: wall clock in seconds with microseconds (bash 5 builtin, no fork).
now() { printf '%s' "$EPOCHREALTIME"; }
# elapsed START [END]: seconds between two now() readings, one decimal.
elapsed() { awk -v a="$1" -v b="${2:-$EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'; }

# load_state: read what prepare.sh cached; fails if prepare.sh never ran.
load_state() {
	[[ -r $VM_STATE_FILE ]] || die "no $VM_STATE_FILE: run test/vm/prepare.sh first"
	# shellcheck disable=SC1090
	source "$VM_STATE_FILE"
	[[ -r ${VMLINUZ:-} && -r ${BASE_INITRD:-} ]] ||
		die "cached kernel or base initramfs missing: run test/vm/prepare.sh"
}
