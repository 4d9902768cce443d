#!/usr/bin/env bash
# `prismctl plan` on the paper's setting (issue 15, item 6): the V100-32GB + T4-16GB examples of
# examples/hybrid/ (BERT-like 12 blocks, GPT-like 48 blocks) and a generated 1,000-block case.
#
# For each case it prints the plan's predicted iteration time and Σω against uniform low and
# uniform high (from prismctl's own output), the raises by reason, and the wall time of the whole
# `prismctl plan FILE` process (exec, parse, plan, print) as the median and the max of RUNS runs,
# measured here with bash's EPOCHREALTIME (microseconds, no fork for the clock), and the medians
# of the phases inside the process that `prismctl plan --timing` reports (the planning alone is
# what the 10 ms target is about).
#
# Napkin math (target: under 10 ms for 1,000 blocks and 2 classes): each raise re-evaluates the
# time model, O(L·K) = 2,000 block terms of a few flops each, and there are up to L·(K−1) = 1,000
# raises: ~2·10⁶ terms, a few ms at ~1 ns per term; parsing a 1,000-block PLAN (~400 KB of JSON)
# is ~1 ms. Process start (the dynamic loader, jansson) adds ~1 ms.
#
# usage: bench/bench_plan.sh [BUILD_DIR] [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build-release}
runs=${2:-101}
prismctl=$build/service/prismctl
[[ -x $prismctl ]] || { echo "bench_plan: no $prismctl; build it first" >&2; exit 1; }
dir=$(mktemp -d /tmp/prism-bench-plan-XXXXXX)
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 examples/hybrid/make_plans.py --big "$dir/big1000.plan.json" --blocks 1000

summary() {
  /usr/bin/python3 - "$1" <<'PY'
import collections, json, sys
o = json.load(open(sys.argv[1]))
b = o["baselines"]
r = collections.Counter(x["reason"] for x in o["raises"])
low = {c["name"]: sum(p != c["high_format"] for p in c["plan"]) for c in o["classes"]
       if not c["fixed"]}
def line(label, t, w, fits=True):
    print("  %-13s T = %8.3f ms  sum_omega = %.4g%s" % (label, t * 1e3, w,
                                                       "" if fits else "  (does not fit)"))
line("plan:", o["iteration_seconds"], o["indicator"])
print("  %-13s T0 = %.3f ms; low blocks per class %s" % ("", o["start_seconds"] * 1e3, low))
for k in ("uniform_low", "uniform_high"):
    line(k.replace("_", " ") + ":", b[k]["iteration_seconds"], b[k]["indicator"], b[k]["fits"])
print("  raises: %s" % dict(r))
PY
}

# median_ms VAR: the median and max of the wall times (µs) in the array times, as text.
median_ms() {
  local sorted median max
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  median=$(sed -n "$(( (${#times[@]} + 1) / 2 ))p" <<<"$sorted")
  max=$(tail -n 1 <<<"$sorted")
  printf 'median %d.%03d ms, max %d.%03d ms' $((median / 1000)) $((median % 1000)) \
    $((max / 1000)) $((max % 1000))
}

# time_runs CMD...: runs CMD $runs times, its stdout dropped, the wall times into times.
time_runs() {
  local n t0 t1
  times=()
  for ((n = 0; n < runs; n++)); do
    t0=$EPOCHREALTIME
    "$@" >/dev/null
    t1=$EPOCHREALTIME
    times+=("$(( 10#${t1/./} - 10#${t0/./} ))")
  done
}

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
time_runs "$prismctl" plan --help
echo "process start alone (prismctl plan --help), $runs runs: $(median_ms)"
for name in bert12 gpt48 big1000; do
  if [[ $name == big1000 ]]; then plan=$dir/big1000.plan.json; else plan=examples/hybrid/$name.plan.json; fi
  "$prismctl" plan "$plan" >"$dir/out.json"
  echo "$name ($plan)"
  summary "$dir/out.json"
  time_runs "$prismctl" plan "$plan"
  echo "  prismctl plan wall time, $runs runs: $(median_ms)"
  # The phases inside the process (prismctl plan --timing): medians over the same number of runs.
  for ((n = 0; n < runs; n++)); do
    "$prismctl" plan --timing "$plan" 2>&1 >/dev/null
  done | /usr/bin/python3 -c '
import re, statistics, sys
rows = [tuple(map(float, re.findall(r"([0-9.]+) ms", l))) for l in sys.stdin]
med = [statistics.median(r[i] for r in rows) for i in range(3)]
print("  phases (--timing), median of %d: read and parse %.3f ms, plan %.3f ms, output %.3f ms"
      % (len(rows), *med))'
done
