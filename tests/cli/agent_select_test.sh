#!/usr/bin/env bash
# The crawl agent and the select step through the CLI against a local
# hub-replay: the budget holds, the trace explains itself, an interrupted
# agent resumes, select stores a selection, and bad input gets clear errors.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"

start_hub_replay --synthetic 20000 --seed 5
check "hub-replay started" test -n "$URL"
DB="$TMP/agent.db"
agent() { "$BIN" -q --registry "$DB" crawl --agent --endpoint "$URL" --rate 0 "$@"; }

# A budget the agent cannot finish in: it stops at the budget.
agent --budget 300 >"$TMP/a1.out" 2>&1
check "agent run succeeds" test $? -eq 0
check "agent reports its requests" contains "$TMP/a1.out" "300 of 300 requests used"
check "agent says why it stopped" contains "$TMP/a1.out" "stopped: budget spent"
check "trace next to the registry" test -s "$TMP/agent.agent.jsonl"
check "every trace line is a decision with a reason" \
  test "$(grep -c '"why"' "$TMP/agent.agent.jsonl")" -eq "$(wc -l <"$TMP/agent.agent.jsonl")"
configs=$(sqlite3 "$DB" "SELECT COUNT(*) FROM models WHERE config_status IS NOT NULL")
check "configs stored" test "$configs" -gt 100

# Resume with a larger budget goes on from the stored state.
agent --budget 700 --resume >"$TMP/a2.out" 2>&1
check "resumed agent succeeds" test $? -eq 0
check "resumed agent counts the earlier requests" contains "$TMP/a2.out" "of 700 requests used"
check "resume is in the trace" contains "$TMP/agent.agent.jsonl" '"action":"resume"'
more=$(sqlite3 "$DB" "SELECT COUNT(*) FROM models WHERE config_status IS NOT NULL")
check "resumed agent fetched more configs" test "$more" -gt "$configs"

"$BIN" --registry "$DB" crawl --explain >"$TMP/explain.out" 2>&1
check "explain succeeds" test $? -eq 0
check "explain counts decisions" contains "$TMP/explain.out" "decisions"
check "explain shows the discovery curve" contains "$TMP/explain.out" "discovery curve"
check "explain names the most explored regions" contains "$TMP/explain.out" "Most explored"

"$BIN" -q --registry "$DB" select --k 25 --show 5 >"$TMP/select.out" 2>&1
check "select succeeds" test $? -eq 0
check "select prints coverage" contains "$TMP/select.out" "coarse signatures covered"
check "select prints representatives" contains "$TMP/select.out" "stands for"
check "select says how to see the rest" contains "$TMP/select.out" "20 more: --show 25"
check "select stored its representatives" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM v_representatives")" -eq 25
check "every fetched model is a member" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM selection_members")" -eq \
  "$(sqlite3 "$DB" "SELECT COUNT(*) FROM features WHERE status = 'ok'")"

# The representatives through the capture tracer: every (model, profile) the
# structure allows gets a programs row, captured or with the reason.
"$BIN" -q --registry "$DB" capture --selection --profile decode --max-layers 1 --max-gb 0.5 >"$TMP/cap.out" 2>&1
check "capture --selection succeeds" test $? -eq 0
check "capture --selection reports what it captured" contains "$TMP/cap.out" "captured ("
check "representatives were captured" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM programs WHERE status = 'captured'")" -gt 0
check "every representative that decodes has a programs row" \
  test "$(sqlite3 "$DB" "SELECT COUNT(DISTINCT model_id) FROM programs")" -eq \
  "$(sqlite3 "$DB" "SELECT COUNT(*) FROM v_representatives r JOIN features f ON f.model_id = r.model_id WHERE json_extract(f.features_json, '$.structure') IN ('decoder', 'encoder-decoder', 'hybrid', 'ssm', 'multimodal')")"
