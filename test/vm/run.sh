#!/usr/bin/env bash
# run.sh — boot the test guest once, run one command in it, return its status.
#
#   test/vm/run.sh [options] [--payload DIR] -- CMD [ARGS...]
#
# Options:
#   --payload DIR    copy DIR into the guest at /payload (the command runs there)
#   --timeout SECS   kill the guest after SECS seconds (default 300)
#   --mem MB         guest memory (default 1024)
#   --boot-timeout S a boot that has not started /init after S seconds is hung
#                    (default 120)
#   --boot-retries N boot again up to N times when /init never started: hung
#                    or crashed early boots (default 1)
#   --smp N          guest CPUs (default 2)
#   --log FILE       console log (default: a new /tmp/vipd-vm-*.log, kept)
#   --env KEY=VAL    pass KEY=VAL to the guest command's environment (through
#                    the kernel command line: no spaces or quotes); repeatable
#   --append ARGS    extra kernel command-line words (also: $VIPD_VM_APPEND)
#   --initrd FILE    boot FILE (a plain cpio) instead of the cached base
#                    initramfs; the payload is appended to it all the same
#                    (the systemd guest: systemd-image.sh, systemd-test.sh)
#   --verbose        stream the whole console to stdout while it runs
#   --quiet          print nothing but errors and the timing line
#
# Without --verbose the command's own output (console lines between the
# start and the exit marker) is printed after the guest stops.
#
# Exit status: the guest command's status when the guest printed its exit
# marker; otherwise 124 on timeout (or a boot that hung on every try) and 125
# on any other failure (kernel panic, guest crash, qemu error), with the last
# 80 console lines on stderr.
#
# How: the cached base initramfs (prepare.sh) gets a second, uncompressed cpio
# archive appended holding the payload and the command (/payload/.vipd-vm/argv);
# the kernel unpacks both. qemu runs with software emulation (KVM does not
# work on these machines) and no network device at all.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }

timeout=300 mem=1024 smp=2 logfile="" payload="" verbose=0 quiet=0
boot_timeout=120 boot_retries=1
append=${VIPD_VM_APPEND:+ $VIPD_VM_APPEND}
envs=() initrd_base=""
while (($#)); do
	case $1 in
	--payload) payload=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--boot-timeout) boot_timeout=$2; shift 2 ;;
	--boot-retries) boot_retries=$2; shift 2 ;;
	--smp) smp=$2; shift 2 ;;
	--log) logfile=$2; shift 2 ;;
	--env) envs+=("$2"); shift 2 ;;
	--append) append="$append $2"; shift 2 ;;
	--initrd) initrd_base=$2; shift 2 ;;
	--verbose) verbose=1; shift ;;
	--quiet) quiet=1; shift ;;
	--) shift; break ;;
	-h | --help) usage ;;
	*) echo "run.sh: unknown option '$1'" >&2; usage ;;
	esac
