#!/usr/bin/env bash
# prism-bench allreduce over slow links: P MPI ranks, each in its own network namespace, joined by
# veth pairs to one bridge whose every port is rate-limited (tc tbf, both directions, like a
# full-duplex NIC), MPI over TCP. See bench/README.md, "Quantized all-reduce".
#
#   bash bench/allreduce_netns.sh [BUILD_DIR] [--ranks "2 4"] [--rates "1gbit 10gbit unlimited"]
#        [--mib 4,16,64] [--wire all] [--seconds 1] [--timeout 600]
#
# Layout (every name is this script's own; nothing outside them is touched):
#   namespace prism-ar-br   bridge prism-ar-br, 10.213.0.254/24, and mpirun itself
#   namespace prism-ar-R    veth prism-ar (10.213.0.R+1/24), its peer prism-ar-pR on the bridge
# tbf shapes prism-ar (what rank R sends) and prism-ar-pR (what it receives) to the same rate.
#
# How the ranks get into their namespaces: Open MPI 4.1's ranks reach their launcher's PMIx
# server over TCP on 127.0.0.1, which a rank in another namespace cannot see, so wrapping each
# rank in `ip netns exec` makes MPI_Init fail ("OPAL ERROR: Unreachable"). Instead every
# namespace is a "host": mpirun runs in prism-ar-br with a hostfile naming prism-ar-0.., and its
# rsh launcher's agent is a small script that starts the orted daemon for host H with
# `ip netns exec H`. Each orted then serves its one rank on its own loopback, and talks to mpirun
# over the bridge (oob_tcp_if_include); the ranks talk over the bridge (btl self,tcp,
# btl_tcp_if_include, pml ob1, so neither shared memory nor UCX can go around the links).
# Each orted believes it has a node to itself, so two things a real cluster would not need:
# --bind-to none (otherwise every orted binds its rank to core 0, the ranks share one core, and
# every message waits for a 4 ms scheduler tick), and, with more ranks than cores,
# mpi_yield_when_idle (ranks that spin in MPI_Wait would take the cores from the ones computing).
# btl_tcp_links 2 (two TCP connections per pair of ranks): with Open MPI's default of one, every
# MPI message between two ranks queues behind the bytes already in that one connection, and when
# both ranks of a pair send large messages at once (prism's all-to-all and all-gather do), one
# rendezvous handshake can wait for the other direction's whole message (our reading of it): at
# 1 Gbit/s, P=2, 64 MiB, prism's 8-bit all-reduce ran at 0.46 Gbit/s instead of 0.85 in 3 of 5
# runs with one link, and in none of 5 with two; the FP32 baseline is no slower with two.
set -euo pipefail

BUILD=build
RANKS="2 4"
RATES="1gbit 10gbit unlimited"
MIB=4,16,64
WIRE=all
SECONDS_PER=1
RUN_TIMEOUT=600
SUBNET=10.213.0
NS=prism-ar

usage() {
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
    --*) [ "$1" = --help ] || [ $# -ge 2 ] ||
        { echo "allreduce_netns.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
    esac
    case "$1" in
    -h | --help) usage; exit 0 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --mib) MIB=$2; shift 2 ;;
    --wire) WIRE=$2; shift 2 ;;
    --seconds) SECONDS_PER=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    -*) echo "allreduce_netns.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) BUILD=$1; shift ;;
    esac
done

if [ "$(id -u)" -ne 0 ]; then
    echo "allreduce_netns.sh: needs root (it creates network namespaces, veth pairs and tc qdiscs);" \
        "run it as root or with sudo" >&2
    exit 2
fi
BENCH=$(cd "$BUILD" 2>/dev/null && pwd)/bench/prism-bench
if [ ! -x "$BENCH" ]; then
    echo "allreduce_netns.sh: no $BUILD/bench/prism-bench (cmake --build $BUILD --target prism-bench)" >&2
    exit 2
fi
for tool in ip tc mpirun timeout unshare hostname; do
    command -v "$tool" >/dev/null || { echo "allreduce_netns.sh: '$tool' is not installed" >&2; exit 2; }
done
maxp=0
for p in $RANKS; do
    case "$p" in '' | *[!0-9]*) echo "allreduce_netns.sh: --ranks: '$p' is not a number" >&2; exit 2 ;; esac
    if [ "$p" -lt 2 ] || [ "$p" -gt 16 ]; then
        echo "allreduce_netns.sh: --ranks: $p is not 2 to 16" >&2
        exit 2
    fi
    [ "$p" -gt "$maxp" ] && maxp=$p
