#!/usr/bin/env bash
# rig.sh — build (once) the etcd and kube-apiserver that the Kubernetes
# source's integration tests run against.
#
#   test/k8s/rig.sh               # build what is missing; prints the directory
#   test/k8s/rig.sh --dir         # print the directory only, build nothing
#   test/k8s/rig.sh --kube-proxy  # also kube-proxy, of the same release (the
#                                 # benchmark's peer), recorded in
#                                 # kube-proxy.versions
#
# Each binary is built from the Go module proxy in its own throwaway module
# (kube-apiserver's needs one replace per staging module of
# k8s.io/kubernetes, generated from that release's go.mod), statically
# (CGO_ENABLED=0, so the same binaries run in the qemu guest), into
#
#   $VIPD_K8S_CACHE/$K8S_VERSION/{etcd,kube-apiserver,versions}
#
# (default /var/cache/vipd-k8s/v1.37.2). The versions file records what was
# built with what; a directory whose versions file differs is rebuilt. A
# warm run does nothing; a rebuild with a warm Go build cache takes seconds.
# source/kubernetes/apitest finds the binaries there (or in
# $VIPD_K8S_ASSETS).
#
# Environment:
#   VIPD_K8S_CACHE   cache directory (default /var/cache/vipd-k8s)
#   VIPD_K8S_FORCE=1 rebuild even when the cache is current
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
VIPD_K8S_CACHE=${VIPD_K8S_CACHE:-/var/cache/vipd-k8s}
OUT=$VIPD_K8S_CACHE/$K8S_VERSION

log() { printf '[k8s-rig %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[k8s-rig] ERROR: %s\n' "$*" >&2; exit 1; }

if [[ ${1:-} == --dir ]]; then
	echo "$OUT"
	exit 0
fi
proxy=0
if [[ ${1:-} == --kube-proxy ]]; then
	proxy=1
	shift
