#!/usr/bin/env bash
# The unit stage of two builds side by side on the same op cases: each
# configuration (backend, isolation) runs with the one build and then the
# other on fresh copies of REGISTRY, REPEAT times, alternating, so load on
# the machine falls on both alike. Prints a Markdown table of the whole
# command's wall time (median of the repeats) and the second build's over
# the first's. A run that fails (exit status other than 0 or 1: a registry
# of a schema the older build cannot read, say) stops the comparison.
# COMPARE_CONFIGS picks configurations [default: "cpu process,sim process,cpu none,sim none"].
#
#   bash bench/compare_builds.sh BASE_BIN NEW_BIN REGISTRY [REPEAT] [-- RUN_ARGS...]
#
# e.g. a build of the last release against this tree's, on the seed models:
#   git worktree add /tmp/base v1 && (cd /tmp/base && bash scripts/build.sh coverage coverage_sim)
#   bash bench/compare_builds.sh /tmp/base/build/bin/coverage build/bin/coverage seed.db 2
set -euo pipefail
base=${1:?usage: bash bench/compare_builds.sh BASE_BIN NEW_BIN REGISTRY [REPEAT] [-- RUN_ARGS...]}
new=${2:?usage: bash bench/compare_builds.sh BASE_BIN NEW_BIN REGISTRY [REPEAT] [-- RUN_ARGS...]}
reg=${3:?usage: bash bench/compare_builds.sh BASE_BIN NEW_BIN REGISTRY [REPEAT] [-- RUN_ARGS...]}
shift 3
repeat=1
if (($# > 0)) && [[ $1 != -- ]]; then repeat=$1; shift; fi
[[ ${1:-} == -- ]] && shift
[[ $repeat =~ ^[1-9][0-9]?$ ]] || { echo "compare_builds: REPEAT must be 1-99, not '$repeat'" >&2; exit 2; }
for f in "$base" "$new"; do [[ -x $f ]] || { echo "compare_builds: no executable at '$f'" >&2; exit 2; }; done
[[ -f $reg ]] || { echo "compare_builds: no registry at '$reg'" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
once() {  # BIN BACKEND ISOLATION [RUN_ARGS...] -> wall seconds
  local bin=$1 backend=$2 isolation=$3 t0 t1
  shift 3
  cp "$reg" "$tmp/r.db"
  t0=$(date +%s.%N)
  local rc=0
  "$bin" -q --threads 1 --registry "$tmp/r.db" run --stage=unit --backend "$backend" --isolation "$isolation" \
    --run compare "$@" >"$tmp/run.out" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  if ((rc > 1)); then
    echo "compare_builds: $bin failed (exit $rc):" >&2
    tail -5 "$tmp/run.out" >&2
    exit 2
  fi
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf("%.2f\n", b - a) }'
}

cases=$(sqlite3 "$reg" "SELECT COUNT(*) FROM op_cases")
echo "$cases op cases of $reg, $repeat run(s) each, alternating"
echo
echo "| backend, isolation | base | new | new / base |"
echo "|---|---:|---:|---:|"
IFS=, read -r -a configs <<<"${COMPARE_CONFIGS:-cpu process,sim process,cpu none,sim none}"
for config in "${configs[@]}"; do
  read -r backend isolation <<<"$config"
  : >"$tmp/base.t"
  : >"$tmp/new.t"
  for ((r = 0; r < repeat; ++r)); do
    once "$base" "$backend" "$isolation" "$@" >>"$tmp/base.t"
    once "$new" "$backend" "$isolation" "$@" >>"$tmp/new.t"
  done
  b=$(median <"$tmp/base.t")
  n=$(median <"$tmp/new.t")
  awk -v c="$backend, $isolation" -v b="$b" -v n="$n" 'BEGIN { printf("| %s | %.1f s | %.1f s | %.2fx |\n", c, b, n, n / b) }'
done
