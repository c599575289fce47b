#!/usr/bin/env bash
# Builds coverage with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-asan/ (COVERAGE_SANITIZE, Note [Sanitizers] in CMakeLists.txt) and
# runs the whole test suite there: the CLI tests drive build-asan/bin/coverage,
# whose workers and sim plugin are instrumented too. Any sanitizer output
# fails the run, also from a process whose failure a test expects (a worker,
# a death test): it all goes to build-asan/sanitizer/<tool>.<pid> and is
# printed at the end. Extra arguments go to ctest (e.g. -R cli_sim).
# Suppressions, for third-party libraries only: tests/sanitizer/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
root=$PWD
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
torch=()
if [[ -n ${COVERAGE_TORCH_PYTHON:-} ]]; then torch=(-DCOVERAGE_TORCH_PYTHON="$COVERAGE_TORCH_PYTHON"); fi
# -O1: reports name the right lines and the build is quicker; NDEBUG as in build/.
cmake -S . -B build-asan "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DCOVERAGE_SANITIZE=ON -DCOVERAGE_BUILD_BENCH=OFF "${torch[@]}"
cmake --build build-asan --parallel "$(nproc)"

logs=$root/build-asan/sanitizer
rm -rf "$logs"
mkdir -p "$logs"
supp=$root/tests/sanitizer
# handle_segv=0: sim's planted crash raises SIGSEGV, and the harness must see
# the signal (as without sanitizers), not ASan's report and exit status 1.
# intercept_tls_get_addr=0: GCC 12's LeakSanitizer follows the dynamic TLS
# blocks it records from __tls_get_addr, and its tracer faulted on one at exit
# ("Tracer caught signal 11", google/sanitizers#1353) in one test, depending
# on nothing but the length of this log path (the environment's size moves
# the layout); without that tracking, leaks are still checked from the
# threads' stacks, registers and static TLS, and the suite is clean.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:handle_segv=0:intercept_tls_get_addr=0:log_path=$logs/asan:suppressions=$supp/asan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
# UBSan's log_path works beside ASan through tests/sanitizer/ubsan_log_path.cc.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan:suppressions=$supp/ubsan.supp"

cd build-asan
status=0
# Sanitized code runs 2-3 times slower: test.sh's limit per test (600 s) times 3.
ctest --output-on-failure --parallel "$(nproc)" --timeout 1800 "$@" || status=$?
if [[ -n $(ls -A "$logs") ]]; then
  for f in "$logs"/*; do
    echo "=== $f"
    cat "$f"
  done
  echo "sanitize: $(ls "$logs" | wc -l) process(es) wrote sanitizer reports (above)" >&2
  exit 1
fi
[[ $status -eq 0 ]] && echo "sanitize: suite passed, no sanitizer reports"
exit $status
