#!/usr/bin/env bash
# The sanitizer build reports what it should, where scripts/sanitize.sh looks:
# a planted signed overflow and a planted heap overflow each end their process
# and leave their report in a file under log_path, none on stderr.
#   bash tests/sanitizer/reports_test.sh PLANTED_BINARY
set -u
bin=${1:?usage: reports_test.sh PLANTED_BINARY}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/../cli/lib.sh"
export ASAN_OPTIONS="halt_on_error=1:handle_segv=0:log_path=$TMP/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$TMP/ubsan"

"$bin" ub >/dev/null 2>"$TMP/ub.err"
check "signed overflow ends the process" test $? -ne 0
check "its report is in ubsan.<pid>" grep -q "runtime error: signed integer overflow" "$TMP"/ubsan.*
check "with its stack" grep -q "planted.cc" "$TMP"/ubsan.*
check "and not on stderr" test ! -s "$TMP/ub.err"

"$bin" heap >/dev/null 2>"$TMP/heap.err"
check "heap overflow ends the process" test $? -ne 0
check "its report is in asan.<pid>" grep -q "ERROR: AddressSanitizer: heap-buffer-overflow" "$TMP"/asan.*
check "and not on stderr" test ! -s "$TMP/heap.err"

"$bin" none
check "a clean run exits 0" test $? -eq 0
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
