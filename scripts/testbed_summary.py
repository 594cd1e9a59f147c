#!/usr/bin/env python3
"""The testbed's summary (scripts/testbed.sh): per workload and scheduler the
measured median (min-max over every round's iterations) beside three
predictions of the same schedule and their errors:
  first      on the profile taken before the schedules were made (what the
             schedulers saw), minutes to a quarter of an hour before the runs;
  per_round  each round's runs predicted on the kernels timed just before
             them (the median over the rounds of those predictions): a
             profile taken first, seconds before what it predicts;
  merged     on the kernels of every round merged (per kernel the median):
             the machine's typical speed over the window the runs span.
Then the cells within 10% and the ranking check (pairs whose measured ranges
do not overlap, in the measured order?) for each, and per cell the compute
ratio: the measured compute-stream busy time over the simulated one (report
rank, the last prediction). A ratio far from 1 says the kernels themselves ran
slower or faster than timed and the co-run model predicted, apart from what the
schedule model gets wrong. Per workload also the drift of the machine between
the first profile and the runs: the first profile's simulated compute per
step over the rounds' (the median over the schedules), printed as a percent;
a first-profile miss beside a per_round hit with a drift of that size is the
machine's speed moving, not the model. Also writes OUT/testbed.json.

usage: testbed_summary.py OUT TAG=PLAN [TAG=PLAN ...]
       testbed_summary.py --combine-rounds OUT.json ROUND.json [ROUND.json ...]
         (one measured.json from the rounds' `concerto run --json` outputs:
          every iteration, their median, min and max, and the compute and
          communication busy time of the median round)
"""
import glob
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


