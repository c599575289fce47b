#!/usr/bin/env bash
# `coverage import opinfo` with the venv's torch: OpInfo samples stored as op
# cases with source opinfo (deterministic keys, a kwarg-only argument, a
# non-contiguous input), resume, the --source filter of run and registry,
# the verdicts on cpu (every sample passes) and sim (its bf16 matmul fails
# f32 mm), and the report's split by source.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
export COVERAGE_HOME=${COVERAGE_HOME:?set COVERAGE_HOME}
source "$(dirname "$0")/lib.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DB="$TMP/r.db"
q() { sqlite3 "$1" "$2"; }
OPINFOS=(--opinfo softmax --opinfo mm --opinfo ravel --opinfo bitwise_and)

"$BIN" -q --registry "$DB" import opinfo "${OPINFOS[@]}" >"$TMP/empty.out" 2>&1
check "with no op cases and no --op, nothing is kept: refused, saying what to do" test $? -eq 2
check "  the refusal names --op and --all-ops" contains "$TMP/empty.out" "name ops with --op, or import every op with --all-ops"
"$BIN" -q --registry "$DB" import opinfo --all-ops --op mm >"$TMP/both.out" 2>&1
check "--all-ops with --op is refused" test $? -eq 2
"$BIN" -q --registry "$DB" import opinfo --opinfo not_an_opinfo --all-ops >"$TMP/unknown.out" 2>&1
check "an unknown OpInfo is an error naming it" test $? -ne 0
check "  ... by name" contains "$TMP/unknown.out" "no OpInfo is named 'not_an_opinfo'"

"$BIN" -q --registry "$DB" import opinfo "${OPINFOS[@]}" --all-ops >"$TMP/imp.out" 2>&1
rc=$?
check "import of four OpInfos succeeds" test $rc -eq 0 || cat "$TMP/imp.out" >&2
check "the OpInfos with f32 samples are imported, one without them skipped" \
  contains "$TMP/imp.out" "4 (OpInfo, dtype) pairs imported, 1 without samples"
check "bitwise_and has no f32 samples: skipped with the reason" \
  test "$(q "$DB" "SELECT status || ': ' || reason FROM opinfo_imports WHERE opinfo = 'bitwise_and'")" = \
  "skipped: bitwise_and does not support f32 on CPU"
check "every imported sample's calls are op cases with source opinfo" \
  test "$(q "$DB" "SELECT COUNT(*) FROM op_cases c WHERE NOT EXISTS (SELECT 1 FROM opinfo_samples o WHERE o.case_id = c.case_id)")" -eq 0
check "softmax's seven samples are stored, by index" \
  test "$(q "$DB" "SELECT COUNT(DISTINCT sample) FROM opinfo_samples WHERE opinfo = 'softmax' AND variant = ''")" -eq 7
check "a kwarg-only argument is kept: softmax.with_dtype converts with _to_copy(dtype=f64)" \
  test "$(q "$DB" "SELECT COUNT(*) FROM opinfo_samples o JOIN op_cases c USING (case_id) WHERE o.variant = 'with_dtype' AND c.op = 'aten::_to_copy' AND EXISTS (SELECT 1 FROM json_each(c.case_json, '\$.args') a WHERE json_extract(a.value, '\$.name') = 'dtype' AND json_extract(a.value, '\$.value') = 7)")" -gt 0
check "a non-contiguous input keeps its strides: ravel of a [5,5,5] view with strides [50,10,2]" \
  test "$(q "$DB" "SELECT COUNT(*) FROM opinfo_samples o JOIN op_cases c USING (case_id) WHERE o.opinfo = 'ravel' AND json_extract(c.case_json, '\$.args[0].tensor.strides') = '[50,10,2]'")" -gt 0
check "an empty matrix of mm's samples is a case" \
  test "$(q "$DB" "SELECT COUNT(*) FROM op_cases WHERE op = 'aten::mm' AND json_extract(case_json, '\$.args[0].tensor.shape') = '[0,5]'")" -eq 1
keys() { q "$1" "SELECT key FROM op_cases ORDER BY key"; }
before=$(keys "$DB")

