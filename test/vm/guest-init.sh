#!/bin/bash
# guest-init.sh — /init (PID 1) of the vipd test guest. Runs INSIDE the guest.
#
# Mounts the usual filesystems, brings lo up, loads the kernel modules the
# tests need, runs the command that run.sh put in the payload archive
# (/payload/.vipd-vm/argv, NUL-separated, run in /payload), prints
#   VIPD-VM-EXIT=<rc> token=<VIPD_VM_TOKEN>
# on the console and powers the machine off. Kernel command-line words KEY=VAL
# arrive here as environment variables and are passed on to the command.
#
# PID 1 must never exit (the kernel would panic), so no 'set -e' here.
set +e -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/usr/lib/busybox
export HOME=/root LANG=C.UTF-8 VIPD_VM=1
umask 022

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
exec </dev/null >/dev/console 2>&1
# run.sh boots with loglevel=7 so the log has the whole boot; from here on
# only errors and worse reach the console (VIPD_VM_LOGLEVEL=7 for everything).
echo "${VIPD_VM_LOGLEVEL:-4}" >/proc/sys/kernel/printk

uptime_s() { read -r up _ </proc/uptime && echo "$up"; }
echo "VIPD-VM-INIT uptime=$(uptime_s)"

hostname -F /etc/hostname
ip link set lo up

# Modules: names listed by prepare.sh; modprobe resolves their dependencies.
t_mod=$(uptime_s)
# shellcheck disable=SC2046
if ! modprobe -a $(cat /etc/vipd-vm/modules); then
	echo "vipd-vm: WARNING: some modules failed to load"
fi
echo "vipd-vm: $(wc -l </proc/modules) modules loaded in $(awk -v a="$t_mod" -v b="$(uptime_s)" 'BEGIN { printf "%.1f", b - a }') s"

rc=127
argv=/payload/.vipd-vm/argv
if [[ -r $argv ]]; then
	mapfile -d '' -t cmd <"$argv"
	echo "vipd-vm: running: ${cmd[*]}"
	echo "vipd-vm: ready at uptime $(uptime_s) s"
	cd /payload && "${cmd[@]}"
	rc=$?
else
	echo "vipd-vm: no $argv: nothing to run (was the payload archive appended?)"
fi

echo "vipd-vm: command exited $rc at uptime $(uptime_s) s"
echo "VIPD-VM-EXIT=$rc token=${VIPD_VM_TOKEN:-none}"
# Also through printk, which the kernel flushes before powering off.
echo "<0>VIPD-VM-EXIT=$rc token=${VIPD_VM_TOKEN:-none}" >/dev/kmsg
sleep 0.2
poweroff -f
# Should not get here; if it does, make qemu exit (-no-reboot) anyway.
echo o >/proc/sysrq-trigger
sleep 5
echo b >/proc/sysrq-trigger
