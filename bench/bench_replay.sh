#!/usr/bin/env bash
# `prismctl replay` against a plain-Python replay of the same policy (issue 16 item 4, DESIGN 13):
# a generated 10,000-block x 60-step trace of 2 ranks (bench/replay_trace_gen.py, about 200 MB of
# JSONL; converted to the binary form with `prismctl replay --record`), replayed side by side by
#   python   bench/replay_reference.py (standard library only) on the JSONL trace
#   jsonl    prismctl replay on the JSONL trace
#   binary   prismctl replay on the binary trace
# each RUNS times, end to end (process start, reading the file, parsing, merging, deciding,
# writing every telemetry record to a file). The three outputs must be identical byte for byte
# (same decisions, same numbers, same text) or the benchmark fails. It prints the median wall
# and CPU (user + sys) seconds and the speed-up over Python of each. Then it times a --sweep of
# 8 configurations of the binary trace against 8 separate replays of it.
#
# Napkin math: the JSONL trace is ~207 MB, 1.2 M block records of 7 numbers, ~6 M numbers to
# convert; at ~50-100 ns per number and a few ns per byte scanned, ~0.5 s of parsing in C. The
# binary trace holds the 600 k merged block records in ~27 MB (45 bytes each), no text to parse.
# Both then make 11 decisions over 10,000 blocks (~0.3 ms each) and write 11 records of 10,000
# blocks, 4 numbers each: 440 k numbers as exact shortest text, ~0.1 µs each. Targets (DESIGN
# 13): binary >= 10x the Python reference, JSONL >= 1x.
#
# usage: bench/bench_replay.sh [BUILD_DIR] [RUNS] [WORK_DIR]
#   BUILD_DIR default build-release; RUNS default 5; WORK_DIR default /tmp/prism-bench-replay
#   (the generated traces are kept there and reused while the generator is unchanged).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-release}
runs=${2:-5}
work=${3:-/tmp/prism-bench-replay}
prismctl=$build/service/prismctl
[[ -x $prismctl ]] || { echo "bench_replay: no $prismctl; build it first" >&2; exit 1; }
mkdir -p "$work"
py=/usr/bin/python3
trace=$work/trace.jsonl
bin=$work/trace.ptrace
cfg=$work/config.json
stamp=$work/generator.sha
want=$(sha256sum bench/replay_trace_gen.py | cut -d' ' -f1)
if [[ ! -s $trace || ! -s $stamp || $(cat "$stamp") != "$want" ]]; then
  echo "bench_replay: generating $trace (10,000 blocks x 60 steps x 2 ranks)" >&2
  $py bench/replay_trace_gen.py "$trace" --blocks 10000 --steps 60 --ranks 2 --seed 16
  echo "$want" > "$stamp"
fi
# Decisions every 5 steps after a warmup of 10 (11 decisions), a cooldown of 10: blocks switch.
echo '{"warmup_steps": 10, "update_interval_steps": 5, "min_steps_between_switches": 10}' > "$cfg"
ts=1700000000
"$prismctl" replay --world-size 2 --config "$cfg" --timestamp $ts --record "$bin" "$trace" > /dev/null 2>&1

TIMEFORMAT='%R %U %S'
# Runs a command RUNS times (stdout to $work/NAME.out); prints "NAME wall_median cpu_median".
measure() {
  local name=$1
  shift
  local walls=() cpus=()
  for ((i = 0; i < runs; i++)); do
    local t
    t=$({ time "$@" > "$work/$name.out" 2> "$work/$name.err"; } 2>&1)
    read -r real user sys <<< "$t"
    walls+=("$real")
    cpus+=("$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.3f", u + s }')")
  done
  local wm cm
  wm=$(printf '%s\n' "${walls[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  cm=$(printf '%s\n' "${cpus[@]}" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  echo "$name $wm $cm"
}

results=()
results+=("$(measure python $py bench/replay_reference.py "$trace" --world-size 2 --config "$cfg" --timestamp $ts)")
results+=("$(measure jsonl "$prismctl" replay --world-size 2 --config "$cfg" --timestamp $ts "$trace")")
results+=("$(measure binary "$prismctl" replay --timestamp $ts "$bin")")
cmp "$work/python.out" "$work/jsonl.out" || { echo "bench_replay: JSONL replay differs from Python" >&2; exit 1; }
cmp "$work/python.out" "$work/binary.out" || { echo "bench_replay: binary replay differs from Python" >&2; exit 1; }
decisions=$(wc -l < "$work/python.out")
echo "trace: $(du -m "$trace" | cut -f1) MB JSONL, $(du -m "$bin" | cut -f1) MB binary; $decisions decisions;" \
     "outputs identical ($(du -m "$work/python.out" | cut -f1) MB of telemetry each); $runs runs, medians"
printf '%-8s %10s %10s %12s %12s\n' replay wall_s cpu_s x_py_wall x_py_cpu
read -r _ pw pc <<< "${results[0]}"
for r in "${results[@]}"; do
  read -r name w c <<< "$r"
  awk -v n="$name" -v w="$w" -v c="$c" -v pw="$pw" -v pc="$pc" \
    'BEGIN { printf "%-8s %10.2f %10.2f %12.1f %12.1f\n", n, w, c, pw / w, pc / c }'
done

# --sweep: 8 configurations in one pass against 8 separate replays (each prints its telemetry).
sweep_args=(--sweep bf16_threshold=0.5,0.6 --sweep int8_threshold=0.2,0.3 --sweep hysteresis_margin=0.05,0.1)
separate() {
  for b in 0.5 0.6; do for i in 0.2 0.3; do for h in 0.05 0.1; do
    echo "{\"warmup_steps\": 10, \"update_interval_steps\": 5, \"min_steps_between_switches\": 10,
           \"bf16_threshold\": $b, \"int8_threshold\": $i, \"hysteresis_margin\": $h}" > "$work/sep.json"
    "$prismctl" replay --config "$work/sep.json" --timestamp $ts "$bin" > /dev/null 2>&1
  done; done; done
}
s1=$(measure sweep8 "$prismctl" replay --config "$cfg" "${sweep_args[@]}" "$bin")
s2=$(measure separate8 separate)
echo
echo "8 configurations of the binary trace (bf16_threshold x int8_threshold x hysteresis_margin):"
printf '%-10s %10s %10s\n' how wall_s cpu_s
for r in "$s1" "$s2"; do
  read -r name w c <<< "$r"
  printf '%-10s %10.2f %10.2f\n' "$name" "$w" "$c"
done
echo
cat "$work/sweep8.out"
