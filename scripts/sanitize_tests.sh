#!/usr/bin/env bash
# Runs the sanitizer build's tests (make sanitize) JOBS at a time: each test's
# output goes to BUILD/sanitize-logs/TEST.log, printed whole when the test
# fails (any ASan or UBSan report fails it: abort_on_error, halt_on_error).
# Exits non-zero when any test failed, after all have run.
#
# usage: scripts/sanitize_tests.sh BUILD JOBS TEST...
#        (env: SANITIZE_WINDOW_FILTER and SANITIZE_IR_FILTER, --gtest_filter
#        arguments for window_solver_test and ir_test)
set -uo pipefail
if (($# < 3)); then
  echo "usage: scripts/sanitize_tests.sh BUILD JOBS TEST..." >&2
  exit 2
fi
BUILD=$1
JOBS=$2
shift 2
mkdir -p "$BUILD/sanitize-logs"
export BUILD SANITIZE_WINDOW_FILTER="${SANITIZE_WINDOW_FILTER:-}" SANITIZE_IR_FILTER="${SANITIZE_IR_FILTER:-}"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

run_one() {
  local t=$1 log="$BUILD/sanitize-logs/$1.log" filter=""
  [[ $t == window_solver_test ]] && filter=$SANITIZE_WINDOW_FILTER
  [[ $t == ir_test ]] && filter=$SANITIZE_IR_FILTER
  local start=$SECONDS
  if "./$BUILD/$t" --gtest_brief=1 $filter >"$log" 2>&1; then
    echo "sanitize: $t passed ($((SECONDS - start)) s)"
  else
    echo "sanitize: $t FAILED ($((SECONDS - start)) s); its output ($log):"
    cat "$log"
    return 1
  fi
}
export -f run_one

# xargs runs JOBS at a time in the order given (put the longest first) and
# exits non-zero when any run did.
printf '%s\n' "$@" | xargs -P "$JOBS" -I{} bash -c 'run_one "$1"' _ {}
status=$?
if ((status != 0)); then
  echo "sanitize: a test failed (above)" >&2
  exit 1
fi
echo "sanitize: all $# tests passed"
