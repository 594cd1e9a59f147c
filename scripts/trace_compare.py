#!/usr/bin/env python3
"""Compare a run's trace with the simulator's trace of the same schedule.

The op-by-op reading behind docs/results.md's testbed findings, as commands:

  kernels SIM RUN     per rank and kernel type (type, phase): ops, simulated
                      and measured compute time, measured / simulated. Shows a
                      kernel priced wrong (gelu ran 1.5x its old price).
  overlap SIM RUN     per rank, the compute ops (simulated >= --min-us) split by
                      how much of their span ran beside a communication op of
                      the same rank in the run (overlapped > 90%, none < 10%,
                      part); measured / simulated of each, and their quotient:
                      the interference the run saw. Simulate with
                      --interference 0 so the simulated side is the bare kernels.
  comm-tail RUN       per communication op (name containing --match): its
                      duration, the compute time of its rank beside it, and how
                      long after that compute stopped it ended; with the median
                      over the ops that had compute beside them.

  jitter RUN          per collective present on every rank of the run (matched by
                      name): each rank's compute time since its previous one
                      began, and the slowest rank's past their mean, over the
                      mean; summary: the mean of that over the collectives with
                      at least --min-us of compute, and over e_n (the expected
                      largest of n standard normals): the coefficient of
                      variation the model's compute_jitter stands for, and the
                      total the slowest ranks took past the mean (what the
                      rendezvous waited).

SIM is `concerto simulate ... --all-ranks --trace SIM` of the schedule the
run executed (`concerto run ... --trace RUN`), both Chrome traces. Ops are
matched by (rank, op name). --json prints one JSON object instead of tables.
Exit 2 on bad input (a missing file, not a trace, no op in common).
"""
import argparse
import json
import math
import statistics
import sys
from collections import defaultdict


class InputError(Exception):
    pass


