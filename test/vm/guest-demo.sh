#!/bin/bash
# guest-demo.sh — runs INSIDE the guest for demo.sh (`make demo`).
#
# Builds the NAT topology (topo.sh), starts `vipd run -c /payload/demo.toml`
# (or, while vipd has no working `run`, programs the same service with
# ipvsadm and says so loudly), sends 20 requests from the client namespace
# through the VIP, and shows ipvsadm -Ln, per-backend counts and vipd's log.
# Exits 0 only if every request was answered and every backend took a share.
set -u
source /payload/topo.sh || exit 1

cfg=/payload/demo.toml
requests=${VIPD_DEMO_REQUESTS:-20}
say() { printf '\n== %s\n' "$*"; }

# The first service of the config: its VIP and port.
vip=$(sed -n 's/^[[:space:]]*vip[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$cfg" | sed -n 1p)
port=$(sed -n 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*\([0-9]*\).*/\1/p' "$cfg" | sed -n 1p)
port=${port:-80}
[[ -n $vip ]] || { echo "demo: no 'vip = \"...\"' in $cfg"; exit 1; }

say "topology: client ns -> LB (this root namespace) -> 2 backends (NAT)"
topo_nat 2 || exit 1
topo_env | sed 's/^/   /'
echo "   service from $cfg: $vip:$port"

# --- the load balancer ----------------------------------------------------------
mode=vipd vpid=""
if [[ -x /payload/vipd ]] && /payload/vipd run --help >/dev/null 2>&1; then
	say "starting: vipd run -c $cfg"
	/payload/vipd run -c "$cfg" >/tmp/vipd.log 2>&1 &
	vpid=$!
	# Ready when IPVS has the service with all its backends.
	for ((i = 0; i < 150; i++)); do
		n=$(ipvsadm -Ln -t "$vip:$port" 2>/dev/null | grep -c -- '->.*Masq\|->.*Route\|->.*Tunnel')
		((n >= TOPO_N)) && break
		kill -0 "$vpid" 2>/dev/null || break
		sleep 0.2
	done
	if ! kill -0 "$vpid" 2>/dev/null; then
		say "vipd exited early:"
		cat /tmp/vipd.log
		exit 1
	fi
	echo "   vipd (pid $vpid) programmed $vip:$port after $((i / 5)).$((i % 5 * 2)) s"
else
	mode=ipvsadm
	cat <<-EOF

	!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
	!!  'vipd run' is not available in this build: programming the same      !!
	!!  service with ipvsadm instead. This is NOT vipd balancing the traffic. !!
	!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
	EOF
	TOPO_VIP=$vip TOPO_VIP6=fd00::10 topo_vip_add vipd0
	ipvsadm -A -t "$vip:$port" -s rr
	for ip in $TOPO_BACKEND_IPS; do ipvsadm -a -t "$vip:$port" -r "$ip:$port" -m; done
	echo "vipd run unavailable; ipvsadm stand-in" >/tmp/vipd.log
fi

# --- traffic ----------------------------------------------------------------------
say "$requests requests from the client namespace to http://$vip:$port/"
json=$(topo_hit "$requests" "http://$vip:$port/")
echo "   $json"
ok=$(sed -n 's/.*"ok":\([0-9]*\).*/\1/p' <<<"$json")
counts=$(sed -n 's/.*"counts":{\([^}]*\)}.*/\1/p' <<<"$json" | tr -d '"')
say "answers per backend"
served=0
for b in $TOPO_BACKENDS; do
	c=$(tr ',' '\n' <<<"$counts" | sed -n "s/^$b:\\([0-9]*\\)$/\\1/p")
	c=${c:-0}
	printf -v bar '%*s' "$c" ''
	printf '   %-4s %3d %s\n' "$b" "$c" "${bar// /#}"
	((c > 0)) && served=$((served + 1))
done

say "ipvsadm -Ln"
ipvsadm -Ln
sleep 2.5 # IPVS counters move on a ~2 s estimator tick
say "ipvsadm -Ln --stats"
ipvsadm -Ln --stats

# --- vipd's log and shutdown -------------------------------------------------------
if [[ -n $vpid ]]; then
	say "stopping vipd (SIGTERM)"
	kill -TERM "$vpid"
	for ((i = 0; i < 50; i++)); do kill -0 "$vpid" 2>/dev/null || break; sleep 0.2; done
	kill -0 "$vpid" 2>/dev/null && { echo "   vipd still running after 10 s: killing"; kill -KILL "$vpid"; }
	wait "$vpid"
	echo "   vipd exited $?; IPVS afterwards:"
	ipvsadm -Ln | sed 's/^/   /'
fi
say "vipd log"
cat /tmp/vipd.log

say "result ($mode)"
if [[ ${ok:-0} == "$requests" && $served == "$TOPO_N" ]]; then
	echo "   all $requests requests answered, by all $TOPO_N backends"
	exit 0
fi
echo "   FAILED: $ok/$requests answered, $served/$TOPO_N backends served"
exit 1