done
(($#)) || { echo "run.sh: no command given" >&2; usage; }
[[ -z $payload || -d $payload ]] || die "--payload $payload is not a directory"
[[ -z $initrd_base || -r $initrd_base ]] || die "--initrd $initrd_base is not readable"
[[ $timeout =~ ^[0-9]+$ && $boot_timeout =~ ^[0-9]+$ && $boot_retries =~ ^[0-9]+$ ]] ||
	die "--timeout, --boot-timeout and --boot-retries take whole numbers"
for kv in "${envs[@]}"; do
	[[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*=[^[:space:]\"\']*$ ]] ||
		die "--env '$kv': need KEY=VAL with no spaces or quotes (put data in the payload instead)"
done

t_start=$(now)
# Cheap when nothing changed (~0.3 s); rebuilds the base initramfs when the
# guest scripts or host tools changed.
"$VM_DIR/prepare.sh" >/dev/null
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: run test/vm/prepare.sh"

work=$(mktemp -d /tmp/vipd-vm-run.XXXXXX)
if [[ -z $logfile ]]; then
	logfile=$(mktemp /tmp/vipd-vm-XXXXXX.log)
fi
: >"$logfile"
qpid="" tailpid=""
cleanup() {
	# Never leave a guest or a tail running, whatever happened.
	if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
		kill -KILL "$qpid" 2>/dev/null || true
		wait "$qpid" 2>/dev/null || true
	fi
	if [[ -n $tailpid ]]; then kill "$tailpid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- payload archive ----------------------------------------------------------
mkdir -p "$work/root/payload/.vipd-vm"
if [[ -n $payload ]]; then
	# Hard links when possible (same filesystem), a copy otherwise.
	cp -al "$payload/." "$work/root/payload/" 2>/dev/null ||
		cp -a "$payload/." "$work/root/payload/"
fi
printf '%s\0' "$@" >"$work/root/payload/.vipd-vm/argv"
(cd "$work/root" && find payload -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$work/payload.cpio"
# The kernel unpacks concatenated cpio archives one after the other.
(
	flock -s 9 # see prepare.sh
	load_state
	cat "${initrd_base:-$BASE_INITRD}" "$work/payload.cpio" >"$work/initrd.cpio"
	cp "$VMLINUZ" "$work/vmlinuz"
	echo "$KVER" >"$work/kver"
) 9>"$VIPD_VM_CACHE/.lock"
KVER=$(cat "$work/kver")

# --- boot -----------------------------------------------------------------------
# One boot; sets token t_boot t_init t_end qrc outcome ("" when qemu stopped by
# itself, "timeout", or "boot-timeout" when /init never started).
boot() {
	token=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
	# loglevel=7: the whole boot is in the log (/init lowers the console level
	# to 4 for the tests). panic=-1: reboot at once on panic, and -no-reboot
	# turns that into qemu exiting. oops=panic, softlockup_panic=1: a broken
	# kernel ends the run now instead of at the timeout. panic_on_rcu_stall:
	# the emulator has locked a vCPU up with its timers stopped, which the
	# soft-lockup watchdog (a timer itself) never saw; the run hung until
	# its timeout (once in a make bench, whose figures would be void anyway).
	local cmdline="console=ttyS0 loglevel=7 panic=-1 oops=panic softlockup_panic=1 sysctl.kernel.panic_on_rcu_stall=1 VIPD_VM_TOKEN=$token ${envs[*]}$append"
	local qemu=(
		qemu-system-x86_64
		-accel tcg,thread=multi -cpu max -M q35 -smp "$smp" -m "$mem"
		-nodefaults -display none -no-reboot -serial stdio
		-kernel "$work/vmlinuz" -initrd "$work/initrd.cpio" -append "$cmdline"
	)
	: >"$logfile"
	t_boot=$(now) t_init="" outcome=""
	"${qemu[@]}" </dev/null >>"$logfile" 2>&1 &
	qpid=$!
	if ((verbose)); then
		# From /init on (the boot messages stay in the log file). tail ends
		# by itself within a second of qemu; sed -u does not buffer.
		tail -n +1 -f --pid="$qpid" -s 0.2 "$logfile" |
			sed -u -n '/VIPD-VM-INIT uptime=/,$ { s/\r$//; p }' &
		tailpid=$!
	fi
	local deadline boot_deadline
	deadline=$(awk -v a="$t_boot" -v t="$timeout" 'BEGIN { printf "%d", a + t }')
	boot_deadline=$(awk -v a="$t_boot" -v t="$boot_timeout" 'BEGIN { printf "%d", a + t }')
	while kill -0 "$qpid" 2>/dev/null; do
		if [[ -z $t_init ]]; then
			if grep -aq 'VIPD-VM-INIT uptime=' "$logfile"; then
				t_init=$(now)
			elif ((${EPOCHREALTIME%.*} >= boot_deadline)); then
				outcome=boot-timeout
			fi
		fi
		((${EPOCHREALTIME%.*} < deadline)) || outcome=timeout
		if [[ -n $outcome ]]; then
			kill -TERM "$qpid" 2>/dev/null || true
			sleep 1
			kill -KILL "$qpid" 2>/dev/null || true
			break
		fi
		sleep 0.1
	done
	qrc=0
	wait "$qpid" || qrc=$?
	qpid=""
	t_end=$(now)
	if [[ -n $tailpid ]]; then
		wait "$tailpid" 2>/dev/null || true # prints the last lines, then ends
		tailpid=""
	fi
}

((quiet)) || log "booting $KVER (payload $(du -sh "$work/payload.cpio" | cut -f1), timeout ${timeout}s, log $logfile)"
# A boot that never reaches /init (seen once in ~30 boots on a loaded host: a
# soft lockup in early kernel init under TCG) is retried; anything after /init
# started is the command's business and is never retried.
for ((attempt = 0; ; attempt++)); do
	boot
	[[ -z $t_init ]] && ((attempt < boot_retries)) || break
	hung=${logfile%.log}.boot$((attempt + 1))-failed.log
	cp "$logfile" "$hung"
	log "boot did not reach /init (${outcome:-qemu exit $qrc} after $(elapsed "$t_boot" "$t_end") s; console in $hung): booting again"
done

timing="boot to /init $([[ -n $t_init ]] && elapsed "$t_boot" "$t_init" || echo '?') s, guest $(elapsed "$t_boot" "$t_end") s, total $(elapsed "$t_start" "$t_end") s"

# --- result ---------------------------------------------------------------------
marker=$(grep -ao "VIPD-VM-EXIT=[0-9]* token=$token" "$logfile" | tail -n 1 || true)
if [[ -n $marker ]]; then
	rc=${marker#VIPD-VM-EXIT=}
	rc=${rc%% *}
	if ((!verbose && !quiet)); then
		# The command's output: the console after the "ready" line, less
		# the rig's own closing lines.
		tr -d '\r' <"$logfile" | awk -v tok="token=$token" '
			index($0, tok) || /^vipd-vm: command exited/ || /reboot: Power down/ { next }
			on { print }
			/^vipd-vm: ready at uptime/ { on = 1 }'
	fi
	log "guest command exited $rc ($timing)"
	exit "$rc"
fi

# No marker: the guest did not finish its command.
if [[ $outcome == timeout ]]; then
	why="TIMEOUT: guest still running after ${timeout}s, killed"
	rc=124
elif [[ $outcome == boot-timeout ]]; then
	why="BOOT HUNG: /init did not start within ${boot_timeout}s ($((attempt + 1)) boots)"
	rc=124
elif grep -aq 'Kernel panic' "$logfile"; then
	why="KERNEL PANIC in the guest (qemu exit $qrc)"
	rc=125
else
	why="guest stopped without the exit marker (qemu exit $qrc)"
	rc=125
fi
{
	echo "================ vipd-vm: last 80 console lines ($logfile) ================"
	tail -n 80 "$logfile" | tr -d '\r'
	echo "=========================================================================="
	echo "vipd-vm: FAILED: $why ($timing)"
} >&2
exit "$rc"
