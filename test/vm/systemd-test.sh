#!/usr/bin/env bash
# systemd-test.sh — `make systemd-test`: the vipd unit and package under a
# real systemd.
#
# Builds the .deb with `make deb` (nfpm) and rignode, boots the systemd guest
# (systemd-image.sh: Debian 12's systemd as PID 1, built and cached on
# first use) with run.sh --initrd, and runs guest-systemd.sh there: dpkg -i,
# systemctl start / reload / watchdog restart / stop, the exec check's
# identity, the unit's writable paths. Prints the guest's checks and ends
# with "systemd: N passed, N failed"; exits non-zero on any failure.
#
# Environment: VIPD_SYSTEMD_TIMEOUT (guest, default 900 s), VIPD_SYSTEMD_LOG
# (console log), VIPD_SYSTEMD_MEM (guest MiB, default 1024).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
"$VM_DIR/prepare.sh" >/dev/null
image=$("$VM_DIR/systemd-image.sh")
t_image=$(now)

payload=$(mktemp -d /tmp/vipd-systemd-payload.XXXXXX)
stamp=$(mktemp /tmp/vipd-systemd-stamp.XXXXXX)
trap 'rm -rf "$payload" "$stamp"' EXIT
mkdir -p "$payload/bin"
cd "$REPO_ROOT"
export CGO_ENABLED=0
log "make deb"
make --no-print-directory deb >"$payload/make-deb.log" 2>&1 || { cat "$payload/make-deb.log" >&2; die "make deb failed"; }
deb=$(find bin -maxdepth 1 -name 'vipd_*_amd64.deb' -newer "$stamp" | sed -n 1p)
[[ -n $deb ]] || { cat "$payload/make-deb.log" >&2; die "make deb wrote no bin/vipd_*_amd64.deb"; }
log "package: $deb ($(du -h "$deb" | cut -f1))"
cp "$deb" "$payload/vipd.deb"
rm -f "$payload/make-deb.log"
go build -ldflags='-s -w' -o "$payload/bin/rignode" ./test/e2e/cmd/rignode
cp "$VM_DIR/topo.sh" "$VM_DIR/guest-systemd.sh" "$payload/"
t_build=$(now)

rc=0
"$VM_DIR/run.sh" --initrd "$image" --append "rdinit=/sbin/init systemd.show_status=0" \
	--mem "${VIPD_SYSTEMD_MEM:-1024}" --timeout "${VIPD_SYSTEMD_TIMEOUT:-900}" \
	${VIPD_SYSTEMD_LOG:+--log "$VIPD_SYSTEMD_LOG"} --payload "$payload" \
	-- bash /payload/guest-systemd.sh || rc=$?
log "systemd-test: image $(elapsed "$t0" "$t_image") s, build $(elapsed "$t_image" "$t_build") s, guest $(elapsed "$t_build") s, total $(elapsed "$t0") s"
if ((rc != 0)); then
	echo "systemd-test: FAILED (exit $rc)" >&2
	exit "$rc"
fi
echo "systemd-test: PASSED"
