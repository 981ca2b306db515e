#!/usr/bin/env bash
# Installs the host packages vipd's root tests use, only when missing.
set -euo pipefail
need=()
command -v iptables-legacy-restore >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
command -v ip >/dev/null || need+=(iproute2)
command -v arping >/dev/null || need+=(arping)
command -v curl >/dev/null || need+=(curl)
# agent's lock tests take the lock as another user with flock(1).
command -v flock >/dev/null || need+=(util-linux)
# test/bench checks its keepalived.conf fixtures with `keepalived -t`.
[ -x /usr/sbin/keepalived ] || need+=(keepalived)
# ha/bgp's interop tests and the BGP e2e tests' router run bird2.
[ -x /usr/sbin/bird ] || need+=(bird2)
if ((${#need[@]})); then
	echo "deps: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# cmd/vipd's status page test loads the page in headless Chromium: it
# skips without it, unless CI=true, where a failed install fails.
if ! command -v chromium >/dev/null; then
	echo "deps: installing chromium"
	if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
		[ "${CI:-}" = true ] && { echo "deps: cannot install chromium" >&2; exit 1; }
		echo "deps: cannot install chromium; the status page's browser test will skip" >&2
	fi
fi
# migrate's tests import the sample configurations of keepalived's package;
# a host whose dpkg leaves out /usr/share/doc gets them from the package.
samples=/usr/share/doc/keepalived/samples
if [ ! -d "$samples" ]; then
	echo "deps: extracting keepalived's samples into $samples"
	tmp=$(mktemp -d)
	(cd "$tmp" && apt-get download keepalived >/dev/null 2>&1 || { apt-get update -qq && apt-get download keepalived >/dev/null; })
	dpkg-deb --fsys-tarfile "$tmp"/keepalived_*.deb | tar -x -C / ".$samples"
	rm -rf "$tmp"
fi
