#!/usr/bin/env bash
# Runs one fuzz target of a PRISM_FUZZ build for a number of executions (default 10^7), as the
# runs recorded in bench/README.md were made:  fuzz/run.sh BUILD_DIR TARGET [RUNS [SECONDS]]
# (SECONDS: stop there if RUNS are not done by then; 0 or none: no limit; FUZZ_NICE: its nice
# level, 19 unless set).
# New inputs go to BUILD_DIR/fuzz-work/TARGET (the committed corpus is only read); libFuzzer's
# log is BUILD_DIR/fuzz-logs/TARGET/fuzz-0.log (-jobs=1 runs the fuzzer in one child process).
# Afterwards, fuzz/run.sh --merge BUILD_DIR TARGET minimizes the committed corpus together with
# what the run found (-merge=1, inputs of at most MERGE_MAX_BYTES) into fuzz/corpus/TARGET.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
max_len() {
  case "$1" in
    config) echo 2048 ;;
    trace) echo 4096 ;;
    rest) echo 2048 ;;
    agent_message) echo 4096 ;;
    agent_frames) echo 4096 ;;
    hints) echo 16384 ;;
    plans) echo 16384 ;;
    *) echo 4096 ;;
  esac
}
if [[ "${1:-}" == "--merge" ]]; then
  # The committed corpus is kept small: only inputs of at most MERGE_MAX_BYTES (default 512 for
  # trace and rest, whose short lines cover what long ones do, 4096 for hints and plans, 1024 for the
  # others) are candidates;
  # -merge=1 keeps the fewest of them with all their coverage.
  build=$2 target=$3 cap=${MERGE_MAX_BYTES:-1024}
  [[ -z "${MERGE_MAX_BYTES:-}" && ("$target" == trace || "$target" == rest) ]] && cap=512
  # A hint table is a 1024-byte header and its slots: a valid one is longer than 1024 bytes.
  [[ -z "${MERGE_MAX_BYTES:-}" && ("$target" == hints || "$target" == plans) ]] && cap=4096
  fresh=$(mktemp -d) candidates=$(mktemp -d)
  find "$here/corpus/$target" "$build/fuzz-work/$target" -type f -size -$((cap + 1))c \
    -exec cp {} "$candidates/" \;
  "$build/fuzz/fuzz_$target" -merge=1 -max_len="$(max_len "$target")" "$fresh" "$candidates"
  # Inputs that once crashed the target stay, whatever their size and coverage.
  cp "$here/corpus/$target"/regression-* "$fresh/" 2>/dev/null || true
  rm -rf "${here:?}/corpus/$target"
  mkdir -p "$here/corpus/$target"
  cp "$fresh"/* "$here/corpus/$target/"
  rm -rf "$fresh" "$candidates"
  exit 0
fi
build=$(cd "$1" && pwd) target=$2 runs=${3:-10000000} seconds=${4:-0}
mkdir -p "$build/fuzz-work/$target" "$build/fuzz-logs/$target"
dict=()
[[ -f "$here/$target.dict" ]] && dict=(-dict="$here/$target.dict")
cd "$build/fuzz-logs/$target"
start=$(date +%s)
set +e
nice -n "${FUZZ_NICE:-19}" "$build/fuzz/fuzz_$target" -runs="$runs" -max_total_time="$seconds" -max_len="$(max_len "$target")" -jobs=1 \
  -print_final_stats=1 "${dict[@]}" "$build/fuzz-work/$target" "$here/corpus/$target" \
  >run.log 2>&1
rc=$?
set -e
echo "exit $rc, wall $(( $(date +%s) - start )) s" >>run.log
exit $rc
