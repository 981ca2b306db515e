#!/usr/bin/env bash
# demo.sh — `make demo`: boot the test guest and watch vipd balance traffic.
#
#   test/vm/demo.sh [CONFIG]        # CONFIG defaults to examples/demo.toml
#
# Builds vipd (./cmd/vipd, static) and the rig's rignode, boots one guest
# that builds the NAT topology of topo.sh (client ns -> LB root ns with
# uplink 'lb-c' -> backends be1 10.0.2.11, be2 10.0.2.12), runs
# `vipd run -c /payload/demo.toml`, sends 20 requests through the VIP from the
# client namespace and prints ipvsadm -Ln, the per-backend counts and vipd's
# log (guest-demo.sh). The console streams here.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

config=${1:-$REPO_ROOT/examples/demo.toml}
[[ -r $config ]] || die "no demo configuration at $config"

"$VM_DIR/prepare.sh" >/dev/null
payload=$(mktemp -d /tmp/vipd-demo-payload.XXXXXX)
trap 'rm -rf "$payload"' EXIT
mkdir -p "$payload/bin"

cd "$REPO_ROOT"
export CGO_ENABLED=0
if compgen -G "cmd/vipd/*.go" >/dev/null; then
	go build -o "$payload/vipd" ./cmd/vipd
else
	log "no ./cmd/vipd yet: the demo will use ipvsadm"
fi
go build -ldflags='-s -w' -o "$payload/bin/rignode" ./test/e2e/cmd/rignode
cp "$config" "$payload/demo.toml"
cp "$VM_DIR/topo.sh" "$VM_DIR/guest-demo.sh" "$payload/"

"$VM_DIR/run.sh" --verbose --timeout "${VIPD_DEMO_TIMEOUT:-300}" \
	--log "${VIPD_DEMO_LOG:-/tmp/vipd-demo.log}" --payload "$payload" \
	-- bash /payload/guest-demo.sh
