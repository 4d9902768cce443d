#!/usr/bin/env bash
# Runs every test: installs what is missing, then configures, builds and tests four builds:
#   build/       Release (as scripts/run.sh builds prismd), CUDA kernels on when nvcc is found;
#                every test (the GPU ones skip without a GPU)
#   build-asan/  Debug with AddressSanitizer + UndefinedBehaviorSanitizer, CPU only; every test
#   build-emu/   the CUDA code on the device emulation (cudaemu/), with ASan + UBSan; the tests
#                labelled cuda, which run there instead of skipping
#   build-tsan/  the same under ThreadSanitizer on smaller sizes; the tests labelled cuda, and
#                test_missing_barrier, which checks that a removed __syncthreads is reported
# The emulated builds need the CUDA toolkit's headers, not nvcc or a GPU; without a toolkit they
# are skipped with one line and the CPU builds still run. Each build's summary line says how many
# CUDA tests ran and how many skipped. The exit status is non-zero when any step of any build
# failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

# CMake's check_language(CUDA) looks for nvcc on PATH; the toolkit's default place is not on it.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

jobs=$(nproc)
declare -A result

# The CUDA tests of a build that ran and that skipped, from ctest's log: "N ran, M skipped".
cuda_count() {
  local dir=$1 log=$2 names ran=0 skipped=0 name
  names=$(ctest --test-dir "$dir" -N -L cuda | sed -n 's/^ *Test *#[0-9]*: *//p')
  for name in $names; do
    if grep -Eq "Test +#[0-9]+: $name \.+ *\*\*\*Skipped" "$log"; then
      skipped=$((skipped + 1))
    elif grep -Eq "Test +#[0-9]+: $name \.+ *Passed" "$log"; then
      ran=$((ran + 1))
    fi
  done
  echo "$ran CUDA tests ran, $skipped skipped"
}

# run_build NAME DIR LABEL [CMAKE ARGS...]: configure, build and test DIR (only the tests with
# LABEL when it is not empty); records one summary line. Every step is checked by hand because
# errexit does not apply inside a function that is called as an if condition.
run_build() {
  local name=$1 dir=$2 label=$3
  shift 3
  local log="$dir/configure.log" testlog="$dir/test.log"
  mkdir -p "$dir"
  echo "==> $name: configure ($*)"
  if ! cmake -S . -B "$dir" "$@" 2>&1 | tee "$log"; then
    result[$name]="FAILED at configure"
    return 1
  fi
  local cuda="CUDA off"
  if grep -q 'prism: CUDA kernels ON (emulated)' "$log"; then
    cuda="CUDA emulated"
  elif grep -q 'prism: CUDA kernels ON' "$log"; then
    cuda="CUDA on"
  fi
  echo "==> $name: build"
  if ! cmake --build "$dir" -j"$jobs"; then
    result[$name]="FAILED at build ($cuda)"
    return 1
  fi
  echo "==> $name: test${label:+ (label $label)}"
  local select=()
  [[ -n "$label" ]] && select=(-L "$label")
  local rc=0
  ctest --test-dir "$dir" --output-on-failure -j2 "${select[@]}" 2>&1 | tee "$testlog" || rc=$?
  local counts="$cuda"
  [[ "$cuda" != "CUDA off" ]] && counts="$cuda: $(cuda_count "$dir" "$testlog")"
  if ((rc != 0)); then
    result[$name]="FAILED in tests ($counts)"
    return 1
  fi
  result[$name]="passed ($counts)"
}

# The toolkit's headers, as cudaemu/CMakeLists.txt looks for them.
toolkit_headers() {
  local d
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr; do
    [[ -n "$d" && -f "$d/include/cuda_runtime_api.h" && -f "$d/include/nccl.h" && -f "$d/include/cublasLt.h" ]] &&
      return 0
  done
  return 1
}

status=0
builds=(build build-asan)
run_build build build "" -DCMAKE_BUILD_TYPE=Release || status=1
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_build build-asan build-asan "" -DCMAKE_BUILD_TYPE=Debug -DPRISM_SANITIZE=ON -DPRISM_CUDA=OFF \
  -DPRISM_BENCH=OFF || status=1

if toolkit_headers; then
  builds+=(build-emu build-tsan)
  run_build build-emu build-emu cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPRISM_CUDAEMU=ON \
    -DPRISM_SANITIZE=ON -DPRISM_BENCH=OFF || status=1
  unset ASAN_OPTIONS
  run_build build-tsan build-tsan cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPRISM_CUDAEMU=ON \
    -DPRISM_TSAN=ON -DPRISM_BENCH=OFF || status=1
else
  echo "test.sh: build-emu, build-tsan: skipped: no CUDA toolkit headers (cuda_runtime_api.h, nccl.h," \
    "cublasLt.h under \$CUDA_HOME, /usr/local/cuda or /usr): the emulated CUDA builds need them"
fi

echo
for name in "${builds[@]}"; do
  echo "test.sh: $name: ${result[$name]}"
done
exit "$status"
