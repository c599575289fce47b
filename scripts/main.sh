#!/usr/bin/env bash
# The main job: the whole mission on the real Hub data bundled in data/hub.
#
#   1. hub-replay serves data/hub on loopback (a local Hub API: listing,
#      model info, config.json);
#   2. `coverage crawl --agent` crawls it within a request budget;
#   3. `coverage select` picks one representative per family (coarse
#      signature, Note [Signatures]);
#   4. `coverage capture --selection` traces them with transformers under the
#      main job's short profiles (configs/main_profiles.json);
#   5. `coverage nightly` on the simulated accelerator `sim` ($COVERAGE_BACKEND
#      picks another) configured by configs/sim_main.json (bf16 matmul
#      operands, declared, and three faults; $COVERAGE_SIM_CONFIG picks
#      another): the unit, module, model and train stages, then the
#      report against the previous main job.
#
# Every step resumes: rerun after Ctrl-C and finished work is kept (the crawl
# agent's trace, the traced pairs, the nightly's finished cases and models).
# Outputs under $COVERAGE_OUT (default out/): main.db, reports/<run>/. Wall
# time per step is printed at the end; the last line is `report: <path>`.
# Environment: COVERAGE_BACKEND (sim), MAIN_BUDGET (crawl requests, 600),
# MAIN_K (representatives; default one per family), MAIN_PROFILES
# (configs/main_profiles.json), MAIN_NIGHTLY (configs/nightly_main.json),
# MAIN_SYNTHETIC (serve a synthetic hub of that many models instead of
# data/hub). The full-size mission (bench/README.md, "The main job"):
#   MAIN_SYNTHETIC=1000000 MAIN_BUDGET=100000 MAIN_K=841 \
#   COVERAGE_OUT=out/full bash scripts/main.sh
# (MAIN_PROFILES=configs/capture_profiles.json MAIN_NIGHTLY=configs/nightly.json
# add the long profiles).
# Extra arguments go to `coverage nightly`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
declare -a STEP_NAMES=() STEP_SECONDS=()
step_start=0
begin() { step_start=$(date +%s.%N); printf '\n== %s\n' "$1"; }
end_step() {
  STEP_NAMES+=("$1")
  STEP_SECONDS+=("$(awk -v a="$step_start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')")
}
print_times() {
  [ ${#STEP_NAMES[@]} -gt 0 ] || return 0
  printf '\nwall time per step:\n'
  local total=0 i
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-10s %8s s\n' "${STEP_NAMES[$i]}" "${STEP_SECONDS[$i]}"
    total=$(awk -v a="$total" -v b="${STEP_SECONDS[$i]}" 'BEGIN{printf "%.1f", a+b}')
  done
  printf '  %-10s %8s s\n' "total" "$total"
}

begin setup
bash scripts/setup.sh
end_step setup
begin build
# Only what the job runs: the CLI (and its workers), sim, the hub replay
# server; the test command builds the tests, benchmarks and fuzz targets.
bash scripts/build.sh coverage coverage_sim hub-replay
end_step build

OUT=${COVERAGE_OUT:-out}
mkdir -p "$OUT"
REGISTRY=${COVERAGE_REGISTRY:-$OUT/main.db}
BIN=$ROOT/build/bin
B=("$BIN/coverage" --registry "$REGISTRY")
PROFILES=${MAIN_PROFILES:-configs/main_profiles.json}
NIGHTLY=${MAIN_NIGHTLY:-configs/nightly_main.json}
BUDGET=${MAIN_BUDGET:-600}
K=${MAIN_K:-}

hub_pid=""
cleanup() {
  if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'print_times; exit 130' INT TERM

begin crawl
hub_log=$OUT/hub-replay.log
hub_source=(--data data/hub)
[ -n "${MAIN_SYNTHETIC:-}" ] && hub_source=(--synthetic "$MAIN_SYNTHETIC")
"$BIN/hub-replay" --port 0 "${hub_source[@]}" >"$hub_log" 2>&1 &
hub_pid=$!
endpoint=""
for _ in $(seq 1 100); do
  endpoint=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$hub_log" | head -1 || true)
  [ -n "$endpoint" ] && break
  kill -0 "$hub_pid" 2>/dev/null || { cat "$hub_log" >&2; echo "main: hub-replay did not start" >&2; exit 2; }
  sleep 0.1
done
[ -n "$endpoint" ] || { echo "main: hub-replay printed no address within 10 s ($hub_log)" >&2; exit 2; }
resume=()
[ -f "${REGISTRY%.db}.agent.jsonl" ] && resume=(--resume)
HF_ENDPOINT=$endpoint "${B[@]}" crawl --agent --budget "$BUDGET" --rate 0 "${resume[@]}"
kill "$hub_pid" 2>/dev/null || true
wait "$hub_pid" 2>/dev/null || true
hub_pid=""
end_step crawl

begin select
if [ -n "$K" ]; then
  "${B[@]}" select --k "$K" --show 0
else
  "${B[@]}" select --per-family --show 0
fi
end_step select

begin capture
"${B[@]}" capture --selection --profiles "$PROFILES" --max-gb 4
end_step capture

begin nightly
# The nightly's id is kept until it has finished, so a rerun resumes it.
id_file=$OUT/main.nightly-id
if [ -s "$id_file" ]; then
  run_id=$(cat "$id_file")
  echo "resuming nightly $run_id"
else
  run_id=main-$(date -u +%Y%m%dT%H%M%SZ)
  echo "$run_id" >"$id_file"
fi
set +e
# sim as the main job runs it: its numerics and three realistic faults
# (configs/sim_main.json says which and why).
export COVERAGE_SIM_CONFIG=${COVERAGE_SIM_CONFIG:-$ROOT/configs/sim_main.json}
"${B[@]}" nightly --config "$NIGHTLY" --run-id "$run_id" --backend "${COVERAGE_BACKEND:-sim}" "$@" | tee "$OUT/nightly.log"
rc=${PIPESTATUS[0]}
set -e
end_step nightly
if [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ]; then rm -f "$id_file"; fi
print_times
echo "registry: $REGISTRY (query it: build/bin/coverage --registry '$REGISTRY' registry stats)"
report=$(grep '^report: ' "$OUT/nightly.log" | tail -1 || true)
[ -n "$report" ] && echo "$report"
exit "$rc"
