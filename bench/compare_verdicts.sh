#!/usr/bin/env bash
# Were two runs judged the same? Compares a unit run case by case (by op
# case key) and a model-stage run item by item, on everything a verdict
# holds: outcome, error text, error figures, per-output detail, attempts,
# counters. Timings are left out (they differ from run to run), and so are
# the timing members of a model item's detail.
#
#   bash bench/compare_verdicts.sh A.db B.db UNIT_RUN_A UNIT_RUN_B [MODEL_RUN_A MODEL_RUN_B]
#
# Prints the rows compared and the rows that differ (each differing row
# side by side, the first 20); exits 1 when any differs. Used to show that a
# change of the harness keeps the main job's verdicts (bench/README.md).
set -euo pipefail
if (($# != 4 && $# != 6)); then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2
for db in "$a" "$b"; do [[ -f $db ]] || { echo "compare_verdicts: no such registry '$db'" >&2; exit 2; }; done
q() { printf "'%s'" "${1//\'/\'\'}"; }

status=0
compare() {  # name, select over alias s (the run's rows), key expression, run a, run b
  local name=$1 columns=$2 key=$3 run_a=$4 run_b=$5 from=$6
  local sql="
    ATTACH $(q "$b") AS other;
    CREATE TEMP VIEW va AS SELECT $key AS k, $columns FROM $from WHERE s.run_id = $(q "$run_a");
    CREATE TEMP VIEW vb AS SELECT $key AS k, $columns FROM $(sed 's/\bmain\./other./g' <<<"$from") WHERE s.run_id = $(q "$run_b");
    SELECT (SELECT COUNT(*) FROM va), (SELECT COUNT(*) FROM vb),
           (SELECT COUNT(*) FROM (SELECT * FROM va EXCEPT SELECT * FROM vb)),
           (SELECT COUNT(*) FROM (SELECT * FROM vb EXCEPT SELECT * FROM va));"
  local counts
  counts=$(sqlite3 -separator ' ' "$a" "$sql")
  read -r na nb only_a only_b <<<"$counts"
  echo "$name: $na rows in $run_a, $nb in $run_b; $only_a differ or are missing on one side ($only_b the other way)"
  if ((na == 0 || only_a > 0 || only_b > 0)); then
    status=1
    sqlite3 -header -column "$a" "
      ATTACH $(q "$b") AS other;
      CREATE TEMP VIEW va AS SELECT $key AS k, $columns FROM $from WHERE s.run_id = $(q "$run_a");
      CREATE TEMP VIEW vb AS SELECT $key AS k, $columns FROM $(sed 's/\bmain\./other./g' <<<"$from") WHERE s.run_id = $(q "$run_b");
      SELECT 'a' AS side, * FROM (SELECT * FROM va EXCEPT SELECT * FROM vb)
      UNION ALL SELECT 'b', * FROM (SELECT * FROM vb EXCEPT SELECT * FROM va) ORDER BY 2, 1 LIMIT 20;" | cut -c1-400
  fi
}

compare "unit" \
  "s.outcome, s.error, s.max_abs_err, s.max_rel_err, s.mismatch_frac, s.cosine, s.error_ratio, json_remove(s.detail_json, '\$.timing'), s.attempts, s.flaky, s.attempt_outcomes, s.counters_json" \
  "c.key" "$3" "$4" "main.results s JOIN main.op_cases c ON c.case_id = s.case_id"
if (($# == 6)); then
  compare "models" \
    "s.outcome, s.error, s.blocked_by, s.family, s.max_abs_err, s.max_rel_err, s.cosine, s.error_ratio, json_remove(s.detail_json, '\$.replay.backend_seconds', '\$.replay.reference_seconds', '\$.worker'), s.attempts, s.flaky, s.attempt_outcomes" \
    "s.model_id || ' ' || s.profile || ' ' || s.stage || ' ' || s.item" "$5" "$6" "main.model_results s"
fi
exit $status
