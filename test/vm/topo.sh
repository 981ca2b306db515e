# shellcheck shell=bash
# topo.sh — test topologies for the real-kernel rig. Runs INSIDE the guest only.
#
#   source /payload/topo.sh
#   topo_nat 2          # or: topo_nat 2 onearm | topo_dr 2 | topo_tun 2 [ipip|gue|gre] | topo_ha 2 [nat]
#                       # | topo_bgp 2 | topo_k8s NODES PODS [onearm]
#   topo_vip_add        # put TOPO_VIP/TOPO_VIP6 on dummy 'rigvip0' (plain-ipvsadm tests;
#                       # vipd adds its VIPs itself)
#   ipvsadm -A -t "$TOPO_VIP:80" -s rr; ...
#   topo_hit 10 "http://$TOPO_VIP/"     # from the client namespace, JSON counts
#   topo_down
#
# The load balancer is the guest's root namespace (vipd, IPVS and the VIP
# dummy live there). Every other host is a network namespace; I = 1..N.
#
# NAT (topo_nat N [onearm]):
#   client (ns 'client')  eth0 10.0.1.2/24      fd00:1::2/64   default via the LB
#   LB client side        veth 'lb-c' 10.0.1.1  fd00:1::1      ip_forward=1
#   LB backend side       bridge 'brbe' 10.0.2.1 fd00:2::1     (ports vbeI)
#   backend (ns 'beI')    eth0 10.0.2.(10+I)    fd00:2::(10+I) default via the LB
#   VIP                   10.0.0.10             fd00::10       routed to the LB
#   'onearm': the backends have no route back (SNAT needed, e.g. MASQUERADE
#   with -m ipvs plus net.ipv4.vs.conntrack=1).
#
# DR (topo_dr N) and TUN (topo_tun N [ipip|gue|gre]): one L2 segment.
#   LB                    bridge 'brlan' 10.0.3.1 fd00:3::1    (ports vcl, vbeI)
#   client (ns 'client')  eth0 10.0.3.2         fd00:3::2
#   backend (ns 'beI')    eth0 10.0.3.(10+I)    fd00:3::(10+I)
#   VIP                   10.0.3.100 (on-link: the LB answers ARP for it)
#                         fd00:3:1::100 (routed to the LB: Linux answers NDP only
#                         for addresses on the receiving interface)
#   The backends hold both VIPs on lo with arp_ignore=1/arp_announce=2. TUN also
#   brings up tunl0/ip6tnl0 (plus fou port 6080 for gue) or gre0/ip6gre0, with
#   rp_filter=0.
#
# Backends run 'rignode serve' (HTTP on :80 and :8080, UDP on :53) answering
# with their name (be1, be2, ...); without rignode, busybox httpd on :80.
# After a topo_* call these variables are set (topo_env prints them):
#   TOPO_KIND TOPO_N TOPO_VIP TOPO_VIP6 TOPO_CLIENT_NS TOPO_CLIENT_IP TOPO_CLIENT_IP6
#   TOPO_LB_IP TOPO_LB_IP6 TOPO_BACKENDS ("be1 be2") TOPO_BACKEND_IPS TOPO_BACKEND_IP6S
#   TOPO_LB_IF (LB interface facing the VIP's clients)
# Everything uses addresses that exist only inside the guest, which has no
# network device to the outside at all.

if [[ ${VIPD_VM:-} != 1 ]]; then
	echo "topo.sh: refusing to run outside the vipd test guest (VIPD_VM is not 1)" >&2
	return 1 2>/dev/null || exit 1
fi

TOPO_RIGNODE=${TOPO_RIGNODE:-/payload/bin/rignode}
TOPO_STATE=/run/vipd-rig
TOPO_TUN_GUE_PORT=6080

# 'ip' is iproute2's (PATH puts real tools before busybox applets; busybox's
# ip has no netns support). Under software emulation every exec of a
# dynamically linked tool costs 60-100 ms, so commands are batched: one
# 'ip -batch' for the root namespace, one per namespace, one sysctl call per
# namespace.

_topo_fail() { echo "topo.sh: $*" >&2; return 1; }

