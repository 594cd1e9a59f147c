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
check option_out_of_range 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --interference 99
contains option_message "$TMP/err" "option --interference: 99 fraction is out of range [-1, 10]"
check option_negative_sentinel 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --interference -0.5
contains option_negative_message "$TMP/err" "option --interference: -0.5 is negative; give -1 for the cluster's value"
# Numbers as people write them: no hexadecimal, NaN or sizes under a byte (issue 44).
check memory_budget_under_a_byte 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --memory-budget 0.5
contains memory_budget_under_a_byte_says "$TMP/err" "0.5 bytes is less than one byte"
check memory_budget_hex 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --memory-budget 0x10
contains memory_budget_hex_says "$TMP/err" "'0x10' is not a size"
check option_hex 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --interference 0x1
contains option_hex_says "$TMP/err" "'0x1' is not a number"
check run_timeout_nan 2 "$BIN" run "$ROOT/tests/golden/overlap_fifo.json" --timeout nan --dry-run
contains run_timeout_nan_says "$TMP/err" "'nan' is not a number in [0.001, 1000000]"
check run_timeout_huge 2 "$BIN" run "$ROOT/tests/golden/overlap_fifo.json" --timeout 1e308 --dry-run
sed 's/^devices_per_node: 8/devices_per_node: 4096/' "$ROOT/examples/clusters/a800-4x8.yaml" > "$TMP/wide.yaml"
check nodes_over_the_device_limit 1 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --cluster "$TMP/wide.yaml" --nodes 1048576
contains nodes_over_the_device_limit_says "$TMP/err" "--nodes 1048576: 1048576 nodes x 4096 devices per node"
# A host runs at most 32 ranks per core (at least 64): dp=4096 started 4,096 MPI ranks on 2 cores.
check run_too_many_ranks 1 "$BIN" run --model gpt-tiny --plan dp=4096 --nodes 512
contains run_too_many_ranks_says "$TMP/err" "4096 ranks on this host of"
check run_in_process_too_many_ranks 1 "$BIN" run --model gpt-tiny --plan dp=4096 --nodes 512 --in-process
contains run_in_process_too_many_ranks_says "$TMP/err" "more than the limit of"
# profile --program takes the program's rank count only within --ranks' bounds.
"$BIN" lower --model gpt-tiny --plan dp=2048 -o "$TMP/dp2048.json" 2>/dev/null
check profile_program_too_many_ranks 1 "$BIN" profile --program "$TMP/dp2048.json" --in-process
contains profile_program_too_many_ranks_says "$TMP/err" "the program has 2048 ranks, more than profile runs at once (1024); pass --ranks N"
# Every number of a cluster file is bounded where it is read (a latency of 1e308 us aborted in the cost model).
sed 's/^\(\s*latency_us:\).*/\1 1e308/' "$ROOT/examples/clusters/a800-4x8.yaml" > "$TMP/slow.yaml"
check cluster_number_too_large 1 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --cluster "$TMP/slow.yaml"
contains cluster_number_too_large_says "$TMP/err" "latency_us': must be at most 1e15, got 1e+308"
check option_sentinel_ok 0 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --interference -1 --share-links 0
check share_links_not_a_switch 2 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --share-links 0.5
# An input that makes the simulated time overflow is a bad input (exit 1), not "iteration inf ms".
printf '%s' '{"format": "concerto-ir", "version": 1, "name": "big", "mesh": {"axes": [{"name": "dp", "size": 1}]},
 "graphs": [{"name": "main", "tensors": [{"name": "x", "shape": [4], "dtype": "f32"}, {"name": "y", "shape": [4], "dtype": "f32"}, {"name": "z", "shape": [4], "dtype": "f32"}],
  "ops": [{"id": 0, "name": "a", "kind": "compute", "type": "scale", "inputs": ["x"], "outputs": ["y"], "duration_us": 1e308},
          {"id": 1, "name": "b", "kind": "compute", "type": "scale", "inputs": ["y"], "outputs": ["z"], "duration_us": 1e308}]}]}' > "$TMP/big.json"
