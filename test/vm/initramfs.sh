#!/usr/bin/env bash
# initramfs.sh KVER MODDIR MODLIST — build (or reuse) the guest's base initramfs.
#
# Called by prepare.sh. Prints the path of the archive on stdout.
#
# The archive is cached as $VIPD_VM_CACHE/initramfs/base-<key>.cpio where
# <key> hashes everything that goes in: the kernel version and module list,
# this script, guest-init.sh, and path/size/mtime of every host file copied
# (binaries, their shared libraries, xtables plugins). A package upgrade on the
# host or an edit of these scripts therefore rebuilds it; nothing else does.
#
# Contents: merged-/usr layout with
#   busybox (static; applets in /usr/lib/busybox, LAST in PATH so real tools win)
#   bash (also /bin/sh), iproute2 (ip ss bridge), ipvsadm, iptables (legacy and
#   nft, with the xtables plugin directory; 'iptables' = nft like Debian 12),
#   ipset, nft, conntrack, curl, socat, arping, tcpdump, kmod, a few coreutils
#   (timeout env xargs, whose busybox versions run applets instead of PATH),
#   their shared libraries (found with ldd), the kernel modules of MODLIST with
#   a depmod index, and /init (guest-init.sh).
#
# The archive is NOT compressed: under software emulation the kernel unpacks
# a plain cpio faster than it gunzips one, and qemu loads it from the host
# page cache.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