# _topo_sysctl NS KEY=VAL...: write sysctls in namespace NS ("" = root ns).
_topo_sysctl() {
	local ns=$1; shift
	(($#)) || return 0
	if [[ -n $ns ]]; then
		ip netns exec "$ns" busybox sysctl -q -w "$@" >/dev/null
	else
		busybox sysctl -q -w "$@" >/dev/null
	fi
}

# Batches: _topo_root CMD... and _topo_in NS CMD... queue 'ip' commands (one
# string each, without the leading 'ip'); _topo_flush runs the queues.
declare -a _TOPO_ROOT_Q=() _TOPO_NS_ORDER=()
declare -A _TOPO_NS_Q=() _TOPO_NS_SYSCTL=()
_topo_root() { _TOPO_ROOT_Q+=("$@"); }
_topo_in() {
	local ns=$1 c; shift
	[[ -v "_TOPO_NS_Q[$ns]" ]] || _TOPO_NS_ORDER+=("$ns")
	for c in "$@"; do _TOPO_NS_Q[$ns]+="$c"$'\n'; done
}
_topo_sysctl_in() {
	local ns=$1; shift
	_TOPO_NS_SYSCTL[$ns]+="${_TOPO_NS_SYSCTL[$ns]:+ }$*"
}
_topo_flush() {
	local ns rc=0
	if ((${#_TOPO_ROOT_Q[@]})); then
		printf '%s\n' "${_TOPO_ROOT_Q[@]}" | ip -batch - || rc=1
	fi
	for ns in "${_TOPO_NS_ORDER[@]}"; do
		printf '%s' "${_TOPO_NS_Q[$ns]}" | ip -n "$ns" -batch - || rc=1
		# shellcheck disable=SC2086
		_topo_sysctl "$ns" ${_TOPO_NS_SYSCTL[$ns]:-} || rc=1
	done
	_TOPO_ROOT_Q=() _TOPO_NS_ORDER=() _TOPO_NS_Q=() _TOPO_NS_SYSCTL=()
	((rc == 0)) || _topo_fail "setting up the topology failed (see above)"
}

# _topo_ns NAME: queue a namespace with lo up.
_topo_ns() {
	_topo_root "netns add $1"
	_topo_in "$1" "link set lo up"
	echo "$1" >>"$TOPO_STATE/namespaces"
}

# _topo_veth NS PEER [BRIDGE [NAME]]: queue a veth pair, NAME (default 'eth0')
# inside NS and PEER in the root namespace (enslaved to BRIDGE when not "").
_topo_veth() {
	local ns=$1 peer=$2 br=${3:-} name=${4:-eth0}
	_topo_root "link add $peer type veth peer name $name netns $ns"
	[[ -z $br ]] || _topo_root "link set $peer master $br"
	_topo_root "link set $peer up"
	_topo_in "$ns" "link set $name up"
	# topo_down deletes the root end explicitly: deleting a namespace destroys
	# its devices asynchronously, and a quick re-create would find the name taken.
	echo "$peer" >>"$TOPO_STATE/links"
}

# _topo_bridge NAME: queue a bridge that forwards at once (no STP delay).
_topo_bridge() {
	_topo_root "link add $1 type bridge stp_state 0 forward_delay 0" "link set $1 up"
	echo "$1" >>"$TOPO_STATE/links"
}

# _topo_start_backends NS...: start the backend server in each NS, then wait
# until all listen.
_topo_start_backends() {
	local ns i
	for ns in "$@"; do
		rm -f "$TOPO_STATE/$ns.ready"
		if [[ -x $TOPO_RIGNODE ]]; then
			ip netns exec "$ns" "$TOPO_RIGNODE" serve -name "$ns" -http :80,:8080 -udp :53 \
				-ready "$TOPO_STATE/$ns.ready" -down "$TOPO_STATE/$ns.down" \
				>"$TOPO_STATE/$ns.log" 2>&1 &
		else
			mkdir -p "$TOPO_STATE/www-$ns"
			echo "$ns" >"$TOPO_STATE/www-$ns/index.html"
			ip netns exec "$ns" busybox httpd -f -p 80 -h "$TOPO_STATE/www-$ns" \
				>"$TOPO_STATE/$ns.log" 2>&1 &
		fi
		echo $! >"$TOPO_STATE/$ns.pid"
	done
	for ns in "$@"; do
		for ((i = 0; i < 200; i++)); do
			if [[ -x $TOPO_RIGNODE ]]; then
				[[ -e $TOPO_STATE/$ns.ready ]] && continue 2
			else
				[[ -n $(ip netns exec "$ns" ss -Hltn 'sport = :80') ]] && continue 2
			fi
			sleep 0.05
		done
		cat "$TOPO_STATE/$ns.log" >&2
		_topo_fail "backend server in $ns did not start"
		return 1
	done
}

_topo_begin() {
	[[ ! -e $TOPO_STATE/kind ]] || _topo_fail "a topology already exists ($(cat "$TOPO_STATE/kind")): topo_down first" || return 1
	[[ ${2:-} =~ ^[1-9][0-9]?$ ]] || _topo_fail "$1: need a backend count 1..99" || return 1
	mkdir -p "$TOPO_STATE"
	: >"$TOPO_STATE/namespaces"
	: >"$TOPO_STATE/links"
	echo "$1" >"$TOPO_STATE/kind"
	TOPO_KIND=$1 TOPO_N=$2 TOPO_CLIENT_NS=client
	TOPO_BACKENDS="" TOPO_BACKEND_IPS="" TOPO_BACKEND_IP6S=""
	local i
	for ((i = 1; i <= TOPO_N; i++)); do TOPO_BACKENDS+="${TOPO_BACKENDS:+ }be$i"; done
}

_topo_finish() {
	_topo_flush || return 1
	# shellcheck disable=SC2086
	_topo_start_backends $TOPO_BACKENDS || return 1
	topo_env >"$TOPO_STATE/env"
	# The global addresses skip duplicate address detection (nodad), but
	# every interface's link-local address goes through it, and until it
	# is done a namespace solicits its IPv6 neighbours late: the first
	# packet of a fresh namespace to a new IPv6 neighbour waited a second
	# or more (a backend's first direct reply to the client in DR and TUN).
	local ns i
	for ns in "" $(cat "$TOPO_STATE/namespaces"); do
		for ((i = 0; ; i++)); do
			[[ -n $(ip ${ns:+-n "$ns"} -6 addr show scope link tentative -dadfailed) ]] || break
			((i < 100)) || _topo_fail "${ns:-the root namespace} still has tentative IPv6 addresses after 5 s" || return 1
			sleep 0.05
		done
	done
	# Sanity, and warm ARP/NDP caches: every backend answers the LB, the LB
	# answers the client, over IPv4 and IPv6; where backends answer the
	# client directly (DR, TUN), every backend reaches the client too.
	local ip
	for ip in $TOPO_BACKEND_IPS $TOPO_BACKEND_IP6S; do
		busybox ping -c 1 -W 2 "$ip" >/dev/null 2>&1 || _topo_fail "backend $ip unreachable from the LB" || return 1
	done
	for ip in "$TOPO_LB_IP" "$TOPO_LB_IP6"; do
		ip netns exec "$TOPO_CLIENT_NS" busybox ping -c 1 -W 2 "$ip" >/dev/null 2>&1 ||
			_topo_fail "LB $ip unreachable from the client" || return 1
	done
	case $TOPO_KIND in
	dr | tun-*)
		for ns in $TOPO_BACKENDS; do
			for ip in "$TOPO_CLIENT_IP" "$TOPO_CLIENT_IP6"; do
				ip netns exec "$ns" busybox ping -c 1 -W 2 "$ip" >/dev/null 2>&1 ||
					_topo_fail "client $ip unreachable from backend $ns" || return 1
			done
		done
		;;
	esac
}

# topo_nat N [onearm]: LVS-NAT topology (see the top of this file).
topo_nat() {
	local n=${1:-2} mode=${2:-} i ns
	[[ -z $mode || $mode == onearm ]] || _topo_fail "topo_nat: unknown mode '$mode'" || return 1
	_topo_begin "nat${mode:+-$mode}" "$n" || return 1
	TOPO_VIP=10.0.0.10 TOPO_VIP6=fd00::10
	TOPO_LB_IP=10.0.1.1 TOPO_LB_IP6=fd00:1::1 TOPO_LB_IF=lb-c
	TOPO_CLIENT_IP=10.0.1.2 TOPO_CLIENT_IP6=fd00:1::2

	_topo_sysctl "" net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1

	# client segment: veth lb-c <-> client:eth0
	_topo_ns client
	_topo_veth client lb-c
	_topo_root "addr add 10.0.1.1/24 dev lb-c" "addr add fd00:1::1/64 dev lb-c nodad"
	_topo_in client "addr add 10.0.1.2/24 dev eth0" "addr add fd00:1::2/64 dev eth0 nodad" \
		"route add default via 10.0.1.1" "route add default via fd00:1::1"

	# backend segment: bridge brbe, one veth per backend
	_topo_bridge brbe
	_topo_root "addr add 10.0.2.1/24 dev brbe" "addr add fd00:2::1/64 dev brbe nodad"
	for ((i = 1; i <= n; i++)); do
		ns=be$i
		_topo_ns "$ns"
		_topo_veth "$ns" "v$ns" brbe
		_topo_in "$ns" "addr add 10.0.2.$((10 + i))/24 dev eth0" "addr add fd00:2::$((10 + i))/64 dev eth0 nodad"
		if [[ -z $mode ]]; then
			_topo_in "$ns" "route add default via 10.0.2.1" "route add default via fd00:2::1"
		fi
		TOPO_BACKEND_IPS+="${TOPO_BACKEND_IPS:+ }10.0.2.$((10 + i))"
		TOPO_BACKEND_IP6S+="${TOPO_BACKEND_IP6S:+ }fd00:2::$((10 + i))"
	done
	_topo_finish
}

# _topo_lan N KIND: queue one L2 segment with LB, client and backends (DR, TUN).
# _topo_lan N KIND [nat]: the LAN with the client and, unless 'nat' (the
# caller puts them elsewhere), N direct-routing backends.
_topo_lan() {
	local n=$1 kind=$2 i ns
	_topo_begin "$kind" "$n" || return 1
	TOPO_VIP=10.0.3.100 TOPO_VIP6=fd00:3:1::100
	TOPO_LB_IP=10.0.3.1 TOPO_LB_IP6=fd00:3::1 TOPO_LB_IF=brlan
	TOPO_CLIENT_IP=10.0.3.2 TOPO_CLIENT_IP6=fd00:3::2

	_topo_bridge brlan
	_topo_root "addr add 10.0.3.1/24 dev brlan" "addr add fd00:3::1/64 dev brlan nodad"

	_topo_ns client
	_topo_veth client vcl brlan
	# Linux answers ARP for an address on any interface (the VIP on the LB's
	# dummy) but NDP only for addresses on the receiving interface, so the
	# IPv6 VIP is routed to the LB instead of being on-link.
	_topo_in client "addr add 10.0.3.2/24 dev eth0" "addr add fd00:3::2/64 dev eth0 nodad" \
		"route add fd00:3:1::/64 via fd00:3::1"

	[[ ${3:-} != nat ]] || return 0
	for ((i = 1; i <= n; i++)); do
		ns=be$i
		_topo_ns "$ns"
		_topo_veth "$ns" "v$ns" brlan
		_topo_in "$ns" "addr add 10.0.3.$((10 + i))/24 dev eth0" "addr add fd00:3::$((10 + i))/64 dev eth0 nodad" \
			"addr add 10.0.3.100/32 dev lo" "addr add fd00:3:1::100/128 dev lo nodad"
		# The VIP is local on every backend but only the LB answers ARP for it.
		_topo_sysctl_in "$ns" net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
			net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2
		TOPO_BACKEND_IPS+="${TOPO_BACKEND_IPS:+ }10.0.3.$((10 + i))"
		TOPO_BACKEND_IP6S+="${TOPO_BACKEND_IP6S:+ }fd00:3::$((10 + i))"
	done
}

# topo_dr N: LVS-DR (direct routing) topology.
topo_dr() {
	_topo_lan "${1:-2}" dr || return 1
	_topo_finish
}

# topo_tun N [ipip|gue|gre]: LVS-TUN topology; backends decapsulate. For gue
# the backends listen on UDP port $TOPO_TUN_GUE_PORT (ipvsadm --tun-port).
# topo_ha N [nat]: the DR LAN (as topo_dr) with two load balancers as
# namespaces, lb1 (eth0 10.0.3.21) and lb2 (eth0 10.0.3.22), for a pair of
# nodes that share the VIP 10.0.3.100 by VRRP. The root namespace only
# bridges: it holds no VIP and no IPVS service. Each node runs vipd (or
# keepalived) in its namespace, which makes its dummy interface there.
# With 'nat' the backends are on a second segment instead: bridge brbe
# (root 10.0.2.1, for the sanity pings), each node's eth1 10.0.2.(20+I)
# (veth vlbbI), backends beI 10.0.2.(10+I) with no VIP and a default route
# via 10.0.2.254, a floating address the master holds ([ha] addresses).
topo_ha() {
	local n=${1:-2} mode=${2:-} i ns
	[[ -z $mode || $mode == nat ]] || _topo_fail "topo_ha: unknown mode '$mode'" || return 1
	_topo_lan "$n" "ha${mode:+-$mode}" "$mode" || return 1
	for i in 1 2; do
		_topo_ns "lb$i"
		_topo_veth "lb$i" "vlb$i" brlan
		_topo_in "lb$i" "addr add 10.0.3.$((20 + i))/24 dev eth0" "addr add fd00:3::$((20 + i))/64 dev eth0 nodad"
	done
	if [[ $mode == nat ]]; then
		_topo_bridge brbe
		_topo_root "addr add 10.0.2.1/24 dev brbe"
		for i in 1 2; do
			_topo_veth "lb$i" "vlbb$i" brbe eth1
			_topo_in "lb$i" "addr add 10.0.2.$((20 + i))/24 dev eth1"
		done
		for ((i = 1; i <= n; i++)); do
			ns=be$i
			_topo_ns "$ns"
			_topo_veth "$ns" "v$ns" brbe
			_topo_in "$ns" "addr add 10.0.2.$((10 + i))/24 dev eth0" "route add default via 10.0.2.254"
			TOPO_BACKEND_IPS+="${TOPO_BACKEND_IPS:+ }10.0.2.$((10 + i))"
		done
	fi
	TOPO_LB_IP=10.0.3.21 TOPO_LB_IF=eth0
	_topo_finish
}

# topo_bgp N: two vipd nodes that announce their VIPs over BGP to a router.
#   LAN                   bridge 'brlan' (root: 10.0.3.1, fd00:3::1, only for the sanity pings)
#   router (ns 'rtr')     eth0 10.0.3.254 fd00:3::fe on the LAN; eth1 10.0.4.1 fd00:4::1
#                         towards the client; forwarding, L4 multipath hashing.
#                         The test runs bird2 there (BGP to the nodes, ECMP into the kernel).
#   nodes (ns 'lbI')      eth0 10.0.3.(20+I) fd00:3::(20+I), default via the router;
#                         vipd runs there (ip netns exec lbI vipd run ...)
#   client (ns 'client')  eth0 10.0.4.2 fd00:4::2, default via the router
#   backend (ns 'beI')    eth0 10.0.3.(10+I) fd00:3::(10+I), default via the router; the
#                         VIPs on lo with arp_ignore=1/arp_announce=2 (direct routing)
#   VIP                   10.0.5.100, fd00:5::100: routed by the router to the nodes
#                         that announce it.
topo_bgp() {
	local n=${1:-2} i ns
	_topo_begin bgp "$n" || return 1
	TOPO_VIP=10.0.5.100 TOPO_VIP6=fd00:5::100
	TOPO_LB_IP=10.0.3.21 TOPO_LB_IP6=fd00:3::21 TOPO_LB_IF=eth0
	TOPO_CLIENT_IP=10.0.4.2 TOPO_CLIENT_IP6=fd00:4::2

	_topo_bridge brlan
	_topo_root "addr add 10.0.3.1/24 dev brlan" "addr add fd00:3::1/64 dev brlan nodad"

	_topo_ns rtr
	_topo_veth rtr vrtr brlan
	_topo_in rtr "addr add 10.0.3.254/24 dev eth0" "addr add fd00:3::fe/64 dev eth0 nodad"
	_topo_sysctl_in rtr net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
		net.ipv4.fib_multipath_hash_policy=1 net.ipv6.fib_multipath_hash_policy=1

	_topo_ns client
	# A veth between two namespaces: eth1 in the router, eth0 in the client.
	_topo_root "link add eth1 netns rtr type veth peer name eth0 netns client"
	_topo_in rtr "link set eth1 up" "addr add 10.0.4.1/24 dev eth1" "addr add fd00:4::1/64 dev eth1 nodad"
	_topo_in client "link set eth0 up" "addr add 10.0.4.2/24 dev eth0" "addr add fd00:4::2/64 dev eth0 nodad" \
		"route add default via 10.0.4.1" "route add default via fd00:4::1"

	for i in 1 2; do
		_topo_ns "lb$i"
		_topo_veth "lb$i" "vlb$i" brlan
		_topo_in "lb$i" "addr add 10.0.3.$((20 + i))/24 dev eth0" "addr add fd00:3::$((20 + i))/64 dev eth0 nodad" \
			"route add default via 10.0.3.254" "route add default via fd00:3::fe"
	done

	for ((i = 1; i <= n; i++)); do
		ns=be$i
		_topo_ns "$ns"
		_topo_veth "$ns" "v$ns" brlan
		_topo_in "$ns" "addr add 10.0.3.$((10 + i))/24 dev eth0" "addr add fd00:3::$((10 + i))/64 dev eth0 nodad" \
			"addr add $TOPO_VIP/32 dev lo" "addr add $TOPO_VIP6/128 dev lo nodad" \
			"route add default via 10.0.3.254" "route add default via fd00:3::fe"
		_topo_sysctl_in "$ns" net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
			net.ipv4.conf.eth0.arp_ignore=1 net.ipv4.conf.eth0.arp_announce=2
		TOPO_BACKEND_IPS+="${TOPO_BACKEND_IPS:+ }10.0.3.$((10 + i))"
		TOPO_BACKEND_IP6S+="${TOPO_BACKEND_IP6S:+ }fd00:3::$((10 + i))"
	done
	_topo_flush || return 1
	# Warm the router's neighbour caches, in parallel: the sanity pings of
	# _topo_finish cross it, and two IPv6 resolutions in a row can take
	# more than their 2 s under emulation.
	local ip pids=()
	for ip in 10.0.3.21 10.0.3.22 fd00:3::21 fd00:3::22 10.0.4.2 fd00:4::2; do
		ip netns exec rtr busybox ping -c 1 -W 3 "$ip" >/dev/null 2>&1 &
		pids+=($!)
	done
	wait "${pids[@]}" || true
	_topo_finish
}

topo_tun() {
	local n=${1:-2} encap=${2:-ipip} ns
	case $encap in ipip | gue | gre) ;; *) _topo_fail "topo_tun: unknown encapsulation '$encap'" || return 1 ;; esac
	_topo_lan "$n" "tun-$encap" || return 1
	for ns in $TOPO_BACKENDS; do
		# Decapsulated packets come in on the tunnel device while the client
		# is reached through eth0: reverse-path filtering must be off.
		_topo_sysctl_in "$ns" net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
		case $encap in
		ipip | gue)
			_topo_in "$ns" "link set tunl0 up" "link set ip6tnl0 up"
			_topo_sysctl_in "$ns" net.ipv4.conf.tunl0.rp_filter=0
			if [[ $encap == gue ]]; then
				_topo_in "$ns" "fou add port $TOPO_TUN_GUE_PORT gue" "fou add port $TOPO_TUN_GUE_PORT gue -6"
			fi
			;;
		gre)
			_topo_in "$ns" "link set gre0 up" "link set ip6gre0 up"
			_topo_sysctl_in "$ns" net.ipv4.conf.gre0.rp_filter=0
			;;
		esac
	done
	_topo_finish
}

