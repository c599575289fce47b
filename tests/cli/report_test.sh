#!/usr/bin/env bash
# Reports and the nightly job through the CLI, on sim:
#   - a first nightly (no baseline) passes and writes report.html, junit.xml and report.json;
#   - a second one with an injected fault exits 1 and names the new failures in all three;
#   - an expectation for them turns them into expected failures (no regression);
#   - a third, clean one reports them fixed;
#   - the nightly's HTML report works in Chromium (tests/browser/report_test.mjs);
#   - `coverage repro` prints a case that replays with the printed command, and a Python script that parses;
#   - bad input is refused clearly.
# Latency on a test machine shared with other tests is noise, so these nightlies
# fail on new failures and drift only (the performance judgement has its own
# unit tests in tests/reports).
# Needs COVERAGE_BIN and COVERAGE_HOME.
set -uo pipefail
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
HOME_DIR=${COVERAGE_HOME:?set COVERAGE_HOME}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"
unset COVERAGE_SIM_FAULTS COVERAGE_ATTEMPT
DB=$TMP/r.db
echo '{"numerics": "exact"}' > "$TMP/exact.json"
export COVERAGE_SIM_CONFIG=$TMP/exact.json
"$BIN" -q --registry "$DB" capture --model microsoft/resnet-50 > /dev/null 2>&1
check "capture" test "$(sqlite3 "$DB" 'SELECT COUNT(*) FROM op_cases')" -gt 10
cat > "$TMP/nightly.json" <<JSON
{"backend": "sim", "stages": ["unit"], "run_prefix": "n", "report_dir": "$TMP/reports", "expectations": "$TMP/none.json",
 "fail_on": ["new_failure", "drift"]}
JSON
echo '{"backend": "sim", "expected_failures": []}' > "$TMP/none.json"
nightly() { "$BIN" -q --registry "$DB" nightly --config "$TMP/nightly.json" --run-id "$1" > "$TMP/$1.out" 2>&1; }

nightly n1
check "a first nightly without a baseline passes" test $? -eq 0 || tail -20 "$TMP/n1.out" >&2
for f in report.html junit.xml report.json; do
  check "n1 wrote $f" test -s "$TMP/reports/n1/$f"
done
check "the report's path is printed last" test "$(tail -1 "$TMP/n1.out")" = "report: $TMP/reports/n1/report.html"
check "no baseline is said" grep -q "no baseline for run n1-unit" "$TMP/reports/n1/report.json"
check "the HTML needs no network" bash -c "! grep -Eq '(src|href)=\"https?:' '$TMP/reports/n1/report.html'"

# 2. A fault on relu: new failures, exit 1.
COVERAGE_SIM_FAULTS='[{"op": "aten::relu", "fault": "wrong_values"}]' nightly n2
check "a nightly with new failures exits 1" test $? -eq 1 || tail -20 "$TMP/n2.out" >&2
relu=$(sqlite3 "$DB" "SELECT COUNT(*) FROM op_cases WHERE op = 'aten::relu'")
check "the summary counts the new failures" contains "$TMP/n2.out" "$relu new_failure"
check "REGRESSED is printed with why" contains "$TMP/n2.out" "REGRESSED ($relu new_failure"
check "report.json lists them" test "$(grep -o '"new_failure"' "$TMP/reports/n2/report.json" | wc -l)" -ge "$relu"
check "junit.xml has the failures" test "$(grep -c '<failure' "$TMP/reports/n2/junit.xml")" -ge "$relu"
check "the baseline was the first nightly" contains "$TMP/reports/n2/report.json" "n1-unit"
check "junit.xml is well-formed" python3 -c "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])" "$TMP/reports/n2/junit.xml"
check "report.json is JSON" python3 -c "import sys, json; json.load(open(sys.argv[1]))" "$TMP/reports/n2/report.json"

# The nightly's own report in Chromium: no console errors, sorting and
# filtering work, a screenshot is saved.
REPORT_SCREENSHOT=${REPORT_SCREENSHOT:-$TMP/shot.png} node "$HOME_DIR/tests/browser/report_test.mjs" \
  "$TMP/reports/n2/report.html" > "$TMP/browser.out" 2>&1
check "the nightly's report works in Chromium" test $? -eq 0 || cat "$TMP/browser.out" >&2
check "its screenshot is saved" test -s "${REPORT_SCREENSHOT:-$TMP/shot.png}"

# 3. Expected: the same failures with an expectation are not a regression.
cat > "$TMP/exp.json" <<'JSON'
{"backend": "sim", "expected_failures": [{"stage": "unit", "op": "aten::relu", "outcomes": ["mismatch"], "reason": "known: relu corrupted on purpose"}]}
JSON
"$BIN" -q --registry "$DB" report --run n2-unit --baseline n1-unit --expectations "$TMP/exp.json" \
  --out "$TMP/expected" > "$TMP/expected.out" 2>&1
check "a report with expectations succeeds" test $? -eq 0 || cat "$TMP/expected.out" >&2
check "expected failures are not new failures" bash -c "! grep -q new_failure '$TMP/expected.out'"
check "they are reported as expected" contains "$TMP/expected.out" "expected_failure"