(($# == 3)) || die "usage: initramfs.sh KVER MODDIR MODLIST"
KVER=$1 MODDIR=$2 MODLIST=$3
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

# Host binaries copied into the guest (must exist; prepare.sh installs them).
BINARIES=(
	bash ip ss bridge ipvsadm xtables-legacy-multi xtables-nft-multi ipset
	nft conntrack curl socat arping tcpdump kmod timeout env xargs
)
# Copied when the host has them (not installed by prepare.sh).
OPTIONAL_BINARIES=(keepalived strace ethtool bird birdc)
XTABLES_DIR=/usr/lib/x86_64-linux-gnu/xtables

bin_paths=()
for b in "${BINARIES[@]}"; do
	p=$(command -v "$b") || die "host binary '$b' missing: run test/vm/prepare.sh"
	bin_paths+=("$(readlink -f "$p")")
done
for b in "${OPTIONAL_BINARIES[@]}"; do
	p=$(command -v "$b" 2>/dev/null) && bin_paths+=("$(readlink -f "$p")")
done
[[ -x /bin/busybox ]] || die "no /bin/busybox: run test/vm/prepare.sh"

# libs_of FILE...: shared libraries that FILEs need, by the path the loader
# looks up (the soname path: put() copies the file behind the symlink there).
libs_of() {
	ldd "$@" 2>/dev/null | awk '
		$2 == "=>" && $3 ~ /^\// { print $3 }
		$1 ~ /^\// && $1 !~ /:$/ { print $1 }' | sort -u
}
mapfile -t lib_paths < <(libs_of "${bin_paths[@]}")

# --- cache key -------------------------------------------------------------
key=$(
	{
		echo "$KVER"
		cat "$MODLIST"
		cat "$VM_DIR/initramfs.sh" "$VM_DIR/guest-init.sh"
		stat -L -c '%n %s %Y' /bin/busybox "${bin_paths[@]}" "${lib_paths[@]}" "$XTABLES_DIR"/*
	} | sha256sum | cut -c1-16
)
out=$VIPD_VM_CACHE/initramfs/base-$key.cpio
if [[ -s $out ]]; then
	echo "$out"
	exit 0
fi

# --- build -------------------------------------------------------------------
t0=$(now)
log "building base initramfs $key"
mkdir -p "$VIPD_VM_CACHE/initramfs"
stage=$(mktemp -d "$VIPD_VM_CACHE/initramfs/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

# Merged-/usr skeleton, like Debian 12.
mkdir -p "$stage"/{usr/bin,usr/sbin,usr/lib/busybox,usr/lib64,proc,sys,dev,tmp,run,root,etc,payload,var}
ln -s usr/bin "$stage/bin"
ln -s usr/sbin "$stage/sbin"
ln -s usr/lib "$stage/lib"
ln -s usr/lib64 "$stage/lib64"
ln -s ../run "$stage/var/run"
chmod 1777 "$stage/tmp"
# The kernel opens /dev/console for init's stdio before devtmpfs is mounted.
mknod -m 600 "$stage/dev/console" c 5 1
mknod -m 666 "$stage/dev/null" c 1 3

# put HOSTPATH: copy a host file to the same path in the stage (through the
# merged-/usr symlinks).
put() {
	local src=$1 dst=$stage$1
	mkdir -p "$(dirname "$dst")"
	cp -L --preserve=mode "$src" "$dst"
}

# busybox and its applets (flat directory, last in the guest's PATH).
put /bin/busybox
for a in $(/bin/busybox --list); do
	ln -s ../../bin/busybox "$stage/usr/lib/busybox/$a"
done

# Real tools and their libraries.
for p in "${bin_paths[@]}"; do put "$p"; done
mapfile -t plugin_libs < <(libs_of "$XTABLES_DIR"/*.so)
for l in "${lib_paths[@]}" "${plugin_libs[@]}"; do put "$l"; done
mkdir -p "$stage$XTABLES_DIR"
cp -a "$XTABLES_DIR"/. "$stage$XTABLES_DIR/"

# Names the tools are called by. Each binary was copied to its resolved path;
# link the usual names to it (in /usr/sbin or /usr/bin as on Debian 12).
link() { # link TARGET_PATH NAME_PATH
	[[ -e $stage$2 || -L $stage$2 ]] || ln -s "$1" "$stage$2"
}
for p in "${bin_paths[@]}"; do
	n=$(basename "$p")
	link "$p" "/usr/sbin/$n"
done
for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
	link /usr/sbin/xtables-legacy-multi "/usr/sbin/${n/tables/tables-legacy}"
	link /usr/sbin/xtables-nft-multi "/usr/sbin/${n/tables/tables-nft}"
	link /usr/sbin/xtables-nft-multi "/usr/sbin/$n" # Debian 12 default backend
done
for n in modprobe insmod rmmod lsmod modinfo depmod; do
	link /usr/bin/kmod "/usr/sbin/$n"
done
link /usr/bin/bash /usr/bin/sh

# Kernel modules: the closure from MODLIST, with its own depmod index so the
# guest's modprobe (and the kernel's autoload through /sbin/modprobe) work.
kmods=$MODDIR/lib/modules/$KVER
mkdir -p "$stage/lib/modules/$KVER"
while read -r ko; do
	[[ $ko == \#* || -z $ko ]] && continue
	rel=${ko#"$kmods"/}
	mkdir -p "$stage/lib/modules/$KVER/$(dirname "$rel")"
	cp "$ko" "$stage/lib/modules/$KVER/$rel"
done <"$MODLIST"
for f in modules.order modules.builtin modules.builtin.modinfo; do
	[[ -e $kmods/$f ]] && cp "$kmods/$f" "$stage/lib/modules/$KVER/"
done
depmod -b "$stage" "$KVER"
mkdir -p "$stage/etc/vipd-vm"
sed -n 's/^# modules: //p' "$MODLIST" >"$stage/etc/vipd-vm/modules"
# Loading 'dummy' must not create dummy0: the tests (and vipd) create their own.
mkdir -p "$stage/etc/modprobe.d"
echo 'options dummy numdummies=0' >"$stage/etc/modprobe.d/vipd-vm.conf"

# Minimal /etc.
# nobody and vipd-check, the user exec checks run as (the .deb creates it).
printf '%s\n' 'root:x:0:0:root:/root:/bin/bash' 'vipd-check:x:999:999:vipd exec checks:/nonexistent:/usr/sbin/nologin' \
	'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$stage/etc/passwd"
printf '%s\n' 'root:x:0:' 'vipd-check:x:999:' 'nogroup:x:65534:' >"$stage/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$stage/etc/hosts"
echo 'hosts: files' >"$stage/etc/nsswitch.conf"
echo vipd-vm >"$stage/etc/hostname"
cp /etc/protocols /etc/services "$stage/etc/" 2>/dev/null || true
if [[ -d /etc/iproute2 ]]; then cp -a /etc/iproute2 "$stage/etc/"; fi
if [[ -d /usr/share/iproute2 ]]; then mkdir -p "$stage/usr/share" && cp -a /usr/share/iproute2 "$stage/usr/share/"; fi

# /init
install -m 755 "$VM_DIR/guest-init.sh" "$stage/init"

(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
	cpio --null -o -H newc -R 0:0 --quiet) >"$out.tmp"
mv "$out.tmp" "$out"
# Drop older bases.
for old in "$VIPD_VM_CACHE"/initramfs/base-*.cpio; do
	[[ $old == "$out" ]] || rm -f "$old"
done
log "base initramfs built in $(elapsed "$t0") s: $(du -h "$out" | cut -f1)"
echo "$out"
