#!/usr/bin/env python3
"""What the torch engine (concerto.engine) costs per op on the host, against the same kernels
called directly and against the C++ runtime (docs/results.md, "The torch engine").

1. A chain of N tiny ops (`add` of two [8] tensors, one rank, one stream): the engine's step time
   per op, the torch kernels alone per op (the same run_kernel calls in a loop), and the C++
   runtime's step per op (`concerto run --in-process`, the median of its iterations).
2. The presets gpt-tiny and llama-tiny (one rank, fifo): the engine's step against the kernels
   alone and the C++ runtime, and the share of the step the engine's own bookkeeping takes.

Side by side in one process (the C++ runtime through the CLI, in turn with the others), medians
of --reps; ratios printed, and one JSON object with --json. Run on a quiet machine:

    PYTHONPATH=build/python $(bash scripts/setup_torch.sh) scripts/engine_overhead.py --cli build/concerto
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import concerto
from concerto import torch_kernels
from concerto.engine import Engine


def chain_program(n):
    tensors = [{"name": "x0", "shape": [8], "dtype": "f32"}, {"name": "b", "shape": [8], "dtype": "f32"}]
    ops = []
    for i in range(n):
        tensors.append({"name": "x%d" % (i + 1), "shape": [8], "dtype": "f32"})
        ops.append({"id": i, "name": "add%d" % i, "kind": "compute", "type": "add", "inputs": ["x%d" % i, "b"],
                    "outputs": ["x%d" % (i + 1)], "flops": 8})
    return concerto.parse_program(json.dumps({"format": "concerto-ir", "version": 1, "name": "chain%d" % n,
                                              "mesh": {"axes": []}, "graphs": [{"name": "main", "tensors": tensors,
                                                                                "ops": ops}]}))


def engine_and_kernels(program, model, reps):
    """(median engine step s, median kernels-alone s, ops)."""
    program, schedule = concerto.schedule(program, scheduler="fifo")
    eng = Engine(program, schedule, model=model)
    for _ in range(2):
        eng.step()
    steps = [eng.step().time_s for _ in range(reps)]
    values, calls = dict(eng.state), []
    for op in eng.ops:
        if op.kind != "compute":
            continue
        ins = [values[i] for i in op.d["inputs"]]
        for name, v in zip(op.d["outputs"], torch_kernels.run_kernel(op.d, ins, op.ctx)):
            values[name] = v
        calls.append((op, ins))
    alone = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for op, ins in calls:
            torch_kernels.run_kernel(op.d, ins, op.ctx)
        alone.append(time.perf_counter() - t0)
    eng.close()
    return statistics.median(steps), statistics.median(alone), len(eng.ops)


def cpp_runtime(cli, program_or_model, reps):
    """The C++ runtime's median iteration (s), one rank in process."""
    if not cli:
        return None
    args = [cli, "run", "--in-process", "--iterations", str(reps), "--warmup", "2", "--json"]
    if os.path.exists(program_or_model):
        args.insert(2, program_or_model)
    else:
        args += ["--model", program_or_model]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["median_iteration_us"] / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=2000, help="length of the chain (default 2000)")
    ap.add_argument("--reps", type=int, default=10, help="repetitions, median reported (default 10)")
    ap.add_argument("--cli", default="", help="the concerto CLI, for the C++ runtime's figures")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    chain = chain_program(a.ops)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "chain.json")
        chain.write(path)
        step, alone, n = engine_and_kernels(chain, "", a.reps)
        cpp = cpp_runtime(a.cli, path, a.reps)
    out["chain"] = {"ops": n, "engine_us_per_op": step / n * 1e6, "kernels_alone_us_per_op": alone / n * 1e6,
                    "engine_overhead_us_per_op": (step - alone) / n * 1e6,
                    "cpp_runtime_us_per_op": cpp / n * 1e6 if cpp else None}
    print("chain of %d adds: engine %.1f us/op, torch kernels alone %.1f us/op, engine's own %.1f us/op%s"
          % (n, step / n * 1e6, alone / n * 1e6, (step - alone) / n * 1e6,
             ", C++ runtime %.1f us/op" % (cpp / n * 1e6) if cpp else ""), file=sys.stderr)
    for model in ("gpt-tiny", "llama-tiny"):
        step, alone, n = engine_and_kernels(concerto.lower(model), model, a.reps)
        cpp = cpp_runtime(a.cli, model, a.reps)
        out[model] = {"ops": n, "engine_step_ms": step * 1e3, "kernels_alone_ms": alone * 1e3,
                      "engine_overhead_share": (step - alone) / step, "cpp_runtime_step_ms": cpp * 1e3 if cpp else None,
                      "engine_over_cpp_runtime": step / cpp if cpp else None}
        print("%s (%d ops): engine %.1f ms, kernels alone %.1f ms (engine's own share %.1f%%)%s"
              % (model, n, step * 1e3, alone * 1e3, 100 * (step - alone) / step,
                 ", C++ runtime %.1f ms (engine / runtime %.2fx)" % (cpp * 1e3, step / cpp) if cpp else ""),
              file=sys.stderr)
    if a.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