"$BIN" -q --registry "$DB" import opinfo "${OPINFOS[@]}" --all-ops >"$TMP/again.out" 2>&1
check "a rerun imports nothing again" contains "$TMP/again.out" "0 (OpInfo, dtype) pairs imported, 0 without samples, 5 imported before"
check "  and stores nothing twice" test "$(keys "$DB")" = "$before"
"$BIN" -q --registry "$TMP/other.db" import opinfo "${OPINFOS[@]}" --all-ops >/dev/null 2>&1
check "the same import into another registry gives the same keys" test "$(keys "$TMP/other.db")" = "$before"
"$BIN" -q --registry "$DB" import opinfo "${OPINFOS[@]}" --all-ops --force >/dev/null 2>&1
check "--force imports again and replaces, keeping the keys" test "$(keys "$DB")" = "$before"
check "  with one provenance row per sample call" \
  test "$(q "$DB" "SELECT COUNT(*) FROM opinfo_samples")" = "$(q "$TMP/other.db" "SELECT COUNT(*) FROM opinfo_samples")"

# The default keeps only ops the registry holds: a registry of mm cases keeps mm's calls only.
"$BIN" -q --registry "$TMP/mm.db" import opinfo --opinfo mm --op mm >/dev/null 2>&1
"$BIN" -q --registry "$TMP/mm.db" import opinfo --opinfo softmax --opinfo mm --force >"$TMP/kept.out" 2>&1
check "by default only the ops the registry holds are kept" \
  test "$(q "$TMP/mm.db" "SELECT group_concat(DISTINCT op) FROM op_cases")" = "aten::mm"
check "  and the summary says how many ops were kept" contains "$TMP/kept.out" "kept (the calls of 1 op;"

"$BIN" --registry "$DB" registry stats >"$TMP/stats.out" 2>&1
check "registry stats separates the sources" contains "$TMP/stats.out" "sources: 0 captured from models, [0-9]* from OpInfo samples"
"$BIN" --registry "$DB" registry query --source captured >"$TMP/captured.out" 2>&1
check "registry query --source captured finds none here" contains "$TMP/captured.out" "0 cases"

"$BIN" -q --registry "$DB" run --stage=unit --source opinfo --backend cpu --run cpu1 >"$TMP/cpu.out" 2>&1
check "on cpu every imported sample passes" test $? -eq 0 || tail -20 "$TMP/cpu.out" >&2
check "  (all of them ran)" \
  test "$(q "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'cpu1' AND outcome = 'pass'")" = "$(q "$DB" "SELECT COUNT(*) FROM op_cases")"
"$BIN" -q --registry "$DB" run --stage=unit --source captured --backend cpu --run none1 >"$TMP/none.out" 2>&1
check "--source captured selects no OpInfo case" test "$(q "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'none1'")" -eq 0
"$BIN" -q --registry "$DB" run --stage=unit --source opinfo --backend sim --op mm --numerics none --run sim1 >"$TMP/sim.out" 2>&1
check "on sim judged at exact fp32 the f32 mm samples fail as the real shapes do (its bf16 matmul)" \
  test "$(q "$DB" "SELECT COUNT(*) FROM results r JOIN op_cases c USING (case_id) WHERE r.run_id = 'sim1' AND r.outcome = 'mismatch' AND c.dtypes LIKE '% f32 %'")" -gt 0
"$BIN" -q --registry "$DB" report --run sim1 --out "$TMP/rep" >/dev/null 2>&1
check "the report's JSON counts the unit verdicts by source" \
  test "$(python3 -c 'import json,sys; print([s for s in json.load(open(sys.argv[1]))["stages"] if s["stage"] == "unit"][0]["sources"]["opinfo"]["mismatch"])' "$TMP/rep/report.json")" -gt 0
check "the HTML report shows the OpInfo samples apart" contains "$TMP/rep/report.html" 'data-source="opinfo"'
check "  and in the stage x family matrix" contains "$TMP/rep/report.html" "OpInfo samples"

echo "import_opinfo_test: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