# 4. A clean nightly: the failures are fixed.
nightly n3
check "a clean nightly after a bad one exits 0" test $? -eq 0 || tail -20 "$TMP/n3.out" >&2
check "the fixes are counted" contains "$TMP/n3.out" "$relu fixed"

# 5. repro.
key=$(sqlite3 "$DB" "SELECT key FROM op_cases WHERE op = 'aten::relu' LIMIT 1")
"$BIN" --registry "$DB" repro "$key" --backend sim > "$TMP/repro.out" 2>&1
check "repro succeeds" test $? -eq 0
check "repro prints the case JSON" grep -q '"op":"aten::relu"' "$TMP/repro.out"
check "repro names its results" contains "$TMP/repro.out" "n2-unit"
cmd=$(grep -E '^coverage --registry' "$TMP/repro.out" | head -1)
check "repro prints a replay command" test -n "$cmd"
eval "\"$BIN\"${cmd#coverage}" > "$TMP/replay.out" 2>&1
check "the printed command replays the case" test $? -eq 0 || cat "$TMP/replay.out" >&2
check "it ran exactly that case" contains "$TMP/replay.out" "1 planned"
sed -n "/^cat > repro_.*<<'PY'$/,/^PY$/p" "$TMP/repro.out" | sed '1d;$d' > "$TMP/repro.py"
check "the Python script parses" python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$TMP/repro.py"
check "the script calls the aten overload" grep -q "torch.ops.aten.relu.default" "$TMP/repro.py"

# The replay of one case is a run too, but no baseline for a full nightly:
# a fault after it is a new failure against the last nightly.
COVERAGE_SIM_FAULTS='[{"op": "aten::relu", "fault": "nan"}]' nightly n4
check "after a repro replay, the next nightly compares with the last nightly" contains "$TMP/n4.out" "report of n4-unit against n3-unit"
check "and its failures are new" contains "$TMP/n4.out" "$relu new_failure"
check "repro's script writes floats as floats" bash -c "! grep -Eq \"'(eps|momentum|alpha|value)': [0-9]+,\" '$TMP/repro.py'"

# A slower kernel (sim's "slow" fault: 100 ms per relu call, far above the
# noise of a loaded machine) is a
# performance regression that survives being measured again.
nightly n5  # clean, after n4's failures: the baseline for n6
cat > "$TMP/perf.json" <<JSON
{"backend": "sim", "stages": ["unit"], "report_dir": "$TMP/reports", "expectations": "$TMP/none.json",
 "fail_on": ["new_failure", "drift", "perf_regression"]}
JSON
COVERAGE_SIM_FAULTS='[{"op": "aten::relu", "fault": "slow", "us": 100000}]' \
  "$BIN" -q --registry "$DB" nightly --config "$TMP/perf.json" --run-id n6 > "$TMP/n6.out" 2>&1
check "a slower kernel fails the nightly" test $? -eq 1 || tail -20 "$TMP/n6.out" >&2
check "the slower cases are measured again" contains "$TMP/n6.out" "measuring them again"
confirmed=$(grep -o '[0-9]* still are when measured again' "$TMP/n6.out" | cut -d' ' -f1)
check "the relu slowdowns are confirmed" test "${confirmed:-0}" -ge "$relu"
check "the re-measuring run is stored" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'n6-perfcheck'")" -ge "$relu"

# 6. Bad input.
"$BIN" --registry "$DB" repro 0000000000000000 > "$TMP/bad1.out" 2>&1
check "an unknown key is refused" test $? -eq 2
check "the refusal names the key" contains "$TMP/bad1.out" "0000000000000000"
"$BIN" --registry "$DB" report --run no-such-run > "$TMP/bad2.out" 2>&1
check "an unknown run is refused" test $? -eq 2
check "the refusal names the run" contains "$TMP/bad2.out" "no-such-run"
"$BIN" --registry "$DB" report --run n2-unit --run n2-unit > "$TMP/twice.out" 2>&1
check "a run given twice is refused (it would count every case twice)" test $? -eq 2
check "the refusal names the run" contains "$TMP/twice.out" "--run 'n2-unit' is given twice"
# An output path that is a device is written through, never replaced.
"$BIN" -q --registry "$DB" registry stats -o /dev/null > "$TMP/devnull.out" 2>&1
check "registry stats -o /dev/null succeeds" test $? -eq 0
check "and /dev/null is still a device" test -c /dev/null
echo '{"backend": "sim", "expected_failures": [{"op": "aten::relu"}]}' > "$TMP/noreason.json"
"$BIN" --registry "$DB" report --run n2-unit --expectations "$TMP/noreason.json" > "$TMP/bad3.out" 2>&1
check "an expectation without a reason is refused" test $? -eq 2
check "the refusal names the file" contains "$TMP/bad3.out" "noreason.json"
echo '{"backend": "sim", "stages": ["nightly"]}' > "$TMP/badcfg.json"
"$BIN" --registry "$DB" nightly --config "$TMP/badcfg.json" > "$TMP/bad4.out" 2>&1
check "a bad nightly config is refused" test $? -eq 2
check "the refusal names the stage" contains "$TMP/bad4.out" "'nightly'"

echo "report_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