fi
[[ $# == 0 ]] || die "usage: $0 [--dir | --kube-proxy]"

command -v go >/dev/null || die "go is not installed"
export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false
GO_VERSION=$(go env GOVERSION)
WANT="kubernetes $K8S_VERSION
etcd $ETCD_VERSION
go $GO_VERSION
cgo 0"

base_current() {
	[[ -x $OUT/etcd && -x $OUT/kube-apiserver && -r $OUT/versions && $(<"$OUT/versions") == "$WANT" ]]
}
proxy_current() {
	((proxy == 0)) || [[ -x $OUT/kube-proxy && -r $OUT/kube-proxy.versions && $(<"$OUT/kube-proxy.versions") == "$WANT" ]]
}
current() { base_current && proxy_current; }

if current && [[ ${VIPD_K8S_FORCE:-} != 1 ]]; then
	echo "$OUT"
	exit 0
fi

mkdir -p "$VIPD_K8S_CACHE"
# One build at a time per cache; a second caller waits, then finds it done.
exec 9>"$VIPD_K8S_CACHE/.lock"
flock 9
if current && [[ ${VIPD_K8S_FORCE:-} != 1 ]]; then
	echo "$OUT"
	exit 0
fi

work=$(mktemp -d /tmp/vipd-k8s-rig.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/etcd" "$work/kube-apiserver" "$work/out"

# build NAME DIR LDFLAGS: go mod tidy and a static, stripped build of the
# throwaway module in DIR into $work/out/NAME.
build() {
	local name=$1 dir=$2 ldflags=$3 t0=$SECONDS
	log "building $name (a cold build takes minutes; later ones reuse Go's caches)"
	(cd "$dir" && go mod tidy && go build -trimpath -ldflags "$ldflags" -o "$work/out/$name" .) ||
		die "building $name failed"
	log "built $name in $((SECONDS - t0)) s, $(du -m "$work/out/$name" | cut -f1) MB"
}

# etcd: a one-line main around etcdmain.
cat >"$work/etcd/go.mod" <<EOF
module vipd.test/k8s-rig/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
cat >"$work/etcd/main.go" <<'EOF'
// Command etcd is etcd, built for vipd's Kubernetes tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF

# kube-apiserver: k8s.io/kubernetes requires its staging modules at v0.0.0
# with replaces into ./staging, which a consumer does not inherit: replace
# each with the published module of the same release.
kmod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[[ -r $kmod ]] || die "cannot download k8s.io/kubernetes@$K8S_VERSION's go.mod"
staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$kmod" | sort -u)
[[ -n $staging ]] || die "no staging replaces in $kmod"
staging_ver=v0.${K8S_VERSION#v1.}
{
	printf 'module vipd.test/k8s-rig/kube-apiserver\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n'
	printf 'require k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
	for m in $staging; do
		printf 'replace %s => %s %s\n' "$m" "$m" "$staging_ver"
	done
} >"$work/kube-apiserver/go.mod"
cat >"$work/kube-apiserver/main.go" <<'EOF'
// Command kube-apiserver is the Kubernetes API server, built for vipd's
// Kubernetes tests.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
EOF

minor=${K8S_VERSION#v1.}
minor=${minor%%.*}
version_flags="-s -w \
-X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
-X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor \
-X k8s.io/component-base/version.gitTreeState=clean"

# kube-proxy (--kube-proxy): the same module layout as kube-apiserver's.
mkdir -p "$work/kube-proxy"
sed 's|^module .*|module vipd.test/k8s-rig/kube-proxy|' "$work/kube-apiserver/go.mod" >"$work/kube-proxy/go.mod"
cat >"$work/kube-proxy/main.go" <<'EOF'
// Command kube-proxy is Kubernetes' service proxy, built for vipd's
// benchmark (IPVS mode against the same API server).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() { os.Exit(cli.Run(app.NewProxyCommand())) }
EOF
if ((proxy == 1)) && { ! proxy_current || [[ ${VIPD_K8S_FORCE:-} == 1 ]]; }; then
	build kube-proxy "$work/kube-proxy" "$version_flags"
	grep -q "Kubernetes $K8S_VERSION" <<<"$("$work/out/kube-proxy" --version)" ||
		die "the built kube-proxy does not say it is $K8S_VERSION"
	if base_current && [[ ${VIPD_K8S_FORCE:-} != 1 ]]; then
		cp "$work/out/kube-proxy" "$OUT/kube-proxy.new"
		printf '%s\n' "$WANT" >"$OUT/kube-proxy.versions.new"
		mv "$OUT/kube-proxy.new" "$OUT/kube-proxy"
		mv "$OUT/kube-proxy.versions.new" "$OUT/kube-proxy.versions"
		log "cached kube-proxy in $OUT"
		echo "$OUT"
		exit 0
	fi
fi

build etcd "$work/etcd" "-s -w"
build kube-apiserver "$work/kube-apiserver" "$version_flags"

grep -q "etcd Version: ${ETCD_VERSION#v}" <<<"$("$work/out/etcd" --version)" ||
	die "the built etcd does not say it is $ETCD_VERSION"
grep -q "Kubernetes $K8S_VERSION" <<<"$("$work/out/kube-apiserver" --version)" ||
	die "the built kube-apiserver does not say it is $K8S_VERSION"

printf '%s\n' "$WANT" >"$work/out/versions"
rm -rf "$OUT.new"
mkdir -p "$OUT.new"
cp "$work/out/etcd" "$work/out/kube-apiserver" "$work/out/versions" "$OUT.new/"
if [[ -x $work/out/kube-proxy ]]; then
	cp "$work/out/kube-proxy" "$OUT.new/"
	printf '%s\n' "$WANT" >"$OUT.new/kube-proxy.versions"
fi
rm -rf "$OUT"
mv "$OUT.new" "$OUT"
log "cached in $OUT"
echo "$OUT"