# topo_k8s NODES PODS [onearm]: a cluster behind the LB, for the Kubernetes
# source's tests: the NAT layout of topo_nat (client, bridge 'brbe' 10.0.2.1),
# with NODES namespaces 'nodeI' at 10.0.2.(10+I) whose servers also listen on
# TOPO_K8S_NODEPORT (30080, a Service's nodePort, answering with the node's
# name) and PODS namespaces 'podJ' at 10.0.2.(100+J) (a routed pod network).
# All default via the LB. TOPO_BACKENDS lists the nodes, then the pods.
#
# Every node also runs a stand-in for kube-proxy's health server: rignode on
# TOPO_K8S_HEALTHZ (10256) whose /healthz answers 200, or 503 while
# $TOPO_STATE/nodeI-health.down exists (topo_node_health_down/up nodeI).
# topo_node_healthz nodeI PORT starts another one on PORT (a Service's
# healthCheckNodePort), down while $TOPO_STATE/nodeI-health-PORT.down exists
# (topo_node_health_down/up nodeI PORT). topo_link_down/up nodeI cuts/restores
# a node's link (its bridge port vnodeI). topo_down stops them all.
#
# 'onearm': the on-prem layout where the LB is just another host on the
# nodes' LAN. A gateway namespace 'gw' (eth0 10.0.2.254, fd00:2::fe, no
# forwarding, no route to the client) is the nodes' and pods' default route
# instead of the LB, so a reply to the client's address goes to 'gw' and dies
# there: plain NAT (client address kept) breaks every connection, and only
# SNAT (the LB's own 10.0.2.1 as the source towards the nodes) works. The
# LB's own traffic to the nodes (health probes) is on-link and unaffected.
TOPO_K8S_NODEPORT=30080
TOPO_K8S_HEALTHZ=10256
topo_k8s() {
	local nodes=${1:-2} pods=${2:-2} mode=${3:-} i ns gw4=10.0.2.1 gw6=fd00:2::1
	[[ $pods =~ ^[0-9]+$ ]] || _topo_fail "topo_k8s: bad pod count '$pods'" || return 1
	[[ -z $mode || $mode == onearm ]] || _topo_fail "topo_k8s: unknown mode '$mode'" || return 1
	_topo_begin "k8s${mode:+-$mode}" "$((nodes + pods))" || return 1
	TOPO_BACKENDS=""
	TOPO_VIP=10.0.0.10 TOPO_VIP6=fd00::10
	TOPO_LB_IP=10.0.1.1 TOPO_LB_IP6=fd00:1::1 TOPO_LB_IF=lb-c
	TOPO_CLIENT_IP=10.0.1.2 TOPO_CLIENT_IP6=fd00:1::2
	_topo_sysctl "" net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
	_topo_ns client
	_topo_veth client lb-c
	_topo_root "addr add 10.0.1.1/24 dev lb-c" "addr add fd00:1::1/64 dev lb-c nodad"
	_topo_in client "addr add 10.0.1.2/24 dev eth0" "addr add fd00:1::2/64 dev eth0 nodad" \
		"route add default via 10.0.1.1" "route add default via fd00:1::1"
	_topo_bridge brbe
	_topo_root "addr add 10.0.2.1/24 dev brbe" "addr add fd00:2::1/64 dev brbe nodad"
	if [[ $mode == onearm ]]; then
		gw4=10.0.2.254 gw6=fd00:2::fe
		_topo_ns gw
		_topo_veth gw vgw brbe
		_topo_in gw "addr add $gw4/24 dev eth0" "addr add $gw6/64 dev eth0 nodad"
		_topo_sysctl_in gw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0
	fi
	local -a hosts=()
	for ((i = 1; i <= nodes; i++)); do hosts+=("node$i $((10 + i))"); done
	for ((i = 1; i <= pods; i++)); do hosts+=("pod$i $((100 + i))"); done
	local h host
	for h in "${hosts[@]}"; do
		read -r ns host <<<"$h"
		_topo_ns "$ns"
		_topo_veth "$ns" "v$ns" brbe
		_topo_in "$ns" "addr add 10.0.2.$host/24 dev eth0" "addr add fd00:2::$host/64 dev eth0 nodad" \
			"route add default via $gw4" "route add default via $gw6"
		TOPO_BACKENDS+="${TOPO_BACKENDS:+ }$ns"
		TOPO_BACKEND_IPS+="${TOPO_BACKEND_IPS:+ }10.0.2.$host"
		TOPO_BACKEND_IP6S+="${TOPO_BACKEND_IP6S:+ }fd00:2::$host"
	done
	_topo_finish || return 1
	# The nodes' nodePort and kube-proxy health servers, stopped by topo_down.
	for ((i = 1; i <= nodes; i++)); do
		ns=node$i
		rm -f "$TOPO_STATE/$ns-nodeport.ready" "$TOPO_STATE/$ns-health.ready" "$TOPO_STATE/$ns-health.down"
		ip netns exec "$ns" "$TOPO_RIGNODE" serve -name "$ns" -http ":$TOPO_K8S_NODEPORT" \
			-ready "$TOPO_STATE/$ns-nodeport.ready" >"$TOPO_STATE/$ns-nodeport.log" 2>&1 &
		echo $! >"$TOPO_STATE/$ns-nodeport.pid"
		ip netns exec "$ns" "$TOPO_RIGNODE" serve -name "$ns" -http ":$TOPO_K8S_HEALTHZ" \
			-down "$TOPO_STATE/$ns-health.down" \
			-ready "$TOPO_STATE/$ns-health.ready" >"$TOPO_STATE/$ns-health.log" 2>&1 &
		echo $! >"$TOPO_STATE/$ns-health.pid"
	done
	local what
	for ((i = 1; i <= nodes; i++)); do
		for what in nodeport health; do
			_topo_wait_ready "node$i-$what" || return 1
		done
	done
}

