#!/bin/sh
# Loads vipd's kernel modules and settings now rather than at next boot, and
# tells systemd about the unit. It does not start vipd: edit
# /etc/vipd/vipd.toml, then `systemctl enable --now vipd`.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
	systemctl restart systemd-modules-load.service || true
	systemctl restart systemd-sysctl.service || true
fi
