#!/usr/bin/env bash
# systemd-image.sh — build (or reuse) the root filesystem of the systemd guest.
#
#   test/vm/systemd-image.sh        # prints the archive's path on stdout
#
# The systemd guest boots Debian 12's own systemd as PID 1 from an
# initramfs that IS the whole root filesystem (rdinit=/sbin/init): no block
# device, no switch_root. The archive is a plain cpio (unpacked faster than
# a compressed one under software emulation) of a minimal Debian bookworm
# built with mmdebstrap from the host's apt sources, plus:
#   - the kernel modules of the rig's closure (prepare.sh) with a depmod
#     index, so systemd-modules-load and modprobe work as on a real host;
#   - vipd-vm-early.service (prints run.sh's boot marker, quiets the console)
#     and vipd-vm-test.service (runs the payload's command after
#     multi-user.target, prints the exit marker, powers off): systemd-guest/;
#   - units that are slow or useless here masked (gettys, logind, timers).
#
# Cached as $VIPD_VM_CACHE/systemd/rootfs-<key>.cpio, <key> hashing the
# package list, this script, systemd-guest/* and the kernel modules; a warm
# run does nothing. Needs root (mmdebstrap, mknod) and apt access to Debian's
# mirror; installs mmdebstrap when it is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

SUITE=bookworm
# What the guest needs: systemd as init; the data-plane tools vipd's package
# depends on or recommends (iptables, ipvsadm, ipset); iproute2 and busybox
# for topo.sh; kmod for modules-load; procps for ps/pidof.
PACKAGES=(systemd systemd-sysv iproute2 iptables ipvsadm ipset kmod procps busybox)
# Units that cost boot time under emulation and do nothing useful in a
# guest without terminals, network, users or a disk.
MASK=(
	getty.target serial-getty@ttyS0.service getty@tty1.service console-getty.service
	systemd-logind.service systemd-firstboot.service systemd-update-utmp.service
	systemd-update-utmp-runlevel.service systemd-journal-catalog-update.service
	systemd-hwdb-update.service systemd-udev-trigger.service systemd-udevd.service
	systemd-udev-settle.service systemd-timesyncd.service systemd-networkd.service
	systemd-resolved.service systemd-random-seed.service systemd-pstore.service
	systemd-binfmt.service systemd-boot-update.service systemd-machine-id-commit.service
	sys-kernel-debug.mount sys-kernel-tracing.mount sys-fs-fuse-connections.mount
	sys-kernel-config.mount dev-hugepages.mount dev-mqueue.mount
	apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer
	e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer
	remote-fs.target cryptsetup.target
	kmod-static-nodes.service modprobe@dm_mod.service modprobe@loop.service
	modprobe@drm.service modprobe@efi_pstore.service modprobe@fuse.service
	modprobe@configfs.service systemd-journal-flush.service
	systemd-remount-fs.service systemd-sysusers.service e2scrub_reap.service
	systemd-tmpfiles-setup-dev.service ipvsadm.service
)

[[ $(id -u) == 0 ]] || die "systemd-image.sh must run as root (mmdebstrap)"
"$VM_DIR/prepare.sh" >/dev/null
load_state
modlist=$VIPD_VM_CACHE/modules-$KVER.list
[[ -s $modlist ]] || die "no module list $modlist: run test/vm/prepare.sh"

key=$(
	{
		echo "$SUITE ${PACKAGES[*]} ${MASK[*]} $KVER"
		cat "$modlist" "${BASH_SOURCE[0]}"
		# Names, not paths: a clone elsewhere hits the same image.
		for f in "$VM_DIR"/systemd-guest/*; do echo "== ${f##*/}"; cat "$f"; done
	} | sha256sum | cut -c1-16
)
outdir=$VIPD_VM_CACHE/systemd
out=$outdir/rootfs-$key.cpio
if [[ -s $out ]]; then
	echo "$out"
	exit 0
fi

mkdir -p "$outdir"
exec 8>"$outdir/.lock"
flock 8
if [[ -s $out ]]; then # built by another run meanwhile
	echo "$out"
	exit 0
