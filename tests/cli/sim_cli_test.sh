#!/usr/bin/env bash
# `--backend sim` through the CLI: listed with the other backends, the unit
# stage on a captured registry (bf16 matmul numerics by default, exact on
# request, faults from the environment), the model stage on a representative
# crawled from hub-replay, and clear errors for bad configuration and plugins.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
export COVERAGE_HOME=${COVERAGE_HOME:?set COVERAGE_HOME}
unset COVERAGE_SIM_CONFIG COVERAGE_SIM_FAULTS COVERAGE_ATTEMPT
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"
DB="$TMP/r.db"
echo '{"numerics": "exact"}' >"$TMP/exact.json"

"$BIN" run --list-backends >"$TMP/list.out" 2>&1
check "list-backends succeeds" test $? -eq 0
check "sim is listed as available" grep -q '^sim  *available' "$TMP/list.out"
check "privateuse1 plugins are listed" grep -q '^privateuse1:<path>  *available' "$TMP/list.out"
check "cuda is listed with its availability" grep -Eq '^cuda  *(available|unavailable .*\(.+\))' "$TMP/list.out"

"$BIN" -q --registry "$DB" capture --model microsoft/resnet-50 >/dev/null 2>&1
check "capture of one model" test $? -eq 0

"$BIN" -q --registry "$DB" run --stage=unit --backend sim --run declared >"$TMP/declared.out" 2>&1
check "sim declares its bf16 convolutions and passes against the declaration" test $? -eq 0 || cat "$TMP/declared.out" >&2
check "  the run records what it was judged under" test "$(sqlite3 "$DB" \
  "SELECT json_extract(config_json, '$.replay.numerics.source') || ' ' || (json_extract(config_json, '$.replay.numerics.declared') LIKE 'fp32 operands rounded to bf16 in %') FROM runs WHERE run_id = 'declared'")" = "backend 1"
check "  and each convolution its error against exact fp32" test "$(sqlite3 "$DB" \
  "SELECT COUNT(*) FROM results r JOIN op_cases c USING (case_id) WHERE r.run_id = 'declared' AND c.op = 'aten::convolution' AND json_extract(r.detail_json, '$.replay.declared.exact_fp32.max_rel_err') > 0")" -gt 0
"$BIN" -q --registry "$DB" run --stage=unit --backend sim --numerics none --run bf16 >"$TMP/bf16.out" 2>&1
check "judged at exact fp32 (--numerics none) sim's bf16 convolutions fail, exit 1" test $? -eq 1
check "the convolutions mismatch" grep -q 'aten::convolution.*mismatch\|mismatch.*aten::convolution\|aten::convolution  *[0-9]' "$TMP/bf16.out"
check "the run is stored as on backend sim" \
  test "$(sqlite3 "$DB" "SELECT backend FROM runs WHERE run_id = 'bf16'")" = "sim"

COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit --backend sim --run exact >"$TMP/exact.out" 2>&1
check "exact numerics: every case passes on sim" test $? -eq 0

COVERAGE_SIM_CONFIG="$TMP/exact.json" COVERAGE_SIM_FAULTS='[{"op": "aten::relu", "fault": "unsupported"}]' \
  "$BIN" -q --registry "$DB" run --stage=unit --backend sim --op relu --run faults >"$TMP/faults.out" 2>&1
check "an injected fault fails the run" test $? -eq 1
check "an unsupported fault is recorded as unsupported" \
  test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results r JOIN runs USING (run_id) WHERE run_id = 'faults' AND outcome = 'unsupported'")" -gt 0

# Ctrl-C while the worker loads a plugin whose constructor never returns:
# the run stops within a second or two with 130, nothing stored, instead of
# waiting out the 300 s start-up deadline.
if [[ -n ${HANGING_PLUGIN:-} ]]; then
  COVERAGE_TEST_MARK="$TMP" "$BIN" -q --registry "$DB" run --stage=unit --op relu --isolation process \
    --backend "privateuse1:$HANGING_PLUGIN" --run hang-start >"$TMP/hang.out" 2>&1 &
  hang_pid=$!
  sleep 3
  kill -INT "$hang_pid"
  t0=$(date +%s.%N)
  wait "$hang_pid"
  hang_rc=$?
  t1=$(date +%s.%N)
  check "Ctrl-C while a worker starts exits 130" test "$hang_rc" -eq 130 || cat "$TMP/hang.out" >&2
  check "Ctrl-C while a worker starts stops within 5 s" awk -v a="$t0" -v b="$t1" 'BEGIN { exit !(b - a < 5) }'
  check "Ctrl-C while a worker starts says so" grep -q "interrupted while the worker for backend .* was starting" "$TMP/hang.out"
  check "Ctrl-C while a worker starts stored no result" \
    test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'hang-start'")" -eq 0
  # The worker inherited the mark in its environment; none may still run.
  marked() { grep -lsa "COVERAGE_TEST_MARK=$TMP" /proc/[0-9]*/environ 2>/dev/null | grep -v "/proc/$$/" | wc -l; }
  check "no worker is left behind" test "$(marked)" -eq 0