def median(values):
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def combine_rounds(out, paths):
    rounds = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if not d.get("iteration_us"):
            sys.exit("testbed: %s has no iteration_us" % p)
        rounds.append(d)
    iters = [t for d in rounds for t in d["iteration_us"]]
    # The round whose median iteration is the median of the rounds' (the lower
    # one for an even count) gives the busy times, as `run` gives its median
    # iteration's.
    by_median = sorted(rounds, key=lambda d: d["median_iteration_us"])
    mid = by_median[(len(by_median) - 1) // 2]
    combined = {"rounds": len(rounds), "iteration_us": iters, "iterations": len(iters),
                "median_iteration_us": median(iters), "min_iteration_us": min(iters),
                "max_iteration_us": max(iters), "compute_busy_us": mid["compute_busy_us"],
                "comm_busy_us": mid["comm_busy_us"], "round_files": paths}
    with open(out, "w") as f:
        json.dump(combined, f, indent=1)


PREDICTIONS = [("first", ".simulated.json"), ("per_round", ".round-*.simulated.json"),
               ("merged", ".merged.simulated.json")]


def ranking(cells, key):
    pairs, ordered, wrong = 0, 0, []
    for a, b in itertools.combinations(cells, 2):
        if a["measured_max_ms"] < b["measured_min_ms"] or b["measured_max_ms"] < a["measured_min_ms"]:
            pairs += 1
            same = (a["measured_median_ms"] < b["measured_median_ms"]) == (a[key] < b[key])
            if same and a[key] != b[key]:
                ordered += 1
            else:
                wrong.append(a["scheduler"] + "/" + b["scheduler"])
    return pairs, ordered, wrong


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "--combine-rounds":
        combine_rounds(sys.argv[2], sys.argv[3:])
        return
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv[1]
    rows, workloads = [], []
    for arg in sys.argv[2:]:
        tag, plan = arg.split("=", 1)
        d = os.path.join(out, tag)
        known = ["sequential", "fifo", "ddp", "megatron", "megatron-tp-overlap", "zero", "deepspeed-overlap",
                 "xla-lhs", "concerto"]
        scheds = sorted({f[: -len(".measured.json")] for f in os.listdir(d)
                         if f.endswith(".measured.json") and ".round-" not in f},
                        key=lambda s: (known.index(s) if s in known else len(known), s))
        cells, drifts = [], []
        for s in scheds:
            measured = os.path.join(d, s + ".measured.json")
            cell = {"workload": plan, "scheduler": s,
                    "measured_median_ms": field(measured, "median_iteration_us") / 1e3,
                    "measured_min_ms": field(measured, "min_iteration_us") / 1e3,
                    "measured_max_ms": field(measured, "max_iteration_us") / 1e3}
            busy_measured = field(measured, "compute_busy_us")
            busy_by_prediction = {}
            for name, suffix in PREDICTIONS:
                paths = sorted(glob.glob(os.path.join(glob.escape(d), glob.escape(s) + suffix)))
                if not paths:
                    continue
                sim = median([field(p, "makespan_us") for p in paths]) / 1e3
                cell["simulated_%s_ms" % name] = sim
                cell["error_%s" % name] = sim / cell["measured_median_ms"] - 1
                busy = median([field(p, "compute_busy_us") for p in paths])
                busy_by_prediction[name] = busy
                cell["compute_ratio"] = busy_measured / busy if busy > 0 else 0.0
            if busy_by_prediction.get("per_round", 0) > 0 and "first" in busy_by_prediction:
                drifts.append(busy_by_prediction["first"] / busy_by_prediction["per_round"] - 1)
            cells.append(cell)
        w = {"workload": plan, "cells": len(cells)}
        if drifts:
            w["first_profile_kernel_drift"] = median(drifts)
        for name, _ in PREDICTIONS:
            have = [c for c in cells if "error_%s" % name in c]
            if not have:
                continue
            pairs, ordered, wrong = ranking(have, "simulated_%s_ms" % name)
            w[name] = {"cells_within_10pct": sum(abs(c["error_%s" % name]) <= 0.10 for c in have),
                       "separable_pairs": pairs, "pairs_in_measured_order": ordered, "pairs_wrong": wrong}
        workloads.append(w)
        rows += cells
    names = [n for n, _ in PREDICTIONS if any("error_%s" % n in c for c in rows)]
    header = "| workload | scheduler | measured ms (min-max) |"
    for n in names:
        header += " simulated ms (%s) | error (%s) |" % (n, n)
    print(header + " compute ratio |")
    print("|---|---|---:|" + "---:|---:|" * len(names) + "---:|")
    for c in rows:
        line = "| %s | %s | %.1f (%.1f-%.1f) |" % (c["workload"], c["scheduler"], c["measured_median_ms"],
                                                   c["measured_min_ms"], c["measured_max_ms"])
        for n in names:
            if "error_%s" % n in c:
                line += " %.1f | %+.1f%% |" % (c["simulated_%s_ms" % n], 100 * c["error_%s" % n])
            else:
                line += " - | - |"
        print(line + " %.2f |" % c.get("compute_ratio", 0.0))
    print()
    summary = {"cells": rows, "workloads": workloads, "cell_count": len(rows)}
    for n in names:
        for w in workloads:
            if n not in w:
                continue
            v = w[n]
            print("- %s, %s: %d of %d cells within 10%%; ranking: %d of %d separable pairs in the measured order%s" % (
                w["workload"], n, v["cells_within_10pct"], w["cells"], v["pairs_in_measured_order"],
                v["separable_pairs"], " (wrong or tied: %s)" % ", ".join(v["pairs_wrong"]) if v["pairs_wrong"] else ""))
        total = sum(w[n]["cells_within_10pct"] for w in workloads if n in w)
        print("- all, %s: %d of %d cells within 10%%" % (n, total, len(rows)))
        if n == "first":
            for w in workloads:
                if "first_profile_kernel_drift" in w:
                    print("- %s: the first profile's kernels against the rounds' (simulated compute per step): %+.1f%%"
                          % (w["workload"], 100 * w["first_profile_kernel_drift"]))
        summary["cells_within_10pct_%s" % n] = total
    last = names[-1] if names else None
    steady = [c for c in rows if abs(c.get("compute_ratio", 0) - 1) <= 0.10]
    if last:
        print("- kernels as predicted (compute ratio within 10%%, %s): %d of %d cells, %d of them within 10%% end to end"
              % (last, len(steady), len(rows), sum(abs(c["error_%s" % last]) <= 0.10 for c in steady)))
    summary["cells_kernels_as_predicted"] = len(steady)
    with open(os.path.join(out, "testbed.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