def load_ops(path):
    """The complete ('X') events of a Chrome trace: name, rank, kind, type, phase, start, duration (us)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}")
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e.msg} at line {e.lineno})")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise InputError(f"{path}: not a Chrome trace (no traceEvents list)")
    ops = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        try:
            ops.append({
                "name": str(e["name"]),
                "rank": int(e["pid"]),
                "kind": str(args.get("kind", "")),
                "type": str(args.get("type", "")),
                "phase": str(args.get("phase", "")),
                "start_us": float(e["ts"]),
                "dur_us": float(e["dur"]),
            })
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: event {i}: needs name, pid, ts and dur")
    if not ops:
        raise InputError(f"{path}: no complete ('X') events")
    return ops


def by_key(ops):
    return {(o["rank"], o["name"]): o for o in ops}


def matched_compute(sim_ops, run_ops):
    """(simulated op, run op) pairs of compute ops present in both traces."""
    sim = by_key(sim_ops)
    pairs = [(sim[(o["rank"], o["name"])], o) for o in run_ops
             if o["kind"] == "compute" and (o["rank"], o["name"]) in sim]
    if not pairs:
        raise InputError("no compute op in common (are both traces of the same schedule?)")
    return pairs


def ratio(measured, simulated):
    return measured / simulated if simulated > 0 else None


def kernels(sim_ops, run_ops):
    """Per rank and (type, phase): ops, simulated_ms, measured_ms, ratio."""
    acc = defaultdict(lambda: [0, 0.0, 0.0])
    for s, r in matched_compute(sim_ops, run_ops):
        a = acc[(r["rank"], r["type"], r["phase"])]
        a[0] += 1
        a[1] += s["dur_us"]
        a[2] += r["dur_us"]
    rows = [{"rank": k[0], "type": k[1], "phase": k[2], "ops": v[0], "simulated_ms": v[1] / 1e3,
             "measured_ms": v[2] / 1e3, "ratio": ratio(v[2], v[1])} for k, v in acc.items()]
    rows.sort(key=lambda x: (x["rank"], -x["measured_ms"]))
    return {"kernels": rows}


def overlap_us(start, end, spans):
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def overlap(sim_ops, run_ops, min_us):
    """Compute ops split by how much of their run span had a comm op of their rank beside it."""
    comm = defaultdict(list)
    for o in run_ops:
        if o["kind"] != "compute":
            comm[o["rank"]].append((o["start_us"], o["start_us"] + o["dur_us"]))
    acc = defaultdict(lambda: [0, 0.0, 0.0])
    for s, r in matched_compute(sim_ops, run_ops):
        if s["dur_us"] < min_us or r["dur_us"] <= 0:
            continue
        share = overlap_us(r["start_us"], r["start_us"] + r["dur_us"], comm[r["rank"]]) / r["dur_us"]
        cls = "overlapped" if share > 0.9 else "none" if share < 0.1 else "part"
        a = acc[(r["rank"], cls)]
        a[0] += 1
        a[1] += s["dur_us"]
        a[2] += r["dur_us"]
    rows = [{"rank": k[0], "class": k[1], "ops": v[0], "simulated_ms": v[1] / 1e3, "measured_ms": v[2] / 1e3,
             "ratio": ratio(v[2], v[1])} for k, v in acc.items()]
    rows.sort(key=lambda x: (x["rank"], x["class"]))
    interference = {}
    for rank in sorted({x["rank"] for x in rows}):
        got = {x["class"]: x["ratio"] for x in rows if x["rank"] == rank}
        if got.get("overlapped") and got.get("none"):
            interference[str(rank)] = got["overlapped"] / got["none"] - 1
    return {"min_us": min_us, "classes": rows, "interference_by_rank": interference}


def comm_tail(run_ops, match):
    """Per comm op: duration, compute beside it on its rank, and its end after that compute stopped."""
    compute = defaultdict(list)
    for o in run_ops:
        if o["kind"] == "compute":
            compute[o["rank"]].append((o["start_us"], o["start_us"] + o["dur_us"]))
    rows = []
    for o in sorted(run_ops, key=lambda o: (o["rank"], o["start_us"])):
        if o["kind"] == "compute" or match not in o["name"]:
            continue
        a, b = o["start_us"], o["start_us"] + o["dur_us"]
        beside = overlap_us(a, b, compute[o["rank"]])
        stops = [min(e, b) for s, e in compute[o["rank"]] if s < b and e > a]
        tail = b - max(stops) if stops else o["dur_us"]
        rows.append({"rank": o["rank"], "op": o["name"], "dur_ms": o["dur_us"] / 1e3,
                     "compute_beside_ms": beside / 1e3, "end_after_compute_ms": tail / 1e3})
    if not rows:
        raise InputError(f"no communication op whose name contains '{match}'")
    tails = [x["end_after_compute_ms"] for x in rows if x["compute_beside_ms"] > 0.5 * x["dur_ms"]]
    summary = {"ops": len(rows), "ops_mostly_beside_compute": len(tails)}
    if tails:
        summary.update({"median_end_after_compute_ms": statistics.median(tails),
                        "min_end_after_compute_ms": min(tails), "max_end_after_compute_ms": max(tails)})
    return {"match": match, "comm": rows, "summary": summary}


def expected_max_normal(n, steps=4000):
    """E max of n independent standard normals (midpoint rule over [-10, 10])."""
    if n <= 1:
        return 0.0
    h, total = 20.0 / steps, 0.0
    for i in range(steps):
        x = -10 + (i + 0.5) * h
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        total += x * n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * cdf ** (n - 1) * h
    return total


def jitter(run_ops, min_us):
    """Per collective on every rank: the ranks' compute since the previous one and its spread."""
    ranks = sorted({o["rank"] for o in run_ops})
    if len(ranks) < 2:
        raise InputError("the run trace has one rank: no synchronisation to spread over")
    per_rank = {r: sorted((o for o in run_ops if o["rank"] == r), key=lambda o: o["start_us"]) for r in ranks}
    names = None
    for r in ranks:
        mine = {o["name"] for o in per_rank[r] if o["kind"] != "compute"}
        names = mine if names is None else names & mine
    compute_since = {}  # (rank, comm op name) -> compute us since the rank's previous such op began
    for r in ranks:
        since = 0.0
        for o in per_rank[r]:
            if o["kind"] == "compute":
                since += o["dur_us"]
            elif o["name"] in names:
                compute_since[(r, o["name"])] = since
                since = 0.0
    rows = []
    for o in per_rank[ranks[0]]:
        if o["kind"] == "compute" or o["name"] not in names:
            continue
        times = [compute_since[(r, o["name"])] for r in ranks]
        mean = sum(times) / len(times)
        spread = (max(times) - mean) / mean if mean > 0 else 0.0
        rows.append({"op": o["name"], "mean_compute_ms": mean / 1e3, "max_compute_ms": max(times) / 1e3,
                     "spread": spread, "counted": mean >= min_us})
    if not rows:
        raise InputError("no communication op on every rank of the run")
    counted = [r for r in rows if r["counted"]]
    e_n = expected_max_normal(len(ranks))
    summary = {"ranks": len(ranks), "collectives": len(rows), "counted": len(counted)}
    if counted:
        mean_spread = sum(r["spread"] for r in counted) / len(counted)
        summary.update({"mean_spread": mean_spread, "e_n": e_n, "compute_jitter": mean_spread / e_n,
                        "slowest_past_mean_ms": sum(r["max_compute_ms"] - r["mean_compute_ms"] for r in counted)})
    return {"min_us": min_us, "collectives": rows, "summary": summary}


