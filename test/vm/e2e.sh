#!/usr/bin/env bash
# e2e.sh — `make e2e`: run the real-kernel tests in ONE qemu guest.
#
#   test/vm/e2e.sh
#
# 1. prepare.sh (packages, kernel, base initramfs; fast when done before)
# 2. builds, all static (CGO_ENABLED=0), into a payload directory:
#      vipd                ./cmd/vipd, when it exists       -> /payload/vipd
#      vipd-kubernetes     ./cmd/vipd-kubernetes            -> /payload/vipd-kubernetes
#      vipd-bgp            ./cmd/vipd-bgp                   -> /payload/vipd-bgp
#      bin/rignode         test backend/client tool          -> /payload/bin/rignode
#      tests/NN-NAME/*.test  `go test -c` of each package in $VIPD_GUEST_PKGS,
#                          then `go test -c -tags e2e ./test/e2e`, each with
#                          the package's testdata/ beside it
#      topo.sh, guest-tests.sh
# 3. boots one guest that runs every test binary in turn with -test.v
#    (guest-tests.sh), streaming the console here;
# 4. prints each binary's result and duration, the slowest tests, and a final summary line
#    "e2e: N passed, N failed" (top-level tests). Exits non-zero if anything
#    failed or the guest did not finish.
#
# Environment:
#   VIPD_GUEST_PKGS        space-separated Go packages whose (root-only) tests
#                          must run in the guest, e.g. "./internal/ipvs"
#   VIPD_GUEST_TAGS        build tags for those packages (default none)
#   VIPD_E2E_RUN           -test.run pattern passed to every test binary
#   VIPD_E2E_COUNT         -test.count passed to every test binary (run each
#                          test N times in a row in the one guest: flakiness)
#   VIPD_E2E_TAGS          more build tags for ./test/e2e (habench: the failover benchmark)
#   VIPD_E2E_TEST_TIMEOUT  -test.timeout per binary (default 25m)
#   VIPD_E2E_TIMEOUT       whole-guest timeout in seconds (default 2400)
#   VIPD_E2E_LOG           console log file (default /tmp/vipd-e2e-DATE.log)
#   VIPD_E2E_QUIET=1       do not stream the console (summary only)
#   VIPD_E2E_EXPECT_FAIL=1 make a rig self-test assert something false
#                          (selftest.sh uses it to prove failures fail the run)
#   VIPD_E2E_K8S           1: put etcd and kube-apiserver (test/k8s/rig.sh,
#                          built when missing) in the payload, /payload/k8s,
#                          for the Kubernetes tests, and boot with 2 GB; 0: not.
#                          Default 1 when VIPD_E2E_RUN is empty or names
#                          Kubernetes, else 0.
#   VIPD_E2E_MEM           guest memory in MB (default 1024; 2048 with VIPD_E2E_K8S)
#   VIPD_E2E_SLOWEST       how many of the slowest tests the summary lists (default 12)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
"$VM_DIR/prepare.sh" >/dev/null
log "prepare.sh: $(elapsed "$t0") s"

payload=$(mktemp -d /tmp/vipd-e2e-payload.XXXXXX)
trap 'rm -rf "$payload"' EXIT
mkdir -p "$payload/bin" "$payload/tests"
: >"$payload/tests/list"

cd "$REPO_ROOT"
export CGO_ENABLED=0
tb=$(now)
# vipd itself, once it exists.
if compgen -G "cmd/vipd/*.go" >/dev/null; then
	# As make build builds them (-trimpath, no symbol tables): the
	# guest runs, and the benchmarks measure, what ships.
	go build -trimpath -ldflags='-s -w' -o "$payload/vipd" ./cmd/vipd
	# The Kubernetes provider, beside vipd where it looks for it.
	go build -trimpath -ldflags='-s -w' -o "$payload/vipd-kubernetes" ./cmd/vipd-kubernetes
	# The BGP speaker, beside vipd where it looks for it.
	go build -trimpath -tags grpcnotrace -ldflags='-s -w' -o "$payload/vipd-bgp" ./cmd/vipd-bgp
	log "built vipd, vipd-kubernetes and vipd-bgp"
fi
go build -ldflags='-s -w' -o "$payload/bin/rignode" ./test/e2e/cmd/rignode

