#!/usr/bin/env bash
# Runs the sanitizer build's test executable (make sanitize: sanitize_tests,
# every listed test file in one binary) in JOBS shards at once (GoogleTest's
# GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX: each shard a disjoint part of the
# tests). Each shard's output goes to DIR/sanitize-logs/shard-I.log (DIR: the
# binary's directory), printed whole when the shard fails (any ASan or UBSan
# report fails it: abort_on_error, halt_on_error). Exits non-zero when any
# shard failed, after all have run.
#
# usage: scripts/sanitize_tests.sh BINARY JOBS [EXCLUDE]
#        EXCLUDE: test names or patterns to leave out, ':'-separated
#        (a GoogleTest negative filter)
set -uo pipefail
if (($# < 2 || $# > 3)); then
  echo "usage: scripts/sanitize_tests.sh BINARY JOBS [EXCLUDE]" >&2
  exit 2
fi
BINARY=$1
JOBS=$2
EXCLUDE=${3:-}
if [[ ! -x $BINARY ]]; then
  echo "sanitize: $BINARY: no such executable (build it first: make sanitize)" >&2
  exit 2
fi
if ! [[ $JOBS =~ ^[1-9][0-9]*$ ]]; then
  echo "sanitize: JOBS must be a positive integer, got '$JOBS'" >&2
  exit 2
fi
LOGS="$(dirname "$BINARY")/sanitize-logs"
mkdir -p "$LOGS"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
FILTER=()
[[ -n $EXCLUDE ]] && FILTER=("--gtest_filter=-$EXCLUDE")

start=$SECONDS
pids=()
for ((i = 0; i < JOBS; i++)); do
  GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$i "$BINARY" --gtest_brief=1 "${FILTER[@]}" \
    >"$LOGS/shard-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < JOBS; i++)); do
  log="$LOGS/shard-$i.log"
  wait "${pids[$i]}"
  status=$?
  ran=$(grep -oE '^\[==========\] [0-9]+ tests? from' "$log" | tail -1 | grep -oE '[0-9]+' | head -1 || true)
  if ((status == 0)); then
    echo "sanitize: shard $((i + 1))/$JOBS passed (${ran:-?} tests)"
  else
    echo "sanitize: shard $((i + 1))/$JOBS FAILED; its output ($log):"
    cat "$log"
    failed=1
  fi
done
if ((failed)); then
  echo "sanitize: a shard failed (above)" >&2
  exit 1
fi
echo "sanitize: all shards passed ($((SECONDS - start)) s)"
