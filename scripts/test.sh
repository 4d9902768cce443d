#!/usr/bin/env bash
# Runs every test: installs what is missing, then configures, builds and tests two builds:
#   build/       Release (as scripts/run.sh builds prismd), CUDA kernels on when a toolkit is found
#   build-asan/  Debug with AddressSanitizer + UndefinedBehaviorSanitizer, CPU only
# Both builds always run; the exit status is non-zero when any step of either failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-deps.sh

# CMake's check_language(CUDA) looks for nvcc on PATH; the toolkit's default place is not on it.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

jobs=$(nproc)
declare -A result

# run_build NAME DIR [CMAKE ARGS...]: configure, build and test DIR; records one summary line.
# Every step is checked by hand because errexit does not apply inside a function that is
# called as an if condition.
run_build() {
  local name=$1 dir=$2
  shift 2
  local log="$dir/configure.log"
  mkdir -p "$dir"
  echo "==> $name: configure ($*)"
  if ! cmake -S . -B "$dir" "$@" 2>&1 | tee "$log"; then
    result[$name]="FAILED at configure"
    return 1
  fi
  local cuda="CUDA off"
  if grep -q 'prism: CUDA kernels ON' "$log"; then
    cuda="CUDA on"
  fi
  echo "==> $name: build"
  if ! cmake --build "$dir" -j"$jobs"; then
    result[$name]="FAILED at build ($cuda)"
    return 1
  fi
  echo "==> $name: test"
  if ! ctest --test-dir "$dir" --output-on-failure -j2; then
    result[$name]="FAILED in tests ($cuda)"
    return 1
  fi
  result[$name]="passed ($cuda)"
}

status=0
run_build build build -DCMAKE_BUILD_TYPE=Release || status=1
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
run_build build-asan build-asan -DCMAKE_BUILD_TYPE=Debug -DPRISM_SANITIZE=ON -DPRISM_CUDA=OFF \
  -DPRISM_BENCH=OFF || status=1

echo
for name in build build-asan; do
  echo "test.sh: $name: ${result[$name]}"
done
exit "$status"
