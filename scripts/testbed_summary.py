#!/usr/bin/env python3
"""The testbed's summary (scripts/testbed.sh): per workload and scheduler the
measured median (min-max) beside the simulated time and the error, the cells
within 10%, and the ranking check (pairs whose measured ranges do not overlap,
in the measured order?), and per cell the compute ratio: the measured
compute-stream busy time over the simulated one (report rank). A ratio far
from 1 says the kernels themselves ran slower or faster than the profile and
the co-run model predicted (the machine's speed moved between the profile and
the run, or the co-run slowdown was mispredicted), apart from what the
schedule model gets wrong. Also writes OUT/testbed.json.

usage: testbed_summary.py OUT TAG=PLAN [TAG=PLAN ...]
"""
import itertools
import json
import os
import re
import sys


def field(path, name):
    with open(path) as f:
        text = f.read()
    m = re.search(r'"%s":\s*([-0-9.eE+]+)' % name, text)
    if not m:
        sys.exit("testbed: %s has no '%s'" % (path, name))
    return float(m.group(1))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    rows, workloads = [], []
    for arg in sys.argv[2:]:
        tag, plan = arg.split("=", 1)
        d = os.path.join(out, tag)
        known = ["sequential", "fifo", "ddp", "megatron", "megatron-tp-overlap", "zero", "deepspeed-overlap",
                 "xla-lhs", "concerto"]
        scheds = sorted({f[: -len(".measured.json")] for f in os.listdir(d) if f.endswith(".measured.json")},
                        key=lambda s: (known.index(s) if s in known else len(known), s))
        cells = []
        for s in scheds:
            med = field(os.path.join(d, s + ".measured.json"), "median_iteration_us") / 1e3
            lo = field(os.path.join(d, s + ".measured.json"), "min_iteration_us") / 1e3
            hi = field(os.path.join(d, s + ".measured.json"), "max_iteration_us") / 1e3
            sim = field(os.path.join(d, s + ".simulated.json"), "makespan_us") / 1e3
            busy_measured = field(os.path.join(d, s + ".measured.json"), "compute_busy_us")
            busy_simulated = field(os.path.join(d, s + ".simulated.json"), "compute_busy_us")
            cells.append({"workload": plan, "scheduler": s, "measured_median_ms": med, "measured_min_ms": lo,
                          "measured_max_ms": hi, "simulated_ms": sim, "error": sim / med - 1,
                          "compute_ratio": busy_measured / busy_simulated if busy_simulated > 0 else 0.0})
        pairs, ordered, wrong = 0, 0, []
        for a, b in itertools.combinations(cells, 2):
            if a["measured_max_ms"] < b["measured_min_ms"] or b["measured_max_ms"] < a["measured_min_ms"]:
                pairs += 1
                same = (a["measured_median_ms"] < b["measured_median_ms"]) == (a["simulated_ms"] < b["simulated_ms"])
                if same and a["simulated_ms"] != b["simulated_ms"]:
                    ordered += 1
                else:
                    wrong.append(a["scheduler"] + "/" + b["scheduler"])
        within = sum(abs(c["error"]) <= 0.10 for c in cells)
        workloads.append({"workload": plan, "cells": len(cells), "cells_within_10pct": within,
                          "separable_pairs": pairs, "pairs_in_measured_order": ordered, "pairs_wrong": wrong})
        rows += cells
    print("| workload | scheduler | measured ms (min-max) | simulated ms | error | compute ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for c in rows:
        print("| %s | %s | %.1f (%.1f-%.1f) | %.1f | %+.1f%% | %.2f |" % (
              c["workload"], c["scheduler"], c["measured_median_ms"], c["measured_min_ms"], c["measured_max_ms"],
              c["simulated_ms"], 100 * c["error"], c["compute_ratio"]))
    print()
    for w in workloads:
        print("- %s: %d of %d cells within 10%%; ranking: %d of %d separable pairs in the measured order%s" % (
            w["workload"], w["cells_within_10pct"], w["cells"], w["pairs_in_measured_order"], w["separable_pairs"],
            " (wrong or tied: %s)" % ", ".join(w["pairs_wrong"]) if w["pairs_wrong"] else ""))
    total = sum(w["cells_within_10pct"] for w in workloads)
    print("- all: %d of %d cells within 10%%" % (total, len(rows)))
    steady = [c for c in rows if abs(c["compute_ratio"] - 1) <= 0.10]
    print("- kernels as predicted (compute ratio within 10%%): %d of %d cells, %d of them within 10%% end to end" % (
        len(steady), len(rows), sum(abs(c["error"]) <= 0.10 for c in steady)))
    with open(os.path.join(out, "testbed.json"), "w") as f:
        json.dump({"cells": rows, "workloads": workloads, "cells_within_10pct": total, "cell_count": len(rows),
                   "cells_kernels_as_predicted": len(steady),
                   "cells_kernels_as_predicted_within_10pct": sum(abs(c["error"]) <= 0.10 for c in steady)},
                  f, indent=1)


if __name__ == "__main__":
    main()