# _topo_wait_ready NAME: wait (10 s) for $TOPO_STATE/NAME.ready, which a
# rignode serve started with -ready writes once it listens.
_topo_wait_ready() {
	local j
	for ((j = 0; j < 200; j++)); do
		[[ -e $TOPO_STATE/$1.ready ]] && return 0
		sleep 0.05
	done
	cat "$TOPO_STATE/$1.log" >&2
	_topo_fail "the server $1 did not start"
}

# topo_node_healthz NODE PORT: start a health server in NODE's namespace on
# PORT (a Service's healthCheckNodePort, as kube-proxy serves it): /healthz
# answers 200, or 503 while $TOPO_STATE/NODE-health-PORT.down exists.
topo_node_healthz() {
	local node=$1 port=$2 name
	[[ $port =~ ^[1-9][0-9]*$ ]] || _topo_fail "topo_node_healthz: bad port '$port'" || return 1
	name=$node-health-$port
	rm -f "$TOPO_STATE/$name.ready" "$TOPO_STATE/$name.down"
	ip netns exec "$node" "$TOPO_RIGNODE" serve -name "$node" -http ":$port" -down "$TOPO_STATE/$name.down" \
		-ready "$TOPO_STATE/$name.ready" >"$TOPO_STATE/$name.log" 2>&1 &
	echo $! >"$TOPO_STATE/$name.pid"
	_topo_wait_ready "$name"
}

