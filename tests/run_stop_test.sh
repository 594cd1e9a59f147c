#!/usr/bin/env bash
# Stopping `concerto run` stops its job: after SIGTERM to the launcher, mpirun and every rank it
# started end, the launcher exits 128 + 15, and its temporary directory is gone (issue 44).
# Usage: run_stop_test.sh BUILD_DIR
set -u
BIN="$(realpath "$1")/concerto"
MARK=99991  # --iterations: finds this job's processes among other tests' ranks
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"; pkill -KILL -f -- "--iterations $MARK" 2>/dev/null' EXIT
before=$(ls -d /tmp/concerto-run-* 2>/dev/null | sort)
"$BIN" run --model gpt-tiny --plan dp=2 --iterations "$MARK" --timeout 600 >"$OUT/out" 2>"$OUT/err" &
launcher=$!
for _ in $(seq 300); do  # until both ranks run (at most 60 s)
  [[ $(pgrep -f -- "concerto_mpi_run.*--iterations $MARK" | wc -l) -ge 2 ]] && break
  sleep 0.2
done
if [[ $(pgrep -f -- "concerto_mpi_run.*--iterations $MARK" | wc -l) -lt 2 ]]; then
  echo "FAIL: the ranks never started"; cat "$OUT/err"; exit 1
fi
kill -TERM "$launcher"
wait "$launcher"
rc=$?
[[ $rc -eq 143 ]] || { echo "FAIL: launcher exit $rc, want 143"; cat "$OUT/err"; exit 1; }
for _ in $(seq 75); do  # every rank gone within 15 s
  pgrep -f -- "--iterations $MARK" >/dev/null || break
  sleep 0.2
done
if pgrep -f -- "--iterations $MARK" >/dev/null; then
  echo "FAIL: still running after SIGTERM:"; pgrep -af -- "--iterations $MARK"; exit 1
fi
after=$(ls -d /tmp/concerto-run-* 2>/dev/null | sort)
left=$(comm -13 <(echo "$before") <(echo "$after"))
[[ -z $left ]] || { echo "FAIL: temporary directory left behind: $left"; exit 1; }
echo "ok: SIGTERM stopped the launcher (exit 143), mpirun and both ranks, and removed its directory"