done
case "$RUN_TIMEOUT" in '' | *[!0-9]*) echo "allreduce_netns.sh: --timeout: '$RUN_TIMEOUT' is not seconds" >&2; exit 2 ;; esac
for rate in $RATES; do
    case "$rate" in unlimited | [0-9]*gbit | [0-9]*mbit) ;;
    *) echo "allreduce_netns.sh: --rates: '$rate' is not Ngbit, Nmbit or unlimited" >&2; exit 2 ;;
    esac
done
if ip netns list | grep -qE "^$NS-"; then
    echo "allreduce_netns.sh: namespaces named $NS-* exist already (a run killed with SIGKILL?);" \
        "this script only removes what it created itself. Remove them with: ip netns del NAME" >&2
    ip netns list | grep -E "^$NS-" >&2
    exit 2
fi

# ---- tear-down: only the namespaces (and so the veths, bridge, qdiscs) this run created -------
CREATED=()
WORK=$(mktemp -d /tmp/prism-ar.XXXXXX)
teardown() {
    local ns pids
    set +e
    for ns in "${CREATED[@]}"; do # the orted daemons and ranks a killed mpirun left behind
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
        [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
    done
    sleep 0.5
    for ns in "${CREATED[@]}"; do
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
        [ ${#pids[@]} -gt 0 ] && kill -9 "${pids[@]}" 2>/dev/null
    done
    for ns in "${CREATED[@]}"; do
        ip netns del "$ns" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap teardown EXIT
trap 'exit 130' INT TERM HUP

# ---- set-up --------------------------------------------------------------------------------
ip netns add "$NS-br"
CREATED+=("$NS-br")
ip -n "$NS-br" link set lo up
ip -n "$NS-br" link add "$NS-br" type bridge
ip -n "$NS-br" addr add "$SUBNET.254/24" dev "$NS-br"
ip -n "$NS-br" link set "$NS-br" up
for ((r = 0; r < maxp; r++)); do
    ip netns add "$NS-$r"
    CREATED+=("$NS-$r")
    ip -n "$NS-$r" link set lo up
    ip -n "$NS-$r" link add "$NS" type veth peer name "$NS-p$r" netns "$NS-br"
    ip -n "$NS-$r" addr add "$SUBNET.$((r + 1))/24" dev "$NS"
    ip -n "$NS-$r" link set "$NS" up
    ip -n "$NS-br" link set "$NS-p$r" master "$NS-br"
    ip -n "$NS-br" link set "$NS-p$r" up
done

# mpirun's rsh agent: "agent HOST COMMAND..." runs COMMAND (an orted) in network namespace HOST,
# and in a UTS namespace of its own whose hostname is HOST: the orteds share one machine and
# would otherwise share the hostname, hence one session directory and one hwloc shared-memory
# topology file, and racing on that file one of them sometimes crashes (SIGSEGV in
# hwloc_shmem_topology_write) and mpirun waits for it for ever.
cat >"$WORK/agent.sh" <<EOF
#!/bin/sh
host=\$1
shift
case "\$host" in
$NS-[0-9] | $NS-[0-9][0-9]) exec ip netns exec "\$host" unshare --uts /bin/sh -c "hostname \$host && \$*" ;;
*) echo "allreduce_netns.sh agent: refusing host '\$host'" >&2; exit 1 ;;
esac
EOF
chmod +x "$WORK/agent.sh"

# tc tbf at RATE on both ends of every rank's veth (unlimited: no qdisc). The bucket holds 1 ms
# of the rate (>= 64 KiB, enough for 64 KiB TSO segments); the FIFO behind it holds 10 ms. Both
# ways off hurt TCP here (this kernel has no fq_codel to put ACKs ahead of bulk data): with 20 ms
# a rank's ACKs waited behind its own data and some P=2 runs went at half the rate; with 2 ms the
# P=4 all-to-all (three senders into each receive port) dropped packets, and a 4 MiB call took
# up to 260 ms (TCP's 200 ms retransmission timeout) instead of 20.
shape() {
    local rate=$1 r bits burst
    for ((r = 0; r < maxp; r++)); do
        ip netns exec "$NS-$r" tc qdisc del dev "$NS" root 2>/dev/null || true
        ip netns exec "$NS-br" tc qdisc del dev "$NS-p$r" root 2>/dev/null || true
        [ "$rate" = unlimited ] && continue
        case "$rate" in
        *gbit) bits=$((${rate%gbit} * 1000000000)) ;;
        *mbit) bits=$((${rate%mbit} * 1000000)) ;;
        esac
        burst=$((bits / 8000))
        [ "$burst" -lt 65536 ] && burst=65536
        ip netns exec "$NS-$r" tc qdisc add dev "$NS" root tbf rate "$rate" burst "$burst" latency 10ms
        ip netns exec "$NS-br" tc qdisc add dev "$NS-p$r" root tbf rate "$rate" burst "$burst" latency 10ms
    done
}