check overflow_is_bad_input 1 "$BIN" simulate "$TMP/big.json" --scheduler fifo
contains overflow_message "$TMP/err" "overflows"
check option_not_a_switch 2 "$BIN" schedule "$ROOT/tests/golden/overlap_fifo.json" --list-schedule 0.5 -o "$TMP/s.json"
contains option_switch_message "$TMP/err" "option --list-schedule: 0.5 is not 0 or 1"
check bad_cluster 1 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --cluster no-such-cluster
# Every scheduler option is a flag (the option table), and --json reports them all.
check options_settable 0 "$BIN" simulate "$ROOT/tests/golden/overlap_fifo.json" --scheduler concerto --fuse 0 --threads 1 --reuse-windows 0 --json
contains options_json_fuse "$TMP/out" '"fuse": 0.0'
contains options_json_threads "$TMP/out" '"threads": 1.0'
contains options_json_solver "$TMP/out" '"solver": "gecode"'
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
# concerto schedule: the report in text and JSON (fields with units), a memory budget.
check schedule_concerto 0 "$BIN" schedule "$TMP/tiny.json" --cluster a800-4x8 --rounds 1 -o "$TMP/c.json"
for needle in "round 1 odd pass:" "makespan " "peak memory" "lower bound"; do contains "schedule_text_$needle" "$TMP/out" "$needle"; done
check schedule_concerto_json 0 "$BIN" schedule "$TMP/tiny.json" --cluster a800-4x8 --rounds 1 --memory-budget 2e9 -o "$TMP/c.json" --json
for field in incumbent_makespan_us final_makespan_us lower_bound_us gap rounds_run windows_optimal windows_hit_time_limit \
    search_seconds peak_memory_bytes incumbent_peak_memory_bytes memory_budget_bytes windows objective_us status; do
  contains "schedule_json_has_$field" "$TMP/out" "\"$field\""
