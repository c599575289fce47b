#!/usr/bin/env bash
# Side by side on the same op cases: coverage's unit stage on cpu and sim,
# in process and through worker processes, and the Python loop a backend
# team would write instead (bench/peers/python_loop.py, cpu), all with one
# ATen thread and 3 warm calls, one after the other on copies of REGISTRY.
# Prints a Markdown table: wall time, share in op compute, overhead per
# case, and each wall time over the Python loop's.
#
#   bash bench/peers/run.sh REGISTRY [FILTER...]    e.g. bash bench/peers/run.sh out/main.db --source captured
#
# FILTER: run/python_loop filters (--op OP, --source captured|opinfo).
set -euo pipefail
cd "$(dirname "$0")/../.."
reg=${1:?usage: bash bench/peers/run.sh REGISTRY [--op OP]... [--source captured|opinfo]}
shift
[[ -f $reg ]] || { echo "peers: no registry at '$reg'" >&2; exit 2; }
BIN=${COVERAGE_BIN:-build/bin/coverage}
PY=${COVERAGE_PYTHON:-.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

row() {  # name wall share cases
  awk -v n="$1" -v w="$2" -v s="$3" -v c="$4" -v base="${5:-0}" 'BEGIN {
    per = 0; if (c > 0) per = 1000 * w * (1 - s) / c
    ratio = "1.00x"; if (base > 0) ratio = sprintf("%.2fx", w / base)
    printf("| %s | %.1f s | %.0f%% | %.2f ms | %s |\n", n, w, 100 * s, per, ratio) }'
}

py_json=$("$PY" bench/peers/python_loop.py --registry "$reg" --threads 1 --warm 3 "$@" 2>/dev/null)
py_wall=$(echo "$py_json" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["wall_s"])')
py_share=$(echo "$py_json" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["op_compute_share"])')
cases=$(echo "$py_json" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["cases"])')

echo "| runner | wall | in op compute | overhead per case | wall / Python loop |"
echo "|---|---:|---:|---:|---:|"
row "Python loop (\`python_loop.py\`, cpu)" "$py_wall" "$py_share" "$cases"
for config in "cpu none" "cpu process" "sim none" "sim process"; do
  read -r backend isolation <<<"$config"
  cp "$reg" "$tmp/r.db"
  t0=$(date +%s.%N)
  out=$("$BIN" -q --threads 1 --registry "$tmp/r.db" run --stage=unit --backend "$backend" --isolation "$isolation" \
        --run "peers-$backend-$isolation" "$@" 2>&1 || true)
  t1=$(date +%s.%N)
  # The stage's own line: its wall time and share in op compute; the wall
  # reported is the whole command's, as a user waits for it.
  line=$(echo "$out" | grep -E "^run peers-" | tail -1)
  stage_wall=$(echo "$line" | grep -oE '[0-9.]+s \(' | grep -oE '[0-9.]+')
  share=$(echo "$line" | grep -oE '\(([0-9]+)% in op compute' | grep -oE '[0-9]+')
  ran=$(echo "$line" | grep -oE '[0-9]+ run now' | grep -oE '[0-9]+')
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b - a}')
  compute_share=$(awk -v s="$share" -v sw="$stage_wall" -v w="$wall" 'BEGIN { v = 0; if (w > 0) v = s / 100 * sw / w; print v }')
  row "coverage, $backend, isolation $isolation" "$wall" "$compute_share" "$ran" "$py_wall"
done
echo
echo "Python loop: $py_json"
