#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite, then every fuzz target for
# 20 s on its seed corpus (scripts/fuzz.sh) when clang is there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 600)
if command -v clang++ >/dev/null 2>&1; then
  bash scripts/fuzz.sh 20
else
  echo "test: fuzz targets skipped: clang++ not found (bash scripts/setup.sh installs it)"
fi