fi

echo '{"numerics": "fp8"}' >"$TMP/bad.json"
COVERAGE_SIM_CONFIG="$TMP/bad.json" "$BIN" -q --registry "$DB" run --stage=unit --backend sim >"$TMP/bad.out" 2>&1
check "a bad sim config is refused with exit 2" test $? -eq 2
check "the error names the file and the key" grep -q "bad.json: key 'numerics'" "$TMP/bad.out"

"$BIN" -q --registry "$DB" run --stage=unit --backend privateuse1:/nonexistent/plugin.so >"$TMP/missing.out" 2>&1
check "a missing plugin is refused with exit 2" test $? -eq 2
check "the error names the plugin" grep -q "'/nonexistent/plugin.so': no such file" "$TMP/missing.out"

if [[ -n "${TESTDEV_PLUGIN:-}" ]]; then
  # A third-party plugin that renames its device and keeps its kernels in a
  # library beside it (tests/support/plugin), in worker processes.
  COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit --backend "privateuse1:$TESTDEV_PLUGIN" \
    --op relu --op add --run testdev >"$TMP/testdev.out" 2>&1
  check "a renamed third-party plugin runs cases and they pass" test $? -eq 0 || cat "$TMP/testdev.out" >&2
  check "its cases were run, not skipped" \
    test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'testdev' AND outcome = 'pass'")" -gt 0
  check "the run records the libtorch it ran on" \
    grep -Eq '^2\.[0-9]+' <<<"$(sqlite3 "$DB" "SELECT libtorch_version FROM runs WHERE run_id = 'testdev'")"
fi

