#!/usr/bin/env bash
# The kill matrix: each step that writes the registry is SIGKILLed at random
# moments and run again until it finishes, and what it stored must equal an
# uninterrupted run of the same step: same content, nothing twice, no lease
# or in-flight mark left, `PRAGMA integrity_check` ok, no child process left
# behind. Steps: capture (the transformers tracer), select (features and the
# selection over a crawled synthetic Hub), run --stage=unit, run
# --stage=module,model,train, and merge (of three unit shards).
#
# Each kill comes after a random delay in [0, T) where T is the step's
# uninterrupted wall time (so some land in start-up, some mid-way, some miss
# because a resumed step has less left to do). KILL_MATRIX_KILLS (default 3)
# kills per step; KILL_MATRIX_SEED seeds the draws. Prints one table row per
# step. Needs COVERAGE_BIN, COVERAGE_HOME (with .venv) and HUB_REPLAY_BIN.
set -uo pipefail
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
SRC=${COVERAGE_HOME:?set COVERAGE_HOME}
KILLS=${KILL_MATRIX_KILLS:-3}
[[ $KILLS =~ ^[1-9][0-9]{0,2}$ ]] || { echo "kill_matrix: KILL_MATRIX_KILLS '$KILLS' is not a whole number 1..999" >&2; exit 2; }
SEED=${KILL_MATRIX_SEED:-$$}
[[ $SEED =~ ^[0-9]{1,9}$ ]] || { echo "kill_matrix: KILL_MATRIX_SEED '$SEED' is not a whole number" >&2; exit 2; }
RANDOM=$SEED
TMP=$(mktemp -d)
source "$(dirname "$0")/lib.sh"
trap 'kill $HUB_PID 2>/dev/null; pkill -9 -f "$TMP/home" 2>/dev/null; rm -rf "$TMP"' EXIT
# A home of our own, so that our workers and tracers (started from it) can be
# told apart from those of tests running beside us.
mkdir -p "$TMP/home"
for d in configs data capture .venv; do ln -s "$SRC/$d" "$TMP/home/$d"; done
export COVERAGE_HOME=$TMP/home
children() { pgrep -f -- "$TMP/home" | wc -l; }
now_ms() { date +%s%3N; }
echo "kill matrix: $KILLS kills per step, seed $SEED"
printf '%-8s %6s %5s %7s  %-28s %s\n' step T_ms kills missed "kill points (ms)" verdict

# step DB ARGS...: `coverage -q --registry DB ARGS...`, as this process (so
# that a SIGKILL reaches coverage itself, not a shell around it). Exit 1 (some
# case failed) is a finished step; 2 and above are not.
step() {
  local db=$1
  shift
  "$BIN" -q --registry "$db" "$@"
  local rc=$?
  [ "$rc" -le 1 ]
}

# killed_until_done NAME T_MS DB ARGS...: runs the step ARGS on DB KILLS
# times, each SIGKILLed after a random delay below T_MS, then once to the end.
killed_until_done() {
  local name=$1 t_ms=$2 db=$3
  shift 3
  local kills=0 missed=0 points="" pid delay
  for _ in $(seq "$KILLS"); do
    delay=$(( (RANDOM * 32768 + RANDOM) % (t_ms > 0 ? t_ms : 1) ))
    "$BIN" -q --registry "$db" "$@" >"$TMP/$name.killed.out" 2>&1 &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); points="$points$delay "; else missed=$((missed + 1)); fi
    wait "$pid" 2>/dev/null
    # Children die with their parent (PR_SET_PDEATHSIG).
    for _ in $(seq 100); do [ "$(children)" -eq 0 ] && break; sleep 0.05; done
    check "$name: no child outlives a kill" test "$(children)" -eq 0
  done
  step "$db" "$@" >"$TMP/$name.final.out" 2>&1
  check "$name: the run after the kills finishes" test $? -eq 0 || tail -5 "$TMP/$name.final.out" >&2
  check "$name: integrity_check ok" test "$(sqlite3 "$db" 'PRAGMA integrity_check')" = ok
  check "$name: no foreign key broken" test -z "$(sqlite3 "$db" 'PRAGMA foreign_key_check')"
  check "$name: no lease left" test "$(sqlite3 "$db" 'SELECT COUNT(*) FROM run_leases')" -eq 0
  check "$name: nothing left in flight" test "$(sqlite3 "$db" 'SELECT COUNT(*) FROM in_flight')" -eq 0
  KILLED=$kills MISSED=$missed POINTS=${points:-none}
}

