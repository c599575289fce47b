#!/usr/bin/env bash
# Runs one `coverage run` as N shards in parallel on this machine and merges
# them into one run: the same steps a Kubernetes Indexed Job, a Slurm array or
# a CI matrix takes, without a cluster.
#
#   deploy/local/run_shards.sh REGISTRY N RUN_ID [coverage run flags...]
#
# Each shard works on its own copy of REGISTRY (shards/<RUN_ID>/shard-<i>.db,
# kept, so running the script again resumes unfinished shards), then all are
# merged back into REGISTRY. Exit status: the worst of the shards' (1 when a
# shard found failures, 2 on errors), after merging what there is.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
REGISTRY=$1 SHARDS=$2 RUN_ID=$3
shift 3
BIN=${COVERAGE_BIN:-$(dirname "$0")/../../build/bin/coverage}
DIR=$(dirname "$REGISTRY")/shards/$RUN_ID
mkdir -p "$DIR"
pids=()
for ((i = 0; i < SHARDS; i++)); do
  db=$DIR/shard-$i.db
  [ -f "$db" ] || cp "$REGISTRY" "$db"
  COVERAGE_SHARD_INDEX=$i COVERAGE_TOTAL_SHARDS=$SHARDS \
    "$BIN" --quiet --registry "$db" run --run "$RUN_ID" "$@" > "$DIR/shard-$i.log" 2>&1 &
  pids+=($!)
done
worst=0
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "shard $i/$SHARDS: exit $rc (log: $DIR/shard-$i.log)"
  if [ "$rc" -gt "$worst" ]; then worst=$rc; fi
done
"$BIN" --registry "$REGISTRY" merge "$DIR"/shard-*.db
exit "$worst"
