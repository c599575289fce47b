#!/usr/bin/env bash
# Runs the whole ctest suite of build/ N times in a row (default 5), with
# BUSY busy loops beside it (default 0: `BUSY=2 bash scripts/stability.sh`),
# and prints one line per run and a summary: a test that fails in any run is
# named with its run. Each run's full output is kept in build/stability/.
# Build first (scripts/build.sh); extra arguments go to ctest.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
shift || true
busy=${BUSY:-0}
if ! [[ $runs =~ ^[1-9][0-9]{0,2}$ ]]; then
  echo "stability: the number of runs must be a whole number from 1 to 999, got '$runs'" >&2
  exit 2
fi
if ! [[ $busy =~ ^[0-9]{1,2}$ ]]; then
  echo "stability: BUSY must be a whole number from 0 to 99, got '$busy'" >&2
  exit 2
fi
[[ -d build ]] || { echo "stability: no build/ (run bash scripts/build.sh first)" >&2; exit 2; }
logs=build/stability
mkdir -p "$logs"
loops=()
stop_loops() { for p in "${loops[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_loops EXIT
for ((i = 0; i < busy; i++)); do
  (while :; do :; done) &
  loops+=($!)
done
failed_runs=0
for ((run = 1; run <= runs; run++)); do
  log=$logs/run-$run-busy-$busy.log
  start=$(date +%s)
  (cd build && ctest --output-on-failure --parallel "$(nproc)" --timeout 600 "$@") >"$log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -1)
  echo "stability: run $run of $runs (busy loops: $busy): exit $rc in ${took} s: ${summary:-no summary}"
  if [[ $rc -ne 0 ]]; then
    failed_runs=$((failed_runs + 1))
    sed -n '/The following tests FAILED/,$p' "$log" | sed 's/^/  /'
  fi
done
echo "stability: $((runs - failed_runs)) passed, $failed_runs failed"
[[ $failed_runs -eq 0 ]]
