#!/usr/bin/env bash
# The layering check catches what it is for: a scratch tree with one
# allowed include passes; a stage-to-report include, a torch header in a
# torch-free folder, a torch-facing project header there, and a folder
# without its README each fail with the file and line named.
set -euo pipefail
check=$(cd "$(dirname "$0")" && pwd)/check_layering.sh
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
for f in core reports stages isolation backends; do
  mkdir -p "$t/$f"; touch "$t/$f/CMakeLists.txt" "$t/$f/README.md"
done
printf '#include "core/result.h"\n' >"$t/stages/a.cc"
printf '#include "core/result.h"\n#include <ATen/ATen.h>\n' >"$t/backends/b.cc"
out=$(bash "$check" "$t") || { echo "a clean tree failed: $out"; exit 1; }

expect_fail() {  # what, pattern
  if out=$(bash "$check" "$t" 2>&1); then echo "not caught: $1"; exit 1; fi
  grep -qF -- "$2" <<<"$out" || { echo "$1: expected '$2' in: $out"; exit 1; }
}
printf '#include "core/result.h"\n#include "reports/report.h"\n' >"$t/stages/a.cc"
expect_fail "stages including reports" "stages/a.cc:2: stages/ must not include reports/report.h"
printf '#include "core/result.h"\n' >"$t/stages/a.cc"
printf '#include <ATen/ATen.h>\n' >"$t/isolation/w.cc"
expect_fail "ATen in isolation" "isolation/w.cc:1: isolation/ is torch-free and must not include libtorch headers"
printf '#include "backends/backend.h"\n' >"$t/isolation/w.cc"
expect_fail "backend.h in isolation" "isolation/w.cc:1: isolation/ is torch-free and must not include the torch-facing backends/backend.h"
rm "$t/isolation/w.cc"
printf 'add_library(coverage_isolation STATIC w.cc)\ntarget_link_libraries(coverage_isolation\n  PUBLIC coverage_core coverage_replay\n  PRIVATE fmt::fmt)\n' >"$t/isolation/CMakeLists.txt"
expect_fail "isolation linking replay" "isolation/CMakeLists.txt:3: isolation/ is torch-free and must not link coverage_replay"
printf 'target_link_libraries(coverage_isolation PUBLIC coverage_core coverage_replay_rules)\n' >"$t/isolation/CMakeLists.txt"
out=$(bash "$check" "$t") || { echo "the torch-free rules library was refused: $out"; exit 1; }
rm "$t/reports/README.md"
expect_fail "a folder without README" "reports/: every folder library has its own CMakeLists.txt and README.md"
echo "layering check: all planted violations caught"
