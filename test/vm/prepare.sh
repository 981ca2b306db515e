#!/usr/bin/env bash
# prepare.sh — make the host ready to boot the real-kernel test guest.
#
#   test/vm/prepare.sh            # idempotent; a warm run takes well under 2 s
#
# 1. Installs the Debian packages the rig needs, but only when one of their
#    binaries is missing (a warm run does no apt work at all).
# 2. Downloads Debian 12's cloud kernel package (name resolved from
#    linux-image-cloud-amd64's dependency), unpacks it with dpkg-deb -x into
#    $VIPD_VM_CACHE (default /var/cache/vipd-vm), runs depmod.
# 3. Resolves the dependency closure of the kernel modules the tests need.
# 4. Builds (or reuses) the cached base initramfs (initramfs.sh).
# 5. Writes $VIPD_VM_CACHE/state.env for run.sh and prints what is cached.
#
# Environment:
#   VIPD_VM_CACHE       cache directory (default /var/cache/vipd-vm)
#   VIPD_VM_KERNEL_PKG  force a kernel package name (default: resolved)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
[[ $(id -u) == 0 ]] || die "prepare.sh must run as root (apt-get, depmod, mknod)"

# ---------------------------------------------------------------------------
# 1. Host packages: "binary:package" pairs. A package is installed only when
#    its binary is missing.
# ---------------------------------------------------------------------------
HOST_NEEDS=(
	qemu-system-x86_64:qemu-system-x86
	ipvsadm:ipvsadm
	xtables-legacy-multi:iptables
	xtables-nft-multi:iptables
	ipset:ipset
	ip:iproute2
	modprobe:kmod
	depmod:kmod
	cpio:cpio
	curl:curl
	socat:socat
	arping:iputils-arping
	nft:nftables
	conntrack:conntrack
	tcpdump:tcpdump
	dpkg-deb:dpkg
	apt-get:apt
)
# sbin directories are not always in root's PATH (e.g. under sudo or CI).
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin

apt_updated=0
apt_update_once() {
	if ((apt_updated == 0)); then
		log "apt-get update"
		apt-get update -q >/dev/null
		apt_updated=1
	fi
}

