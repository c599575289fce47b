#!/usr/bin/env bash
# The CUDA check, on a machine with an NVIDIA GPU and a CUDA build of PyTorch
# (never part of CI). It builds coverage against that machine's torch
# ($COVERAGE_TORCH_PYTHON, default python3) into build-device/, captures the
# bundled registry, runs the unit stage on `cuda` (fp32 in IEEE) and on
# `cuda-tf32` (fp32 matmuls and convolutions in TF32) against the CPU
# reference, and prints a short summary. Sized to finish within 8 minutes on
# a 16-core machine.
#
# Where the machine lacks the project's C++ libraries, first run
# `bash scripts/device-deps.sh` on a Debian 12 machine and carry .devdeps/:
# the packages are unpacked into /tmp/coverage-devdeps and used from there.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
PY=${COVERAGE_TORCH_PYTHON:-python3}
OUTDIR=${OUT:-build-device/out}
mkdir -p "$OUTDIR"

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'

prefix=()
if compgen -G ".devdeps/*.deb" >/dev/null; then
  ROOT=/tmp/coverage-devdeps
  mkdir -p "$ROOT"
  for f in .devdeps/*.deb; do dpkg-deb -x "$f" "$ROOT"; done
  prefix=(-DCMAKE_PREFIX_PATH="$ROOT/usr;$ROOT/usr/lib/x86_64-linux-gnu/cmake" -DCMAKE_INCLUDE_PATH="$ROOT/usr/include"
          -DCMAKE_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu")
  export LD_LIBRARY_PATH="$ROOT/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG_PATH="$ROOT/usr/lib/x86_64-linux-gnu/pkgconfig"
fi

echo "== build (against $PY's torch)"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
source scripts/cuda-flags.sh
cuda_flags "$PY"
cmake -S . -B build-device "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCOVERAGE_TORCH_PYTHON="$PY" \
  -DCOVERAGE_BUILD_TESTS=OFF -DCOVERAGE_BUILD_BENCH=OFF -DCOVERAGE_BUILD_TOOLS=OFF "${prefix[@]}" "${CUDA_FLAGS[@]}" \
  >"$OUTDIR/cmake.log" 2>&1 ||
  { tail -30 "$OUTDIR/cmake.log"; exit 1; }
cmake --build build-device --parallel "$(nproc)" --target coverage >"$OUTDIR/build.log" 2>&1 ||
  { grep -m 20 -E 'error|Error' "$OUTDIR/build.log"; exit 1; }
echo "built in $(($(date +%s) - start)) s"
B=build-device/bin/coverage
DB=build-device/device-check.db
rm -f "$DB" "$DB"-wal "$DB"-shm

"$B" -q --home . --registry "$DB" capture
"$B" --home . run --list-backends | grep -E '^(cpu|cuda)'

summary() {  # run id; Python's sqlite3, since the machine may have no sqlite3 shell
  "$PY" - "$DB" "$1" <<'PYEOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
run = sys.argv[2]
counts = db.execute("SELECT outcome, COUNT(*) FROM results WHERE run_id = ? GROUP BY outcome ORDER BY 2 DESC", (run,))
print("  " + ", ".join(f"{n} {o}" for o, n in counts))
print("  worst cases by max relative error:")
for op, err, outcome in db.execute(
        "SELECT o.op, r.max_rel_err, r.outcome FROM results r JOIN op_cases o USING (case_id) "
        "WHERE r.run_id = ? AND r.max_rel_err IS NOT NULL ORDER BY r.max_rel_err DESC LIMIT 5", (run,)):
    print(f"    {op:32} {err:.2e} {outcome}")
PYEOF
}
for backend in cuda cuda-tf32; do
  echo "== unit stage on $backend vs cpu"
  t0=$(date +%s)
  set +e
  "$B" -q --home . --registry "$DB" run --stage=unit --backend "$backend" --run "device-$backend" --timeout 120 \
    >"$OUTDIR/$backend.log" 2>&1
  rc=$?
  set -e
  echo "exit $rc in $(($(date +%s) - t0)) s"
  summary "device-$backend"
done
echo "== total $(($(date +%s) - start)) s"
