#!/usr/bin/env bash
# A crawl of a local hub-replay, killed with SIGKILL at several points and
# resumed with --resume, ends with exactly what an uninterrupted crawl
# stores: the same models, the same config bytes, no duplicates.
set -u
BIN=${COVERAGE_BIN:?set COVERAGE_BIN}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/lib.sh"

start_hub_replay --synthetic 1000 --seed 11
check "hub-replay started" test -n "$URL"

crawl() {  # crawl DB [extra flags]
  local db=$1
  shift
  "$BIN" -q --registry "$db" crawl --endpoint "$URL" --rate 0 --page-limit 100 --concurrency 4 "$@"
}
dump() {
  sqlite3 "$1" "SELECT id, sha, downloads, config_status, config_json FROM models ORDER BY id"
}

crawl "$TMP/ref.db" >"$TMP/ref.out" 2>&1
check "reference crawl succeeds" test $? -eq 0
check "reference crawl stored every model" test "$(sqlite3 "$TMP/ref.db" "SELECT COUNT(*) FROM models")" -eq 1000
check "reference crawl fetched configs" test "$(sqlite3 "$TMP/ref.db" "SELECT COUNT(*) FROM models WHERE config_status='fetched'")" -gt 300
dump "$TMP/ref.db" >"$TMP/ref.dump"

for delay in 0.1 0.3 0.7 1.2; do
  db="$TMP/killed-$delay.db"
  crawl "$db" >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  ok=0
  for _ in $(seq 10); do
    if crawl "$db" --resume >"$TMP/resume.out" 2>&1; then ok=1; break; fi
  done
  check "resume after kill at ${delay}s finishes" test "$ok" -eq 1 || tail -3 "$TMP/resume.out" >&2
  dump "$db" >"$TMP/killed.dump"
  if ! check "kill at ${delay}s: same models and configs as the reference" cmp -s "$TMP/ref.dump" "$TMP/killed.dump"; then
    diff "$TMP/ref.dump" "$TMP/killed.dump" | head -5 | cut -c1-200 >&2
  fi
done

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