missing=()
for pair in "${HOST_NEEDS[@]}"; do
	bin=${pair%%:*} pkg=${pair#*:}
	command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
done
# The guest needs a *static* busybox (the dynamic 'busybox' package would
# work too, but static is one file with no library closure to get wrong).
if ! [[ -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then
	missing+=(busybox-static)
fi
if ((${#missing[@]})); then
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	apt_update_once
	log "installing: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		"${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------------------
# 2. Kernel: Debian 12 cloud kernel, unpacked (not installed) into the cache.
# ---------------------------------------------------------------------------
mkdir -p "$VIPD_VM_CACHE"
# One prepare at a time per cache; run.sh holds a shared lock while it reads
# the cache, so a rebuild never deletes a base initramfs a boot is about to use.
exec 9>"$VIPD_VM_CACHE/.lock"
flock 9
# resolve_kernel: print "PACKAGE VERSION" of the kernel that
# linux-image-cloud-amd64 depends on. apt-cache takes ~1 s here, so the answer
# is cached and reused until the apt lists change.
resolve_kernel() {
	local key cached
	key=$(stat -c '%n %Y %s' /var/lib/apt/lists/*Packages* 2>/dev/null | sha256sum | cut -c1-16)
	cached=$VIPD_VM_CACHE/kernel-resolved
	if [[ -s $cached && $(cut -d' ' -f1 "$cached") == "$key" ]]; then
		cut -d' ' -f2- "$cached"
		return
	fi
	# "Depends: linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3)"
	local ans
	ans=$(apt-cache show --no-all-versions linux-image-cloud-amd64 2>/dev/null |
		sed -n 's/^Depends:.*\(linux-image-[0-9][^ ,]*\) (= \([^)]*\)).*/\1 \2/p' | sed -n 1p)
	[[ -n $ans ]] && echo "$key $ans" >"$cached"
	echo "$ans"
}
if [[ -n ${VIPD_VM_KERNEL_PKG:-} ]]; then
	kpkg=$VIPD_VM_KERNEL_PKG
	kver_pkg=$(apt-cache policy "$kpkg" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
else
	read -r kpkg kver_pkg < <(resolve_kernel) || true
	if [[ -z ${kpkg:-} ]]; then
		# No apt lists yet (fresh machine) or an old list: refresh once.
		apt_update_once
		read -r kpkg kver_pkg < <(resolve_kernel) || true
	fi
fi
if [[ -z ${kpkg:-} || -z ${kver_pkg:-} || $kver_pkg == "(none)" ]]; then
	# apt knows no kernel: fall back to whatever is already cached.
	prev=$(ls -d "$VIPD_VM_CACHE"/kernel/*/.complete 2>/dev/null | tail -n 1 || true)
	[[ -n $prev ]] || die "cannot resolve linux-image-cloud-amd64's kernel package and nothing is cached"
	kdir=$(dirname "$prev")
	log "apt cannot resolve the cloud kernel; using cached $(basename "$kdir")"
else
	kdir=$VIPD_VM_CACHE/kernel/${kpkg}_${kver_pkg}
fi

if [[ ! -e $kdir/.complete ]]; then
	log "downloading $kpkg $kver_pkg"
	tk=$(now)
	rm -rf "$kdir" "$kdir.tmp"
	mkdir -p "$kdir.tmp/deb"
	chmod 755 "$kdir.tmp/deb" # apt's _apt sandbox user must be able to write here
	(cd "$kdir.tmp/deb" && apt-get download -q "$kpkg=$kver_pkg" >/dev/null 2>&1) || {
		apt_update_once
		(cd "$kdir.tmp/deb" && apt-get download -q "$kpkg=$kver_pkg" >/dev/null)
	}
	dpkg-deb -x "$kdir.tmp"/deb/*.deb "$kdir.tmp/root"
	rm -rf "$kdir.tmp/deb"
	mv "$kdir.tmp/root" "$kdir"
	rmdir "$kdir.tmp"
	kver=$(basename "$(ls -d "$kdir"/lib/modules/*/)")
	# The package ships no modules.dep: generate it.
	depmod -b "$kdir" "$kver"
	touch "$kdir/.complete"
	log "kernel $kver unpacked in $(elapsed "$tk") s"
	# Keep only the kernel in use.
	for old in "$VIPD_VM_CACHE"/kernel/*/; do
		[[ ${old%/} == "$kdir" ]] || rm -rf "${old%/}"
	done
fi
KVER=$(basename "$(ls -d "$kdir"/lib/modules/*/)")
VMLINUZ=$kdir/boot/vmlinuz-$KVER
MODDIR=$kdir
[[ -r $VMLINUZ ]] || die "no kernel image at $VMLINUZ"

# ---------------------------------------------------------------------------
# 3. Module closure. REQUIRED must all exist in this kernel; OPTIONAL are
#    taken when present. The guest loads them all at boot (and the kernel
#    can autoload the rest of the closure through the guest's modprobe).
# ---------------------------------------------------------------------------
REQUIRED_MODULES=(
	# IPVS and every scheduler of 6.1 (there is no 'twos' in 6.1)
	ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_lblc ip_vs_lblcr
	ip_vs_dh ip_vs_sh ip_vs_sed ip_vs_nq ip_vs_fo ip_vs_ovf ip_vs_mh
	# interfaces and tunnels
	dummy veth bridge ipip ip_tunnel fou ip_gre ip6_tunnel
	# netfilter / iptables (IPv4 and IPv6)
	nf_conntrack nf_nat
	iptable_nat iptable_filter iptable_mangle iptable_raw
	ip6table_nat ip6table_filter ip6table_mangle ip6table_raw
	xt_ipvs xt_set xt_mark xt_MASQUERADE xt_nat xt_comment xt_addrtype
	xt_conntrack xt_multiport xt_tcpudp
	# ipset types
	ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_net
	ip_set_hash_ipportip ip_set_hash_ipportnet
	# nftables
	nf_tables nft_compat nft_masq nft_nat nft_ct nft_chain_nat
	# raw sockets (ARP / NDP announcements)
	af_packet
)
OPTIONAL_MODULES=(
	ipv6 tun fou6 ip6_gre sit
	ip_set_hash_netport ip_set_bitmap_port ip_set_list_set
	xt_statistic xt_REDIRECT xt_LOG ipt_REJECT ip6t_REJECT
	nft_reject_inet nft_fib_inet nft_limit nf_conntrack_netlink
)
modlist=$VIPD_VM_CACHE/modules-$KVER.list
modkey=$(printf '%s\n' "${REQUIRED_MODULES[@]}" -- "${OPTIONAL_MODULES[@]}" | sha256sum | cut -c1-16)
if [[ ! -s $modlist || $(head -n 1 "$modlist") != "# $modkey" ]]; then
	found=()
	for m in "${REQUIRED_MODULES[@]}"; do
		modprobe -d "$MODDIR" -S "$KVER" --show-depends "$m" >/dev/null 2>&1 ||
			die "kernel $KVER has no module '$m'"
		found+=("$m")
	done
	for m in "${OPTIONAL_MODULES[@]}"; do
		if modprobe -d "$MODDIR" -S "$KVER" --show-depends "$m" >/dev/null 2>&1; then
			found+=("$m")
		else
			log "optional module '$m' not in $KVER: skipped"
		fi
	done
	# "insmod /path/x.ko" lines in load order; "builtin x" lines are skipped.
	{
		echo "# $modkey"
		echo "# modules: ${found[*]}"
		modprobe -d "$MODDIR" -S "$KVER" -a --show-depends "${found[@]}" |
			awk '$1 == "insmod" { print $2 }' | awk '!seen[$0]++'
	} >"$modlist.tmp"
	mv "$modlist.tmp" "$modlist"
fi
mapfile -t kofiles < <(grep -v '^#' "$modlist")
modnames=$(sed -n 's/^# modules: //p' "$modlist")

# ---------------------------------------------------------------------------
# 4. Base initramfs (cached, keyed by its inputs).
# ---------------------------------------------------------------------------
BASE_INITRD=$("$VM_DIR/initramfs.sh" "$KVER" "$MODDIR" "$modlist")

# ---------------------------------------------------------------------------
# 5. State for run.sh.
# ---------------------------------------------------------------------------
cat >"$VM_STATE_FILE.tmp" <<EOF
KVER=$KVER
VMLINUZ=$VMLINUZ
MODDIR=$MODDIR
BASE_INITRD=$BASE_INITRD
EOF
mv "$VM_STATE_FILE.tmp" "$VM_STATE_FILE"

kosize=$(cd "$MODDIR/lib/modules/$KVER" && du -ch "${kofiles[@]}" 2>/dev/null | tail -n 1 | cut -f1)
cat <<EOF
vipd-vm cache: $VIPD_VM_CACHE
  kernel:    $KVER ($(basename "$kdir"))
  vmlinuz:   $VMLINUZ ($(du -h "$VMLINUZ" | cut -f1))
  modules:   ${#kofiles[@]} .ko files ($kosize) for: $modnames
  initramfs: $BASE_INITRD ($(du -h "$BASE_INITRD" | cut -f1))
  qemu:      $(qemu-system-x86_64 --version | sed -n 1p)
prepare.sh done in $(elapsed "$t0") s
EOF
