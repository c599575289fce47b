#!/usr/bin/env bash
# Submits N shards of one run as a Slurm array and the merge after it.
#   deploy/slurm/submit.sh REGISTRY N RUN_ID [coverage run flags...]
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,3p' "$0" >&2
  exit 2
fi
export REGISTRY=$(realpath "$1") RUN_ID=$3
N=$2
shift 3
export COVERAGE_RUN_FLAGS="${*:---stage=unit --backend=sim}"
here=$(dirname "$0")
array=$(sbatch --parsable --export=ALL --array=0-$((N - 1)) "$here/coverage-shards.sbatch")
sbatch --export=ALL --dependency=afterany:"$array" "$here/coverage-merge.sbatch"
echo "shards: job $array; merge queued after it"