check "pairs not captured say why" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM programs WHERE status <> 'captured' AND COALESCE(reason, '') = ''")" -eq 0
"$BIN" -q --registry "$DB" capture --selection --profile decode --max-layers 1 --max-gb 0.5 >"$TMP/cap2.out" 2>&1
check "a second capture --selection traces nothing again" contains "$TMP/cap2.out" " 0 captured"
"$BIN" -q --registry "$DB" capture --selection --engine builder >"$TMP/cap3.out" 2>&1
check "the retired --engine is refused" test $? -eq 2
"$BIN" -q --registry "$DB" capture --selection --selection-id 99 >"$TMP/e0.out" 2>&1
check "capture of a missing selection is refused" test $? -eq 2
check "capture names the missing selection" contains "$TMP/e0.out" "no selection 99"

# The module, model and train stages on the representatives replay their
# captured programs: two decoders are captured with small inputs, the rest
# are skipped with the command that would capture them.
cat >"$TMP/profiles.json" <<'JSON'
{"profiles": [
  {"name": "prefill", "families": ["decoder", "encoder", "encoder-decoder", "hybrid", "ssm", "multimodal"], "seq_len": 8},
  {"name": "train", "families": ["decoder", "encoder", "encoder-decoder", "hybrid", "ssm", "multimodal"],
   "batch": 2, "seq_len": 8, "training": true},
  {"name": "image", "families": ["vision", "conv"]},
  {"name": "audio", "families": ["speech"], "seq_len": 16000}
]}
JSON
decoders=$(sqlite3 "$DB" "SELECT r.model_id FROM v_representatives r JOIN programs p ON p.model_id = r.model_id
  WHERE p.profile = 'decode' AND p.status = 'captured' ORDER BY p.estimated_gb, r.model_id LIMIT 2")
model_flags=()
for m in $decoders; do model_flags+=(--model "$m"); done
"$BIN" -q --registry "$DB" capture --selection --profiles "$TMP/profiles.json" --profile prefill --profile train \
  "${model_flags[@]}" --max-layers 1 --max-gb 0.5 >"$TMP/cap4.out" 2>&1
check "two decoders are captured for the model stages" \
  test "$(sqlite3 "$DB" "SELECT COUNT(DISTINCT model_id) FROM programs WHERE profile IN ('prefill', 'train') AND status = 'captured'")" -eq 2 ||
  { tail -5 "$TMP/cap4.out"; sqlite3 "$DB" "SELECT model_id, profile, status, reason FROM programs WHERE profile IN ('prefill', 'train')"; } >&2
# 8 GB: OPT-1.3B's one-layer training step holds its parameters, gradients
# and AdamW moments on both sides (Note [Memory estimate]: about 7.2 GB).
models() { "$BIN" -q --registry "$DB" run --profiles "$TMP/profiles.json" --max-gb 8 --train-steps 1 "$@"; }
models --stage module,model,train --run m1 >"$TMP/m1.out" 2>&1
check "module, model and train on the cpu backend pass" test $? -eq 0
check "the summary names the stages" contains "$TMP/m1.out" "stages module,model,train"
check "every representative has a result for every stage" \
  test "$(sqlite3 "$DB" "SELECT COUNT(DISTINCT model_id || '/' || stage) FROM model_results WHERE run_id = 'm1'")" -eq 75
check "nothing fails on the cpu backend" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM v_model_failures WHERE run_id = 'm1'")" -eq 0
check "every stage with a captured program passed" \
  test "$(sqlite3 "$DB" "SELECT COUNT(DISTINCT model_id || '/' || stage) FROM model_results WHERE run_id = 'm1' AND outcome = 'pass'")" -eq \
  "$(sqlite3 "$DB" "SELECT COUNT(*) FROM (SELECT DISTINCT p.model_id, s.stage FROM programs p,
     (SELECT 'module' AS stage, 'prefill' AS profile UNION ALL SELECT 'model', 'prefill' UNION ALL SELECT 'train', 'train') s
     WHERE p.profile = s.profile AND p.status = 'captured')")" ||
  sqlite3 "$DB" "SELECT model_id, stage, item, outcome, substr(error, 1, 300) FROM model_results WHERE run_id = 'm1'
    AND error NOT LIKE '%coverage capture --selection%'" >&2
check "the others say how to capture them" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM model_results WHERE run_id = 'm1' AND error LIKE '%coverage capture --selection --profile%'")" -gt 0
check "skipped stages say why" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM model_results WHERE run_id = 'm1' AND outcome = 'skipped' AND error = ''")" -eq 0
models --stage module,model,train --run m1 >"$TMP/m2.out" 2>&1
check "resuming a finished run runs nothing" contains "$TMP/m2.out" ", 0 stage runs now"
models --stage unit,model >"$TMP/m3.out" 2>&1
check "unit with model stages is refused" test $? -eq 2
check "the refusal says they run apart" contains "$TMP/m3.out" "run in separate invocations"
models --stage model --profile nope >"$TMP/m4.out" 2>&1
check "an unknown profile is refused" test $? -eq 2
check "the refusal names the profile" contains "$TMP/m4.out" "'nope'"
models --stage model --op mm >"$TMP/m5.out" 2>&1
check "--op with model stages is refused" test $? -eq 2
models --stage model --model 'nobody/*' >"$TMP/m6.out" 2>&1
check "a --model pattern matching no representative is refused" test $? -eq 2
check "stored results survive refused runs" \
  test "$(sqlite3 "$DB" "SELECT COUNT(DISTINCT model_id || '/' || stage) FROM model_results WHERE run_id = 'm1'")" -eq 75

# Bad input: clear errors, exit 2, nothing lost.
before=$(sqlite3 "$DB" "SELECT COUNT(*) FROM models WHERE config_status IS NOT NULL")
"$BIN" --registry "$DB" select --k 0 >"$TMP/e1.out" 2>&1
check "select --k 0 is refused" test $? -eq 2
check "select --k 0 names the flag" contains "$TMP/e1.out" "\-\-k"
"$BIN" --registry "$DB" crawl --agent --model a/b >"$TMP/e2.out" 2>&1
check "agent with --model is refused" test $? -eq 2
check "agent with --model says why" contains "$TMP/e2.out" "chooses its own queries"
"$BIN" --registry "$DB" crawl --explain --trace "$TMP/none.jsonl" >"$TMP/e3.out" 2>&1
check "explain without a trace is refused" test $? -eq 2
check "explain names the missing trace" contains "$TMP/e3.out" "none.jsonl"
agent --budget 10 --resume --trace "$TMP/none.jsonl" >"$TMP/e4.out" 2>&1
check "resume without a trace is refused" test $? -eq 2
check "resume names the missing trace" contains "$TMP/e4.out" "none.jsonl"
"$BIN" --registry "$DB" select --defaults "$TMP/none.jsonl" >"$TMP/e5.out" 2>&1
check "select with a missing defaults file is refused" test $? -eq 2
check "select names the defaults file" contains "$TMP/e5.out" "none.jsonl"
"$BIN" --registry "$TMP/missing.db" select >"$TMP/e6.out" 2>&1
check "select on a missing registry is refused" test $? -eq 2
check "nothing lost" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM models WHERE config_status IS NOT NULL")" -eq "$before"
check "no registry created by a failed select" test ! -e "$TMP/missing.db"
"$BIN" --registry "$DB" select --per-family --k 3 >"$TMP/e7.out" 2>&1
check "select --per-family with --k is refused" test $? -eq 2

# One representative per family: k is the number of coarse signatures, and
# every one of them is covered.
"$BIN" -q --registry "$DB" select --per-family --show 0 >"$TMP/family.out" 2>&1
check "select --per-family succeeds" test $? -eq 0
families=$(sqlite3 "$DB" "SELECT COUNT(DISTINCT coarse) FROM features WHERE status = 'ok'")
check "select --per-family picks one per family" contains "$TMP/family.out" "k = $families,"
check "select --per-family covers every family" contains "$TMP/family.out" "covered: $families of $families (100.0%)"

echo "agent/select CLI: $pass passed, $fail failed"
test "$fail" -eq 0