def fmt(v):
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def print_table(rows, columns):
    print(" | ".join(columns))
    for r in rows:
        print(" | ".join(fmt(r[c]) for c in columns))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels", help="measured / simulated per rank and kernel type")
    o = sub.add_parser("overlap", help="compute beside communication against compute without")
    o.add_argument("--min-us", type=float, default=500.0,
                   help="only compute ops simulated at least this long [us] (default 500)")
    for s in (k, o):
        s.add_argument("sim", help="simulator trace (concerto simulate --all-ranks --trace)")
        s.add_argument("run", help="run trace (concerto run --trace)")
    c = sub.add_parser("comm-tail", help="how long after the compute beside it each comm op ended")
    c.add_argument("run", help="run trace (concerto run --trace)")
    c.add_argument("--match", default="", help="only comm ops whose name contains this (default: all)")
    j = sub.add_parser("jitter", help="the ranks' compute between synchronisations and its spread")
    j.add_argument("run", help="run trace (concerto run --trace)")
    j.add_argument("--min-us", type=float, default=2000.0,
                   help="summarise the collectives with at least this much compute before them [us] (default 2000)")
    for s in (k, o, c, j):
        s.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        if args.command == "kernels":
            out = kernels(load_ops(args.sim), load_ops(args.run))
            table = (out["kernels"], ["rank", "type", "phase", "ops", "simulated_ms", "measured_ms", "ratio"])
        elif args.command == "overlap":
            if args.min_us < 0:
                raise InputError(f"--min-us must be >= 0, got {args.min_us}")
            out = overlap(load_ops(args.sim), load_ops(args.run), args.min_us)
            table = (out["classes"], ["rank", "class", "ops", "simulated_ms", "measured_ms", "ratio"])
        elif args.command == "jitter":
            if args.min_us < 0:
                raise InputError(f"--min-us must be >= 0, got {args.min_us}")
            out = jitter(load_ops(args.run), args.min_us)
            table = (out["collectives"], ["op", "mean_compute_ms", "max_compute_ms", "spread", "counted"])
        else:
            out = comm_tail(load_ops(args.run), args.match)
            table = (out["comm"], ["rank", "op", "dur_ms", "compute_beside_ms", "end_after_compute_ms"])
    except InputError as e:
        print(f"trace_compare: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print_table(*table)
    if args.command == "overlap":
        for rank, f in out["interference_by_rank"].items():
            print(f"rank {rank}: overlapped / none - 1 = {f:+.3f}")
    if args.command in ("comm-tail", "jitter"):
        print("summary: " + ", ".join(f"{k} {fmt(v)}" for k, v in out["summary"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
