#!/usr/bin/env bash
# `coverage capture` with the real tracer (transformers in the project venv)
# on tiny configs of real architectures: programs, module paths, phases,
# value domains, stored reasons for configs transformers rejects, resume and
# determinism.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
export COVERAGE_HOME=${COVERAGE_HOME:?set COVERAGE_HOME}
source "$(dirname "$0")/lib.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DB="$TMP/r.db"
MODELS="$TMP/models.jsonl"
q() { sqlite3 "$DB" "$1"; }

cp "$COVERAGE_HOME/capture/tracer/tests/tiny_models.jsonl" "$MODELS"
cat >>"$MODELS" <<'JSON'
{"id": "bad/bert-heads", "config": {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 50, "num_attention_heads": 3, "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 100}}
{"id": "bad/unknown-type", "config": {"model_type": "not_a_model_type", "hidden_size": 64}}
JSON

"$BIN" -q --registry "$DB" capture --models "$MODELS" --profile prefill --profile image --profile audio \
  --jobs 2 >"$TMP/cap.out" 2>&1
rc=$?
check "capture of the tiny models succeeds" test $rc -eq 0 || cat "$TMP/cap.out" >&2
check "capture counts what it captured" contains "$TMP/cap.out" "6 captured"
check "llama prefill is captured" test "$(q "SELECT status FROM programs WHERE model_id='tiny/llama' AND profile='prefill'")" = captured
check "the program holds the attention op the library calls, recorded whole" \
  test "$(q "SELECT COUNT(*) FROM program_calls pc JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND p.profile='prefill' AND pc.op='aten::scaled_dot_product_attention' AND pc.module='model.layers.0.self_attn'")" -eq 1
check "with the CPU's kernel for it as its decomposition, not as a call" \
  test "$(q "SELECT pc.decomposition FROM program_calls pc JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND p.profile='prefill' AND pc.op='aten::scaled_dot_product_attention' AND pc.module='model.layers.0.self_attn'"):$(q "SELECT COUNT(*) FROM program_calls WHERE op LIKE '%flash%'")" = '["aten::_scaled_dot_product_flash_attention_for_cpu"]:0'
check "and an op case of its own" \
  test "$(q "SELECT COUNT(*) > 0 FROM op_cases WHERE op='aten::scaled_dot_product_attention'")" -eq 1
check "depth is cut, the true count recorded" \
  test "$(q "SELECT layers_json FROM programs WHERE model_id='tiny/llama' AND profile='prefill'")" = '{"num_hidden_layers":{"kept":2,"of":4}}'
check "calls carry module paths of both kept layers" \
  test "$(q "SELECT COUNT(DISTINCT module) FROM program_calls pc JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND module LIKE 'model.layers._.mlp%'")" -ge 2
check "token ids have their value domain" \
  test "$(q "SELECT json_extract(tensor_json, '\$.domain.kind') || ':' || json_extract(tensor_json, '\$.domain.hi') FROM program_values v JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND v.name='input_ids'")" = "int:128"
check "parameters carry their init rule" \
  test "$(q "SELECT json_extract(init_json, '\$.rule') FROM program_values v JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND v.name='model.layers.0.mlp.up_proj.weight'")" = normal
check "op cases are derived from the calls, with provenance" \
  test "$(q "SELECT COUNT(*) FROM case_sources WHERE model_id='tiny/llama' AND first_call IS NOT NULL")" -gt 10
for m in tiny/bert:prefill tiny/t5:prefill tiny/vit:image tiny/whisper:audio tiny/mixtral:prefill; do
  check "$m is captured" test "$(q "SELECT status FROM programs WHERE model_id='${m%%:*}' AND profile='${m##*:}'")" = captured
done
check "only the profiles for a model's structure are traced" \
  test "$(q "SELECT COUNT(*) FROM programs WHERE model_id='tiny/vit'")" -eq 1
check "a config transformers rejects is stored as not built" \
  test "$(q "SELECT status || '/' || stage FROM programs WHERE model_id='bad/bert-heads'")" = "not_built/build"
check "its reason is the library's, naming the dimension" \
  test "$(q "SELECT COUNT(*) FROM programs WHERE model_id='bad/bert-heads' AND reason LIKE '%hidden size (50)%attention heads (3)%'")" -eq 1
check "an unknown model_type is stored as not built, with the type" \
  test "$(q "SELECT COUNT(*) FROM programs WHERE model_id='bad/unknown-type' AND status='not_built' AND reason LIKE '%not_a_model_type%'")" -ge 1
check "the summary names the reasons" contains "$TMP/cap.out" "not_built (build): The hidden size (50)"

"$BIN" -q --registry "$DB" capture --models "$MODELS" --model tiny/llama --profile train >"$TMP/train.out" 2>&1
check "llama train is captured, on meta" test "$(q "SELECT status || '/' || device FROM programs WHERE model_id='tiny/llama' AND profile='train'")" = captured/meta
check "train has forward, backward and optimizer calls" \
  test "$(q "SELECT group_concat(phase) FROM (SELECT DISTINCT phase FROM program_calls pc JOIN programs p USING(program_id) WHERE p.model_id='tiny/llama' AND p.profile='train' ORDER BY phase)")" = "backward,forward,optimizer"
check "the loss's backward is in the program" \
  test "$(q "SELECT COUNT(*) FROM program_calls pc JOIN programs p USING(program_id) WHERE p.profile='train' AND pc.op='aten::_log_softmax_backward_data'")" -ge 1

n=$(q "SELECT COUNT(*) FROM op_cases")
keys() { q "SELECT group_concat(key) FROM (SELECT c.key FROM program_calls pc JOIN programs p USING(program_id) JOIN op_cases c USING(case_id) WHERE p.model_id='tiny/llama' AND p.profile='prefill' ORDER BY pc.call_index)"; }
before=$(keys)
"$BIN" -q --registry "$DB" capture --models "$MODELS" --profile prefill --profile image --profile audio >"$TMP/again.out" 2>&1
check "a second capture traces nothing again" contains "$TMP/again.out" "0 captured"
check "and says the pairs were done before" contains "$TMP/again.out" "done before"
check "and adds no cases" test "$(q "SELECT COUNT(*) FROM op_cases")" -eq "$n"
"$BIN" -q --registry "$DB" capture --models "$MODELS" --model tiny/llama --profile prefill --force >/dev/null 2>&1
check "the same config twice gives the same keys, call by call" test "$(keys)" = "$before"
check "a recapture replaces provenance" \
  test "$(q "SELECT COUNT(*) FROM programs WHERE model_id='tiny/llama' AND profile='prefill'")" -eq 1

check "the expert cut is stored (tiny/mixtral's 4 experts are under the default 8)" \
  test "$(q "SELECT max_experts || ':' || (layers_json LIKE '%experts%') FROM programs WHERE model_id='tiny/mixtral' AND profile='prefill'")" = "8:0"
"$BIN" -q --registry "$DB" capture --models "$MODELS" --model tiny/mixtral --profile prefill --max-experts 2 \
  >"$TMP/experts.out" 2>&1
check "another expert cut traces the pair again" contains "$TMP/experts.out" "1 captured"
check "with the cut and the true count recorded" \
  test "$(q "SELECT max_experts || ' ' || layers_json FROM programs WHERE model_id='tiny/mixtral' AND profile='prefill'")" = \
  '2 {"num_hidden_layers":{"kept":2,"of":2},"num_local_experts":{"kept":2,"of":4}}'
check "and the router has one row per kept expert" \
  test "$(q "SELECT json_extract(tensor_json, '\$.shape[0]') FROM program_values v JOIN programs p USING(program_id) WHERE p.model_id='tiny/mixtral' AND p.profile='prefill' AND v.name='model.layers.0.mlp.gate.weight'")" = 2
"$BIN" -q --registry "$DB" capture --models "$MODELS" --model tiny/mixtral --profile prefill --max-experts -1 \
  >"$TMP/experts_bad.out" 2>&1
check "a negative --max-experts is refused, naming the flag" test $? -eq 2 -a -n "$(grep -- --max-experts "$TMP/experts_bad.out")"

# A team's own model list, with no crawl and no selection: the stages run on
# it (--models, --all-captured) and select chooses among the imported configs.
check "imported configs have their features" \
  test "$(q "SELECT COUNT(*) FROM features f JOIN models m ON m.id = f.model_id WHERE f.status = 'ok' AND m.id LIKE 'tiny/%'")" \
  -eq "$(q "SELECT COUNT(*) FROM models WHERE id LIKE 'tiny/%'")"
printf '# my models\ntiny/llama\n\ntiny/bert\n' >"$TMP/own.txt"
"$BIN" -q --registry "$DB" run --stage=module,model --models "$TMP/own.txt" --run own --max-gb 2 >"$TMP/own.out" 2>&1
check "run --models runs the stages on the listed models" test $? -eq 0 || cat "$TMP/own.out" >&2
check "both models, both stages, judged and passing" \
  test "$(q "SELECT COUNT(DISTINCT model_id || ':' || stage) || ':' || SUM(outcome <> 'pass') FROM model_results WHERE run_id = 'own'")" = "4:0"
"$BIN" -q --registry "$DB" run --stage=model --models "$MODELS" --model 'tiny/*' --run own-jsonl --max-gb 2 \
  >"$TMP/own_jsonl.out" 2>&1
check "the capture's JSONL file works as the list" \
  test "$(q "SELECT COUNT(DISTINCT model_id) FROM model_results WHERE run_id = 'own-jsonl'")" -eq "$(q "SELECT COUNT(*) FROM models WHERE id LIKE 'tiny/%'")"
"$BIN" -q --registry "$DB" run --stage=model --all-captured --run all --max-gb 2 >"$TMP/all.out" 2>&1
check "--all-captured runs every model with a captured program" \
  test "$(q "SELECT COUNT(DISTINCT model_id) FROM model_results WHERE run_id = 'all'")" -eq \
  "$(q "SELECT COUNT(DISTINCT model_id) FROM programs WHERE status = 'captured'")"
printf 'tiny/llama\nnobody/never-captured\n' >"$TMP/unknown.txt"
"$BIN" -q --registry "$DB" run --stage=model --models "$TMP/unknown.txt" --run unknown >"$TMP/unknown.out" 2>&1
check "a listed model the registry lacks is refused, named" \
  test $? -eq 2 -a -n "$(grep "nobody/never-captured" "$TMP/unknown.out")"
"$BIN" -q --registry "$DB" run --stage=unit --models "$TMP/own.txt" >"$TMP/unit_models.out" 2>&1
check "--models is for the model stages" test $? -eq 2 -a -n "$(grep -- "--stage=module" "$TMP/unit_models.out")"
"$BIN" -q --registry "$DB" select --k 3 >"$TMP/select.out" 2>&1
check "select chooses among the imported models" \
  test "$(q "SELECT COUNT(*) FROM representatives")" -eq 3 || cat "$TMP/select.out" >&2

"$BIN" --registry "$DB" registry programs >"$TMP/list.out" 2>&1
check "registry programs lists the pairs" contains "$TMP/list.out" "tiny/whisper"
"$BIN" --registry "$DB" registry programs --model tiny/llama --profile prefill --calls >"$TMP/calls.out" 2>&1
check "registry programs --calls prints the program" contains "$TMP/calls.out" "model.layers.1.self_attn"

echo "capture_test: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
