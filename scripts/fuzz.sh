#!/usr/bin/env bash
# Runs every libFuzzer target in fuzz/ for SECONDS each (make fuzz-smoke: 60),
# seeded from examples/, tests/errors/, tests/golden/ and fuzz/seeds/; the
# corpus each run grows is kept in BUILD/fuzz-corpus/TARGET and reused.
#
#   scripts/fuzz.sh BUILD SECONDS [TARGET...]
#
# Prints one line per target (runs, coverage, corpus size, crashes) and one
# JSON object per target appended to BUILD/fuzz-report.jsonl. Exits 1 when a target
# found a crash, leak or timeout (its reproducer is in BUILD/fuzz-artifacts/).
set -uo pipefail
BUILD=${1:?usage: scripts/fuzz.sh BUILD SECONDS [TARGET...]}
SECONDS_EACH=${2:?usage: scripts/fuzz.sh BUILD SECONDS [TARGET...]}
shift 2
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(fuzz_program fuzz_schedule fuzz_plan fuzz_cluster fuzz_sharding fuzz_model fuzz_trace fuzz_profile)
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SEEDS="$BUILD/fuzz-seeds"
mkdir -p "$BUILD/fuzz-artifacts"

# Copies FILES into DIR, each prefixed with the byte PREFIX (octal) when given:
# the plan and cluster targets read their first byte as a selector.
seed() {  # seed DIR PREFIX FILES...
  local dir="$1" prefix="$2"; shift 2
  mkdir -p "$dir"
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    if [[ -n "$prefix" ]]; then
      { printf "\\$prefix"; cat "$f"; } >"$dir/$prefix-$(basename "$f")"
    else
      cp "$f" "$dir/"
    fi
  done
}
# The seeds of one target (rebuilt each run; several runs of different
# targets may go at once).
seed_target() {  # seed_target TARGET
  rm -rf "${SEEDS:?}/$1"
  case "$1" in
    fuzz_program) seed "$SEEDS/$1" "" "$ROOT"/examples/ir/*.json "$ROOT"/tests/errors/*.json "$ROOT"/tests/golden/*.json ;;
    fuzz_schedule) seed "$SEEDS/$1" "" "$ROOT"/fuzz/seeds/schedule/*.json ;;
    fuzz_plan) seed "$SEEDS/$1" "000" "$ROOT"/fuzz/seeds/plan/*.txt
               seed "$SEEDS/$1" "001" "$ROOT"/examples/plans/*.yaml ;;
    fuzz_cluster) seed "$SEEDS/$1" "000" "$ROOT"/examples/clusters/*.yaml "$ROOT"/tests/golden/clusters/*.yaml
                  seed "$SEEDS/$1" "001" "$ROOT"/examples/clusters/*.json "$ROOT"/tests/golden/clusters/*.json ;;
    fuzz_sharding) seed "$SEEDS/$1" "" "$ROOT"/examples/plans/*.json "$ROOT"/tests/errors/sharding_*.json ;;
    fuzz_model) seed "$SEEDS/$1" "000" "$ROOT"/examples/models/*.yaml
                seed "$SEEDS/$1" "001" "$ROOT"/examples/models/vit-*.yaml "$ROOT"/fuzz/seeds/model/*.yaml ;;
    fuzz_trace) seed "$SEEDS/$1" "000" "$ROOT"/fuzz/seeds/trace/*.json
                seed "$SEEDS/$1" "001" "$ROOT"/fuzz/seeds/trace/*.json ;;
    fuzz_profile) seed "$SEEDS/$1" "" "$ROOT"/fuzz/seeds/profile/*.json ;;
    *) echo "fuzz: unknown target $1" >&2; exit 2 ;;
  esac
}

failed=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD/$t"
  [[ -x "$bin" ]] || { echo "fuzz: $bin not built (make fuzz)" >&2; exit 2; }
  seed_target "$t"
  corpus="$BUILD/fuzz-corpus/$t"
  mkdir -p "$corpus"
  log="$BUILD/fuzz-$t.log"
  echo "fuzz: $t for ${SECONDS_EACH} s" >&2
  "$bin" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -max_len=65536 -timeout=20 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz-artifacts/$t-" "$corpus" "$SEEDS/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  files=$(find "$corpus" -type f | wc -l)
  found=$(grep -cE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|==ERROR' "$log")
  printf '%-14s %10s runs  cov %6s  ft %7s  corpus %6s  exit %d%s\n' "$t" "${runs:-?}" "${cov:-?}" "${ft:-?}" \
    "$files" "$rc" "$( ((rc != 0)) && echo "  FOUND: see $log" )"
  printf '{"date": "%s", "target": "%s", "seconds": %s, "runs": %s, "coverage_edges": %s, "features": %s, "corpus_files": %s, "exit": %d}\n' \
    "$(date -u +%FT%TZ)" "$t" "$SECONDS_EACH" "${runs:-0}" "${cov:-0}" "${ft:-0}" "$files" "$rc" >>"$BUILD/fuzz-report.jsonl"
  ((rc == 0)) || failed=1
  ((found == 0)) || failed=1
done
exit $failed