done
# simulate with concerto: progress on stderr (a long search is never silent) and the search's report in --json.
check simulate_concerto_json 0 "$BIN" simulate "$TMP/tiny.json" --scheduler concerto --rounds 1 --json
contains simulate_concerto_report "$TMP/out" '"incumbent_makespan_us"'
contains simulate_concerto_progress "$TMP/err" "incumbent: best baseline"
check schedule_memory_budget_infeasible 1 "$BIN" schedule "$TMP/tiny.json" --cluster a800-4x8 --memory-budget 1 -o "$TMP/c.json"
contains schedule_memory_budget_message "$TMP/err" "the lowest peak any starting schedule reaches is"
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
contains models_small_counts_in_millions "$TMP/out" "2.17M parameters, 4 experts top-2"
check bad_order 1 "$BIN" lower --model gpt-tiny --plan dp=2,tp=2,order=dp-xp -o "$TMP/x.json"
contains bad_order_names_key "$TMP/err" "order 'dp-xp': unknown axis 'xp'"
check bad_plan 1 "$BIN" lower --model gpt-tiny --plan dp=2,tp=3 -o "$TMP/x.json"
check deadlock_is_error 1 "$BIN" simulate "$ROOT/tests/golden/deadlock_p2p.json"
contains deadlock_message "$TMP/err" "deadlock"
# The plan search (docs/cli.md, "plan").
check plan_tiny 0 "$BIN" plan --model gpt-tiny --cluster a800-4x8 --nodes 1 --global-batch 8 --search-top 0 --json
contains plan_json_ranked "$TMP/out" '"ranked": ['
contains plan_json_fates "$TMP/out" '"compute-bound":'
check plan_vit 1 "$BIN" plan --model vit-b16 --global-batch 8
contains plan_vit_says "$TMP/err" "plan search covers the gpt and llama families"
check plan_no_split 1 "$BIN" plan --model gpt-tiny --cluster a800-4x8 --nodes 1 --global-batch 7 --max-tp 1
contains plan_no_split_says "$TMP/err" "no valid plan of gpt-tiny on 8 devices"
check plan_needs_batch 2 "$BIN" plan --model gpt-tiny
# Per-op sharding plans and plan files (docs/frontends.md).
check lower_sharding 0 "$BIN" lower --model gpt-tiny --sharding "$ROOT/examples/plans/gpt-tiny-mixed.json" -o "$TMP/mixed.json" --json
contains lower_sharding_json "$TMP/out" '"comm_ops"'
check validate_sharded 0 "$BIN" validate "$TMP/mixed.json"
check compare_sharding 0 "$BIN" compare --model gpt-tiny --sharding "$ROOT/examples/plans/gpt-tiny-megatron-tp2.json" --cluster commodity-4x8 --schedulers fifo --json
contains compare_sharding_label "$TMP/out" '"program": "gpt-tiny (sharding'
check sharding_and_plan_exclusive 2 "$BIN" lower --model gpt-tiny --plan dp=2 --sharding "$ROOT/examples/plans/gpt-tiny-dp2.json" -o "$TMP/x.json"
printf '{"mesh": {"dp": 2}, "tensors": {"tokens": [["dq"], []]}}' > "$TMP/bad_sharding.json"
check bad_sharding_axis 1 "$BIN" lower --model gpt-tiny --sharding "$TMP/bad_sharding.json" -o "$TMP/x.json"
contains bad_sharding_axis_message "$TMP/err" "unknown mesh axis 'dq'"
check plan_file 0 "$BIN" lower --model gpt-1.3b --plan "$ROOT/examples/plans/dp4-tp8.yaml" -o "$TMP/p.json" --json
contains plan_file_canonical "$TMP/out" '"plan": "dp=4,tp=8"'
printf 'dp: 2\nzero: 5\n' > "$TMP/bad_plan.yaml"
check bad_plan_file 1 "$BIN" lower --model gpt-tiny --plan "$TMP/bad_plan.yaml" -o "$TMP/x.json"
contains bad_plan_file_names_file "$TMP/err" "bad_plan.yaml: "
# concerto run / profile (docs/cli.md); MPI itself is tested by the mpi_* CTests.
EX="$ROOT/examples/ir/dp_matmul_allreduce.json"
check run_in_process 0 "$BIN" run "$EX" --in-process --scheduler ddp --iterations 2 --warmup 1 --json --trace "$TMP/run.trace.json"
for field in median_iteration_us iteration_us exposed_comm_us warmup_iterations; do
  contains "run_json_has_$field" "$TMP/out" "\"$field\""