# add_test NAME PKG [go test -c flags...]: compile PKG's tests into the payload.
n=0
add_test() {
	local name=$1 pkg=$2 dir
	shift 2
	n=$((n + 1))
	dir=$(printf '%02d-%s' "$n" "$name")
	mkdir -p "$payload/tests/$dir"
	go test -c -ldflags="-s -w" "$@" -o "$payload/tests/$dir/$name.test" "$pkg"
	if [[ ! -e $payload/tests/$dir/$name.test ]]; then
		log "$pkg has no tests: skipped"
		rm -rf "${payload:?}/tests/$dir"
		return
	fi
	local src
	src=$(go list "$@" -f '{{.Dir}}' "$pkg")
	if [[ -d $src/testdata ]]; then cp -a "$src/testdata" "$payload/tests/$dir/"; fi
	echo "$dir $name.test" >>"$payload/tests/list"
}
for pkg in ${VIPD_GUEST_PKGS:-}; do
	name=$(go list -f '{{.ImportPath}}' "$pkg")
	name=${name#github.com/vipd/vipd/}
	add_test "${name//\//_}" "$pkg" ${VIPD_GUEST_TAGS:+-tags "$VIPD_GUEST_TAGS"}
done
add_test e2e ./test/e2e -tags "e2e${VIPD_E2E_TAGS:+,$VIPD_E2E_TAGS}"
cp "$VM_DIR/topo.sh" "$VM_DIR/guest-tests.sh" "$payload/"
# The import tests load keepalived's samples (test/deps.sh installs them).
if [[ -d /usr/share/doc/keepalived/samples ]]; then cp -a /usr/share/doc/keepalived/samples "$payload/keepalived-samples"; fi
k8s=${VIPD_E2E_K8S:-}
if [[ -z $k8s ]]; then
	k8s=0
	[[ -n ${VIPD_E2E_RUN:-} && ${VIPD_E2E_RUN:-} != *Kubernetes* ]] || k8s=1
fi
mem=${VIPD_E2E_MEM:-1024}
if [[ $k8s == 1 ]]; then
	assets=$("$REPO_ROOT/test/k8s/rig.sh")
	mkdir -p "$payload/k8s"
	cp "$assets/etcd" "$assets/kube-apiserver" "$payload/k8s/"
	mem=${VIPD_E2E_MEM:-2048}
fi
log "built $(wc -l <"$payload/tests/list") test binaries in $(elapsed "$tb") s ($(du -sh "$payload" | cut -f1) payload)"

# Guest parameters travel on the kernel command line.
envs=()
for v in VIPD_E2E_RUN VIPD_E2E_COUNT VIPD_E2E_TEST_TIMEOUT VIPD_E2E_EXPECT_FAIL VIPD_HA_BENCH_N VIPD_HEALTHBENCH_SIZES VIPD_HEALTHBENCH_WINDOW VIPD_HEALTHBENCH_SAMPLES VIPD_HEALTHBENCH_PEERS VIPD_HEALTHBENCH_SIDES VIPD_HEALTHBENCH_GOGC; do
	[[ -z ${!v:-} ]] || envs+=(--env "$v=${!v}")
done
[[ $k8s != 1 ]] || envs+=(--env VIPD_K8S_ASSETS=/payload/k8s)
logfile=${VIPD_E2E_LOG:-/tmp/vipd-e2e-$(date +%Y%m%d-%H%M%S).log}
verbose=(--verbose)
[[ ${VIPD_E2E_QUIET:-} != 1 ]] || verbose=(--quiet)

rc=0
"$VM_DIR/run.sh" "${verbose[@]}" --timeout "${VIPD_E2E_TIMEOUT:-2400}" --mem "$mem" --log "$logfile" \
	--payload "$payload" "${envs[@]}" -- bash /payload/guest-tests.sh || rc=$?

# --- summary ---------------------------------------------------------------------
clean=$(mktemp)
tr -d '\r' <"$logfile" >"$clean"
echo
echo "==================== vipd e2e summary ===================="
while read -r dir _; do
	line=$(grep -E "^VIPD-E2E-RESULT $dir " "$clean" | tail -n 1 || true)
	if [[ -z $line ]]; then
		printf '  %-40s DID NOT FINISH\n' "$dir"
		[[ $rc != 0 ]] || rc=1
		continue
	fi
	brc=$(sed -n 's/.* rc=\([0-9]*\).*/\1/p' <<<"$line")
	secs=$(sed -n 's/.* secs=\([0-9.]*\).*/\1/p' <<<"$line")
	printf '  %-40s %-4s %6s s\n' "$dir" "$([[ $brc == 0 ]] && echo ok || echo FAIL)" "$secs"
done <"$payload/tests/list"
# The slowest top-level tests (go test -v's "--- PASS: TestX (12.34s)"):
# where the suite's time goes.
echo "  slowest tests:"
sed -nE 's/^--- (PASS|FAIL|SKIP): ([^ ]+) \(([0-9.]+)s\)$/\3 \2 \1/p' "$clean" | sort -rn | sed -n "1,${VIPD_E2E_SLOWEST:-12}p" |
	awk '{ printf "    %8.1f s  %s%s\n", $1, $2, ($3 == "PASS" ? "" : " (" $3 ")") }'
passed=$(grep -cE '^--- PASS: ' "$clean" || true)
failed=$(grep -cE '^--- FAIL: ' "$clean" || true)
if ((failed)); then
	echo "  failed tests:"
	grep -E '^--- FAIL: ' "$clean" | sed 's/^/    /'
fi
rm -f "$clean"
echo "  console log: $logfile"
echo "  total: $(elapsed "$t0") s"
if ((rc != 0)) && ((failed == 0)); then
	# The guest died or timed out: make sure the count says so.
	failed=1
	echo "  the guest did not finish its run (run.sh exit $rc)"
fi
echo "e2e: $passed passed, $failed failed"
((rc == 0 && failed == 0))
