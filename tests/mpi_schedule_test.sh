#!/bin/bash
# `concerto schedule --mpi 3` (rank 0 runs concerto with --batch-windows 1, two
# MPI processes solve its window batches) writes byte for byte the schedule and
# program of the same search on one local thread (docs/concerto.md, "Parallel
# window solving"). Usage: mpi_schedule_test.sh path/to/concerto
set -euo pipefail
BIN=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN" lower --model gpt-tiny --plan dp=2,tp=2 -o "$TMP/p.json" 2>/dev/null
OPTS=(--cluster commodity-4x8 --batch-windows 1 --block 20 --rounds 3 --stall-rounds 0 --window-fail-limit 100)
"$BIN" schedule "$TMP/p.json" -o "$TMP/local.json" "${OPTS[@]}" --threads 1 --json > "$TMP/local.out" 2>/dev/null
"$BIN" schedule "$TMP/p.json" -o "$TMP/mpi.json" "${OPTS[@]}" --mpi 3 > "$TMP/mpi.out" 2> "$TMP/mpi.err" || {
  cat "$TMP/mpi.err"; exit 1; }
cmp "$TMP/local.json" "$TMP/mpi.json"
cmp "$TMP/local.json.program.json" "$TMP/mpi.json.program.json"
grep -q '"batch_solver": "1 thread"' "$TMP/local.out" || { echo "the local run did not batch"; exit 1; }
grep -Eq "2 window workers answered [1-9][0-9]* windows" "$TMP/mpi.err" || {
  echo "the workers answered no window:"; cat "$TMP/mpi.err"; exit 1; }
grep -E "window workers answered" "$TMP/mpi.err"
echo "mpi schedule identical to the local one"