# topo_node_health_down NODE [PORT] / topo_node_health_up NODE [PORT]: make
# NODE's health server (kube-proxy's on 10256 without PORT, else the one of
# topo_node_healthz) answer 503 / 200.
topo_node_health_down() { touch "$TOPO_STATE/$1-health${2:+-$2}.down"; }
topo_node_health_up() { rm -f "$TOPO_STATE/$1-health${2:+-$2}.down"; }

# topo_link_down NAME / topo_link_up NAME: cut / restore the link of
# namespace NAME (a node, a pod, a backend): its bridge port vNAME goes down
# (and with it the carrier of its eth0), or up again.
topo_link_down() { ip link set "v$1" down; }
topo_link_up() { ip link set "v$1" up; }

# topo_env: print the TOPO_* variables as KEY=VALUE lines (for the Go harness).
topo_env() {
	local v
	for v in TOPO_KIND TOPO_N TOPO_VIP TOPO_VIP6 TOPO_CLIENT_NS TOPO_CLIENT_IP TOPO_CLIENT_IP6 \
		TOPO_LB_IP TOPO_LB_IP6 TOPO_LB_IF TOPO_BACKENDS TOPO_BACKEND_IPS TOPO_BACKEND_IP6S; do
		printf '%s=%s\n' "$v" "${!v:-}"
	done
}

