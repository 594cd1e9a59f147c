#!/usr/bin/env python3
"""A prepared check for the few minutes a GPU (H100 or H200, torch 2.x) is lent: measures what the
CPU cannot and writes it where docs/validation.md can take it. Run it through
scripts/device_check.sh (which picks the interpreter and sets PYTHONPATH to the build's module):

    bash scripts/device_check.sh [--dry-run] [--out DIR] [--build DIR]

Parts (expected time on one H100 SXM, from arithmetic on its datasheet figures, not yet measured;
the whole run is meant to stay under 10 minutes, and `--budget-s` (default 540) skips what would
start after it):

1. The torch engine on the device (concerto.engine.Engine), about 30-60 s including CUDA's and
   cuBLAS's start: gpt-tiny and llama-tiny lowered under dp=2 (llama-tiny also dp=2,zero=1), the
   mesh rewritten to one rank so every collective's group is the rank alone, which the engine runs
   as a copy on the collective's own CUDA stream (engine.py, `_collective`, n == 1): "a comm stream
   running copies stands in for NCCL". Each program scheduled with concerto and fifo, 5 steps on
   the device and 5 on the CPU from the same program, schedule and initialisation (the engine's
   default seed), TF32 off: the per-step losses must agree to a relative 1e-3. One run per program
   in dtype "ir" (bf16 tensors in bf16) on the device: losses finite and the first within 5% of
   fp32's.
2. GEMM efficiency across shapes, about 15-30 s: torch.matmul timed with CUDA events (warm-up,
   the median of >= 10 repetitions, each a batch of launches queued behind a spin kernel so the
   host's launch time is not measured), achieved TFLOP/s and efficiency against the h100-8x8
   preset's peak, beside the cost model's price of the same GEMM as a one-op IR program
   (`concerto.simulate(..., cluster="h100-8x8")["makespan_us"]`).
3. A GEMM beside a copy, about 10-20 s: a bf16 8192^3 GEMM timed alone and while another stream
   runs back-to-back copies (device to device, 1 GiB; pinned host to device, 512 MiB; and an
   elementwise kernel streaming 1 GiB on the SMs), slowdown = beside / alone - 1, with the copy's
   GB/s alone and beside, against the preset's `interference` (docs/cost-model.md, "Compute
   interference").
4. OUT/h100_profile.json: the measured GEMMs and interference as a profile-like record for the cost
   model (not read by any code yet).

Everything goes into OUT/device_check.json (one object, units in the field names) and
OUT/device_check.md (a section for docs/validation.md). Progress goes to stderr.

`--dry-run` forces the CPU with tiny sizes and few repetitions (CI: syntax and the CPU path, under
a minute): part 1 runs the engine on the CPU twice (still checking equality), part 2 times three
tiny shapes with time.perf_counter (the same cost-model call), part 3 runs a small GEMM beside a
copying thread (host to device is skipped). Exit status: 0 when every check passed, 1 when one
failed or a part raised, 2 without a CUDA device and without --dry-run.
"""

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The h100-8x8 preset as docs/cost-model.md ("h100-8x8") states it. The library does not expose a
# preset's fields to Python; `interference` is also read back from the simulator (part 3).
PRESET = {
    "name": "h100-8x8",
    "peak_tflops_bf16": 989.0,
    "peak_tflops_fp32": 67.0,
    "matmul_efficiency": 0.80,
    "gemm_ramp_k": 256,
    "sm_count": 132,
    "launch_overhead_us": 4.0,
    "memory_bandwidth_gbps": 3350.0,
    "memory_efficiency": 0.85,
    "interference": 0.2,
    "interference_growth": 1.0,
    "source": "docs/cost-model.md, the h100-8x8 table",
}

# Part 3's GEMM side (bf16 m = n = k) and copy sizes (bytes; host to device copies half).
INTERFERENCE_GEMM = 8192
INTERFERENCE_COPY_BYTES = 1 << 30
INTERFERENCE_GEMMS = 40

ENGINE_CASES = [("gpt-tiny", "dp=2"), ("llama-tiny", "dp=2"), ("llama-tiny", "dp=2,zero=1")]
ENGINE_SCHEDULERS = ["concerto", "fifo"]
ENGINE_TOLERANCE_REL = 1e-3   # device vs CPU losses, TF32 off
IR_DTYPE_TOLERANCE_REL = 0.05  # dtype "ir" (bf16) first loss vs fp32's


