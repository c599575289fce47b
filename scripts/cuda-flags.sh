# Sourced by scripts/build.sh and scripts/device-check.sh: `cuda_flags PY`
# sets the array CUDA_FLAGS to the CMake flags a build against PY's torch
# needs when that torch is a CUDA build (empty for a CPU build), and says on
# stderr what it chose. Caffe2's CMake config, which find_package(Torch)
# runs, needs three things a wheel's layout does not give it:
#   - the CUDA toolkit (CUDA_TOOLKIT_ROOT_DIR): $CUDA_HOME or $CUDA_PATH, else
#     the prefix nvcc itself reports (its "TOP", which sees through a wrapper
#     script on PATH), else the real path behind nvcc, else /usr/local/cuda*;
#   - the GPU architectures (TORCH_CUDA_ARCH_LIST): $TORCH_CUDA_ARCH_LIST,
#     else none where nvidia-smi sees a GPU (Caffe2 asks the GPU), else
#     "8.0;9.0" (A100, H100), since without a GPU Caffe2's detection compiles
#     a probe that fails;
#   - NVRTC (CUDA_nvrtc_LIBRARY): the wheel's own (nvidia/*/lib beside
#     torch), else the toolkit's.
# Errors (return 1, a message on stderr): a CUDA torch with no toolkit found.
cuda_flags() {
  local py=$1 cuda root="" arch site nvrtc="" c
  CUDA_FLAGS=()
  cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null) || return 0
  [[ -n $cuda ]] || return 0
  root=${CUDA_HOME:-${CUDA_PATH:-}}
  if [[ -z $root ]] && command -v nvcc >/dev/null 2>&1; then
    root=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
    if [[ -n $root && -d $root ]]; then
      root=$(cd "$root" && pwd -P)
    else
      root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    fi
  fi
  if [[ -z $root || ! -x $root/bin/nvcc ]]; then
    root=""
    for c in /usr/local/cuda /usr/local/cuda-*; do
      if [[ -x $c/bin/nvcc ]]; then root=$c; break; fi
    done
  fi
  if [[ -z $root ]]; then
    echo "cuda: $py's torch is built with CUDA $cuda, but no CUDA toolkit was found (no nvcc on PATH, none in" \
         "/usr/local/cuda*): set CUDA_HOME to its prefix" >&2
    return 1
  fi
  arch=${TORCH_CUDA_ARCH_LIST-}
  if [[ -z ${TORCH_CUDA_ARCH_LIST+set} ]] && ! nvidia-smi -L >/dev/null 2>&1; then arch="8.0;9.0"; fi
  site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  for c in "$site"/nvidia/*/lib/libnvrtc.so* "$root"/lib64/libnvrtc.so* "$root"/targets/*/lib/libnvrtc.so*; do
    if [[ -f $c && $c != *builtins* && $c != *alt* ]]; then nvrtc=$c; break; fi
  done
  CUDA_FLAGS+=("-DCUDA_TOOLKIT_ROOT_DIR=$root")
  [[ -n $arch ]] && CUDA_FLAGS+=("-DTORCH_CUDA_ARCH_LIST=$arch")
  [[ -n $nvrtc ]] && CUDA_FLAGS+=("-DCUDA_nvrtc_LIBRARY=$nvrtc")
  echo "cuda: torch built with CUDA $cuda; toolkit $root; architectures ${arch:-those of the GPU here};" \
       "NVRTC ${nvrtc:-left to Caffe2}" >&2
}
