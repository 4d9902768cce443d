#!/usr/bin/env bash
# The README's first command: a whole Prism job on this machine. Installs what is missing,
# builds (Release, build-release/), then starts prismd, one prism-agent per rank and the ranks of
# a small data-parallel PyTorch job (examples/train_demo.py, gloo on 127.0.0.1), and prints where
# to look and the block map as the job runs. Ctrl-C (or the job's end) stops everything.
#
#   scripts/demo.sh [--ranks N] [--steps N] [--step-ms MS] [--http-port P] [--grpc-port P]
#
# State and logs go to ./prism-demo/ (prismd's data, one directory per agent, every log).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

RANKS=4
STEPS=3000
STEP_MS=50
HTTP_PORT=8080
GRPC_PORT=50051
usage() {
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) RANKS="$2"; shift 2 ;;
        --steps) STEPS="$2"; shift 2 ;;
        --step-ms) STEP_MS="$2"; shift 2 ;;
        --http-port) HTTP_PORT="$2"; shift 2 ;;
        --grpc-port) GRPC_PORT="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "demo.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for v in RANKS STEPS STEP_MS HTTP_PORT GRPC_PORT; do
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ]; then
        echo "demo.sh: --$(echo "$v" | tr 'A-Z_' 'a-z-'): '${!v}' is not a whole number from 1" >&2
        exit 2
    fi
done

bash scripts/install-deps.sh >&2
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build-release -j"$(nproc)" --target prismd prismctl prism-agent prism >&2

B=build-release
RUN=prism-demo
JOB=demo
mkdir -p "$RUN"
rm -rf "$RUN"/agent* "$RUN"/*.log "$RUN"/trainer*.jsonl
cat > "$RUN/config.json" <<'EOF'
{"warmup_steps": 10, "update_interval_steps": 10, "history_window": 5, "min_steps_between_switches": 20,
 "apply_lag_steps": 3, "step_timeout_ms": 1000, "calibration_samples": 4}
EOF

PIDS=()
stop() {
    trap - EXIT INT TERM
    echo "stopping..." >&2
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop EXIT INT TERM

HTTP="127.0.0.1:$HTTP_PORT"
"$B/service/prismd" --grpc-listen "127.0.0.1:$GRPC_PORT" --http-listen "$HTTP" --data-dir "$RUN/data" \
    --config "$RUN/config.json" 2> "$RUN/prismd.log" &
PIDS+=($!)
for _ in $(seq 100); do
    curl -sf "http://$HTTP/readyz" > /dev/null && break
    sleep 0.1
done
curl -sf "http://$HTTP/readyz" > /dev/null || { echo "prismd did not start; see $RUN/prismd.log" >&2; exit 1; }

for r in $(seq 0 $((RANKS - 1))); do
    "$B/agent/prism-agent" --prismd "127.0.0.1:$GRPC_PORT" --dir "$RUN/agent$r" \
        --metrics-listen "127.0.0.1:$((9470 + r))" --device auto 2> "$RUN/agent$r.log" &
    PIDS+=($!)
done
DIST_PORT=$((29500 + RANDOM % 1000))
export PRISM_LIBRARY="$PWD/$B/lib/libprism.so"
for r in $(seq 0 $((RANKS - 1))); do
    /usr/bin/python3 examples/train_demo.py --job "$JOB" --rank "$r" --world "$RANKS" --dir "$RUN/agent$r" \
        --steps "$STEPS" --step-ms "$STEP_MS" --dist-port "$DIST_PORT" --log "$RUN/trainer$r.jsonl" \
        --shift-step $((STEPS / 2)) \
        > "$RUN/trainer$r.out" 2> "$RUN/trainer$r.log" &
    PIDS+=($!)
done

echo "Prism dashboard: http://$HTTP/#/jobs/$JOB"
echo "Prism demo: prismd, $RANKS agents and $RANKS trainers (job '$JOB'); logs in $RUN/"
echo "  block map    http://$HTTP/v1/jobs/$JOB/blocks   (or: $B/service/prismctl --server http://$HTTP blocks $JOB)"
echo "  metrics      http://$HTTP/metrics, agents on http://127.0.0.1:9470/metrics and up"
echo "  Ctrl-C stops everything."
echo

TRAINERS=("${PIDS[@]:$((1 + RANKS))}")
while :; do
    sleep 3
    running=0
    for p in "${TRAINERS[@]}"; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
    echo "---- $(date +%T)  $running/$RANKS trainers running"
    "$B/service/prismctl" --server "http://$HTTP" blocks "$JOB" 2>/dev/null ||
        echo "(no block map yet: the job appears with its first report)"
    [ "$running" -gt 0 ] || break
done
echo "the job finished; trainer summaries:"
cat "$RUN"/trainer*.out