def log(msg):
    print("device_check: " + msg, file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rel_diff(a, b):
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return float("inf")
    return abs(a - b) / max(abs(b), 1e-12)


def fmt(x, spec="%.3g"):
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return spec % x


def git_commit():
    try:
        out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        sha = out.stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class Budget:
    """The run's wall-clock budget: a part (or a GEMM shape) that would start after it is skipped."""

    def __init__(self, seconds):
        self.start = time.perf_counter()
        self.seconds = seconds

    def elapsed(self):
        return time.perf_counter() - self.start

    def left(self):
        return self.seconds - self.elapsed()


# ---- part 1: the engine ----------------------------------------------------------------------------

def one_rank_program(concerto, model, plan):
    """`model` lowered under `plan`, its mesh rewritten to one rank: (program, how it was rewritten).

    First only the mesh (every axis of size 1) and the roles (rank 0); a program whose local shapes
    then no longer fit its collectives (ZeRO's reduce_scatter / all_gather: the IR's shapes are per
    rank) also has every sharded dim multiplied by the sizes of its axes, i.e. each tensor takes its
    global shape, and the one rank runs the whole global batch."""
    d = concerto.lower(model, plan).to_dict()
    sizes = {a["name"]: int(a["size"]) for a in d["mesh"]["axes"]}
    roles = d.get("roles") or []
    if len(roles) > 1:
        raise RuntimeError("%s under %s has %d roles; the one-rank rewrite takes SPMD programs" % (model, plan, len(roles)))

    def rewrite(scale_shapes):
        one = json.loads(json.dumps(d))
        one["mesh"]["axes"] = [dict(a, size=1) for a in one["mesh"]["axes"]]
        if roles:
            one["roles"] = [dict(r, ranks=[0]) for r in one["roles"]]
        if scale_shapes:
            for g in one["graphs"]:
                for t in g["tensors"]:
                    for i, axes in enumerate(t.get("sharding") or []):
                        for a in axes:
                            t["shape"][i] *= sizes[a]
        return concerto.parse_program(json.dumps(one), "%s:%s:one-rank" % (model, plan))

    try:
        p, how = rewrite(False), "mesh"
    except concerto.Error:
        p, how = rewrite(True), "mesh+global-shapes"
    problems = p.verify()
    if problems:
        raise RuntimeError("one-rank %s %s does not verify: %s" % (model, plan, "; ".join(problems[:3])))
    if p.num_ranks != 1:
        raise RuntimeError("one-rank %s %s has %d ranks" % (model, plan, p.num_ranks))
    return p, how


def run_engine(torch, Engine, prog, sched, device, dtype, model, steps):
    """`steps` steps of a fresh engine: (losses, step times in ms, facts about the engine)."""
    e = Engine(prog, sched, device=device, dtype=dtype, model=model)
    try:
        if e.cuda:
            # The engine's streams do not wait for the default stream, on which its constructor
            # copied the state to the device (see the report); make that copy finish first.
            torch.cuda.synchronize(e.device)
        facts = {
            "collective_group_sizes": sorted({len(op.group) for op in e.ops if op.kind == "collective"}),
            "ir_streams": list(e.stream_names),
            "cuda_streams": sorted(getattr(e, "cuda_streams", {}).keys()) if e.cuda else [],
        }
        losses, times = [], []
        for _ in range(steps):
            r = e.step()
            losses.append(None if r.loss is None else float(r.loss))
            times.append(r.time_s * 1e3)
        return losses, times, facts
    finally:
        e.close()


def part_engine(ctx):
    torch, concerto = ctx.torch, ctx.concerto
    from concerto.engine import Engine
    steps = 3 if ctx.dry else 5
    dev = ctx.device
    out = {"steps": steps, "device": dev, "reference_device": "cpu", "tolerance_rel": ENGINE_TOLERANCE_REL,
           "ir_dtype_tolerance_rel": IR_DTYPE_TOLERANCE_REL, "tf32": False, "runs": [], "ir_dtype": [],
           "ok": True}
    for model, plan in ENGINE_CASES:
        t0 = time.perf_counter()
        prog1, how = one_rank_program(concerto, model, plan)
        f32_first = None
        for sname in ENGINE_SCHEDULERS:
            if ctx.budget.left() < 30:
                out["runs"].append({"model": model, "plan": plan, "scheduler": sname, "ok": False,
                                    "error": "skipped: out of the time budget"})
                out["ok"] = False
                continue
            ts = time.perf_counter()
            prog, sched = concerto.schedule(prog1, cluster=PRESET["name"], scheduler=sname)
            schedule_s = time.perf_counter() - ts
            ops = prog.to_dict()["graphs"][0]["ops"]
            cols = [o for o in ops if o["kind"] == "collective"]
            run = {"model": model, "plan": plan, "scheduler": sname, "rewrite": how, "num_ops": len(ops),
                   "num_collectives": len(cols), "collectives": sorted({o["collective"] for o in cols}),
                   "collective_streams": sorted({o.get("stream", "comm") for o in cols}),
                   "schedule_s": schedule_s}
            try:
                dl, dt, facts = run_engine(torch, Engine, prog, sched, dev, "f32", model, steps)
                rl, rt, _ = run_engine(torch, Engine, prog, sched, "cpu", "f32", model, steps)
                diff = max(rel_diff(a, b) for a, b in zip(dl, rl)) if dl else float("inf")
                run.update(facts)
                run.update({"device_losses": dl, "reference_losses": rl, "max_rel_loss_diff": diff,
                            "device_step_ms": dt, "reference_step_ms": rt,
                            "device_step_ms_median": median(dt), "reference_step_ms_median": median(rt),
                            "device_first_step_ms": dt[0] if dt else None})
                problems = []
                if not all(x is not None and math.isfinite(x) for x in dl + rl):
                    problems.append("a loss is missing or not finite")
                if not diff <= ENGINE_TOLERANCE_REL:
                    problems.append("device and CPU losses differ by %.3g (relative), over %g"
                                    % (diff, ENGINE_TOLERANCE_REL))
                if run["num_collectives"] and run["collective_group_sizes"] != [1]:
                    problems.append("collective groups of sizes %s, not the rank alone" % run["collective_group_sizes"])
                run["ok"] = not problems
                if problems:
                    run["error"] = "; ".join(problems)
                if sname == "concerto":
                    f32_first = dl[0] if dl else None
                log("engine: %s %s %s (%s, %d collectives): %s losses %s, cpu %s, max rel diff %.2g, "
                    "median step %.1f ms on %s, %.1f ms on cpu%s"
                    % (model, plan, sname, how, len(cols), dev, ["%.5f" % x for x in dl], ["%.5f" % x for x in rl],
                       diff, median(dt), dev, median(rt), "" if run["ok"] else "  FAILED: " + run["error"]))
            except Exception as e:  # the other runs go on; the failure is recorded
                run.update({"ok": False, "error": "%s: %s" % (type(e).__name__, e),
                            "traceback": traceback.format_exc()})
                log("engine: %s %s %s FAILED: %s" % (model, plan, sname, run["error"]))
            out["ok"] &= run["ok"]
            out["runs"].append(run)

        # dtype "ir": bf16 tensors in bf16 on the device (concerto's schedule).
        if ctx.budget.left() < 30:
            out["ir_dtype"].append({"model": model, "plan": plan, "ok": False, "error": "skipped: out of the time budget"})
            out["ok"] = False
            continue
        ir = {"model": model, "plan": plan, "scheduler": "concerto", "device": dev, "rewrite": how}
        try:
            prog, sched = concerto.schedule(prog1, cluster=PRESET["name"], scheduler="concerto")
            il, it, _ = run_engine(torch, Engine, prog, sched, dev, "ir", model, steps)
            finite = all(x is not None and math.isfinite(x) for x in il)
            first = rel_diff(il[0], f32_first) if il and f32_first is not None else float("inf")
            ir.update({"losses": il, "finite": finite, "f32_first_loss": f32_first,
                       "rel_diff_first_loss_vs_f32": first, "step_ms": it, "step_ms_median": median(it)})
            ir["ok"] = finite and first <= IR_DTYPE_TOLERANCE_REL
            if not ir["ok"]:
                ir["error"] = ("a loss is not finite" if not finite else
                               "first loss %.3g relative from fp32's, over %g" % (first, IR_DTYPE_TOLERANCE_REL))
            log("engine: %s %s dtype ir on %s: losses %s, first %.2g from fp32's, median step %.1f ms%s"
                % (model, plan, dev, ["%.4f" % x for x in il], first, median(it),
                   "" if ir["ok"] else "  FAILED: " + ir["error"]))
        except Exception as e:
            ir.update({"ok": False, "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()})
            log("engine: %s %s dtype ir FAILED: %s" % (model, plan, ir["error"]))
        out["ok"] &= ir["ok"]
        out["ir_dtype"].append(ir)
        log("engine: %s %s done in %.1f s" % (model, plan, time.perf_counter() - t0))
    return out


# ---- part 2: GEMMs -----------------------------------------------------------------------------------

def gemm_shapes(dry):
    """(label, m, n, k, dtype)."""
    if dry:
        return [("square", 64, 64, 64, "bf16"), ("k small", 256, 128, 64, "bf16"), ("square f32", 256, 256, 256, "f32")]
    shapes = [("square", s, s, s, "bf16") for s in (1024, 2048, 4096, 8192)]
    shapes += [("tall-skinny", 16384, 1024, 1024, "bf16"), ("tall-skinny", 65536, 1024, 1024, "bf16"),
               ("tall-skinny", 16384, 1024, 4096, "bf16")]
    for h in (1024, 4096, 8192):
        for t in (4096, 8192):
            shapes.append(("fc1 h=%d t=%d" % (h, t), t, 4 * h, h, "bf16"))   # tokens x 4h, depth h
            shapes.append(("fc2 h=%d t=%d" % (h, t), t, h, 4 * h, "bf16"))   # tokens x h, depth 4h
    shapes += [("k ramp", 8192, 8192, k, "bf16") for k in (64, 128, 256, 1024)]
    shapes += [("square f32 (TF32 off)", s, s, s, "f32") for s in (4096, 8192)]
    return shapes


def gemm_program(m, n, k, dtype):
    """The one-op IR program of c[m, n] = a[m, k] @ b[k, n] (docs/ir.md section 2)."""
    elt = 2 if dtype == "bf16" else 4
    return {
        "format": "concerto-ir", "version": 1, "name": "gemm_%dx%dx%d_%s" % (m, n, k, dtype),
        "mesh": {"axes": []},
        "graphs": [{
            "name": "main", "streams": ["compute", "comm"],
            "tensors": [{"name": "a", "shape": [m, k], "dtype": dtype},
                        {"name": "b", "shape": [k, n], "dtype": dtype},
                        {"name": "c", "shape": [m, n], "dtype": dtype}],
            "ops": [{"id": 0, "name": "gemm", "kind": "compute", "stream": "compute", "type": "matmul",
                     "inputs": ["a", "b"], "outputs": ["c"], "flops": 2 * m * n * k,
                     "bytes": elt * (m * k + k * n + m * n)}],
        }],
    }


def predicted_us(concerto, m, n, k, dtype):
    p = concerto.parse_program(json.dumps(gemm_program(m, n, k, dtype)), "gemm")
    return float(concerto.simulate(p, cluster=PRESET["name"], scheduler="fifo")["makespan_us"])


def time_cuda(torch, fn, min_reps=10, target_s=0.25):
    """Median time of one fn() in us from CUDA events: each repetition times a batch of launches
    queued behind a spin kernel (so the host's launch time is hidden), after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    est_us = max(s.elapsed_time(e) * 1e3, 1.0)
    inner = int(min(200, max(1, math.ceil(200.0 / est_us))))
    reps = int(max(min_reps, min(50, target_s * 1e6 / (inner * est_us))))
    sleep_cycles = int((50 + 15 * inner) * 2000)  # ~2 GHz: 50 us + 15 us per queued launch
    pairs = []
    for _ in range(reps):
        torch.cuda._sleep(sleep_cycles)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return median([a.elapsed_time(b) * 1e3 / inner for a, b in pairs]), reps, inner


def time_cpu(fn, min_reps=5, target_s=0.05):
    fn()
    t = time.perf_counter()
    fn()
    est = max(time.perf_counter() - t, 1e-6)
    reps = int(max(min_reps, min(20, target_s / est)))
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    return median(ts), reps, 1


def part_gemm(ctx):
    torch, concerto = ctx.torch, ctx.concerto
    dev = ctx.device
    out = {"timing": "perf_counter" if ctx.dry else "cuda_events", "min_reps": 5 if ctx.dry else 10,
           "preset": PRESET["name"], "shapes": [], "ok": True}
    torch.manual_seed(0)
    for label, m, n, k, dtype in gemm_shapes(ctx.dry):
        row = {"label": label, "m": m, "n": n, "k": k, "dtype": dtype, "flops": 2 * m * n * k}
        if ctx.budget.left() < 60:
            row.update({"ok": False, "error": "skipped: out of the time budget"})
            out["shapes"].append(row)
            out["ok"] = False
            continue
        try:
            tdt = torch.bfloat16 if dtype == "bf16" else torch.float32
            a = torch.randn(m, k, device=dev, dtype=tdt)
            b = torch.randn(k, n, device=dev, dtype=tdt)
            c = torch.empty(m, n, device=dev, dtype=tdt)

            def fn():
                torch.matmul(a, b, out=c)

            us, reps, inner = time_cuda(torch, fn) if dev == "cuda" else time_cpu(fn)
            del a, b, c
            peak = PRESET["peak_tflops_bf16"] if dtype == "bf16" else PRESET["peak_tflops_fp32"]
            tflops = row["flops"] / (us * 1e-6) / 1e12
            pred = predicted_us(concerto, m, n, k, dtype)
            kernel = max(pred - PRESET["launch_overhead_us"], 1e-9)
            row.update({"measured_us": us, "reps": reps, "launches_per_rep": inner, "achieved_tflops": tflops,
                        "efficiency_vs_peak": tflops / peak, "peak_tflops": peak, "predicted_us": pred,
                        "predicted_kernel_us": kernel,
                        "model_efficiency": row["flops"] / (kernel * 1e-6) / 1e12 / peak,
                        "predicted_over_measured": pred / us, "ok": True})
            log("gemm: %-22s %6d x %6d x %6d %-4s %10.1f us %7.1f TFLOP/s (%.2f of peak), model %10.1f us, "
                "ratio %.2f" % (label, m, n, k, dtype, us, tflops, tflops / peak, pred, pred / us))
        except Exception as e:
            row.update({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
            out["ok"] = False
            log("gemm: %s %dx%dx%d FAILED: %s" % (label, m, n, k, row["error"]))
        finally:
            if dev == "cuda":
                torch.cuda.empty_cache()
        out["shapes"].append(row)
    ok = [r for r in out["shapes"] if r.get("ok")]
    out["median_predicted_over_measured"] = median([r["predicted_over_measured"] for r in ok])
    out["median_predicted_over_measured_bf16"] = median([r["predicted_over_measured"] for r in ok if r["dtype"] == "bf16"])
    out["median_predicted_kernel_over_measured"] = median([r["predicted_kernel_us"] / r["measured_us"] for r in ok])
    return out


# ---- part 3: a kernel beside a copy --------------------------------------------------------------------

def model_interference(concerto):
    """The simulator's compute slowdown with one collective in flight on h100-8x8: an 8192^3 GEMM
    alone and beside an all_reduce that outlasts it (two ranks), compute busy time beside / alone - 1."""
    def prog(with_ar):
        m = n = k = 8192
        g = gemm_program(m, n, k, "bf16")
        if with_ar:
            g["mesh"]["axes"] = [{"name": "dp", "size": 2}]
            gr = g["graphs"][0]
            gr["tensors"] += [{"name": "g", "shape": [1 << 31], "dtype": "bf16"},
                              {"name": "g2", "shape": [1 << 31], "dtype": "bf16"}]
            gr["ops"].append({"id": 1, "name": "ar", "kind": "collective", "stream": "comm",
                              "collective": "all_reduce", "group": {"axes": ["dp"]},
                              "inputs": ["g"], "outputs": ["g2"]})
        return concerto.parse_program(json.dumps(g), "interference")

    alone = concerto.simulate(prog(False), cluster=PRESET["name"], scheduler="fifo")
    beside = concerto.simulate(prog(True), cluster=PRESET["name"], scheduler="fifo")
    if beside["comm_busy_us"] < beside["compute_busy_us"]:
        return None  # the collective did not outlast the GEMM: no clean reading
    return beside["compute_busy_us"] / alone["compute_busy_us"] - 1


def _beside_cuda(torch, gemm, copy, copy_bytes, n_gemm, t_gemm_us, t_copy_us):
    """GEMMs on one stream while `copy` runs back to back on another, the copies queued first and
    outlasting the GEMMs: (median GEMM us, copy GB/s inside the GEMMs' window, coverage)."""
    A, B = torch.cuda.Stream(), torch.cuda.Stream()
    k = int(math.ceil((n_gemm * t_gemm_us * 1.5 + 5000.0) / max(t_copy_us, 1.0))) + 2
    torch.cuda.synchronize()
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    with torch.cuda.stream(B):
        ce = [ev()]
        ce[0].record(B)
        for _ in range(k):
            copy()
            e = ev()
            e.record(B)
            ce.append(e)
    with torch.cuda.stream(A):
        ge = [ev()]
        ge[0].record(A)
        for _ in range(n_gemm):
            gemm()
            e = ev()
            e.record(A)
            ge.append(e)
    torch.cuda.synchronize()
    t = lambda e: ce[0].elapsed_time(e) * 1e3  # noqa: E731  us since the first copy began
    g0, g1 = t(ge[0]), t(ge[-1])
    c1 = t(ce[-1])
    coverage = max(0.0, min(c1, g1) - max(0.0, g0)) / max(g1 - g0, 1e-9)
    gemm_us = median([ge[i].elapsed_time(ge[i + 1]) * 1e3 for i in range(n_gemm)])
    inside = [(t(ce[i]), t(ce[i + 1])) for i in range(k) if t(ce[i]) >= g0 and t(ce[i + 1]) <= g1]
    gbps = (len(inside) * copy_bytes / (sum(b - a for a, b in inside) * 1e-6) / 1e9) if inside else None
    return gemm_us, gbps, coverage, k, len(inside)


def _time_alone_cuda(torch, fn, reps, warmup):
    """Median microseconds of `fn` on a stream of its own, timed by CUDA events between calls."""
    s = torch.cuda.Stream()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        evs[0].record(s)
        for i in range(reps):
            fn()
            evs[i + 1].record(s)
    torch.cuda.synchronize()
    return median([evs[i].elapsed_time(evs[i + 1]) * 1e3 for i in range(reps)])


def _copy_alone_cuda(torch, copy, copy_bytes, reps=5):
    us = _time_alone_cuda(torch, copy, reps, warmup=1)
    return us, copy_bytes / (us * 1e-6) / 1e9


def _gemm_alone_cuda(torch, gemm, n):
    return _time_alone_cuda(torch, gemm, n, warmup=3)


def part_interference_cuda(ctx, out):
    torch = ctx.torch
    m = n = k = INTERFERENCE_GEMM
    out["gemm"] = {"m": m, "n": n, "k": k, "dtype": "bf16"}
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def gemm():
        torch.matmul(a, b, out=c)

    n_gemm = INTERFERENCE_GEMMS
    alone = _gemm_alone_cuda(torch, gemm, n_gemm)
    out["gemm_alone_us"] = alone
    log("interference: bf16 %d^3 GEMM alone %.1f us" % (m, alone))
    gib = INTERFERENCE_COPY_BYTES
    variants = []
    src = torch.empty(gib, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    variants.append(("copy_d2d", "dst.copy_(src), %d MiB device to device" % (gib >> 20), gib, lambda: dst.copy_(src)))
    hsrc = torch.empty(gib // 2, dtype=torch.uint8, pin_memory=True).fill_(7)
    hdst = torch.empty(gib // 2, dtype=torch.uint8, device="cuda")
    variants.append(("copy_h2d", "dst.copy_(src, non_blocking=True), %d MiB pinned host to device" % (gib >> 21),
                     gib // 2,
                     lambda: hdst.copy_(hsrc, non_blocking=True)))
    fsrc = src.view(torch.bfloat16)
    fdst = dst.view(torch.bfloat16)
    variants.append(("kernel_copy", "torch.neg(src, out=dst), %d MiB bf16: an elementwise kernel on the SMs"
                     % (gib >> 20), gib,
                     lambda: torch.neg(fsrc, out=fdst)))
    for key, what, nbytes, copy in variants:
        if ctx.budget.left() < 30:
            out[key] = {"ok": False, "error": "skipped: out of the time budget"}
            continue
        try:
            t_copy, gbps_alone = _copy_alone_cuda(torch, copy, nbytes)
            beside, gbps_beside, coverage, n_copies, n_inside = _beside_cuda(torch, gemm, copy, nbytes, n_gemm, alone,
                                                                             t_copy)
            again = _gemm_alone_cuda(torch, gemm, n_gemm)  # the GEMM's speed has not drifted meanwhile
            r = {"what": what, "copy_bytes": nbytes, "copy_alone_us": t_copy, "copy_alone_gbps": gbps_alone,
                 "copy_beside_gbps": gbps_beside, "gemm_beside_us": beside, "gemm_alone_after_us": again,
                 "slowdown": beside / alone - 1, "coverage": coverage, "copies_queued": n_copies,
                 "copies_inside_gemm_window": n_inside, "ok": coverage >= 0.99}
            if not r["ok"]:
                r["error"] = "the copies covered %.0f%% of the GEMMs' window" % (100 * coverage)
            out[key] = r
            log("interference: beside %s: GEMM %.1f us (slowdown %+.3f), copy %.1f GB/s alone, %s GB/s beside, "
                "coverage %.2f" % (key, beside, r["slowdown"], gbps_alone, fmt(gbps_beside, "%.1f"), coverage))
        except Exception as e:
            out[key] = {"what": what, "ok": False, "error": "%s: %s" % (type(e).__name__, e)}
            log("interference: %s FAILED: %s" % (key, out[key]["error"]))
    del src, dst, hsrc, hdst, a, b, c
    torch.cuda.empty_cache()


def part_interference_cpu(ctx, out):
    """The dry run's version: a small GEMM timed alone and while a thread copies (torch releases the
    GIL in both); host to device has no meaning here."""
    torch = ctx.torch
    m = n = k = 256
    out["gemm"] = {"m": m, "n": n, "k": k, "dtype": "f32"}
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.empty(m, n)

    def gemm():
        torch.matmul(a, b, out=c)

    reps = 20

    def time_gemms():
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            gemm()
            ts.append((time.perf_counter() - t) * 1e6)
        return median(ts)

    gemm()
    alone = time_gemms()
    out["gemm_alone_us"] = alone
    nbytes = 16 << 20
    src = torch.empty(nbytes, dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the pages touched before the copy is timed
    t = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    gbps_alone = 5 * nbytes / (time.perf_counter() - t) / 1e9
    stop, count = threading.Event(), [0]

    def copier():
        while not stop.is_set():
            dst.copy_(src)
            count[0] += 1

    th = threading.Thread(target=copier, daemon=True)
    th.start()
    time.sleep(0.01)
    c0, t0 = count[0], time.perf_counter()
    beside = time_gemms()
    c1, t1 = count[0], time.perf_counter()
    stop.set()
    th.join()
    out["copy_d2d"] = {"what": "a thread running dst.copy_(src), 16 MiB host memory (dry run)", "copy_bytes": nbytes,
                       "copy_alone_gbps": gbps_alone, "copy_beside_gbps": (c1 - c0) * nbytes / (t1 - t0) / 1e9,
                       "gemm_beside_us": beside, "slowdown": beside / alone - 1, "coverage": 1.0, "ok": True}
    out["copy_h2d"] = {"ok": True, "skipped": "skipped on CPU"}
    out["kernel_copy"] = {"ok": True, "skipped": "skipped on CPU"}
    log("interference (dry run, CPU threads): GEMM %.1f us alone, %.1f us beside a copying thread (%+.3f)"
        % (alone, beside, beside / alone - 1))


def part_interference(ctx):
    out = {"preset": PRESET["name"], "model_interference": PRESET["interference"],
           "model_interference_growth": PRESET["interference_growth"]}
    try:
        out["model_interference_simulated"] = model_interference(ctx.concerto)
    except Exception as e:
        out["model_interference_simulated"] = None
        out["model_interference_simulated_error"] = "%s: %s" % (type(e).__name__, e)
    if ctx.dry:
        out["mode"] = "dry run: CPU threads, not a GPU figure"
        part_interference_cpu(ctx, out)
    else:
        out["mode"] = "cuda streams"
        part_interference_cuda(ctx, out)
    out["ok"] = all(out.get(key, {}).get("ok", False) for key in ("copy_d2d", "copy_h2d", "kernel_copy"))
    return out


# ---- the report ------------------------------------------------------------------------------------------

def profile_record(res):
    gemm = res["parts"].get("gemm") or {}
    inter = res["parts"].get("interference") or {}

    def slow(key):
        r = inter.get(key) or {}
        return r.get("slowdown") if r.get("ok") and "slowdown" in r else None

    return {
        "format": "concerto-device-profile",
        "note": "a measured record for the cost model (scripts/device_check.py); not read by any code yet",
        "device": res["device"]["name"],
        "dry_run": res["dry_run"],
        "date_utc": res["date_utc"],
        "torch_version": res["torch_version"],
        "gemm": [{k: r.get(k) for k in ("m", "n", "k", "dtype", "measured_us", "achieved_tflops",
                                        "efficiency_vs_peak", "predicted_us")}
                 for r in gemm.get("shapes", []) if r.get("ok")],
        "interference_copy_d2d": slow("copy_d2d"),
        "interference_copy_h2d": slow("copy_h2d"),
        "interference_kernel_copy": slow("kernel_copy"),
        "compared_with": {"preset": PRESET["name"], "interference": PRESET["interference"]},
    }


def markdown(res):
    dev = res["device"]
    L = []
    title = ("dry run on the CPU, " if res["dry_run"] else "") + dev["name"]
    L.append("## Device check: %s, %s" % (title, res["date_utc"][:10]))
    L.append("")
    L.append("Measured by `scripts/device_check.sh%s` on %s, torch %s%s, %s, commit %s; %.0f s in all. "
             "Cost-model figures are the `%s` preset's (docs/cost-model.md)%s."
             % (" --dry-run" if res["dry_run"] else "", dev["name"], res["torch_version"],
                ", CUDA %s" % res["cuda_version"] if res.get("cuda_version") else "", res["date_utc"],
                res.get("git_commit") or "?", res["total_s"], PRESET["name"],
                "" if "H100" in dev["name"] or res["dry_run"] else
                "; this device is not an H100, its figures are reported against the H100 preset all the same"))
    if res["dry_run"]:
        L.append("")
        L.append("**Dry run**: CPU, tiny sizes, few repetitions; it checks the script, not a device. "
                 "No figure below is a GPU's.")
    L.append("")
    L.append("Result: **%s**%s" % ("pass" if res["ok"] else "FAIL",
                                    "" if res["ok"] else " (" + "; ".join(res["failures"][:6]) + ")"))

    eng = res["parts"].get("engine")
    L += ["", "### 1. The torch engine on the device", ""]
    if eng and "runs" in eng:
        L.append("One-rank programs (the dp=2 lowering with its mesh rewritten to one rank: every collective "
                 "runs as a copy on its own stream), %d steps on `%s` against the same program, schedule and "
                 "initialisation on the CPU, fp32 with TF32 off; tolerance: relative %g."
                 % (eng["steps"], eng["device"], eng["tolerance_rel"]))
        L.append("")
        L.append("| model | plan | scheduler | rewrite | collectives | streams | losses on `%s` | max rel. diff vs CPU | "
                 "step ms on `%s` (median) | step ms, CPU reference (median) | ok |" % (eng["device"], eng["device"]))
        L.append("|---|---|---|---|---:|---|---|---:|---:|---:|---|")
        for r in eng["runs"]:
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["model"], r["plan"], r["scheduler"], r.get("rewrite", "-"), r.get("num_collectives", "-"),
                ", ".join(r.get("cuda_streams") or r.get("ir_streams") or []) or "-",
                " ".join("%.5f" % x for x in r.get("device_losses") or []) or "-",
                fmt(r.get("max_rel_loss_diff"), "%.2g"), fmt(r.get("device_step_ms_median"), "%.1f"),
                fmt(r.get("reference_step_ms_median"), "%.1f"), "yes" if r.get("ok") else "**no**: " + r.get("error", "")))
        L.append("")
        L.append("dtype `ir` (the programs' bf16 tensors in bf16), concerto's schedule, on `%s`: "
                 "losses finite and the first within %g%% of fp32's." % (eng["device"], 100 * eng["ir_dtype_tolerance_rel"]))
        L.append("")
        L.append("| model | plan | losses | first loss vs fp32 | step ms (median) | ok |")
        L.append("|---|---|---|---:|---:|---|")
        for r in eng["ir_dtype"]:
            L.append("| %s | %s | %s | %s | %s | %s |" % (
                r["model"], r["plan"], " ".join("%.4f" % x for x in r.get("losses") or []) or "-",
                fmt(r.get("rel_diff_first_loss_vs_f32"), "%.2g"), fmt(r.get("step_ms_median"), "%.1f"),
                "yes" if r.get("ok") else "**no**: " + r.get("error", "")))
    else:
        L.append("Not run: %s" % (eng or {}).get("error", "?"))

    g = res["parts"].get("gemm")
    L += ["", "### 2. GEMM efficiency across shapes", ""]
    if g and "shapes" in g:
        L.append("`torch.matmul(a, b, out=c)`, timed with %s (median of >= %d repetitions after a warm-up); "
                 "efficiency against the preset's peak (bf16 %g, fp32 %g TFLOP/s; fp32 with TF32 off). "
                 "Predicted: `concerto.simulate` of the GEMM as a one-op program on `%s` (matmul_efficiency %.2f "
                 "times the GEMM shape factor, plus a %g us launch); model efficiency is the prediction's without "
                 "the launch."
                 % ("CUDA events" if g["timing"] == "cuda_events" else "time.perf_counter", g["min_reps"],
                    PRESET["peak_tflops_bf16"], PRESET["peak_tflops_fp32"], PRESET["name"],
                    PRESET["matmul_efficiency"], PRESET["launch_overhead_us"]))
        L.append("")
        L.append("| shape | m | n | k | dtype | measured us | TFLOP/s | efficiency vs peak | predicted us | "
                 "model efficiency | predicted / measured |")
        L.append("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
        for r in g["shapes"]:
            if not r.get("ok"):
                L.append("| %s | %d | %d | %d | %s | %s | | | | | |" % (r["label"], r["m"], r["n"], r["k"], r["dtype"],
                                                                     r.get("error", "failed")))
                continue
            L.append("| %s | %d | %d | %d | %s | %.1f | %.1f | %.3f | %.1f | %.3f | %.2f |" % (
                r["label"], r["m"], r["n"], r["k"], r["dtype"], r["measured_us"], r["achieved_tflops"],
                r["efficiency_vs_peak"], r["predicted_us"], r["model_efficiency"], r["predicted_over_measured"]))
        L.append("")
        L.append("Median predicted / measured: %s over all shapes, %s over the bf16 ones (%s without the "
                 "model's launch overhead)." % (fmt(g.get("median_predicted_over_measured"), "%.2f"),
                                                fmt(g.get("median_predicted_over_measured_bf16"), "%.2f"),
                                                fmt(g.get("median_predicted_kernel_over_measured"), "%.2f")))
    else:
        L.append("Not run: %s" % (g or {}).get("error", "?"))

    it = res["parts"].get("interference")
    L += ["", "### 3. A kernel beside a copy", ""]
    if it and "gemm_alone_us" in it:
        ge = it["gemm"]
        L.append("A GEMM (%s, %dx%dx%d) on one stream, alone and while another stream runs copies back to back "
                 "(%s); slowdown = beside / alone - 1. The model's `interference` on `%s` is %g (docs/cost-model.md, "
                 "\"Compute interference\": compute runs at 1 / (1 + f) with one collective in flight, the SMs and "
                 "memory bandwidth NCCL's kernels take; the simulator gives %s for one all_reduce beside a GEMM). "
                 "A copy stands in for NCCL: a device-to-device copy contends for memory bandwidth, a host-to-device "
                 "one for little but the copy engines, neither takes SMs the way NCCL's kernels do; the elementwise "
                 "kernel does."
                 % (ge["dtype"], ge["m"], ge["n"], ge["k"], it["mode"], PRESET["name"], PRESET["interference"],
                    fmt(it.get("model_interference_simulated"), "%.3f")))
        L.append("")
        L.append("| beside | GEMM us alone | GEMM us beside | slowdown | copy GB/s alone | copy GB/s beside | "
                 "coverage | model interference |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for key in ("copy_d2d", "copy_h2d", "kernel_copy"):
            r = it.get(key) or {}
            if r.get("skipped") or not r.get("ok") and "slowdown" not in r:
                L.append("| %s | %.1f | %s | | | | | %g |" % (
                    key, it["gemm_alone_us"], r.get("skipped") or r.get("error", "-"), PRESET["interference"]))
                continue
            flag = "" if r.get("ok") else " (**not ok**: %s)" % r.get("error", "?")
            L.append("| %s: %s%s | %.1f | %.1f | %+.3f | %s | %s | %.2f | %g |" % (
                key, r.get("what", ""), flag, it["gemm_alone_us"], r["gemm_beside_us"], r["slowdown"],
                fmt(r.get("copy_alone_gbps"), "%.1f"), fmt(r.get("copy_beside_gbps"), "%.1f"), r.get("coverage", 0),
                PRESET["interference"]))
    else:
        L.append("Not run: %s" % (it or {}).get("error", "?"))

    L += ["", "### 4. Profile record", ""]
    L.append("`%s` holds the measured GEMMs (shape, dtype, us, TFLOP/s) and the slowdowns beside the copies "
             "(`interference_copy_d2d`, `interference_copy_h2d`) as a profile-like record for the cost model. "
             "No code reads it yet." % os.path.basename(res["files"]["profile"]))
    L.append("")
    return "\n".join(L)


class Context:
    pass


def finite(x):
    """x with every non-finite float replaced by None (JSON has no literal for them)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, few repetitions (CI)")
    ap.add_argument("--out", default=os.path.join(ROOT, "device_check_out"), help="output folder")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="skip what would start after this many seconds (default 540)")
    ap.add_argument("--parts", default="engine,gemm,interference", help="comma-separated parts to run")
    args = ap.parse_args(argv)

    import torch
    if not args.dry_run and not torch.cuda.is_available():
        print("device_check: no CUDA device (use --dry-run for the CPU path)", file=sys.stderr)
        return 2
    try:
        import concerto
    except ImportError as e:
        print("device_check: cannot import concerto (%s); PYTHONPATH must hold the build's python folder "
              "(scripts/device_check.sh sets it from --build)" % e, file=sys.stderr)
        return 1

    ctx = Context()
    ctx.torch, ctx.concerto, ctx.dry = torch, concerto, args.dry_run
    ctx.device = "cpu" if args.dry_run else "cuda"
    # The dry run is bounded by its tiny sizes, not by the clock: no part of it may be skipped
    # because a busy CI machine ran slowly (its test's answer must not depend on wall-clock time).
    ctx.budget = Budget(math.inf if args.dry_run else args.budget_s)
    if args.dry_run:
        # CI machines share their few cores: torch's spinning intra-op threads then take seconds
        # for a step of milliseconds. One thread keeps the dry run under a minute.
        torch.set_num_threads(1)
    # TF32 off for the whole run: part 1's equality and part 2's fp32 GEMMs need it.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)

    if ctx.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        device = {"kind": "cuda", "name": torch.cuda.get_device_name(0),
                  "capability": "%d.%d" % (props.major, props.minor), "sm_count": props.multi_processor_count,
                  "memory_gib": props.total_memory / 2 ** 30}
        torch.cuda.init()
    else:
        device = {"kind": "cpu", "name": "CPU (%s, %d threads)" % (platform.processor() or platform.machine(),
                                                                   torch.get_num_threads())}
    now = datetime.datetime.now(datetime.timezone.utc)
    res = {
        "format": "concerto-device-check", "version": 1, "dry_run": args.dry_run, "device": device,
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda if ctx.device == "cuda" else None,
        "concerto_version": getattr(concerto, "__version__", None), "python_version": platform.python_version(),
        "host": platform.node(), "date_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "git_commit": git_commit(),
        "preset": PRESET, "tf32": False, "budget_s": args.budget_s, "parts": {}, "part_s": {}, "failures": [],
        "files": {"json": os.path.join(args.out, "device_check.json"), "markdown": os.path.join(args.out, "device_check.md"),
                  "profile": os.path.join(args.out, "h100_profile.json")},
    }
    if ctx.device == "cuda" and "H100" not in device["name"]:
        res["preset_note"] = ("%s is not an H100: its figures are reported against the h100-8x8 preset all the same"
                              % device["name"])
    log("%s on %s, torch %s, out %s" % ("dry run" if args.dry_run else "device run", device["name"],
                                         torch.__version__, args.out))

    parts = [("engine", part_engine), ("gemm", part_gemm), ("interference", part_interference)]
    wanted = set(p.strip() for p in args.parts.split(",") if p.strip())
    for name, fn in parts:
        if name not in wanted:
            continue
        t = time.perf_counter()
        if ctx.budget.left() <= 0:
            res["parts"][name] = {"ok": False, "error": "skipped: out of the time budget"}
        else:
            log("part %s ..." % name)
            try:
                res["parts"][name] = fn(ctx)
            except Exception as e:
                res["parts"][name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e),
                                      "traceback": traceback.format_exc()}
                log("part %s FAILED:\n%s" % (name, traceback.format_exc()))
        res["part_s"][name] = time.perf_counter() - t
        log("part %s: %s in %.1f s" % (name, "ok" if res["parts"][name].get("ok") else "FAILED", res["part_s"][name]))
        if not res["parts"][name].get("ok"):
            p = res["parts"][name]
            errs = [p["error"]] if "error" in p else []
            for key in ("runs", "ir_dtype", "shapes"):
                errs += ["%s %s: %s" % (r.get("model", r.get("label", "")), r.get("plan", r.get("scheduler", "")),
                                        r["error"]) for r in p.get(key, []) if not r.get("ok") and "error" in r]
            errs += ["%s: %s" % (k, v["error"]) for k, v in p.items() if isinstance(v, dict) and not v.get("ok", True)
                     and "error" in v]
            res["failures"] += ["%s: %s" % (name, e) for e in (errs or ["failed"])]
    res["total_s"] = ctx.budget.elapsed()
    res["ok"] = not res["failures"] and all(res["parts"].get(n, {}).get("ok") for n, _ in parts if n in wanted)
    if not res["ok"] and not res["failures"]:
        res["failures"].append("a part did not complete")

    with open(res["files"]["profile"], "w") as f:
        json.dump(finite(profile_record(res)), f, indent=1, allow_nan=False)
        f.write("\n")
    with open(res["files"]["json"], "w") as f:
        json.dump(finite(res), f, indent=1, allow_nan=False, default=str)
        f.write("\n")
    with open(res["files"]["markdown"], "w") as f:
        f.write(markdown(res))
    log("wrote %s, %s and %s (%.1f s): %s" % (res["files"]["json"], res["files"]["markdown"], res["files"]["profile"],
                                             res["total_s"], "pass" if res["ok"] else "FAIL: " + "; ".join(res["failures"])))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