done
contains run_trace_written "$TMP/run.trace.json" '"traceEvents"'
check run_dry_run 0 "$BIN" run "$EX" --dry-run --iterations 3
contains run_dry_run_yields "$TMP/out" "--mca mpi_yield_when_idle 1"
contains run_dry_run_malloc "$TMP/out" "-x MALLOC_MMAP_THRESHOLD_=2000000000"
contains run_dry_run_worker "$TMP/out" "concerto_mpi_run --program"
# --engine torch: torchrun starts python -m concerto.train on the scheduled program, once per rank.
CONCERTO_TORCH_PYTHON=/bin/true check run_torch_dry_run 0 "$BIN" run "$EX" --engine torch --dry-run --iterations 3 --device cpu
contains run_torch_dry_run_torchrun "$TMP/out" "/bin/true -m torch.distributed.run --standalone --nproc-per-node 2 -m concerto.train --program"
contains run_torch_dry_run_steps "$TMP/out" "--steps 3 --device cpu"
contains run_torch_dry_run_pythonpath "$TMP/out" "PYTHONPATH="
check run_torch_no_in_process 1 "$BIN" run "$EX" --engine torch --in-process
contains run_torch_no_in_process_says "$TMP/err" "--in-process is not available with --engine torch"
check run_device_needs_torch 1 "$BIN" run "$EX" --device cuda
contains run_device_needs_torch_says "$TMP/err" "--device needs --engine torch"
check run_unknown_engine 2 "$BIN" run "$EX" --engine tensorflow
CONCERTO_TORCH_PYTHON=/no/such/python check run_torch_bad_python 1 "$BIN" run "$EX" --engine torch
contains run_torch_bad_python_says "$TMP/err" "CONCERTO_TORCH_PYTHON=/no/such/python is not an executable interpreter"
printf '{"format": "concerto-schedule", "scheduler": "hand", "roles": [{"role": "main", "streams": [{"stream": "compute", "ops": [0]}]}]}' > "$TMP/bad.schedule.json"
check run_refuses_bad_schedule 1 "$BIN" run "$EX" --schedule "$TMP/bad.schedule.json"
contains run_refusal_names_verifier "$TMP/err" "fails verification"
check run_needs_program 2 "$BIN" run --in-process
# One pipeline (driver/job.h): `run --scheduler concerto` executes the schedule
# `simulate --scheduler concerto` simulates, with the same options.
check run_same_lower 0 "$BIN" lower --model gpt-tiny --plan dp=2 -o "$TMP/tiny_dp2.json"
check run_same_simulate 0 "$BIN" simulate "$TMP/tiny_dp2.json" --scheduler concerto --cluster commodity-4x8 --block 40 \
  --write-schedule "$TMP/sim.schedule.json" --write-program "$TMP/sim.program.json"
check run_same_run 0 "$BIN" run "$TMP/tiny_dp2.json" --in-process --scheduler concerto --cluster commodity-4x8 --block 40 \
  --write-schedule "$TMP/run.schedule.json" --write-program "$TMP/run.program.json"
contains run_prints_prediction "$TMP/out" "predicted "
if cmp -s "$TMP/sim.schedule.json" "$TMP/run.schedule.json" && cmp -s "$TMP/sim.program.json" "$TMP/run.program.json"; then
  echo "ok   run_executes_the_simulated_schedule"
else
  echo "FAIL run_executes_the_simulated_schedule: run and simulate wrote different schedules"; fails=$((fails+1))
fi
check run_check_needs_model 2 "$BIN" run "$EX" --check
check run_wrong_ranks 1 "$BIN" run "$EX" -n 3 --in-process
contains run_wrong_ranks_message "$TMP/err" "the program needs 2 ranks"
check run_injected_failure 1 "$BIN" run "$EX" --in-process --fail-op fc.dw --fail-rank 1
contains run_failure_names_rank_and_op "$TMP/err" "rank 1: op 1 'fc.dw': injected failure"
check profile_in_process 0 "$BIN" profile --program "$EX" --in-process --max-bytes 16384 --reps 1 --out-dir "$TMP/prof" --json
for field in matmul_tflops memory_gbps link_latency_us link_bandwidth_gbps comm_corun_slowdown comm_corun_latency_us small_comm_computing_us comm_corun_hold_us hold_round_us link_burst_us mid_idle_us compute_jitter jitter_round kernel_passes kernel_pass_spread; do
  contains "profile_json_has_$field" "$TMP/out" "\"$field\""
