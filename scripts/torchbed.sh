#!/usr/bin/env bash
# The torch testbed (docs/results.md, "Against torch's own DDP, FSDP and tensor parallelism"):
# concerto's schedules on the torch engine against torch's own DistributedDataParallel, FSDP
# (fully_shard) and tensor parallelism (parallelize_module), on the same model, batches, initial
# values and machine, at each link rate of RATES.
#
# Per rate, a network namespace whose loopback is shaped with tbf (as scripts/testbed.sh's; needs
# root), and per workload of WORKLOADS (scripts/torchbed.py's table):
#  1. `torchbed.py prepare`: the workload's model captured and partitioned (OUT/program.json);
#  2. `concerto profile --program` inside the namespace: a cpu-local cluster fitted to this machine
#     (MPI collectives on the shaped link, interference, co-run slowdown) and its profile;
#  3. the torch kernels and gloo's collectives: the engine runs the `sequential` schedule (one op
#     at a time) for a few steps with its trace on, and `concerto profile --from-trace
#     --collectives` puts the torch kernels' and the collectives' times over the profile's other
#     entries (OUT/torch/profile.json; gloo costs about 0.3 ms per collective here, MPI 10 us);
#  4. the rounds (`torchbed.py run` under torchrun, inside the namespace): every variant built once
#     in the same processes, then ROUNDS rounds of WARMUP untimed and STEPS timed steps per variant,
#     the order rotated by one each round; the engine rows' schedules are made for the fitted
#     cluster and the torch kernels' profile;
#  5. our model of torch's own rows where there is one (OUT/model-ddp-<N>mb: the ddp scheduler
#     with N MB buckets; model-fsdp: the zero scheduler), every collective of those and the engine
#     rows' programs timed over gloo as the engine issues it, alone (`torchbed.py collectives`:
#     OUT/gloo/profile.json, over the torch kernels' profile), and `concerto simulate` of each on
#     the fitted cluster and that profile.
# Then the summary (torchbed.py summary): per workload and rate the median step and min-max over the
# rounds, the final losses, the predictions with their errors, the ranking check; OUT_ROOT/torchbed.json.
#
# usage: scripts/torchbed.sh [BUILD_DIR]   (env: RATES="1gbit 10gbit" BURST=256kb LATENCY=50ms
#        WORKLOADS="gpt2-dp2 gpt2-zero3 llama-tp2 llama-tp2-sp" SIZE=bench ROUNDS=5 WARMUP=1 STEPS=3
#        MAX_BYTES=67108864 PROFILE_REPS=3 KERNEL_PASSES=3 MAX_LOSS_DIFF=1e-4 OUT=BUILD_DIR/torchbed PY=(scripts/setup_torch.sh's python)
#        NETNS=1 (0: no namespace and no shaping, the plain loopback: what CI's smoke runs, no root)
#        ONLY_PREDICT=0 (1: keep an earlier run's measurements in OUT, redo only step 5))
set -euo pipefail

