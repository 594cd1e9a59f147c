#!/usr/bin/env python3
"""Captures torchvision's full-size vit_b_16 and wide_resnet50_2 through concerto.torch and prints
their compare tables (markdown) on a cluster preset, every scheduler on the same program, with the
seconds each stage took (docs/results.md, "PyTorch models"). Usage:

    PYTHONPATH=build/python python3 scripts/torchvision_tables.py [--cluster a800-4x8] [--batch 256]
        [--plans dp=32 dp=32,zero=3] [--json]
"""
import argparse
import json
import sys
import time

import torch
import torchvision

import concerto
import concerto.torch as ct

MODELS = {"vit_b_16": torchvision.models.vit_b_16, "wide_resnet50_2": torchvision.models.wide_resnet50_2}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default="a800-4x8")
    ap.add_argument("--batch", type=int, default=256, help="global batch (images per step)")
    ap.add_argument("--plans", nargs="+", default=["dp=32", "dp=32,zero=3"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--json", action="store_true", help="one JSON object instead of markdown")
    args = ap.parse_args()
    out = []
    for name in args.models:
        t0 = time.time()
        cap = ct.capture(MODELS[name](), torch.randn(args.batch, 3, 224, 224),
                         torch.zeros(args.batch, dtype=torch.int64), dtype="bf16")
        capture_s = time.time() - t0
        print("%s: captured %d ops in %.1f s" % (name, cap.program.num_ops, capture_s), file=sys.stderr)
        for plan in args.plans:
            t1 = time.time()
            program = cap.partition(plan=plan)
            partition_s = time.time() - t1
            t2 = time.time()
            table = concerto.compare(program, cluster=args.cluster)
            compare_s = time.time() - t2
            print("%s %s: partitioned in %.1f s, compared in %.1f s" % (name, plan, partition_s, compare_s),
                  file=sys.stderr)
            out.append({"model": name, "plan": plan, "cluster": args.cluster, "batch": args.batch,
                        "ops": program.num_ops, "capture_s": capture_s, "partition_s": partition_s,
                        "compare_s": compare_s, "compare": table})
    if args.json:
        print(json.dumps({"tables": out}))
        return
    for row in out:
        runs = {r["scheduler"]: r for r in row["compare"]["results"]}
        best = min((r for k, r in runs.items() if k != "concerto"), key=lambda r: r["makespan_us"])
        print("\n%s, %s, global batch %d (bf16), %s: %d ops per rank; capture %.1f s + partition %.1f s + "
              "compare %.1f s\n" % (row["model"], row["plan"], row["batch"], row["cluster"], row["ops"],
                                    row["capture_s"], row["partition_s"], row["compare_s"]))
        print("| scheduler | step (ms) | vs concerto | peak memory (GiB) |")
        print("|---|---|---|---|")
        for k, r in runs.items():
            mem = r.get("peak_memory_bytes", 0) / 2**30
            print("| %s | %.2f | %.3fx | %.2f |" % (k, r["makespan_us"] / 1e3, r["makespan_us"] / runs["concerto"]["makespan_us"], mem))
        print("\nconcerto vs the best baseline (%s): %.3fx" % (best["scheduler"], best["makespan_us"] / runs["concerto"]["makespan_us"]))


if __name__ == "__main__":
    main()
