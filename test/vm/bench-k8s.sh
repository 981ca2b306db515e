#!/usr/bin/env bash
# bench-k8s.sh — the Kubernetes part of `make bench` (issue 18): in ONE
# boot of the test guest, a real etcd and kube-apiserver with N
# LoadBalancer Services (one endpoint each); vipd (endpoints mode), then
# kube-proxy of the same release in IPVS mode, program them. For each it
# times EndpointSlice updates at the API server until IPVS has the new real
# server (p50/p99), and takes its CPU (over the updates) and RSS
# (test/bench/k8s, build tag k8sbench).
#
#   test/vm/bench-k8s.sh
#
# Environment (defaults in brackets):
#   VIPD_BENCH_K8S_SIZES    Service counts, comma-separated [1000]
#   VIPD_BENCH_K8S_SAMPLES  updates timed per system and size [30]
#   VIPD_BENCH_K8S_CONVERGE_S  how long each system has from its start to
#                           have every Service in IPVS; one that does not
#                           is a row saying so, with how many it had [3600]
#   VIPD_BENCH_K8S_DEADLINE_S  bounds each size from its start: creating its
#                           Services, and each system's convergence [21600]
#   VIPD_BENCH_TIMEOUT      whole guest, seconds [7200]
#   VIPD_BENCH_MEM          guest memory, MiB [3072]
#   VIPD_BENCH_OUT          output path without extension
#                           [bin/bench/bench-k8s-DATE]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

t0=$(now)
"$VM_DIR/prepare.sh" >/dev/null
assets=$("$REPO_ROOT/test/k8s/rig.sh" --kube-proxy)
payload=$(mktemp -d /tmp/vipd-bench-k8s.XXXXXX)
trap 'rm -rf "$payload"' EXIT
cd "$REPO_ROOT"
export CGO_ENABLED=0
go build -trimpath -ldflags "-s -w" -o "$payload/vipd" ./cmd/vipd
go build -trimpath -ldflags "-s -w" -o "$payload/vipd-kubernetes" ./cmd/vipd-kubernetes
go test -c -tags k8sbench -ldflags "-s -w" -o "$payload/k8sbench.test" ./test/bench/k8s
mkdir -p "$payload/k8s"
cp "$assets/etcd" "$assets/kube-apiserver" "$assets/kube-proxy" "$payload/k8s/"
log "built vipd and the benchmark in $(elapsed "$t0") s"

envs=(--env VIPD_K8S_ASSETS=/payload/k8s)
for v in VIPD_BENCH_K8S_SIZES VIPD_BENCH_K8S_SAMPLES VIPD_BENCH_K8S_CONVERGE_S VIPD_BENCH_K8S_DEADLINE_S; do
	[[ -z ${!v:-} ]] || envs+=(--env "$v=${!v}")
done
out=${VIPD_BENCH_OUT:-$REPO_ROOT/bin/bench/bench-k8s-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$(dirname "$out")"
logfile=$out.console.log
rc=0
"$VM_DIR/run.sh" --verbose --mem "${VIPD_BENCH_MEM:-3072}" --timeout "${VIPD_BENCH_TIMEOUT:-7200}" \
	--log "$logfile" --payload "$payload" "${envs[@]}" -- \
	/payload/k8sbench.test -test.v -test.timeout 2h -test.run '^TestKubernetesBench$' || rc=$?

clean=$(mktemp)
tr -d '\r' <"$logfile" >"$clean"
sed -n '/^BENCH-K8S-TABLE-BEGIN$/,/^BENCH-K8S-TABLE-END$/{/^BENCH-K8S-TABLE-/d;p}' "$clean" >"$out.txt"
sed -n '/^BENCH-K8S-JSON-BEGIN$/,/^BENCH-K8S-JSON-END$/{/^BENCH-K8S-JSON-/d;p}' "$clean" >"$out.json"
rm -f "$clean"
if [[ ! -s $out.txt ]]; then
	echo "bench-k8s: no results (guest exit $rc); console log: $logfile" >&2
	exit 1
fi
cat "$out.txt"
echo "bench-k8s: $out.txt, $out.json; console log $logfile; total $(elapsed "$t0") s"
((rc == 0))