# Packets the shapers dropped during the run (TCP resends them; many drops mean the run's
# TCP flows spent time in loss recovery), summed over the ranks' send and receive sides.
tbf_drops() {
    local p=$1 r sent=0 recv=0 d
    for ((r = 0; r < p; r++)); do
        d=$(ip netns exec "$NS-$r" tc -s qdisc show dev "$NS" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
        sent=$((sent + ${d:-0}))
        d=$(ip netns exec "$NS-br" tc -s qdisc show dev "$NS-p$r" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -1)
        recv=$((recv + ${d:-0}))
    done
    echo "# tbf drops during the run: $sent packets on the ranks' send side, $recv on their receive side"
}

# What one plain TCP stream gets from rank 0's namespace to rank 1's at the current shaping
# (python3, 256 MiB or 3 s, whichever ends first): the ceiling the MPI lines can be read against.
tcp_stream() {
    local py=/usr/bin/python3
    [ -x "$py" ] || { echo "# (no /usr/bin/python3: plain TCP stream not measured)"; return 0; }
    timeout 20 ip netns exec "$NS-1" "$py" -c '
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("'"$SUBNET"'.2", 5299)); s.listen(1); s.settimeout(10); c, _ = s.accept(); c.settimeout(10)
n, t0 = 0, time.time()
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
print("# one plain TCP stream %s-0 -> %s-1: %.3f Gbit/s (%d MiB in %.2f s)" % ("'"$NS"'", "'"$NS"'", n * 8 / (time.time() - t0) / 1e9, n >> 20, time.time() - t0))
' &
    local server=$!
    sleep 0.5
    timeout 15 ip netns exec "$NS-0" "$py" -c '
import socket, time
c = socket.create_connection(("'"$SUBNET"'.2", 5299), timeout=5); buf = b"x" * (1 << 20); t0 = time.time()
for _ in range(256):
    c.sendall(buf)
    if time.time() - t0 > 3: break
c.close()
' || true
    wait "$server" || true
}

echo "# allreduce_netns.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs," \
    "$(sed -n 's/^PRETTY_NAME="\(.*\)"$/\1/p' /etc/os-release), $(mpirun --version | head -1)"
: >"$WORK/results"
for p in $RANKS; do
    yield=0
    [ "$p" -gt "$(nproc)" ] && yield=1
    : >"$WORK/hosts"
    for ((r = 0; r < p; r++)); do echo "$NS-$r slots=1" >>"$WORK/hosts"; done
    for rate in $RATES; do
        shape "$rate"
        echo "# P=$p, link $rate"
        tcp_stream
        # The run's stdout is rank 0's; the lines also go to the table at the end. It runs in the
        # background so that a signal reaches the trap at once (bash runs traps only between
        # foreground commands); mpirun, its orteds and ranks all live in our namespaces, where
        # the tear-down finds them.
        ip netns exec "$NS-br" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            timeout -k 10 "$RUN_TIMEOUT" mpirun -np "$p" --hostfile "$WORK/hosts" --bind-to none \
            --mca mpi_yield_when_idle "$yield" \
            --mca plm_rsh_agent "$WORK/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
            --mca oob_tcp_if_include "$SUBNET.0/24" --mca pml ob1 --mca btl self,tcp \
            --mca btl_tcp_if_include "$SUBNET.0/24" --mca btl_tcp_links 2 \
            "$BENCH" allreduce --mib "$MIB" --wire "$WIRE" --seconds "$SECONDS_PER" \
            --link "$rate" --iface "$NS" | tee -a "$WORK/results" &
        wait $! || echo "# P=$p, link $rate: mpirun failed or ran past --timeout $RUN_TIMEOUT s" >&2
        [ "$rate" = unlimited ] || tbf_drops "$p"
    done
done

# ---- the table -----------------------------------------------------------------------------
echo
echo "| link | P | MiB/rank | what | ms | FP32 GB/s | wire MiB/rank | x BF16 | wire Gbit/s | vs MPI FP32 | rel. error | veth tx MiB/rank |"
echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
awk '!/^#/ && NF >= 22 {
    sub(/^P=/, "", $3)
    err = $22 == "(ref)" ? "ref" : $22
    veth = NF >= 24 ? $24 : ""
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $3, $4, $6, $7, $9, $12, $14, $16, $20, err, veth
}' "$WORK/results"