BUILD=${1:-build}
RATES=${RATES:-"1gbit 10gbit"}
BURST=${BURST:-256kb}
LATENCY=${LATENCY:-50ms}
WORKLOADS=${WORKLOADS:-"gpt2-dp2 gpt2-zero3 llama-tp2 llama-tp2-sp"}
SIZE=${SIZE:-bench}
ROUNDS=${ROUNDS:-5}
WARMUP=${WARMUP:-1}
STEPS=${STEPS:-3}
MAX_BYTES=${MAX_BYTES:-67108864}
PROFILE_REPS=${PROFILE_REPS:-3}      # concerto profile --reps
KERNEL_PASSES=${KERNEL_PASSES:-3}    # concerto profile --kernel-passes
# fp32: the variants sum gradients in different orders (buckets, shards), so after tens of Adam
# steps their losses differ in the last digits, not more.
MAX_LOSS_DIFF=${MAX_LOSS_DIFF:-1e-4}
OUT_ROOT=${OUT:-$BUILD/torchbed}
NETNS=${NETNS:-1}
[[ $NETNS == 1 ]] || RATES=unshaped  # no namespace: one pass over the plain loopback
ONLY_PREDICT=${ONLY_PREDICT:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
CONCERTO=$BUILD/concerto
PY=${PY:-$(bash "$HERE/setup_torch.sh")}
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
export GLOO_SOCKET_IFNAME=lo

[[ -x $CONCERTO && -x $BUILD/concerto_mpi_run && -d $BUILD/python/concerto ]] || {
  echo "torchbed: build $CONCERTO, $BUILD/concerto_mpi_run and the python module first (make test's build)" >&2
  exit 2
}
if [[ $NETNS == 1 ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "torchbed: needs root for the namespace (ip netns, tc); NETNS=0 runs unshaped" >&2; exit 2; }
  for tool in ip tc; do command -v "$tool" >/dev/null || { echo "torchbed: '$tool' not found" >&2; exit 2; }; done
fi

NS=concerto-torchbed-$$
cleanup() { [[ $NETNS == 1 ]] && ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
in_ns() { if [[ $NETNS == 1 ]]; then ip netns exec "$NS" "$@"; else "$@"; fi; }
torchrun() {
  local n=$1; shift
  in_ns "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" "$HERE/torchbed.py" "$@"
}

# Steps 1-4 for workload $W at $RATE into $OUT (sets $ranks).
measure() {
  rm -rf "$OUT" && mkdir -p "$OUT/kernels"
  echo "torchbed: $W at $RATE (files in $OUT)" >&2
  "$PY" "$HERE/torchbed.py" prepare --workload "$W" --size "$SIZE" --out "$OUT"
  ranks=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['ranks'])" "$OUT/workload.json")
  in_ns "$CONCERTO" profile --program "$OUT/program.json" --out-dir "$OUT" --max-bytes "$MAX_BYTES" \
    --reps "$PROFILE_REPS" --kernel-passes "$KERNEL_PASSES" --json > "$OUT/profile.summary.json"
  torchrun "$ranks" run --workload "$W" --size "$SIZE" --out "$OUT/kernels" --variants engine-sequential \
    --rounds 1 --warmup "$WARMUP" --steps "$STEPS" --cluster "$OUT/cpu-local.json" --profile "$OUT/profile.json" \
    --trace engine-sequential
  "$CONCERTO" profile --from-trace "$OUT/kernels/trace.json" --program "$OUT/kernels/engine-sequential.program.json" \
    --cluster "$OUT/cpu-local.json" --profile "$OUT/profile.json" --out-dir "$OUT/torch" --collectives \
    --json > "$OUT/torch.summary.json"
  echo "torchbed: load average before the rounds: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  torchrun "$ranks" run --workload "$W" --size "$SIZE" --out "$OUT" --rounds "$ROUNDS" --warmup "$WARMUP" \
    --steps "$STEPS" --cluster "$OUT/cpu-local.json" --profile "$OUT/torch/profile.json"
  echo "torchbed: load average after the rounds: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}

dirs=()
for RATE in $RATES; do
  if [[ $NETNS == 1 ]]; then
    ip netns del "$NS" 2>/dev/null || true
    ip netns add "$NS"
    ip netns exec "$NS" ip link set lo up
    ip netns exec "$NS" tc qdisc add dev lo root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
    echo "torchbed: namespace $NS, loopback shaped: $(in_ns tc qdisc show dev lo)" >&2
  else
    RATE=unshaped
    echo "torchbed: no namespace (NETNS=0): the plain loopback" >&2
  fi
  for W in $WORKLOADS; do
    OUT=$OUT_ROOT/$RATE/$W
    if [[ $ONLY_PREDICT == 1 ]]; then
      [[ -f $OUT/measured.json ]] || { echo "torchbed: ONLY_PREDICT=1: no earlier run in $OUT" >&2; exit 2; }
      echo "torchbed: $W at $RATE: the predictions again (files in $OUT)" >&2
    else
      measure
    fi
    ranks=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['ranks'])" "$OUT/workload.json")
    # Our model of each of torch's own rows where one exists: DDP's policy at that bucket size,
    # FSDP's as the zero scheduler on the same zero=3 program (torch's TP has none: its collectives
    # are Megatron's, the partitioner's program is not; issue 40).
    for v in $("$PY" -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['order']))" "$OUT/measured.json"); do
      case $v in
        ddp-*mb) opts=(--scheduler ddp --ddp-bucket "${v:4:-2}") ;;
        fsdp|fsdp-prefetch) opts=(--scheduler zero) ;;
        *) continue ;;
      esac
      "$CONCERTO" schedule "$OUT/program.json" "${opts[@]}" --cluster "$OUT/cpu-local.json" \
        --profile "$OUT/torch/profile.json" -o "$OUT/model-$v.schedule.json" --write-program "$OUT/model-$v.program.json" \
        > /dev/null
    done
    torchrun "$ranks" collectives --out "$OUT" --cluster "$OUT/cpu-local.json" --profile "$OUT/torch/profile.json"
    for P in "$OUT"/engine-*.program.json "$OUT"/model-*.program.json; do
      [[ -f $P ]] || continue
      v=$(basename "$P" .program.json)
      "$CONCERTO" simulate "$P" --schedule "$OUT/$v.schedule.json" --cluster "$OUT/cpu-local.json" \
        --profile "$OUT/gloo/profile.json" --json > "$OUT/$v.simulated.json"
    done
    dirs+=("$OUT")
  done
done
"$PY" "$HERE/torchbed.py" summary "${dirs[@]}" --write "$OUT_ROOT/torchbed.json" --max-loss-diff "$MAX_LOSS_DIFF"
echo "torchbed: files in $OUT_ROOT/<rate>/<workload>/; summary in $OUT_ROOT/torchbed.json" >&2
