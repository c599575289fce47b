#!/usr/bin/env bash
# Configures and builds coverage into build/ (Ninja and ccache when present).
# The build links the libtorch of the project venv (.venv/, scripts/setup.sh);
# COVERAGE_TORCH_PYTHON=/path/to/python builds against that Python's torch
# instead (a CUDA build, a nightly, the one a backend was built with).
# Arguments are targets to build (e.g. `coverage coverage_sim hub-replay`,
# what the main job runs); none builds everything, tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ ! -f build/CMakeCache.txt || -n ${COVERAGE_TORCH_PYTHON:-} ]]; then
  torch=()
  if [[ -n ${COVERAGE_TORCH_PYTHON:-} ]]; then torch=(-DCOVERAGE_TORCH_PYTHON="$COVERAGE_TORCH_PYTHON"); fi
  cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${torch[@]}"
fi
targets=()
if (($# > 0)); then targets=(--target "$@"); fi
cmake --build build --parallel "$(nproc)" "${targets[@]}"
