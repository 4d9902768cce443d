#!/usr/bin/env bash
# The README's first command: installs what is missing, builds prismd and prismctl (Release, in
# build-release/service/) and starts prismd in the foreground on its embedded default (HTTP on 127.0.0.1:8080,
# state in ./prism-data). Arguments go to prismd unchanged: `scripts/run.sh --help` lists them.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Set-up output goes to stderr, so that stdout is prismd's alone (`run.sh --help > file`).
bash scripts/install-deps.sh >&2
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release >&2
cmake --build build-release -j"$(nproc)" --target prismd prismctl >&2

exec ./build-release/service/prismd "$@"
