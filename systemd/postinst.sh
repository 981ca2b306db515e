#!/bin/sh
# Creates the unprivileged user exec health checks run as (vipd-check: a
# system user with no home and no login shell), loads vipd's kernel modules
# and settings now rather than at next boot, and tells systemd about the
# unit. It does not start vipd: edit /etc/vipd/vipd.toml, then
# `systemctl enable --now vipd`. Safe to run again (upgrades, reinstalls).
set -e
if ! getent passwd vipd-check >/dev/null; then
	useradd --system --user-group --no-create-home --home-dir /nonexistent \
		--shell /usr/sbin/nologin --comment "vipd exec health checks" vipd-check
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	systemd-tmpfiles --create vipd.conf || true
	systemctl restart systemd-modules-load.service || true
	systemctl restart systemd-sysctl.service || true
fi