fi
t0=$(now)
if ! command -v mmdebstrap >/dev/null; then
	log "installing mmdebstrap"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null
fi

work=$(mktemp -d /tmp/vipd-systemd-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

# The host's own apt sources (the same mirror the rig's kernel comes from).
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
	[[ -s $f ]] && grep -qv '^\s*\(#\|$\)' "$f" && sources+=("$f")
done
((${#sources[@]})) || die "no apt sources on this host"

log "mmdebstrap $SUITE: ${PACKAGES[*]}"
include=$(
	IFS=,
	echo "${PACKAGES[*]}"
)
mmdebstrap --quiet --mode=root --variant=minbase --include="$include" \
	--aptopt='APT::Install-Recommends "false"' \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	"$SUITE" "$root" "${sources[@]}" >"$work/mmdebstrap.log" 2>&1 ||
	{ tail -n 30 "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
log "mmdebstrap done in $(elapsed "$t0") s ($(du -sh "$root" | cut -f1))"

# Kernel modules: the rig's closure, with its own index.
mdir=$root/usr/lib/modules/$KVER
mkdir -p "$mdir"
grep -v '^#' "$modlist" | while read -r ko; do
	rel=${ko#"$MODDIR"/lib/modules/"$KVER"/}
	rel=${rel#/lib/modules/"$KVER"/}
	mkdir -p "$mdir/$(dirname "$rel")"
	cp "$MODDIR/lib/modules/$KVER/$rel" "$mdir/$rel"
done
for f in modules.builtin modules.builtin.modinfo modules.order; do
	[[ -e $MODDIR/lib/modules/$KVER/$f ]] && cp "$MODDIR/lib/modules/$KVER/$f" "$mdir/"
done
depmod -b "$root/usr" "$KVER" 2>/dev/null || depmod -b "$root" "$KVER"
# The topology's modules (veth, bridge, nf_tables, ...) are loaded at boot
# like guest-init.sh does; ip_vs is not (nor xt_ipvs, which needs it): the
# package's modules-load.d file must load it (the test checks that).
sed -n 's/^# modules: //p' "$modlist" | tr ' ' '\n' | grep -Ev '^(ip_vs|xt_ipvs$)' >"$root/etc/modules-load.d/vipd-vm.conf"

# Guest units and scripts.
install -D -m 0755 "$VM_DIR/systemd-guest/early" "$root/usr/local/lib/vipd-vm/early"
install -D -m 0755 "$VM_DIR/systemd-guest/run-payload" "$root/usr/local/lib/vipd-vm/run-payload"
install -m 0644 "$VM_DIR/systemd-guest/vipd-vm-early.service" "$VM_DIR/systemd-guest/vipd-vm-test.service" \
	"$root/etc/systemd/system/"
mkdir -p "$root/etc/systemd/system/sysinit.target.wants" "$root/etc/systemd/system/multi-user.target.wants"
ln -sf ../vipd-vm-early.service "$root/etc/systemd/system/sysinit.target.wants/"
ln -sf ../vipd-vm-test.service "$root/etc/systemd/system/multi-user.target.wants/"
for u in "${MASK[@]}"; do ln -sf /dev/null "$root/etc/systemd/system/$u"; done
echo vipd-guest >"$root/etc/hostname"
echo "127.0.1.1 vipd-guest" >>"$root/etc/hosts"
: >"$root/etc/fstab"
# A fixed machine id: no first-boot logic.
echo 7669706467756573747379737465646d >"$root/etc/machine-id"
# The journal stays in memory; nothing to flush to a disk.
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nForwardToConsole=no\n' >"$root/etc/systemd/journald.conf.d/vipd-vm.conf"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb

(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$out.tmp"
mv "$out.tmp" "$out"
# Keep only the image in use.
for old in "$outdir"/rootfs-*.cpio; do
	[[ $old == "$out" ]] || rm -f "$old"
done
log "systemd root image built in $(elapsed "$t0") s: $out ($(du -h "$out" | cut -f1))"
echo "$out"
