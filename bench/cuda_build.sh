#!/usr/bin/env bash
# That coverage builds against a CUDA build of PyTorch, here, without a GPU
# (not part of CI: about 20 minutes on 2 cores, and 5.4 GB of venv). Makes a
# venv with torch 2.14.1 (a CUDA 13 build; pip takes it from this machine's
# disk) unless PYTHON is given, builds `coverage` against it into
# build-cuda/ through scripts/build.sh (which finds the CUDA toolkit, the
# architectures and NVRTC: scripts/cuda-flags.sh), and lists the backends.
#
#   bash bench/cuda_build.sh [PYTHON]
#   COVERAGE_CUDA_VENV=/path bash bench/cuda_build.sh   # where the venv goes [default: ~/.cache/coverage-cuda-venv]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-}
if [[ -z $py ]]; then
  venv=${COVERAGE_CUDA_VENV:-$HOME/.cache/coverage-cuda-venv}
  if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.14.1
  fi
  py=$venv/bin/python
fi
[[ -x $py ]] || { echo "cuda_build: no Python at '$py'" >&2; exit 2; }
"$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null
start=$(date +%s)
COVERAGE_TORCH_PYTHON=$py COVERAGE_BUILD_DIR=build-cuda bash scripts/build.sh coverage coverage_sim
echo "built in $(($(date +%s) - start)) s"
build-cuda/bin/coverage run --list-backends