# timed T_VAR CMD...: runs CMD once, uninterrupted, and stores its wall ms.
timed() {
  local var=$1 start
  shift
  start=$(now_ms)
  "$@"
  local rc=$?
  printf -v "$var" '%d' $(($(now_ms) - start))
  return $rc
}

# same NAME REF_DB KILLED_DB SQL: the query's rows are equal on both.
same() {
  sqlite3 "$2" "$4" >"$TMP/$1.ref.txt"
  sqlite3 "$3" "$4" >"$TMP/$1.got.txt"
  check "$1: equal to the uninterrupted run ($(wc -l <"$TMP/$1.ref.txt") rows)" \
    test -s "$TMP/$1.ref.txt" -a -z "$(diff "$TMP/$1.ref.txt" "$TMP/$1.got.txt" | head -1)" ||
    diff "$TMP/$1.ref.txt" "$TMP/$1.got.txt" | head -5 >&2
}

row() {
  local verdict=identical
  [ "$fail" -gt "$1" ] && verdict="DIFFERS ($((fail - $1)) checks failed)"
  printf '%-8s %6d %5d %7d  %-28s %s\n' "$2" "$3" "$KILLED" "$MISSED" "$POINTS" "$verdict"
}

# --- capture: six tiny configs of real architectures, prefill and train ------
MODELS=$SRC/capture/tracer/tests/tiny_models.jsonl
capture=(capture --models "$MODELS" --profile prefill --profile train)
fail0=$fail
timed t step "$TMP/ref.db" "${capture[@]}" >"$TMP/capture.ref.out" 2>&1
check "capture: the uninterrupted run succeeds" test $? -eq 0 || tail -5 "$TMP/capture.ref.out" >&2
killed_until_done capture "$t" "$TMP/killed.db" "${capture[@]}"
programs="SELECT model_id, profile, status, stage, reason, kind, calls, cases, unsupported_calls, value_count
          FROM programs ORDER BY model_id, profile"
same capture-programs "$TMP/ref.db" "$TMP/killed.db" "$programs"
calls="SELECT p.model_id, p.profile, pc.call_index, c.key, pc.op, pc.overload, pc.inputs, pc.outputs, pc.module, pc.phase
       FROM program_calls pc JOIN programs p USING (program_id) LEFT JOIN op_cases c ON c.case_id = pc.case_id
       ORDER BY p.model_id, p.profile, pc.call_index"
same capture-calls "$TMP/ref.db" "$TMP/killed.db" "$calls"
same capture-cases "$TMP/ref.db" "$TMP/killed.db" "SELECT key, case_json FROM op_cases ORDER BY key"
same capture-sources "$TMP/ref.db" "$TMP/killed.db" \
  "SELECT c.key, s.model_id, s.module_path, s.call_site, s.profile, s.depth, s.call_count, s.first_call
   FROM case_sources s JOIN op_cases c USING (case_id) ORDER BY 1, 2, 3, 4, 5, 6"
row "$fail0" capture "$t"

# --- select: features and a selection over a crawled synthetic Hub ----------
start_hub_replay --synthetic 50000 --seed 5
trap 'kill $HUB_PID 2>/dev/null; pkill -9 -f "$TMP/home" 2>/dev/null; rm -rf "$TMP"' EXIT
"$BIN" -q --registry "$TMP/hub.db" crawl --agent --endpoint "$URL" --rate 0 --budget 2500 >"$TMP/crawl.out" 2>&1
check "select: the crawl for it succeeds" test $? -eq 0
cp "$TMP/hub.db" "$TMP/hub-killed.db"
selecting=(select --k 40 --show 0)
fail0=$fail
timed t step "$TMP/hub.db" "${selecting[@]}" >"$TMP/select.ref.out" 2>&1
check "select: the uninterrupted run succeeds" test $? -eq 0
killed_until_done select "$t" "$TMP/hub-killed.db" "${selecting[@]}"
check "select: one selection stored" test "$(sqlite3 "$TMP/hub-killed.db" 'SELECT COUNT(*) FROM selections')" -eq 1
same select-features "$TMP/hub.db" "$TMP/hub-killed.db" \
  "SELECT model_id, version, status, reason, understood, features_json, coarse, fine FROM features ORDER BY model_id"