done
check profile_cluster_loads 0 "$BIN" simulate "$EX" --cluster "$TMP/prof/cpu-local.json" --profile "$TMP/prof/profile.json" --json
contains profile_prices_from_db "$TMP/out" '"cluster": "cpu-local"'
# A plan that needs more devices than the cluster has says what would fit; one
# that uses fewer says so on stderr instead of leaving devices idle silently.
check plan_too_big_for_cluster 1 "$BIN" compare --model gpt-tiny --plan dp=33 --cluster a800-4x8 --rounds 0
contains plan_too_big_suggests "$TMP/err" "must multiply to at most 32"
check plan_uses_part_of_cluster 0 "$BIN" compare --model gpt-tiny --plan dp=3 --cluster a800-4x8 --rounds 0 --json
contains plan_uses_part_says_so "$TMP/err" "note: the program uses 3 of cluster 'a800-4x8''s 32 devices; the other 29 stay idle"
# --nodes scales a preset; fidelity predicts one published row (docs/validation.md).
check nodes_scale 0 "$BIN" compare --model gpt-tiny --plan dp=16 --cluster a100-dgx --nodes 2 --schedulers fifo --json
contains nodes_scale_name "$TMP/out" '"cluster": "a100-dgx x2"'
check nodes_too_few 1 "$BIN" compare --model gpt-tiny --plan dp=16 --cluster a100-dgx --nodes 1 --schedulers fifo
contains nodes_too_few_message "$TMP/err" "program needs 16 ranks but cluster 'a100-dgx x1' has 8 devices"
check fidelity_row 0 "$BIN" fidelity --table "$ROOT/examples/validation/published.yaml" --only gemm-a100-8192x8192x8192 --json
contains fidelity_json "$TMP/out" '"median_abs_error_percent"'
check fidelity_unknown_row 1 "$BIN" fidelity --table "$ROOT/examples/validation/published.yaml" --only no-such-row
contains fidelity_unknown_row_message "$TMP/err" "published.yaml: no row 'no-such-row'"
check from_trace_needs_program 2 "$BIN" profile --from-trace "$TMP/none.json"
contains from_trace_needs_program_message "$TMP/err" "needs --program (the program the run executed"
check from_trace_missing_trace 1 "$BIN" profile --from-trace "$TMP/none.json" --program "$ROOT/tests/golden/overlap_fifo.json" --cluster a800-4x8 --out-dir "$TMP/ft"
contains from_trace_missing_trace_message "$TMP/err" "none.json"
# --kernels-only times a program's kernels over a database; --merge takes the
# per-entry median of several (the testbed's rounds, docs/runtime.md).
check kernels_only_needs_program 2 "$BIN" profile --kernels-only
contains kernels_only_needs_program_message "$TMP/err" "--kernels-only: needs --program"
check kernels_only 0 "$BIN" profile --kernels-only --program "$EX" "$EX" --profile "$TMP/prof/profile.json" --out-dir "$TMP/k1" --json
contains kernels_only_replaces "$TMP/out" '"added": 0'
check kernels_only_again 0 "$BIN" profile --kernels-only --program "$EX" --profile "$TMP/prof/profile.json" --out-dir "$TMP/k2"
check merge_profiles 0 "$BIN" profile --merge "$TMP/prof/profile.json" "$TMP/k1/profile.json" "$TMP/k2/profile.json" --out-dir "$TMP/km" --json
contains merge_profiles_spread "$TMP/out" '"median_spread"'
check merge_profiles_loads 0 "$BIN" simulate "$EX" --cluster "$TMP/prof/cpu-local.json" --profile "$TMP/km/profile.json" --json
check merge_over_base 0 "$BIN" profile --merge "$TMP/k1/profile.json" --profile "$TMP/prof/profile.json" --out-dir "$TMP/kb" --json
contains merge_over_base_keeps_entries "$TMP/out" '"entries_in_all"'
check merge_needs_a_file 2 "$BIN" profile --out-dir "$TMP/km" --merge
check merge_bad_file 1 "$BIN" profile --merge "$TMP/prof/profile.json" "$TMP/none.json" --out-dir "$TMP/km"
contains merge_bad_file_message "$TMP/err" "none.json"
check merge_excludes_kernels_only 2 "$BIN" profile --merge "$TMP/prof/profile.json" "$TMP/k1/profile.json" --kernels-only --program "$EX"
check several_programs_need_kernels_only 2 "$BIN" profile --program "$EX" "$EX" --in-process
contains several_programs_message "$TMP/err" "several --program only with --kernels-only"

if [[ $fails -ne 0 ]]; then echo "$fails CLI checks failed"; exit 1; fi
echo "all CLI checks passed"