# topo_vip_add [IFACE]: put TOPO_VIP and TOPO_VIP6 on a dummy interface in the
# LB (default 'rigvip0'), as a plain-ipvsadm stand-in for what vipd does.
topo_vip_add() {
	local dev=${1:-rigvip0}
	{
		if ! ip link show "$dev" >/dev/null 2>&1; then
			echo "link add $dev type dummy"
			echo "$dev" >>"$TOPO_STATE/links"
		fi
		echo "link set $dev up"
		echo "addr add $TOPO_VIP/32 dev $dev"
		echo "addr add $TOPO_VIP6/128 dev $dev nodad"
	} | ip -batch -
}

# topo_hit N URL|HOST:PORT [rignode hit flags...]: N requests from the client
# namespace, each on a new connection; prints rignode's JSON line. Without
# rignode (HTTP only): one backend name per line, from curl.
topo_hit() {
	local n=$1 target=$2 i
	shift 2
	if [[ -x $TOPO_RIGNODE ]]; then
		ip netns exec "$TOPO_CLIENT_NS" "$TOPO_RIGNODE" hit -n "$n" "$@" "$target"
	else
		for ((i = 0; i < n; i++)); do
			ip netns exec "$TOPO_CLIENT_NS" curl -sS --max-time 2 "$target" || echo "!error"
		done
	fi
}