same select-reps "$TMP/hub.db" "$TMP/hub-killed.db" \
  "SELECT rank, model_id, stands_for, downloads_represented, reason FROM representatives ORDER BY rank"
same select-members "$TMP/hub.db" "$TMP/hub-killed.db" \
  "SELECT model_id, representative_rank, distance FROM selection_members ORDER BY model_id"
row "$fail0" select "$t"

# --- run --stage=unit on the captured cases ---------------------------------
cp "$TMP/ref.db" "$TMP/base.db"
results="SELECT c.key, r.outcome, r.error, r.max_abs_err, r.max_rel_err, r.mismatch_frac, r.cosine, r.error_ratio,
                r.attempts, r.flaky
         FROM results r JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = 'u' ORDER BY c.key"
unit=(--threads 1 run --stage=unit --run u)
fail0=$fail
cp "$TMP/base.db" "$TMP/unit-killed.db"
timed t step "$TMP/ref.db" "${unit[@]}" >"$TMP/unit.ref.out" 2>&1
check "unit: the uninterrupted run succeeds" test $? -eq 0 || tail -5 "$TMP/unit.ref.out" >&2
killed_until_done unit "$t" "$TMP/unit-killed.db" "${unit[@]}"
same unit-results "$TMP/ref.db" "$TMP/unit-killed.db" "$results"
check "unit: the run is finished" test -n "$(sqlite3 "$TMP/unit-killed.db" "SELECT finished_at FROM runs WHERE run_id = 'u'")"
row "$fail0" unit "$t"

# --- run --stage=module,model,train on the captured programs ----------------
# The tiny models stand in for a crawl's configs: select them all.
for db in "$TMP/base.db"; do
  sqlite3 "$db" "UPDATE models SET config_status = 'fetched'"
  step "$db" select --k 4 --show 0 >"$TMP/select-tiny.out" 2>&1
  check "models: the tiny models are selected" test "$(sqlite3 "$db" 'SELECT COUNT(*) FROM representatives')" -eq 4 ||
    cat "$TMP/select-tiny.out" >&2
done
cp "$TMP/base.db" "$TMP/models-ref.db"
cp "$TMP/base.db" "$TMP/models-killed.db"
models=(--threads 1 run --stage module,model,train --run m --max-gb 4 --train-steps 1)
fail0=$fail
timed t step "$TMP/models-ref.db" "${models[@]}" >"$TMP/models.ref.out" 2>&1
check "models: the uninterrupted run succeeds" test $? -eq 0 || tail -5 "$TMP/models.ref.out" >&2
killed_until_done models "$t" "$TMP/models-killed.db" "${models[@]}"
same models-results "$TMP/models-ref.db" "$TMP/models-killed.db" \
  "SELECT model_id, profile, stage, item, outcome, error, blocked_by, max_abs_err, max_rel_err, cosine, error_ratio,
          attempts, flaky FROM model_results WHERE run_id = 'm' ORDER BY model_id, stage, item"
row "$fail0" models "$t"

# --- merge of three unit shards ---------------------------------------------
for i in 0 1 2; do
  cp "$TMP/base.db" "$TMP/shard-$i.db"
  step "$TMP/shard-$i.db" "${unit[@]}" --shard "$i/3" >"$TMP/shard-$i.out" 2>&1
  check "merge: shard $i runs" test $? -eq 0
done
cp "$TMP/base.db" "$TMP/merge-ref.db"
cp "$TMP/base.db" "$TMP/merge-killed.db"
merge=(merge "$TMP"/shard-?.db)
fail0=$fail
timed t step "$TMP/merge-ref.db" "${merge[@]}" >"$TMP/merge.ref.out" 2>&1
check "merge: the uninterrupted merge succeeds" test $? -eq 0 || tail -5 "$TMP/merge.ref.out" >&2
killed_until_done merge "$t" "$TMP/merge-killed.db" "${merge[@]}"
same merge-results "$TMP/merge-ref.db" "$TMP/merge-killed.db" "$results"
same merge-shards "$TMP/merge-ref.db" "$TMP/merge-killed.db" \
  "SELECT run_id, shard_index, shard_count, finished_at IS NOT NULL FROM run_shards ORDER BY 1, 2, 3"
same merge-whole "$TMP/ref.db" "$TMP/merge-killed.db" "$results"
row "$fail0" merge "$t"

echo "kill matrix: $pass checks passed, $fail failed"
[ "$fail" -eq 0 ]
