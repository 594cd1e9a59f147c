#!/usr/bin/env bash
# The emulated-cluster testbed (docs/runtime.md "Testbed", docs/results.md
# "Testbed: measured vs simulated"). Needs root (network namespaces, tc).
#
# Creates a network namespace whose loopback is shaped with tbf (default
# 1 Gbit/s), profiles this machine inside it (`concerto profile`: kernels of
# the workload, collectives over MPI on the shaped loopback, a fitted
# cpu-local cluster), then for each scheduler makes the schedule on that
# cluster + profile, takes the simulator's prediction, and runs the step for
# real over MPI inside the namespace (median of ITERATIONS after WARMUP).
# Prints one row per scheduler: measured and simulated iteration time.
# The namespace is removed on every exit (normal, error, Ctrl-C, kill).
#
# usage: scripts/testbed.sh [BUILD_DIR]     (env: RATE=1gbit ITERATIONS=5 WARMUP=1
#        SCHEDULERS="sequential ddp concerto" MODEL=examples/models/gpt-testbed.yaml
#        PLAN=dp=2 OUT=BUILD_DIR/testbed CONCERTO_BUDGET=30)
set -euo pipefail

BUILD=${1:-build}
RATE=${RATE:-1gbit}
ITERATIONS=${ITERATIONS:-5}
WARMUP=${WARMUP:-1}
SCHEDULERS=${SCHEDULERS:-"sequential ddp concerto"}
MODEL=${MODEL:-examples/models/gpt-testbed.yaml}
PLAN=${PLAN:-dp=2}
OUT=${OUT:-$BUILD/testbed}
CONCERTO_BUDGET=${CONCERTO_BUDGET:-30}
CONCERTO=$BUILD/concerto

if [[ $(id -u) -ne 0 ]]; then
  echo "testbed: needs root (ip netns, tc)" >&2
  exit 2
fi
for tool in ip tc mpirun; do
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
ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst 128kb latency 50ms
in_ns() { ip netns exec "$NS" "$@"; }
echo "testbed: namespace $NS, loopback shaped: $(in_ns tc qdisc show dev lo)" >&2

mkdir -p "$OUT"
"$CONCERTO" lower --model "$MODEL" --plan "$PLAN" -o "$OUT/program.json" >&2
in_ns "$CONCERTO" profile --program "$OUT/program.json" --out-dir "$OUT" --max-bytes 16777216 --reps 3 \
  --json > "$OUT/profile.summary.json"
cat "$OUT/profile.summary.json" >&2

# The first number after "KEY": in a JSON file.
field() { grep -o "\"$2\": *[-0-9.eE+]*" "$1" | head -1 | sed 's/.*: *//'; }

printf '%-12s %14s %14s %10s\n' scheduler measured_ms simulated_ms sim/meas
for s in $SCHEDULERS; do
  extra=()
  [[ $s == concerto ]] && extra=(--time-budget "$CONCERTO_BUDGET")
  "$CONCERTO" schedule "$OUT/program.json" --scheduler "$s" --cluster "$OUT/cpu-local.json" \
    --profile "$OUT/profile.json" -o "$OUT/$s.schedule.json" --write-program "$OUT/$s.program.json" \
    "${extra[@]}" --json > "$OUT/$s.simulated.json"
  in_ns "$CONCERTO" run "$OUT/$s.program.json" --schedule "$OUT/$s.schedule.json" \
    --cluster "$OUT/cpu-local.json" --profile "$OUT/profile.json" \
    --iterations "$ITERATIONS" --warmup "$WARMUP" --trace "$OUT/$s.measured.trace.json" --json > "$OUT/$s.measured.json"
  measured=$(field "$OUT/$s.measured.json" median_iteration_us)
  simulated=$(field "$OUT/$s.simulated.json" makespan_us)
  awk -v s="$s" -v m="$measured" -v p="$simulated" \
    'BEGIN { printf "%-12s %14.1f %14.1f %10.3f\n", s, m / 1e3, p / 1e3, p / m }'
done
echo "testbed: files in $OUT (per scheduler: .simulated.json, .measured.json, .measured.trace.json)" >&2
