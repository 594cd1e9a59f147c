#!/usr/bin/env bash
# When does an all_reduce issued beside compute end, on the testbed's link?
# Runs build/concerto_corun_probe (bench/mpi_corun_probe/main.cc) over 2 MPI
# ranks in a network namespace whose loopback is shaped as `make testbed`
# shapes it (tbf; RATE, BURST, LATENCY as scripts/testbed.sh). Needs root.
# Prints, per message size (2 KiB .. 4 MiB) and compute time beside it
# (0 .. 40 ms), the all_reduce's end after its issue and after the compute's
# end (medians of 7). Extra arguments go to the probe (--json).
#
# usage: scripts/corun_probe.sh [BUILD_DIR] [--json]
set -euo pipefail
BUILD=${1:-build}
shift || true
RATE=${RATE:-1gbit}
BURST=${BURST:-256kb}
LATENCY=${LATENCY:-50ms}
PROBE=$BUILD/concerto_corun_probe
if [[ $(id -u) -ne 0 ]]; then
  echo "corun_probe: needs root (ip netns, tc)" >&2
  exit 2
fi
[[ -x $PROBE ]] || { echo "corun_probe: build $PROBE first (make build; needs MPI)" >&2; exit 2; }
NS=concerto-probe-$$
trap 'ip netns del "$NS" 2>/dev/null || true' EXIT
ip netns add "$NS"
ip -n "$NS" link set lo up
tc -n "$NS" qdisc add dev lo root tbf rate "$RATE" burst "$BURST" latency "$LATENCY"
echo "corun_probe: $(ip netns exec "$NS" tc qdisc show dev lo)" >&2
ip netns exec "$NS" mpirun --allow-run-as-root --oversubscribe -n 2 --mca btl tcp,self \
  --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca mpi_yield_when_idle 1 "$PROBE" "$@"
