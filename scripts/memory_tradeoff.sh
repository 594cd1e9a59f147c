#!/usr/bin/env bash
# The memory-vs-time trade-off of one large model (docs/results.md, "Memory
# against time"): concerto's makespan under per-rank memory budgets, for each
# recomputation mode, beside every baseline's makespan and peak.
#
#   scripts/memory_tradeoff.sh [BUILD_DIR] [OUT_DIR]
#
# Environment: MODEL (llama-70b), PLAN (pp=4,tp=8,sp,microbatches=8, without
# recompute), CLUSTER (a800-4x8), BUDGETS_GB ("40 50 60 70 80"), MODES
# ("none selective full"). Each concerto run takes about 3 minutes on
# llama-70b on a 2-core machine; progress goes to stderr. Prints a markdown
# table and writes OUT_DIR/tradeoff.json (one object per run).
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-$(mktemp -d)}
MODEL=${MODEL:-llama-70b}
PLAN=${PLAN:-pp=4,tp=8,sp,microbatches=8}
CLUSTER=${CLUSTER:-a800-4x8}
BUDGETS_GB=${BUDGETS_GB:-40 50 60 70 80}
MODES=${MODES:-none selective full}
BASELINES=${BASELINES:-sequential fifo ddp megatron megatron-tp-overlap zero deepspeed-overlap xla-lhs}
TOOL="$BUILD/concerto"
[ -x "$TOOL" ] || { echo "memory_tradeoff: $TOOL not found (build first: make build)" >&2; exit 2; }
mkdir -p "$OUT"

for mode in $MODES; do
  program="$OUT/program-$mode.json"
  [ -s "$program" ] || "$TOOL" lower --model "$MODEL" --plan "$PLAN,recompute=$mode" -o "$program" >&2
  for b in $BASELINES; do
    f="$OUT/$mode-$b.json"
    [ -s "$f" ] && continue
    echo "memory_tradeoff: $mode: $b" >&2
    "$TOOL" simulate "$program" --cluster "$CLUSTER" --scheduler "$b" --memory-budget none --json >"$f" 2>/dev/null
  done
  for gb in $BUDGETS_GB; do
    f="$OUT/$mode-concerto-$gb.json"
    [ -s "$f" ] && continue
    echo "memory_tradeoff: $mode: concerto under ${gb} GB" >&2
    if ! "$TOOL" simulate "$program" --cluster "$CLUSTER" --scheduler concerto --memory-budget "${gb}GB" --json \
        >"$f" 2>"$OUT/$mode-concerto-$gb.err"; then
      # Nothing fits: the tool's message (the lowest peak found) is the result.
      python3 -c 'import json,sys; print(json.dumps({"error": open(sys.argv[1]).read().strip().splitlines()[-1]}))' \
        "$OUT/$mode-concerto-$gb.err" >"$f"
    fi
  done
done

python3 - "$OUT" "$MODES" "$BUDGETS_GB" "$BASELINES" "$MODEL" "$PLAN" "$CLUSTER" <<'EOF'
import json, os, sys
out, modes, budgets, baselines, model, plan, cluster = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5], sys.argv[6], sys.argv[7]
GiB = 1 << 30
rows = []
def load(name):
    with open(os.path.join(out, name)) as f:
        return json.load(f)
print(f"{model} {plan} on {cluster}: concerto's iteration time [ms] (peak GiB per rank) under each budget")
print()
print("| budget | " + " | ".join(f"recompute={m}" for m in modes) + " | best |")
print("|---|" + "---|" * (len(modes) + 1))
for gb in budgets:
    cells, best = [], None
    for m in modes:
        j = load(f"{m}-concerto-{gb}.json")
        if "error" in j:
            cells.append("nothing fits")
            rows.append({"mode": m, "scheduler": "concerto", "budget_bytes": int(float(gb) * 1e9), "error": j["error"]})
            continue
        ms, peak = j["makespan_us"] / 1e3, j["peak_memory_bytes"] / GiB
        cells.append(f"{ms:.1f} ({peak:.2f})")
        rows.append({"mode": m, "scheduler": "concerto", "budget_bytes": int(float(gb) * 1e9),
                     "makespan_us": j["makespan_us"], "peak_memory_bytes": j["peak_memory_bytes"]})
        if best is None or ms < best[0]:
            best = (ms, m)
    print(f"| {gb} GB | " + " | ".join(cells) + " | " + (f"{best[0]:.1f} ({best[1]})" if best else "nothing fits") + " |")
print()
print("Baselines (no budget): iteration time [ms] (peak GiB per rank)")
print()
print("| scheduler | " + " | ".join(f"recompute={m}" for m in modes) + " |")
print("|---|" + "---|" * len(modes))
for b in baselines:
    cells = []
    for m in modes:
        j = load(f"{m}-{b}.json")
        cells.append(f"{j['makespan_us'] / 1e3:.1f} ({j['peak_memory_bytes'] / GiB:.2f})")
        rows.append({"mode": m, "scheduler": b, "makespan_us": j["makespan_us"], "peak_memory_bytes": j["peak_memory_bytes"]})
    print(f"| {b} | " + " | ".join(cells) + " |")
with open(os.path.join(out, "tradeoff.json"), "w") as f:
    json.dump({"model": model, "plan": plan, "cluster": cluster, "runs": rows}, f, indent=1)
EOF
