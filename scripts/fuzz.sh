#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ into build-fuzz/ (clang, ASan, UBSan;
# no libtorch) and runs each for SECONDS (default 20) on a scratch copy of its
# seed corpus (fuzz/corpus/<target>/, left unchanged). Prints each target's
# executions and exec/s; exits 1 on any crash, leak, timeout or out-of-memory,
# with the reproducing input kept in build-fuzz/artifacts/<target>/.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]    e.g. bash scripts/fuzz.sh 600 op_case
#
# FUZZ_JOBS (default 2) builds with that many jobs; the targets run one at a
# time, each on one core. FUZZ_RUNS=N stops each target after N executions
# instead (SECONDS is then ignored): FUZZ_RUNS=10000000 bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-20}
shift || true
limit=(-max_total_time="$seconds")
if [[ -n ${FUZZ_RUNS:-} ]]; then
  [[ $FUZZ_RUNS =~ ^[1-9][0-9]{0,11}$ ]] || { echo "fuzz: FUZZ_RUNS '$FUZZ_RUNS' is not a positive whole number" >&2; exit 1; }
  limit=(-runs="$FUZZ_RUNS")
fi
all=(op_case worker_protocol hub_listing hub_headers config_features program expectations tolerances terminal_text)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")

if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found (bash scripts/setup.sh installs it)" >&2
  exit 1
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [[ ! -f build-fuzz/CMakeCache.txt ]]; then
  CC=clang CXX=clang++ cmake -S fuzz -B build-fuzz "${generator[@]}" >/dev/null
fi
cmake --build build-fuzz --parallel "${FUZZ_JOBS:-2}" >/dev/null

failed=()
printf '%-18s %12s %8s %10s  %s\n' target executions seconds exec/s result
for t in "${targets[@]}"; do
  bin=build-fuzz/bin/fuzz_$t
  [[ -x $bin && -d fuzz/corpus/$t ]] || { echo "fuzz: unknown target '$t' (known: ${all[*]})" >&2; exit 1; }
  work=build-fuzz/work/$t artifacts=build-fuzz/artifacts/$t log=build-fuzz/logs/$t.log
  rm -rf "$work" && mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  cp fuzz/corpus/$t/* "$work/"
  rc=0
  "$bin" "$work" -dict=fuzz/json.dict "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  took=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log" | tail -1)
  elapsed=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE '[0-9]+ second' | grep -oE '[0-9]+' || true)
  result=ok
  if ((rc != 0)); then
    result="FAILED (exit $rc; $(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|ERROR: AddressSanitizer: [a-z-]+|runtime error|fuzz invariant failed|ERROR: LeakSanitizer' "$log" || echo 'see log'); log $log)"
    failed+=("$t")
  fi
  printf '%-18s %12s %8s %10s  %s\n' "$t" "${runs:-?}" "${elapsed:-$seconds}" "${took:-?}" "$result"
done
if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}; inputs in build-fuzz/artifacts/" >&2
  exit 1
fi
