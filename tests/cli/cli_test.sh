#!/usr/bin/env bash
# End-to-end checks of the `coverage` CLI: outputs, exit codes, clear errors
# for bad input, and that a failed command loses nothing already stored.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
export COVERAGE_HOME=${COVERAGE_HOME:?set COVERAGE_HOME}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DB="$TMP/r.db"
pass=0
fail=0

check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $name" >&2
  fi
}
run() {  # run EXPECTED_RC CMD... ; output in $OUT
  local expected=$1
  shift
  OUT=$("$@" 2>&1)
  local rc=$?
  if [[ $rc -ne $expected ]]; then
    echo "  '$*' exited $rc, expected $expected; output:" >&2
    echo "$OUT" | tail -5 >&2
    return 1
  fi
}
has() { grep -qF -- "$1" <<<"$OUT"; }
cases() { sqlite3 "$DB" "SELECT COUNT(*) FROM op_cases"; }

check "capture of one model" run 0 "$BIN" -q --registry "$DB" capture --model microsoft/resnet-50
check "capture reports the registry" has "registry: $DB"
n=$(cases)
check "capture stored cases" test "$n" -gt 5
check "recapture skips what is done" run 0 "$BIN" -q --registry "$DB" capture --model microsoft/resnet-50
check "recapture says so" has "1 done before"
check "recapture adds nothing" test "$(cases)" -eq "$n"
calls=$(sqlite3 "$DB" "SELECT SUM(call_count) FROM case_sources")
check "forced recapture" run 0 "$BIN" -q --registry "$DB" capture --model microsoft/resnet-50 --force
check "forced recapture replaces provenance" test "$(sqlite3 "$DB" "SELECT SUM(call_count) FROM case_sources")" -eq "$calls"

check "stats table" run 0 "$BIN" --registry "$DB" registry stats
check "stats names ops" has "aten::convolution"
check "stats json parses" run 0 "$BIN" --registry "$DB" registry stats --format json
check "stats json is json" python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['cases'] == $n" "$OUT"
check "query by op and dims" run 0 "$BIN" --registry "$DB" registry query --op convolution --dim 'weight[-1]==7' --format csv
check "query csv has header and one 7x7 conv" test "$(grep -c . <<<"$OUT")" -eq 2
check "query csv header" has "key,op,case,flops,models,calls"
check "export jsonl" run 0 "$BIN" --registry "$DB" registry export --op relu -o "$TMP/relu.jsonl"
check "export rows round-trip" python3 -c "
import json
rows=[json.loads(l) for l in open('$TMP/relu.jsonl')]
assert rows and all(r['case']['op']=='aten::relu' and r['models']==['microsoft/resnet-50'] for r in rows)"

check "bad --dim is refused" run 2 "$BIN" --registry "$DB" registry query --dim 'self[0]>>3'
check "bad --dim is named" has "--dim 'self[0]>>3'"
check "bad --format is refused" run 2 "$BIN" --registry "$DB" registry query --format xml
check "bad --dtype is refused" run 2 "$BIN" --registry "$DB" registry query --dtype f33
check "missing registry is explained" run 2 "$BIN" --registry "$TMP/none.db" registry stats
check "missing registry says how to make one" has "coverage capture"
check "unknown backend is refused" run 2 "$BIN" --registry "$DB" run --stage=unit --backend neuron
check "unknown backend lists known ones" has "known: cpu"
check "unknown stage is refused" run 2 "$BIN" --registry "$DB" run --stage=model

