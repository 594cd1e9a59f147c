#!/usr/bin/env bash
# The emulated-cluster testbed (docs/runtime.md "The testbed", docs/results.md
# "Testbed: measured vs simulated"). Needs root (network namespaces, tc).
#
# Creates a network namespace whose loopback is shaped with tbf (default
# 1 Gbit/s, bucket BURST=256kb, queue LATENCY=50ms: docs/runtime.md "The
# testbed" says why). For each workload of PLANS (default dp=2, tp=2 and a
# pipeline, pp=2 with 4 micro-batches):
#  1. profiles this machine inside the namespace (`concerto profile`: kernels
#     of the workload in three passes over the profile, each kernel the
#     median; collectives over MPI on the shaped loopback; interference,
#     co-run slowdowns, the hold, the burst and the ranks' jitter; a fitted
#     cpu-local cluster);
#  2. makes each of SCHEDULERS' schedules (default: all seven) on that
#     cluster + profile and takes the simulator's prediction;
#  3. measures in ROUNDS rounds (default 5): each round times the kernels of
#     every schedule's program again (`profile --kernels-only`) and then runs
#     each schedule for real over MPI inside the namespace (WARMUP + ITERATIONS
#     steps on buffers initialised once), in an order rotated by one each round,
#     so a machine whose speed drifts (this shared 2-vCPU one: up to 58% within
#     two hours) drifts under every scheduler and under the kernel timings alike;
#  4. simulates each schedule again (`simulate --schedule`) on each round's
#     kernels (over the first profile's collectives) and on every round's
#     merged (`profile --merge`: per kernel the median).
# Prints per workload and scheduler the measured median, min and max over
# every round's iterations beside three predictions: `first` (the profile
# taken before the schedules), `per_round` (each round's runs on the kernels
# timed just before them; the median over the rounds) and `merged`, with
# the error of each (scripts/testbed_summary.py; then the summary over all
# workloads: cells within 10%, the ranking check, compute ratios;
# OUT/testbed.json), and the load average before and after. About 5 minutes
# per workload with the defaults on 2 cores.
# The namespace is removed on every exit (normal, error, Ctrl-C, kill).
#
# usage: scripts/testbed.sh [BUILD_DIR]     (env: RATE=1gbit BURST=256kb LATENCY=50ms
#        ROUNDS=5 ITERATIONS=1 (per round) WARMUP=1 (per round)
#        SCHEDULERS="sequential fifo ddp megatron zero xla-lhs concerto"
#        MODEL=examples/models/gpt-testbed.yaml PLANS="dp=2 tp=2 pp=2,microbatches=4"
#        (PLAN=P: that one workload) OUT=BUILD_DIR/testbed (one folder per workload) CONCERTO_BUDGET=30
#        MAX_BYTES=67108864 (largest collective profiled))
set -euo pipefail

BUILD=${1:-build}
RATE=${RATE:-1gbit}
BURST=${BURST:-256kb}
LATENCY=${LATENCY:-50ms}
ROUNDS=${ROUNDS:-5}
ITERATIONS=${ITERATIONS:-1}
WARMUP=${WARMUP:-1}
SCHEDULERS=${SCHEDULERS:-"sequential fifo ddp megatron zero xla-lhs concerto"}
MODEL=${MODEL:-examples/models/gpt-testbed.yaml}
PLANS=${PLAN:-${PLANS:-"dp=2 tp=2 pp=2,microbatches=4"}}
OUT_ROOT=${OUT:-$BUILD/testbed}
CONCERTO_BUDGET=${CONCERTO_BUDGET:-30}
# The largest collective profiled: the baselines' fused gradient buckets
# reach 67 MB on gpt-testbed (megatron's one bucket), and the fitted link
# prices them (only the program's own sizes have profile entries), so the
# fit should see messages that large.
MAX_BYTES=${MAX_BYTES:-67108864}
CONCERTO=$BUILD/concerto

if [[ $(id -u) -ne 0 ]]; then
  echo "testbed: needs root (ip netns, tc)" >&2
  exit 2
fi
for tool in ip tc mpirun python3; do
  command -v "$tool" >/dev/null || { echo "testbed: '$tool' not found" >&2; exit 2; }
done
[[ -x $CONCERTO && -x $BUILD/concerto_mpi_run ]] || {
  echo "testbed: build $CONCERTO and $BUILD/concerto_mpi_run first (make build)" >&2
  exit 2
}

