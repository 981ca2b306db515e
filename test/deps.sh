#!/usr/bin/env bash
# Installs the host packages vipd's root tests use, only when missing.
set -euo pipefail
need=()
command -v iptables-legacy-restore >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
command -v ip >/dev/null || need+=(iproute2)
command -v arping >/dev/null || need+=(arping)
command -v curl >/dev/null || need+=(curl)
# test/bench checks its keepalived.conf fixtures with `keepalived -t`.
[ -x /usr/sbin/keepalived ] || need+=(keepalived)
# ha/bgp's interop tests and the BGP e2e tests' router run bird2.
[ -x /usr/sbin/bird ] || need+=(bird2)
if ((${#need[@]})); then
	echo "deps: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
