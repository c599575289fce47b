#!/usr/bin/env bash
# Configures and builds coverage into build/ ($COVERAGE_BUILD_DIR; Ninja and
# ccache when present). The build links the libtorch of the project venv
# (.venv/, scripts/setup.sh); COVERAGE_TORCH_PYTHON=/path/to/python builds
# against that Python's torch instead (a CUDA build, a nightly, the one a
# backend was built with). For a CUDA build of torch it finds the CUDA
# toolkit, the GPU architectures and NVRTC itself and says what it chose
# (scripts/cuda-flags.sh; README, "Building against your own PyTorch").
# Arguments are targets to build (e.g. `coverage coverage_sim hub-replay`,
# what the main job runs); none builds everything, tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-flags.sh
dir=${COVERAGE_BUILD_DIR:-build}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ ! -f $dir/CMakeCache.txt || -n ${COVERAGE_TORCH_PYTHON:-} ]]; then
  torch=()
  if [[ -n ${COVERAGE_TORCH_PYTHON:-} ]]; then torch=(-DCOVERAGE_TORCH_PYTHON="$COVERAGE_TORCH_PYTHON"); fi
  cuda_flags "${COVERAGE_TORCH_PYTHON:-.venv/bin/python}"
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${torch[@]}" "${CUDA_FLAGS[@]}"
fi
targets=()
if (($# > 0)); then targets=(--target "$@"); fi
cmake --build "$dir" --parallel "$(nproc)" "${targets[@]}"
