#!/usr/bin/env bash
# CLI contract: exit codes (0 ok, 1 bad input, 2 bad arguments), --json
# fields, error messages naming the file. Usage: cli_test.sh PATH/TO/concerto
set -u
BIN="$(realpath "$1")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fails=0
check() {  # check NAME EXPECTED_RC CMD...
  local name="$1" want="$2"; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL $name: exit $rc, want $want"; cat "$TMP/err"; fails=$((fails+1))
  else
    echo "ok   $name"
  fi
}
contains() {  # contains NAME FILE NEEDLE
  if grep -qF -- "$3" "$2"; then echo "ok   $1"; else echo "FAIL $1: '$3' not in $2:"; cat "$2"; fails=$((fails+1)); fi
}

check help 0 "$BIN" --help
check no_command 2 "$BIN"
check unknown_flag 2 "$BIN" simulate x.json --no-such-flag
check unknown_scheduler 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --scheduler nope
check missing_file 1 "$BIN" validate "$TMP/none.json"
contains missing_file_names_it "$TMP/err" "none.json"
check option_out_of_range 1 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --interference 99
contains option_message "$TMP/err" "option --interference"
check bad_cluster 1 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --cluster no-such-cluster
check validate_golden 0 "$BIN" validate "$ROOT/tests/golden/send_recv.json"
check simulate_json 0 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --scheduler fifo --json --trace "$TMP/t.json"
for field in makespan_us lower_bound_us exposed_comm_us scheduler overlap_ratio; do
  contains "json_has_$field" "$TMP/out" "\"$field\""
done
contains trace_written "$TMP/t.json" '"traceEvents"'
check lower_tiny 0 "$BIN" lower --model gpt-tiny --plan dp=2,tp=2 -o "$TMP/tiny.json"
check compare_tiny 0 "$BIN" compare "$TMP/tiny.json" --cluster commodity-4x8 --json
contains compare_json "$TMP/out" '"best_scheduler"'
(cd "$TMP" && "$BIN" simulate "$TMP/tiny.json" --scheduler ddp --dump-after schedule >/dev/null 2>&1)
contains dump_after_shows_fused_buckets "$TMP/concerto.schedule.json" '"name": "fused.'
check write_schedule 0 "$BIN" simulate "$TMP/tiny.json" --scheduler megatron --write-schedule "$TMP/s.json" --write-program "$TMP/p.json"
check simulate_given_schedule 0 "$BIN" simulate "$TMP/p.json" --schedule "$TMP/s.json" --json
contains given_schedule_name "$TMP/out" '"scheduler": "megatron"'
check schedule_for_other_program 1 "$BIN" simulate "$TMP/tiny.json" --schedule "$TMP/s.json"
contains schedule_rejected "$TMP/err" "fails verification"
check compare_model_plan 0 "$BIN" compare --model llama-tiny --plan dp=2,tp=2,sp --cluster commodity-4x8 --schedulers fifo,ddp --json
contains compare_model_label "$TMP/out" '"program": "llama-tiny'
check compare_needs_input 2 "$BIN" compare
check models 0 "$BIN" models
contains models_lists_llama "$TMP/out" "llama-70b"
check bad_plan 1 "$BIN" lower --model gpt-tiny --plan dp=2,tp=3 -o "$TMP/x.json"
check deadlock_is_error 1 "$BIN" simulate "$ROOT/tests/golden/deadlock_p2p.json"
contains deadlock_message "$TMP/err" "deadlock"
if [[ $fails -ne 0 ]]; then echo "$fails CLI checks failed"; exit 1; fi
echo "all CLI checks passed"