echo '{"dtypes": {"f32": {"rtol": "tight"}}}' >"$TMP/bad_tol.json"
check "bad tolerance file is refused" run 2 "$BIN" --registry "$DB" run --stage=unit --tolerances "$TMP/bad_tol.json"
check "bad tolerance file is named" has "bad_tol.json: dtypes.f32.rtol"
printf '{"id": "x/y", "family": "decoder", "config": {"model_type": "llama", "hidden_size": 64}}\nnot json\n' >"$TMP/bad_models.jsonl"
check "bad models file is refused" run 2 "$BIN" --registry "$DB" capture --models "$TMP/bad_models.jsonl"
check "bad models file names the line" has "bad_models.jsonl:2"
check "not valid JSON names the column" has "bad_models.jsonl:2: not valid JSON"
printf '{"id": "a/b", "config": {"model_type": "llama"}}\n\n{"id": "a/b", "config": {"model_type": "llama", "hidden_size": 8}}\n' >"$TMP/dup_models.jsonl"
check "a model id given twice is refused" run 2 "$BIN" --registry "$TMP/dup.db" capture --models "$TMP/dup_models.jsonl"
check "with both lines" has "dup_models.jsonl:3: model 'a/b' is also on line 1"
check "and nothing is stored" test ! -e "$TMP/dup.db" -o "$(sqlite3 "$TMP/dup.db" "SELECT COUNT(*) FROM programs" 2>/dev/null || echo 0)" = 0
# Note [Terminal-safe text]: a tracer that prints 2 MB of random bytes, for
# a model whose id holds an escape sequence: what reaches the terminal is a
# few lines of visible text.
printf '#!/bin/bash\ncat >/dev/null\nhead -c 2000000 /dev/urandom\n' >"$TMP/junk_python"
chmod +x "$TMP/junk_python"
printf '{"id": "evil/\\u001b[2Jclear", "config": {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 100}}\n' >"$TMP/evil_models.jsonl"
check "a tracer printing junk fails its pair" run 1 "$BIN" --registry "$TMP/junk.db" capture --models "$TMP/evil_models.jsonl" --profile prefill --python "$TMP/junk_python" --fresh-tracers
check "and a few KB reach the terminal" test "$(printf %s "$OUT" | wc -c)" -lt 4000
check "none of them an escape or a control byte" test "$(printf %s "$OUT" | tr -d '\n' | LC_ALL=C tr -d '\040-\176\200-\377' | wc -c)" -eq 0
check "the model id's escape is shown, not sent" has 'evil/\x1b[2Jclear'
# A registry in a folder the user cannot write: a clear error, not SQLite's
# "attempt to write a readonly database" (as root, run as nobody: root writes anywhere).
as_user=()
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
if [[ $(id -u) != 0 || ${#as_user[@]} -gt 0 ]]; then
  mkdir -p "$TMP/ro" && cp "$DB" "$TMP/ro/r.db" && chmod 644 "$TMP/ro/r.db" && chmod 755 "$TMP" && chmod 555 "$TMP/ro"
  check "a registry in a read-only folder is refused" run 2 "${as_user[@]}" "$BIN" --registry "$TMP/ro/r.db" capture --models "$TMP/bad_models.jsonl"
  check "saying the folder is not writable" has "its folder '$TMP/ro' is not writable"
  chmod 755 "$TMP/ro"
fi
check "a seed of -1 is refused, not wrapped" run 2 "$BIN" --registry "$DB" run --stage=unit --seed -1
check "naming the flag" has "--seed: '-1' is not a whole number"
check "a seed over 2^64 - 1 is refused, not saturated" run 2 "$BIN" --registry "$DB" run --stage=unit --seed 18446744073709551616
check "'latest' is not a run id a run can take" run 2 "$BIN" --registry "$DB" run --stage=unit --run latest
check "a repro for an unknown backend is refused" run 2 "$BIN" --registry "$DB" repro 0123456789abcdef --backend neuron
check "naming the known ones" has "known: cpu"
printf '{"id": "x/big", "config": {"model_type": "llama", "hidden_size": 1e309}}\n' >"$TMP/overflow_models.jsonl"
check "a number out of range is refused" run 2 "$BIN" --registry "$TMP/dup.db" capture --models "$TMP/overflow_models.jsonl"
check "naming the file and line" has "overflow_models.jsonl:1: [json.exception.out_of_range.406] number overflow"
# Note [Dimension bounds]: refused before the tracer hands it to libtorch.
printf '{"id": "huge/llama", "config": {"model_type": "llama", "hidden_size": 1000000000000, "num_hidden_layers": 2}}\n' >"$TMP/huge_models.jsonl"
check "a config beyond the dimension bounds is refused" run 2 "$BIN" --registry "$DB" capture --models "$TMP/huge_models.jsonl"
check "the refusal names the model and the field" has "model 'huge/llama': hidden_size is 1000000000000"
check "over the memory budget is refused" run 1 "$BIN" -q --registry "$TMP/budget.db" capture --model microsoft/resnet-50 --device cpu --max-gb 0.01
check "refusal gives the estimate" has "exceeds --max-gb 0.01"
check "the refusal is stored" test "$(sqlite3 "$TMP/budget.db" "SELECT status || '/' || stage FROM programs")" = "refused/budget"
check "a NaN budget is refused" run 2 "$BIN" -q --registry "$TMP/budget.db" capture --max-gb nan
check "a NaN budget is named" has "--max-gb"
printf 'not a database, just text that is long enough to have a header-sized prefix of bytes......\n' >"$TMP/text.db"
check "a foreign file is not taken for a registry" run 2 "$BIN" --registry "$TMP/text.db" registry stats
check "a foreign file is named" has "is not an SQLite database"
check "a foreign file is left unchanged" grep -q "^not a database" "$TMP/text.db"
sqlite3 "$TMP/other.db" "CREATE TABLE notes(x TEXT); INSERT INTO notes VALUES ('keep me');"
check "another application's database is refused" run 2 "$BIN" --registry "$TMP/other.db" capture --model microsoft/resnet-50
check "another application's database is named" has "SQLite database of something else"
check "another application's database is untouched" test "$(sqlite3 "$TMP/other.db" "SELECT COUNT(*) FROM sqlite_master")" -eq 1
check "run on a missing registry" run 2 "$BIN" --registry "$TMP/typo.db" run --stage=unit
check "run leaves no empty file behind" test ! -e "$TMP/typo.db"
check "failed commands lost nothing" test "$(cases)" -eq "$n"

check "filter matching nothing is an error" run 2 "$BIN" --registry "$DB" run --stage=unit --op no_such_op
check "filter matching nothing says so" has "no op cases in the registry match"
check "unit run" run 0 "$BIN" -q --registry "$DB" run --stage=unit --run first --warm 1
check "unit run summary" has "TOTAL"
check "unit run says where results are" has "results: $DB, run first"
check "one result per case" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='first'")" -eq "$n"
check "resume runs nothing twice" run 0 "$BIN" -q --registry "$DB" run --stage=unit --run first
check "resume reports finished cases" has "$n already done (resumed), 0 run now"
check "still one result per case" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='first'")" -eq "$n"
check "resume with other seed is refused" run 2 "$BIN" -q --registry "$DB" run --stage=unit --run first --seed 7
check "refusal explains" has "would mix results judged differently"
check "cost cap" run 0 "$BIN" -q --registry "$DB" run --stage=unit --run capped --max-case-flops 1e6 --warm 0
check "cost cap reported" has "over the cost cap"
check "memory cap" run 0 "$BIN" -q --registry "$DB" run --stage=unit --run memcapped --max-case-gb 0.001 --warm 0
check "memory cap skips the cases over it" test \
  "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='memcapped' AND outcome='skipped' AND error LIKE '%over --max-case-gb 0.001%'")" -gt 0
check "memory cap: nan is refused" run 2 "$BIN" -q --registry "$DB" run --stage=unit --max-case-gb nan
check "memory cap refusal names the flag" has "--max-case-gb: 'nan' is not a finite number"
check "memory cap is for the unit stage" run 2 "$BIN" -q --registry "$DB" run --stage=model --max-case-gb 2

# Ctrl-C stops after the current case; the same --run id resumes it.
"$BIN" -q --registry "$DB" run --stage=unit --run interrupted --warm 400 >"$TMP/int.out" 2>&1 &
pid=$!
# Once the first result is stored (a loaded machine can take seconds to start).
for _ in $(seq 600); do
  [ "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='interrupted'" 2>/dev/null || echo 0)" -gt 0 ] && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
rc=$?
OUT=$(cat "$TMP/int.out")
check "interrupt exits 130" test "$rc" -eq 130
check "interrupt says how to resume" has "resume with --run interrupted"
done_before=$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='interrupted'")
check "interrupted run is unfinished" test -z "$(sqlite3 "$DB" "SELECT finished_at FROM runs WHERE run_id='interrupted'")"
check "resume after interrupt" run 0 "$BIN" -q --registry "$DB" run --stage=unit --run interrupted --warm 0
check "resume skips what was done" has "$done_before already done (resumed)"
check "resumed run has every case once" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id='interrupted'")" -eq "$n"
check "resumed run is finished" test -n "$(sqlite3 "$DB" "SELECT finished_at FROM runs WHERE run_id='interrupted'")"

# Hostile input (Note [Run ids]): ids that were paths, SQL or options once.
results_before=$(sqlite3 "$DB" "SELECT COUNT(*) FROM results")
for bad in '../../escaped' "q'; DELETE FROM results; --" $'two\nlines' '--run' "$(printf 'x%.0s' $(seq 5000))"; do
  check "run id '${bad:0:20}' is refused" run 2 "$BIN" -q --registry "$DB" run --stage=unit --op relu --run "$bad"
  check "run id refusal names the flag and the rule" has "--run: "
done
check "report of a path-like run id is refused" run 2 "$BIN" -q --registry "$DB" report --run '../../escaped'
check "nothing was written outside the registry's folder" test ! -e "$TMP/../escaped"
check "refused run ids stored nothing" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results")" -eq "$results_before"
# The query the run prints can be pasted as is, even for an awkward path.
odd="$TMP/my reg's \$HOME.db"
cp "$DB" "$odd"
check "run on an awkward registry path" run 0 "$BIN" -q --registry "$odd" run --stage=unit --op relu --run pasted --warm 0
line=$(grep '^  sqlite3 ' <<<"$OUT")
check "the printed query quotes the path" test -n "$line"
files_before=$(ls -A "$TMP" | grep -v -- '-wal$\|-shm$' | sort)
pasted=$(bash -c "$line" 2>&1)
check "the pasted query runs" test $? -eq 0
check "the pasted query is one clean command" test -z "$pasted"
check "the pasted query opened the registry, no other file" \
  test "$(ls -A "$TMP" | grep -v -- '-wal$\|-shm$' | sort)" = "$files_before"
check "the pasted query deleted nothing" test "$(sqlite3 "$odd" "SELECT COUNT(*) FROM results WHERE run_id='pasted'")" -gt 0
# Every number a user types: finite and in range, with a short message.
for args in "run --timeout nan" "run --timeout inf" "run --max-case-flops nan" "run --min-cosine nan" \
            "report --run first --drift-factor nan" "crawl --rate inf" "registry query --min-flops nan"; do
  # shellcheck disable=SC2086
  check "'$args' is refused" run 2 "$BIN" -q --registry "$DB" $args
  check "'$args' names a finite number" has "is not a finite number"
done
for t in -1 100000; do
  check "--threads $t is refused" run 2 "$BIN" --threads "$t" --registry "$DB" registry stats
  check "--threads $t says the machine's bound" has "is outside [0, $(nproc)]"
  check "--threads $t message is short" test "${#OUT}" -lt 300
done

# Registry paths SQLite would answer with "disk I/O error" or "unable to open".
mkdir -p "$TMP/adir"
check "a folder as registry is refused" run 2 "$BIN" --registry "$TMP/adir" registry stats
check "a folder as registry is named" has "is a folder, not a registry file"
check "a missing folder is refused" run 2 "$BIN" --registry "$TMP/nofolder/r.db" capture --model microsoft/resnet-50
check "a missing folder is named" has "the folder '$TMP/nofolder' of registry"
# Another writer holding the registry longer than --busy-timeout.
python3 -c "import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN IMMEDIATE'); time.sleep(6); c.execute('ROLLBACK')" "$DB" &
sleep 1
check "a locked registry gives up after --busy-timeout" run 2 "$BIN" -q --busy-timeout 1 --registry "$DB" run --stage=unit --op relu --run locked --warm 0
check "a locked registry is explained" has "is locked by another writer"
wait
check "the lock lost nothing" test "$(cases)" -eq "$n"

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
