#!/usr/bin/env bash
# Worker isolation and sharding end to end through the CLI:
#   - a run killed with SIGKILL at several random points and resumed with its
#     run id ends with results identical to an uninterrupted run (no case lost,
#     none twice), and leaves no worker process behind;
#   - one run id has one live writer: a second process with the same --run is
#     refused while the first runs, and takes the run over once it is killed;
#   - shards 0..N-1 (deploy/local/run_shards.sh) merged equal the unsharded run,
#     and merging again changes nothing;
#   - a fault campaign on the simulated device: crash, abort, hang, wrong
#     values, NaN, unsupported, error and a flaky crash injected into chosen
#     ops; every fault is attributed to exactly its cases with the right
#     outcome, and every other case completes and passes.
# Needs COVERAGE_BIN and COVERAGE_HOME.
set -uo pipefail
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
SRC=${COVERAGE_HOME:?set COVERAGE_HOME}
TMP=$(mktemp -d)
trap 'pkill -9 -f "$TMP/home" 2>/dev/null; rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"
# A home of our own, so that our workers (started with --home) can be told
# apart from those of tests running in parallel.
mkdir -p "$TMP/home"
ln -s "$SRC/configs" "$TMP/home/configs"
ln -s "$SRC/data" "$TMP/home/data"
ln -s "$SRC/capture" "$TMP/home/capture"
ln -s "$SRC/.venv" "$TMP/home/.venv"
export COVERAGE_HOME=$TMP/home
DB=$TMP/r.db
workers() { pgrep -f -- "--home $TMP/home" | wc -l; }

"$BIN" -q --registry "$DB" capture --profile prefill --profile image > "$TMP/capture.out" 2>&1
check "capture for the isolation tests" test "$(sqlite3 "$DB" 'SELECT COUNT(*) FROM op_cases')" -gt 100

# Results as content, by case key: what must not depend on interruptions.
results() {
  sqlite3 "$1" "SELECT c.key, r.outcome, r.error, r.max_abs_err, r.max_rel_err, r.mismatch_frac, r.cosine,
                       r.error_ratio, r.attempts, r.flaky, r.attempt_outcomes
                FROM results r JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = '$2' ORDER BY c.key"
}