# topo_backend_down NAME / topo_backend_up NAME: make NAME's /healthz answer
# 503 / 200 (the server keeps serving /).
topo_backend_down() { touch "$TOPO_STATE/$1.down"; }
topo_backend_up() { rm -f "$TOPO_STATE/$1.down"; }

# topo_backend_stop NAME / topo_backend_start NAME: kill / restart its server.
topo_backend_stop() {
	local pid
	pid=$(cat "$TOPO_STATE/$1.pid" 2>/dev/null) || return 0
	kill "$pid" 2>/dev/null
	# Not this shell's child ('wait' would return at once): poll until it is
	# gone or a zombie, for up to 5 s, then make sure.
	local i state
	for ((i = 0; i < 100; i++)); do
		{ read -r _ _ state _ <"/proc/$pid/stat"; } 2>/dev/null || break
		[[ $state != Z ]] || break
		sleep 0.05
	done
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$TOPO_STATE/$1.pid" "$TOPO_STATE/$1.ready"
	return 0
}
topo_backend_start() { _topo_start_backends "$1"; }

# topo_down: remove the topology and reset what tests commonly change: IPVS
# table, iptables (both backends), nftables, ipsets, forwarding sysctls.
topo_down() {
	local f pid ns link fam
	for f in "$TOPO_STATE"/*.pid; do
		[[ -e $f ]] || continue
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null
	done
	{
		[[ -r $TOPO_STATE/links ]] && while read -r link; do echo "link del $link"; done <"$TOPO_STATE/links"
		[[ -r $TOPO_STATE/namespaces ]] && while read -r ns; do echo "netns del $ns"; done <"$TOPO_STATE/namespaces"
	} | ip -force -batch - 2>/dev/null
	ipvsadm -C 2>/dev/null
	# Legacy iptables: restore every instantiated table to empty builtin
	# chains with ACCEPT policies (one save + one restore per family).
	for fam in ip ip6; do
		[[ -n $(</proc/net/${fam}_tables_names) ]] || continue # (procfs sizes are 0)
		"${fam}tables-legacy-save" 2>/dev/null | awk '
			/^\*/ { print; next }
			/^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) / { print $1 " ACCEPT [0:0]" }
			/^COMMIT/ { print }' | "${fam}tables-legacy-restore" 2>/dev/null
	done
	nft flush ruleset 2>/dev/null # also clears iptables-nft's tables
	ipset destroy 2>/dev/null
	_topo_sysctl "" net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 \
		net.ipv4.conf.all.arp_ignore=0 net.ipv4.conf.all.arp_announce=0 \
		net.ipv4.conf.default.arp_ignore=0 net.ipv4.conf.default.arp_announce=0
	# What vipd sets and leaves (on_stop = "keep" leaves its VIPs too).
	_topo_sysctl "" net.ipv4.vs.conntrack=0 net.ipv4.vs.expire_nodest_conn=0 \
		net.ipv4.vs.expire_quiescent_template=0 2>/dev/null || true
	ip link del vipd0 2>/dev/null || true
	rm -rf "$TOPO_STATE"
	unset TOPO_KIND TOPO_N TOPO_VIP TOPO_VIP6 TOPO_CLIENT_NS TOPO_CLIENT_IP TOPO_CLIENT_IP6 \
		TOPO_LB_IP TOPO_LB_IP6 TOPO_LB_IF TOPO_BACKENDS TOPO_BACKEND_IPS TOPO_BACKEND_IP6S
	return 0
}

# Re-entering a shell after a topo_* call in an earlier one: restore variables.
if [[ -r $TOPO_STATE/env ]]; then
	while IFS='=' read -r _k _v; do printf -v "$_k" '%s' "$_v"; done <"$TOPO_STATE/env"
	unset _k _v
fi