NS=concerto-testbed-$$
cleanup() {
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
in_ns() { ip netns exec "$NS" "$@"; }
echo "testbed: namespace $NS, loopback shaped: $(in_ns tc qdisc show dev lo)" >&2

# The first number after "KEY": in a JSON file.
field() { grep -o "\"$2\": *[-0-9.eE+]*" "$1" | head -1 | sed 's/.*: *//'; }

summary_args=()
for PLAN in $PLANS; do
tag=$(echo "$PLAN" | tr ',=' '__')
OUT=$OUT_ROOT/$tag
summary_args+=("$tag=$PLAN")
echo "testbed: workload $MODEL under $PLAN (files in $OUT)" >&2
mkdir -p "$OUT"
"$CONCERTO" lower --model "$MODEL" --plan "$PLAN" -o "$OUT/program.json" >&2
in_ns "$CONCERTO" profile --program "$OUT/program.json" --out-dir "$OUT" --max-bytes "$MAX_BYTES" --reps 3 \
  --json > "$OUT/profile.summary.json"
cat "$OUT/profile.summary.json" >&2

read -r -a scheds <<< "$SCHEDULERS"
programs=("$OUT/program.json")
for s in "${scheds[@]}"; do
  extra=()
  [[ $s == concerto ]] && extra=(--time-budget "$CONCERTO_BUDGET")
  "$CONCERTO" schedule "$OUT/program.json" --scheduler "$s" --cluster "$OUT/cpu-local.json" \
    --profile "$OUT/profile.json" -o "$OUT/$s.schedule.json" --write-program "$OUT/$s.program.json" \
    "${extra[@]}" --json > "$OUT/$s.simulated.json"
  programs+=("$OUT/$s.program.json")
done
rm -f "$OUT"/*.round-*.json "$OUT"/*.merged.simulated.json
rm -rf "$OUT"/round-*
echo "testbed: load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
  echo "testbed: round $r of $ROUNDS: kernels, then ${#scheds[@]} schedules" >&2
  "$CONCERTO" profile --kernels-only --program "${programs[@]}" --out-dir "$OUT/round-$r" \
    --json > "$OUT/round-$r.kernels.json"
  n=${#scheds[@]}
  for ((i = 0; i < n; i++)); do
    s=${scheds[$(( (i + r - 1) % n ))]}
    in_ns "$CONCERTO" run "$OUT/$s.program.json" --schedule "$OUT/$s.schedule.json" \
      --cluster "$OUT/cpu-local.json" --profile "$OUT/profile.json" \
      --iterations "$ITERATIONS" --warmup "$WARMUP" --trace "$OUT/$s.round-$r.trace.json" \
      --json > "$OUT/$s.round-$r.measured.json"
  done
done
echo "testbed: load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
round_dbs=()
for ((r = 1; r <= ROUNDS; r++)); do
  round_dbs+=("$OUT/round-$r/profile.json")
  # This round's kernels over the first profile's other entries (collectives).
  "$CONCERTO" profile --merge "$OUT/round-$r/profile.json" --profile "$OUT/profile.json" \
    --out-dir "$OUT/round-$r/full" > /dev/null
done
"$CONCERTO" profile --merge "${round_dbs[@]}" --profile "$OUT/profile.json" --out-dir "$OUT/rounds" \
  --json > "$OUT/rounds.merge.json"
for s in "${scheds[@]}"; do
  python3 "$(dirname "$0")/testbed_summary.py" --combine-rounds "$OUT/$s.measured.json" "$OUT/$s".round-*.measured.json
  simulate_on() {
    "$CONCERTO" simulate "$OUT/$s.program.json" --schedule "$OUT/$s.schedule.json" --cluster "$OUT/cpu-local.json" \
      --profile "$1" --json > "$2" 2>> "$OUT/simulate.log"
  }
  for ((r = 1; r <= ROUNDS; r++)); do simulate_on "$OUT/round-$r/full/profile.json" "$OUT/$s.round-$r.simulated.json"; done
  simulate_on "$OUT/rounds/profile.json" "$OUT/$s.merged.simulated.json"
done
echo "testbed: fitted interference $(field "$OUT/cpu-local.json" interference), co-run slowdown $(field "$OUT/cpu-local.json" corun_slowdown), link $(field "$OUT/profile.summary.json" link_bandwidth_gbps) GB/s, alpha $(field "$OUT/profile.summary.json" link_latency_us) us; kernels over the rounds: max/min median $(field "$OUT/rounds.merge.json" median_spread), largest $(field "$OUT/rounds.merge.json" max_spread)" >&2
echo "=== $PLAN"
python3 "$(dirname "$0")/testbed_summary.py" "$OUT_ROOT" "$tag=$PLAN"
done

echo
python3 "$(dirname "$0")/testbed_summary.py" "$OUT_ROOT" "${summary_args[@]}"
echo "testbed: files in $OUT_ROOT/<workload>/ (per scheduler: .simulated.json (the first profile), .round-R.simulated.json (round R's kernels), .merged.simulated.json (every round's kernels), .measured.json (every round), .round-R.measured.json and .round-R.trace.json; round-R/ and rounds/: the kernel timings); summary in $OUT_ROOT/testbed.json" >&2
