#!/usr/bin/env bash
# The closed loop (docs/runtime.md, "Closing the loop"; docs/results.md):
# profile this machine, run a step for real with each scheduler and compare
# the measured median with the prediction; feed the run's trace back into the
# profile database (`concerto profile --from-trace`), re-schedule on it, run
# again and compare again. In process (threads as ranks, no MPI, no root);
# about 2 minutes on 2 cores with the defaults.
#
# usage: scripts/closed_loop.sh [BUILD_DIR]
#        (env: MODEL=examples/models/gpt-testbed.yaml PLAN=dp=2
#         SCHEDULERS="fifo concerto" ITERATIONS=7 WARMUP=1 OUT=BUILD_DIR/closed-loop)
set -euo pipefail

BUILD=${1:-build}
MODEL=${MODEL:-examples/models/gpt-testbed.yaml}
PLAN=${PLAN:-dp=2}
SCHEDULERS=${SCHEDULERS:-"fifo concerto"}
ITERATIONS=${ITERATIONS:-7}
WARMUP=${WARMUP:-1}
OUT=${OUT:-$BUILD/closed-loop}
CONCERTO=$BUILD/concerto
[[ -x $CONCERTO ]] || { echo "closed_loop: build $CONCERTO first (make build)" >&2; exit 2; }

mkdir -p "$OUT"
"$CONCERTO" lower --model "$MODEL" --plan "$PLAN" -o "$OUT/program.json" >&2
"$CONCERTO" profile --program "$OUT/program.json" --in-process --out-dir "$OUT/isolated" --reps 3 --json \
  > "$OUT/isolated.summary.json"
CLUSTER=$OUT/isolated/cpu-local.json

# The first number after "KEY": in a JSON file.
field() { grep -o "\"$2\": *[-0-9.eE+]*" "$1" | head -1 | sed 's/.*: *//'; }
run() {  # run SCHEDULER PROFILE TAG: one measured run, its trace and program
  "$CONCERTO" run "$OUT/program.json" --in-process --scheduler "$1" --cluster "$CLUSTER" --profile "$2" \
    --iterations "$ITERATIONS" --warmup "$WARMUP" --trace "$OUT/$1.$3.trace.json" \
    --write-program "$OUT/$1.$3.program.json" --json > "$OUT/$1.$3.json"
}
row() {  # row SCHEDULER TAG LABEL
  local f=$OUT/$1.$2.json
  awk -v s="$1" -v l="$3" -v med="$(field "$f" median_iteration_us)" -v lo="$(field "$f" min_iteration_us)" \
      -v hi="$(field "$f" max_iteration_us)" -v p="$(field "$f" predicted_iteration_us)" \
      'BEGIN { printf "%-10s %-26s %10.1f %10.1f-%-10.1f %10.1f %+8.1f%%\n", s, l, med/1e3, lo/1e3, hi/1e3, p/1e3, 100*(p/med-1) }'
}

echo "closed loop: $MODEL ($PLAN), in process, $ITERATIONS iterations after $WARMUP warm-up; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
printf "%-10s %-26s %10s %21s %10s %9s\n" scheduler profile measured_ms min-max predicted_ms error
for s in $SCHEDULERS; do
  run "$s" "$OUT/isolated/profile.json" before
  "$CONCERTO" profile --from-trace "$OUT/$s.before.trace.json" --program "$OUT/$s.before.program.json" \
    --cluster "$CLUSTER" --profile "$OUT/isolated/profile.json" --out-dir "$OUT/$s.from-trace" >&2
  run "$s" "$OUT/$s.from-trace/profile.json" after
  row "$s" before "kernels timed alone"
  row "$s" after "durations from its trace"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