PY=$COVERAGE_HOME/.venv/bin/python
json_of() { "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print($2)" "$1"; }
if [[ -n "${TESTDEV_PLUGIN:-}" && -x "$PY" ]]; then
  check "the run records the plugin's version" test "$(sqlite3 "$DB" \
    "SELECT backend_version FROM runs WHERE run_id = 'testdev'")" = "testdev 0.1 (kernels in libcoverage_testdev_kernels.so)"
  check "and its backend by the device's name, not the library's path" \
    test "$(sqlite3 "$DB" "SELECT backend_name FROM runs WHERE run_id = 'testdev'")" = "privateuse1:testdev"
  # The same plugin from another folder is the same backend: its baseline stays.
  mkdir -p "$TMP/moved"
  cp "$(dirname "$TESTDEV_PLUGIN")"/*.so "$TMP/moved/"
  COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit \
    --backend "privateuse1:$TMP/moved/$(basename "$TESTDEV_PLUGIN")" --op relu --op add --run testdev-moved >/dev/null 2>&1
  "$BIN" -q --registry "$DB" report --run testdev-moved --format json --out "$TMP/moved-report" >/dev/null 2>&1
  check "moving the plugin's library keeps its baseline" \
    test "$(json_of "$TMP/moved-report/report.json" "r['baselines'][0]['run_id']")" = testdev
  check "  the report shows the version" \
    test "$(json_of "$TMP/moved-report/report.json" "r['runs'][0]['backend_version']")" = "testdev 0.1 (kernels in libcoverage_testdev_kernels.so)"
  # Another backend as the baseline on purpose: compared, without a warning
  # that it was judged differently.
  COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit --backend sim --op relu --op add \
    --run sim-relu-add >/dev/null 2>&1
  "$BIN" -q --registry "$DB" report --run testdev-moved --baseline sim-relu-add --format json --out "$TMP/cross" \
    >/dev/null 2>&1
  check "a cross-backend baseline is compared" \
    test "$(json_of "$TMP/cross/report.json" "r['baselines'][0]['backend_name']")" = sim
  check "  without a warning about other options" \
    test "$(json_of "$TMP/cross/report.json" "sum('other options' in w for w in r['warnings'])")" = 0
fi

# A plugin that leaves its device unnamed (its Python package would name it):
# --device-name names it.
SIM_SO=$(dirname "$BIN")/../lib/libcoverage_sim.so
COVERAGE_SIM_UNNAMED=1 COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit \
  --backend "privateuse1:$SIM_SO" --device-name neuron --op relu --run named >"$TMP/named.out" 2>&1
check "--device-name names an unnamed plugin's device and its cases pass" test $? -eq 0 || cat "$TMP/named.out" >&2
check "  the run's backend is that name" \
  test "$(sqlite3 "$DB" "SELECT backend_name FROM runs WHERE run_id = 'named'")" = "privateuse1:neuron"
COVERAGE_SIM_UNNAMED=1 COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$DB" run --stage=unit \
  --backend "privateuse1:$SIM_SO" --op relu --run unnamed >/dev/null 2>&1
check "without it the device keeps PyTorch's default name" \
  test "$(sqlite3 "$DB" "SELECT backend_name FROM runs WHERE run_id = 'unnamed'")" = "privateuse1:privateuseone"
"$BIN" -q --registry "$DB" run --stage=unit --backend sim --device-name neuron --op relu --run renamed >"$TMP/renamed.out" 2>&1
check "a device the plugin named itself is not renamed" test $? -eq 2 -a -n "$(grep "named its device 'sim' itself" "$TMP/renamed.out")"
"$BIN" -q --registry "$DB" run --stage=unit --backend sim --device-name cuda --op relu >"$TMP/cuda_name.out" 2>&1
check "PyTorch's own device types are refused as names" test $? -eq 2 -a -n "$(grep "PyTorch's own device type" "$TMP/cuda_name.out")"

# The repro script loads the plugin and registers its device module itself.
# (Not under the sanitizers: the venv's Python cannot load an instrumented
# plugin, "ASan runtime does not come first".)
if [[ -x "$PY" ]] && ldd "$SIM_SO" 2>/dev/null | grep -q libasan; then
  echo "skipped: the repro scripts under AddressSanitizer (the venv's Python cannot load an instrumented sim)"
elif [[ -x "$PY" ]]; then
  key=$(sqlite3 "$DB" "SELECT c.key FROM results r JOIN op_cases c USING (case_id) WHERE r.run_id = 'named' LIMIT 1")
  script_of() { sed -n "/^cat > repro_.*<<'PY'\$/,/^PY\$/p" "$1" | sed '1d;$d'; }
  "$BIN" -q --registry "$DB" repro "$key" --backend sim >"$TMP/repro_sim.out" 2>&1
  script_of "$TMP/repro_sim.out" >"$TMP/repro_sim.py"
  (cd "$TMP" && COVERAGE_SIM_CONFIG="$TMP/exact.json" "$PY" repro_sim.py) >"$TMP/repro_sim.run" 2>&1
  check "sim's repro script runs on sim" test $? -eq 0 -a -n "$(grep "output 0: .*max abs diff vs cpu 0" "$TMP/repro_sim.run")" ||
    cat "$TMP/repro_sim.run" >&2
  "$BIN" -q --registry "$DB" repro "$key" --backend "privateuse1:$SIM_SO" --device-name neuron >"$TMP/repro_named.out" 2>&1
  check "  the replay command keeps --device-name" grep -q -- "--device-name neuron" "$TMP/repro_named.out"
  script_of "$TMP/repro_named.out" >"$TMP/repro_named.py"
  (cd "$TMP" && COVERAGE_SIM_UNNAMED=1 COVERAGE_SIM_CONFIG="$TMP/exact.json" "$PY" - <<EOF_PY
exec(open('repro_named.py').read())
print('device', DEVICE)
EOF_PY
  ) >"$TMP/repro_named.run" 2>&1
  check "an unnamed plugin's repro script names its device and runs" \
    test -n "$(grep "^device neuron:0" "$TMP/repro_named.run")" -a -n "$(grep "output 0:" "$TMP/repro_named.run")" ||
    cat "$TMP/repro_named.run" >&2
fi

COVERAGE_SIM_PLUGIN="$TMP/none.so" "$BIN" -q --registry "$DB" run --stage=unit --backend sim >"$TMP/noplugin.out" 2>&1
check "COVERAGE_SIM_PLUGIN moves sim" grep -q "none.so': no such file" "$TMP/noplugin.out"

if [[ -n "${HUB_REPLAY_BIN:-}" ]]; then
  start_hub_replay
  MDB="$TMP/m.db"
  "$BIN" -q --registry "$MDB" crawl --endpoint "$URL" --rate 0 --model qgallouedec/tiny-OPTForCausalLM >/dev/null 2>&1
  "$BIN" -q --registry "$MDB" select --k 1 >/dev/null 2>&1
  check "a one-model selection" test "$(sqlite3 "$MDB" "SELECT COUNT(*) FROM v_representatives")" -eq 1
  # Its programs, captured with small inputs, are what the model stages replay.
  cat >"$TMP/mprofiles.json" <<'JSON'
{"profiles": [
  {"name": "prefill", "families": ["decoder"], "seq_len": 8},
  {"name": "train", "families": ["decoder"], "batch": 2, "seq_len": 8, "training": true}
]}
JSON
  "$BIN" -q --registry "$MDB" capture --selection --profiles "$TMP/mprofiles.json" >"$TMP/mcap.out" 2>&1
  check "the model's prefill and train programs are captured" \
    test "$(sqlite3 "$MDB" "SELECT COUNT(*) FROM programs WHERE status = 'captured'")" -eq 2 || cat "$TMP/mcap.out" >&2
  COVERAGE_SIM_CONFIG="$TMP/exact.json" "$BIN" -q --registry "$MDB" run --stage=module,model,train --backend sim \
    --profiles "$TMP/mprofiles.json" --model 'qgallouedec/*' --run m >"$TMP/model.out" 2>&1
  check "module, model and train pass on sim with exact numerics" test $? -eq 0 || cat "$TMP/model.out" >&2
  check "the stages ran the model" grep -q "3 stage runs now" "$TMP/model.out"
  # A crash inside a model stage costs that stage only: the worker dies, the
  # crash is stored with its signal, the next stage runs in a fresh worker.
  COVERAGE_SIM_CONFIG="$TMP/exact.json" COVERAGE_SIM_FAULTS='[{"op": "aten::addmm", "fault": "crash"}]' \
    "$BIN" -q --registry "$MDB" run --stage=model,train --backend sim --profiles "$TMP/mprofiles.json" \
    --model 'qgallouedec/*' --run crash \
    --reruns 1 >"$TMP/crash.out" 2>&1
  check "a crashing model stage fails the run" test $? -eq 1
  check "the model stage is a crash with its signal" test "$(sqlite3 "$MDB" \
    "SELECT outcome || ' ' || (error LIKE '%SIGSEGV%') || ' ' || attempts FROM model_results WHERE run_id = 'crash' AND stage = 'model'")" = "crash 1 2"
  check "the crash names the call the worker died in" test "$(sqlite3 "$MDB" \
    "SELECT (error LIKE '%, in call % (aten::addmm%') || ' ' || (json_extract(detail_json, '$.worker.in_call.op') LIKE 'aten::addmm%') FROM model_results WHERE run_id = 'crash' AND stage = 'model'")" = "1 1"
  check "the train stage ran after it in a fresh worker" test "$(sqlite3 "$MDB" \
    "SELECT outcome FROM model_results WHERE run_id = 'crash' AND stage = 'train'")" = "crash"
  check "the workers are counted" grep -q "crashed" "$TMP/crash.out"
  # Note [A module that kills its worker]: a crash in one module's call is
  # that module's item, and the stage runs again without it for the others.
  COVERAGE_SIM_CONFIG="$TMP/exact.json" COVERAGE_SIM_FAULTS='[{"op": "aten::relu", "fault": "crash"}]' \
    "$BIN" -q --registry "$MDB" run --stage=module --backend sim --profiles "$TMP/mprofiles.json" \
    --model 'qgallouedec/*' --run mcrash --reruns 0 >"$TMP/mcrash.out" 2>&1
  check "a crashing module fails the run" test $? -eq 1
  check "the module that crashed is an item of its own, named at its call" test "$(sqlite3 "$MDB" \
    "SELECT COUNT(*) FROM model_results WHERE run_id = 'mcrash' AND stage = 'module' AND outcome = 'crash'
       AND item <> '*' AND item = json_extract(detail_json, '$.worker.in_call.module')
       AND json_extract(detail_json, '$.worker.in_call.op') LIKE 'aten::relu%'")" -eq 1 || cat "$TMP/mcrash.out" >&2
  check "the other modules are judged" test "$(sqlite3 "$MDB" \
    "SELECT COUNT(*) FROM model_results WHERE run_id = 'mcrash' AND stage = 'module' AND outcome = 'pass'")" -ge 3
fi

echo "sim cli: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