# Compares two result listings: every case with the same verdict and error
# figures. Attempts may differ only where a worker crashed or timed out
# around the case in one of the runs (the machine's doing: a worker killed
# for memory while other tests ran beside this one), and that is printed;
# any other difference prints the differing rows and fails.
same_results() {
  cmp -s "$1" "$2" && return 0
  python3 - "$1" "$2" <<'PY'
import sys
def rows(path):
    with open(path) as f:
        return {line.split("|", 1)[0]: line.rstrip("\n").split("|") for line in f}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
ok = a.keys() == b.keys()
if not ok:
    print("cases only in one run:", sorted(a.keys() ^ b.keys())[:10], file=sys.stderr)
for key in sorted(a.keys() & b.keys()):
    x, y = a[key], b[key]
    if x == y:
        continue
    environment = any(o.split(",")[0] in ("crash", "timeout") for o in (x[10], y[10]))
    if x[:8] == y[:8] and environment:
        print("note: a worker died around case", key, "(attempts:", x[10] or "pass", "/", y[10] or "pass", ")",
              file=sys.stderr)
        continue
    ok = False
    print("differs:", "|".join(x), "\n     vs:", "|".join(y), file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}

# 1. The uninterrupted reference run.
"$BIN" -q --registry "$DB" run --stage=unit --run whole > "$TMP/whole.out" 2>&1
check "uninterrupted run passes" test $? -eq 0
results "$DB" whole > "$TMP/whole.txt"
total=$(wc -l < "$TMP/whole.txt")
check "uninterrupted run has every case" test "$total" -eq "$(sqlite3 "$DB" 'SELECT COUNT(*) FROM op_cases')"

# 2. The same run, SIGKILLed at random points until it finishes: each time
# once a random number of further results is stored (or at once, before the
# first one, when the draw is 0).
stored() { sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'killed'" 2>/dev/null || echo 0; }
kills=0
seen=""
while [ "$kills" -lt 5 ]; do
  done_now=$(stored)
  [ "$done_now" -ge "$total" ] && break
  target=$((done_now + RANDOM % ((total - done_now) / 3 + 1)))
  "$BIN" -q --registry "$DB" run --stage=unit --run killed > "$TMP/killed.out" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ "$(stored)" -lt "$target" ]; do sleep 0.02; done
  kill -9 "$pid" 2>/dev/null && kills=$((kills + 1)) && seen="$seen $(stored)"
  wait "$pid" 2>/dev/null
  # Workers die with their parent.
  for _ in $(seq 100); do [ "$(workers)" -eq 0 ] && break; sleep 0.05; done
  check "no worker outlives a killed run (kill $kills)" test "$(workers)" -eq 0
done
"$BIN" -q --registry "$DB" run --stage=unit --run killed > "$TMP/killed.out" 2>&1
check "the resumed run finishes" test $? -eq 0
echo "killed $kills times, with results stored at each kill:$seen"
check "the run was killed at several points" test "$kills" -ge 3
results "$DB" killed > "$TMP/killed.txt"
check "killed-and-resumed results equal the uninterrupted run" same_results "$TMP/whole.txt" "$TMP/killed.txt"
check "nothing left in flight" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM in_flight WHERE run_id = 'killed'")" -eq 0
check "the killed run is finished" test -n "$(sqlite3 "$DB" "SELECT finished_at FROM runs WHERE run_id = 'killed'")"

# 2b. One live writer per run id (a lease in the registry): a second process
# on the same run is refused while the first writes, nothing of it stored;
# once the first is killed, the next one takes the run over and says so.
dual() { sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'dual'" 2>/dev/null || echo 0; }
"$BIN" -q --registry "$DB" run --stage=unit --run dual > "$TMP/dual1.out" 2>&1 &
first=$!
while kill -0 "$first" 2>/dev/null && [ "$(dual)" -lt 3 ]; do sleep 0.02; done
"$BIN" -q --registry "$DB" run --stage=unit --run dual > "$TMP/dual2.out" 2>&1
check "a second writer of one run id is refused" test $? -eq 2
check "the refusal names the writer" contains "$TMP/dual2.out" "run 'dual' is being written by process $first on host"
check "the refusal says what to do" contains "$TMP/dual2.out" "split the run with --shard i/N"
kill -9 "$first" 2>/dev/null
wait "$first" 2>/dev/null
"$BIN" -q --registry "$DB" run --stage=unit --run dual > "$TMP/dual3.out" 2>&1
check "the run is taken over from the killed writer" test $? -eq 0
check "the takeover is said" contains "$TMP/dual3.out" "run 'dual': taking over from process $first on host"
results "$DB" dual > "$TMP/dual.txt"
check "taken-over results equal the uninterrupted run" same_results "$TMP/whole.txt" "$TMP/dual.txt"
check "no lease is left behind" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM run_leases")" -eq 0

# 3. Shards merged equal the unsharded run.
cp "$DB" "$TMP/merged.db"
COVERAGE_BIN=$BIN bash "$SRC/deploy/local/run_shards.sh" "$TMP/merged.db" 3 sharded --stage=unit > "$TMP/shards.out" 2>&1
check "three shards run and merge" test $? -eq 0 || cat "$TMP/shards.out" >&2
results "$TMP/merged.db" sharded > "$TMP/sharded.txt"
check "merged shards equal the unsharded run" same_results "$TMP/whole.txt" "$TMP/sharded.txt"
check "the merged run is finished" contains "$TMP/shards.out" "finished (3 of 3 shards finished)"
shard_total=0
for i in 0 1 2; do
  n=$(sqlite3 "$TMP/shards/sharded/shard-$i.db" "SELECT COUNT(*) FROM results WHERE run_id = 'sharded'")
  check "shard $i ran a part" test "$n" -gt 0 -a "$n" -lt "$total"
  shard_total=$((shard_total + n))
done
check "the shards' parts add up to the whole" test "$shard_total" -eq "$total"
before=$(sqlite3 "$TMP/merged.db" "SELECT * FROM results ORDER BY run_id, case_id" | md5sum)
"$BIN" --registry "$TMP/merged.db" merge "$TMP"/shards/sharded/shard-*.db > "$TMP/merge2.out" 2>&1
check "merging again succeeds" test $? -eq 0
check "merging again adds nothing" contains "$TMP/merge2.out" "0 results and 0 model results added"
check "merging again changes nothing" test "$before" = "$(sqlite3 "$TMP/merged.db" "SELECT * FROM results ORDER BY run_id, case_id" | md5sum)"

# 4. Sharding needs one run id, and bad shard values are explained.
"$BIN" --registry "$DB" run --stage=unit --shard 1/2 > "$TMP/noid.out" 2>&1
check "a shard without --run is refused" test $? -eq 2
check "the refusal says why" contains "$TMP/noid.out" "pass --run"
"$BIN" --registry "$DB" run --stage=unit --shard 2/2 --run x > "$TMP/bad.out" 2>&1
check "an index out of range is refused" test $? -eq 2
check "the range is named" contains "$TMP/bad.out" "outside 0..1"
JOB_COMPLETION_INDEX=0 "$BIN" --registry "$DB" run --stage=unit --shard auto --run x > "$TMP/k8s.out" 2>&1
check "an Indexed Job index without the count is refused" contains "$TMP/k8s.out" "COVERAGE_TOTAL_SHARDS"
"$BIN" --registry "$DB" run --stage=unit --shard auto --run x > "$TMP/auto.out" 2>&1
check "--shard auto outside an engine is refused" contains "$TMP/auto.out" "no shard in the environment"
"$BIN" --registry "$TMP/merged.db" merge "$TMP/missing.db" > "$TMP/missing.out" 2>&1
check "merging a missing file is refused" test $? -eq 2
"$BIN" --registry "$DB" run --stage=unit --isolation-config "$TMP/none.json" > "$TMP/conf.out" 2>&1
check "a missing isolation config is refused" contains "$TMP/conf.out" "none.json"

# 5. The fault campaign on sim (exact numerics, so that every case without a
# fault passes). The faulted ops are leaves: no other case's op decomposes
# into them on the way to the device.
cat > "$TMP/faults.json" <<'JSON'
[
  {"op": "aten::neg", "fault": "crash"},
  {"op": "aten::silu", "fault": "abort"},
  {"op": "aten::tanh", "fault": "hang"},
  {"op": "aten::sin", "fault": "hang"},
  {"op": "aten::rsqrt", "fault": "wrong_values"},
  {"op": "aten::pow", "fault": "nan"},
  {"op": "aten::gelu", "fault": "unsupported"},
  {"op": "aten::cat", "fault": "error"},
  {"op": "aten::cos", "fault": "crash", "attempts": [1]}
]
JSON
echo '{"numerics": "exact"}' > "$TMP/exact.json"
# The short deadline only for the ops that carry a planted hang: an ordinary
# heavy case (a language model head's mm) must not time out on a loaded machine.
echo '{"timeout_s": 600, "op_timeout_s": {"aten::tanh": 3, "aten::sin": 3}, "reruns": 1}' > "$TMP/isolation.json"
COVERAGE_SIM_CONFIG="$TMP/exact.json" COVERAGE_SIM_FAULTS="@$TMP/faults.json" \
  "$BIN" -q --registry "$DB" run --stage=unit --backend sim --run campaign --isolation-config "$TMP/isolation.json" \
  > "$TMP/campaign.out" 2>&1
check "the campaign run reports failures" test $? -eq 1 || tail -5 "$TMP/campaign.out" >&2
outcomes() {  # op -> "outcome attempts flaky" lines, distinct
  sqlite3 "$DB" "SELECT DISTINCT r.outcome || ' ' || r.attempts || ' ' || r.flaky FROM results r
                 JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = 'campaign' AND c.op = '$1'"
}
cases_of() { sqlite3 "$DB" "SELECT COUNT(*) FROM op_cases WHERE op = '$1'"; }
errors_of() {  # how many of the op's results have an error containing $2
  sqlite3 "$DB" "SELECT COUNT(*) FROM results r JOIN op_cases c ON c.case_id = r.case_id
                 WHERE r.run_id = 'campaign' AND c.op = '$1' AND r.error LIKE '%$2%'"
}
check "every case has a result" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results WHERE run_id = 'campaign'")" -eq "$total"
check "crash: consistent, rerun once" test "$(outcomes aten::neg)" = "crash 2 0"
check "crash: the signal and the op are named" test "$(errors_of aten::neg 'SIGSEGV%while running aten::neg')" -eq "$(cases_of aten::neg)"
check "abort: a crash with SIGABRT" test "$(errors_of aten::silu SIGABRT)" -eq "$(cases_of aten::silu)"
check "abort: outcome" test "$(outcomes aten::silu)" = "crash 2 0"
check "hang: timeout" test "$(outcomes aten::tanh)" = "timeout 2 0"
check "hang: timeout (sin)" test "$(outcomes aten::sin)" = "timeout 2 0"
check "hang: the deadline is named" test "$(errors_of aten::tanh 'within 3 s')" -eq "$(cases_of aten::tanh)"
check "wrong values: mismatch, reproduced exactly after one rerun" test "$(outcomes aten::rsqrt)" = "mismatch 2 0"
check "nan: non-finite mismatch" test "$(outcomes aten::pow)" = "nonfinite_mismatch 2 0"
check "unsupported: not rerun" test "$(outcomes aten::gelu)" = "unsupported 1 0"
check "error: the backend's message" test "$(outcomes aten::cat)" = "error 2 0"
check "flaky crash: first attempt's outcome, passes on the rerun" test "$(outcomes aten::cos)" = "crash 2 1"
check "flaky crash: the attempts are stored" test "$(sqlite3 "$DB" "SELECT DISTINCT attempt_outcomes FROM results r
  JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = 'campaign' AND c.op = 'aten::cos'")" = "crash,pass"
faulted=$(sqlite3 "$DB" "SELECT COUNT(*) FROM op_cases WHERE op IN
  ('aten::neg','aten::silu','aten::tanh','aten::sin','aten::rsqrt','aten::pow','aten::gelu','aten::cat','aten::cos')")
check "every other case completes and passes" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM results
  WHERE run_id = 'campaign' AND outcome = 'pass'")" -eq "$((total - faulted))"
check "the faults are listed in v_flaky" test "$(sqlite3 "$DB" "SELECT COUNT(*) FROM v_flaky WHERE run_id = 'campaign'")" -eq "$(cases_of aten::cos)"
check "the run summary counts crashes and timeouts" grep -q "timed out" "$TMP/campaign.out"
echo "fault campaign: $faulted faulted cases of $total"

echo "isolation_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
