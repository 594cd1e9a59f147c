#!/usr/bin/env python3
"""The torch testbed: concerto's schedules on the torch engine against torch's own
DistributedDataParallel, FSDP (fully_shard) and tensor parallelism (parallelize_module), on the
same model, batches, initial values and machine (docs/results.md, "Against torch's own DDP, FSDP
and tensor parallelism"). scripts/torchbed.sh runs it inside a shaped network namespace.

  torchbed.py prepare --workload W [--size S] --out DIR
      one process: captures the workload's model, partitions it under the workload's plan and
      writes DIR/program.json (what `concerto profile` times and fits a cluster to) and
      DIR/workload.json (its ranks).
  torchbed.py run --workload W [--size S] --out DIR [--variants V,...] [--rounds R]
                  [--warmup K] [--steps N] [--cluster C] [--profile DB] [--trace VARIANT]
      under torchrun (one process per rank): builds every variant once (the same init and the
      same batch sequence for each), then in each of R rounds runs every variant for K untimed
      and N timed steps, in an order rotated by one each round. Rank 0 writes DIR/measured.json
      (per variant: each round's median step, the losses) and, per engine variant, the program
      and schedule it ran (DIR/<variant>.program.json, .schedule.json) for the simulator.
      --trace VARIANT: also DIR/trace.json, that engine variant's ops in the last round's timed
      steps as Chrome trace events (for `concerto profile --from-trace`).
  torchbed.py explain --workload W [--size S] --out DIR [--variants V,...] [--cluster C --profile DB]
      under torchrun: where each variant's step goes on rank 0 (after --warmup steps, the median
      of --steps): wall time, the kernels' own time on the main thread (GEMMs apart; torch's rows
      from torch.profiler, the engine's from its trace) and the rest (waiting for communication,
      host work between kernels); DIR/explain.json.
  torchbed.py collectives --out DIR --cluster C [--profile DB] [--reps N]
      under torchrun: every distinct collective of DIR's engine rows timed as the engine issues it
      over gloo, alone (the slowest rank's median of N), written over DB's entries into
      DIR/gloo/profile.json (what the engine rows are simulated on).
  torchbed.py summary DIR [DIR...] [--write FILE] [--json] [--max-loss-diff X]
      the table of every DIR (a workload at a rate): median and min-max step per variant, the
      final loss and its largest difference to the others, the simulator's prediction for every
      engine row (DIR/<variant>.simulated.json, written by torchbed.sh) and for torch's own rows
      where we model them (DIR/model-<variant>.simulated.json: our ddp / zero policy), with its
      error, the ranking checks; prints a markdown table (and --write: the JSON into FILE). Exits 1 when an
      engine row has no prediction, or with --max-loss-diff when the final losses of a workload's
      variants differ by more than X (relative).

Variants: torch's own: ddp-<N>mb (DistributedDataParallel, bucket_cap_mb N), fsdp (fully_shard per
block and the root, defaults), fsdp-prefetch (explicit forward and backward prefetch of the next two
blocks), tp (ColwiseParallel on q/k/v/gate/up, RowwiseParallel on o/down), tp-sp (the same with
SequenceParallel norms: the residual stream split by tokens, gathered before attention and the MLP,
the row-parallel outputs reduce-scattered, the head's input gathered); the torch engine:
engine-<scheduler> (concerto.train.Trainer under the workload's plan, the schedule made for
--cluster and --profile). Every variant trains with Adam (lr 1e-3) and mean cross entropy; each
rank computes with torch.get_num_threads() = cores / ranks threads.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import time

SIZES = {
    # seq, global batch, hidden, layers, heads, vocab (kv heads and MLP width for LLaMA)
    "tiny": dict(seq=16, batch=4, hidden=32, layers=2, heads=4, vocab=128, kv_heads=2, mlp=64),
    "bench": dict(seq=128, batch=8, hidden=256, layers=8, heads=4, vocab=4096, kv_heads=2, mlp=688),
}

TP_LINEARS = {"q_proj": "col", "k_proj": "col", "v_proj": "col", "o_proj": "row",
              "gate_proj": "col", "up_proj": "col", "down_proj": "row"}

WORKLOADS = {
    "gpt2-dp2": dict(model="gpt2", ranks=2, plan="dp=2", torch=["ddp-25mb", "ddp-1mb", "ddp-5mb", "ddp-100mb"]),
    "gpt2-zero3": dict(model="gpt2", ranks=2, plan="dp=2,zero=3", torch=["fsdp", "fsdp-prefetch"]),
    # The engine rows: Megatron's layout found on the captured graph (Captured.partition, plan tp=2),
    # the same split as torch's parallelize_module with TP_LINEARS.
    "llama-tp2": dict(model="llama", ranks=2, plan="tp=2", torch=["tp"]),
    # Sequence parallelism: torch's SequenceParallel norms around the same split (tp-sp).
    "llama-tp2-sp": dict(model="llama", ranks=2, plan="tp=2,sp", torch=["tp-sp"]),
}
ENGINE_SCHEDULERS = ["ddp", "zero", "megatron", "concerto"]


def default_variants(workload):
    return WORKLOADS[workload]["torch"] + ["engine-" + s for s in ENGINE_SCHEDULERS]


def build_model(kind, size):
    """A transformers causal LM at `size` (random init from the caller's seed), wrapped as
    concerto.train's _Logits (ids in, logits out); and its blocks (what FSDP shards one by one)."""
    import transformers
    from concerto.train import _Logits
    z = SIZES[size]
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=z["vocab"], n_positions=z["seq"], n_embd=z["hidden"],
                                      n_layer=z["layers"], n_head=z["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        cfg._attn_implementation = "eager"
        lm = transformers.GPT2LMHeadModel(cfg)
        return _Logits(lm).train(), list(lm.transformer.h)
    cfg = transformers.LlamaConfig(vocab_size=z["vocab"], hidden_size=z["hidden"], intermediate_size=z["mlp"],
                                   num_hidden_layers=z["layers"], num_attention_heads=z["heads"],
                                   num_key_value_heads=z["kv_heads"], max_position_embeddings=z["seq"],
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    lm = transformers.LlamaForCausalLM(cfg)
    return _Logits(lm).train(), list(lm.model.layers)


def batches(size, seed):
    """The global batches every variant trains on, in order: (ids, labels), both [batch, seq]."""
    import torch
    z = SIZES[size]
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield (torch.randint(0, z["vocab"], (z["batch"], z["seq"]), generator=gen),
               torch.randint(0, z["vocab"], (z["batch"], z["seq"]), generator=gen))


# ---- the variants: each makes .step(ids, labels) -> the step's global mean loss -------------------

class TorchVariant:
    """One of torch's own parallelisms: a wrapped copy of the module and torch.optim.Adam."""

    def __init__(self, name, workload, module, blocks, lr):
        import torch
        import torch.distributed as dist
        self.name, self.dist, self.torch = name, dist, torch
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.split_batch = True  # each rank takes its rows of the global batch (dp)
        if name.startswith("ddp-"):
            from torch.nn.parallel import DistributedDataParallel
            mb = float(name[4:-2])
            self.model = DistributedDataParallel(module, bucket_cap_mb=mb)
        elif name in ("fsdp", "fsdp-prefetch"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (self.world,))
            for b in blocks:
                fully_shard(b, mesh=mesh)
            fully_shard(module, mesh=mesh)
            if name == "fsdp-prefetch":
                for i, b in enumerate(blocks):
                    b.set_modules_to_forward_prefetch(blocks[i + 1:i + 3])
                    b.set_modules_to_backward_prefetch(list(reversed(blocks[max(0, i - 2):i])))
            self.model = module
        elif name in ("tp", "tp-sp"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import Replicate, Shard
            from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                           SequenceParallel, parallelize_module)
            mesh = init_device_mesh("cpu", (self.world,))
            sp = name == "tp-sp"
            for i, b in enumerate(blocks):
                plan = {}
                for path, _ in b.named_modules():
                    leaf = path.split(".")[-1]
                    if leaf in TP_LINEARS:
                        plan[path] = (ColwiseParallel() if TP_LINEARS[leaf] == "col" else
                                      RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel())
                    elif sp and leaf in ("input_layernorm", "post_attention_layernorm"):
                        plan[path] = SequenceParallel()  # the residual stream split by tokens
                if sp:  # gathered before attention and the MLP (the row-parallel outputs reduce-scattered)
                    plan["self_attn"] = PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                           desired_input_kwarg_layouts={"hidden_states": Replicate()})
                    plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
                    if i == 0:  # the embedding's output (whole on every rank): this rank's tokens
                        plan[""] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                      use_local_output=True)
                parallelize_module(b, mesh, plan)
            if sp:  # the final norm on the token split, the head's input gathered
                lm = module.lm
                parallelize_module(lm.model, mesh, {"norm": SequenceParallel()})
                parallelize_module(lm, mesh, {"lm_head": ColwiseParallel(input_layouts=Shard(1),
                                                                          output_layouts=Replicate())})
            self.model = module
            self.split_batch = False
        else:
            raise SystemExit("torchbed: unknown variant '%s'" % name)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)

    def step(self, ids, labels):
        torch, dist = self.torch, self.dist
        if self.split_batch:
            n = ids.shape[0] // self.world
            ids, labels = ids[self.rank * n:(self.rank + 1) * n], labels[self.rank * n:(self.rank + 1) * n]
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten())
        loss.backward()
        self.opt.step()
        # The global mean loss, as the engine's Trainer reports it (the same small all-reduce).
        total = torch.tensor([float(loss.detach()), 1.0], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total[0] / total[1])


class EngineVariant:
    """The torch engine running one of our schedulers' schedules (concerto.train.Trainer)."""

    def __init__(self, name, workload, module, example, lr, cluster, profile, out):
        from concerto.train import Trainer
        w = WORKLOADS[workload]
        self.name = name
        scheduler = name[len("engine-"):]
        self.trainer = Trainer(module, (example[0],), example[1], scheduler=scheduler, cluster=cluster,
                               profile=profile, lr=lr, plan=w["plan"])
        if self.trainer.engine.rank == 0 and out:
            self.trainer.program.write(os.path.join(out, name + ".program.json"))
            with open(os.path.join(out, name + ".schedule.json"), "w") as f:
                json.dump(self.trainer.schedule, f)

    def step(self, ids, labels, trace=None):
        return self.trainer.step((ids,), labels, trace=trace)


# ---- subcommands ----------------------------------------------------------------------------------

def cmd_prepare(a):
    import torch
    import concerto.torch as ct
    w = WORKLOADS[a.workload]
    torch.manual_seed(a.seed)
    module, _ = build_model(w["model"], a.size)
    ids, labels = next(batches(a.size, a.seed))
    cap = ct.capture(module, (ids,), labels, lr=a.lr)
    program = cap.partition(plan=w["plan"])
    os.makedirs(a.out, exist_ok=True)
    program.write(os.path.join(a.out, "program.json"))
    with open(os.path.join(a.out, "workload.json"), "w") as f:
        json.dump({"workload": a.workload, "size": a.size, "ranks": program.num_ranks, "model": w["model"],
                   "plan": w["plan"]}, f)
    print("torchbed: %s (%s, size %s): %d ranks, %d ops per rank -> %s"
          % (a.workload, w["model"], a.size, program.num_ranks, program.num_ops // max(1, program.num_ranks),
             os.path.join(a.out, "program.json")), file=sys.stderr)
    return 0


def _start():
    """The torchrun job's gloo group, and each rank's compute threads (cores / ranks): (rank, world)."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    return rank, world


def _finish(made=None):
    """Ends the engine variants' waiter threads and the process group (after every rank is done)."""
    import torch.distributed as dist
    for v in (made or {}).values():
        if isinstance(v, EngineVariant):
            v.trainer.engine.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def make_variants(a, variants, say):
    """Every variant, built in order on every rank: each starts from the same initial values (one
    seeded init, copied) and draws the same batch sequence (its own generator from the same seed)."""
    import torch
    w = WORKLOADS[a.workload]
    torch.manual_seed(a.seed)
    base, _ = build_model(w["model"], a.size)
    example = next(batches(a.size, a.seed))
    made, feeds = {}, {}
    for v in variants:
        t0 = time.perf_counter()
        module = copy.deepcopy(base)
        blocks = list(module.lm.transformer.h) if w["model"] == "gpt2" else list(module.lm.model.layers)
        if v.startswith("engine-"):
            made[v] = EngineVariant(v, a.workload, module, example, a.lr, a.cluster, a.profile, a.out)
        else:
            made[v] = TorchVariant(v, a.workload, module, blocks, a.lr)
        feeds[v] = batches(a.size, a.seed)
        say("%s ready (%.1f s)" % (v, time.perf_counter() - t0))
    return made, feeds


_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def cmd_explain(a):
    """Where each variant's step goes on rank 0 (after a.warmup steps; the median of a.steps):
    the wall time, the kernels' own time on the main thread (GEMMs apart), and the rest (waiting
    for communication, host work between kernels). torch's rows from torch.profiler (its aten ops
    on the main thread, self time; communication runs in gloo's threads), the engine's from its
    trace (compute ops' spans)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    rank, world = _start()
    variants = a.variants.split(",") if a.variants else default_variants(a.workload)
    made, feeds = make_variants(a, variants, lambda m: None)
    out = {}
    for v in variants:
        for _ in range(a.warmup):
            made[v].step(*next(feeds[v]))
        rows = []
        types = ({o["id"]: o.get("type") for o in made[v].trainer.program.to_dict()["graphs"][0]["ops"]}
                 if v.startswith("engine-") else {})
        for _ in range(a.steps):
            dist.barrier()
            ids, labels = next(feeds[v])
            if v.startswith("engine-"):
                events = []
                t0 = time.perf_counter()
                made[v].step(ids, labels, trace=events)
                wall = (time.perf_counter() - t0) * 1e3
                mine = [e for e in events if e["cat"] == "compute"]
                kernels = sum(e["dur"] for e in mine) / 1e3
                gemm = sum(e["dur"] for e in mine if types.get(e["args"]["id"]) in ("matmul", "attention",
                                                                                      "attention_grad")) / 1e3
                n = len(mine)
            else:
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    t0 = time.perf_counter()
                    made[v].step(ids, labels)
                    wall = (time.perf_counter() - t0) * 1e3
                def outermost(e):  # an aten op no other aten op called
                    p = e.cpu_parent
                    while p is not None:
                        if p.name.startswith("aten::"):
                            return False
                        p = p.cpu_parent
                    return True
                main = [e for e in prof.events() if e.name.startswith("aten::") and outermost(e)]
                kernels = sum(e.cpu_time_total for e in main) / 1e3
                gemm = sum(e.self_cpu_time_total for e in prof.events() if e.name in _GEMMS) / 1e3
                n = len(main)
            rows.append({"wall_ms": wall, "kernels_ms": kernels, "gemm_ms": gemm, "kernel_calls": n})
        mid = sorted(rows, key=lambda r: r["wall_ms"])[len(rows) // 2]  # the median step
        mid["rest_ms"] = mid["wall_ms"] - mid["kernels_ms"]
        out[v] = mid
        if rank == 0:
            print("torchbed: %-16s step %7.1f ms: kernels %7.1f ms (GEMMs %7.1f, %4d top-level calls), rest %7.1f ms"
                  % (v, mid["wall_ms"], mid["kernels_ms"], mid["gemm_ms"], mid["kernel_calls"], mid["rest_ms"]),
                  file=sys.stderr, flush=True)
    if rank == 0 and a.out:
        with open(os.path.join(a.out, "explain.json"), "w") as f:
            json.dump({"workload": a.workload, "size": a.size, "variants": out}, f, indent=1)
    return _finish(made)


def cmd_collectives(a):
    """Under torchrun: every distinct collective of the engine rows' programs (DIR/engine-*.program.json
    with their schedules) timed as the engine issues it over gloo, alone (all ranks enter together
    after a barrier; the median of --reps), written over --profile's entries into
    DIR/gloo/profile.json under each op's profile signature on --cluster."""
    import glob
    import torch
    import torch.distributed as dist
    import concerto
    from concerto.engine import Engine
    rank, world = _start()
    measured, device = {}, None
    for path in sorted(glob.glob(os.path.join(a.out, "engine-*.program.json")) +
                       glob.glob(os.path.join(a.out, "model-*.program.json"))):
        program = concerto.read_program(path)
        with open(path.replace(".program.json", ".schedule.json")) as f:
            engine = Engine(program, f.read(), seed=1)
        device, sigs = concerto.profile_signatures(program, rank, a.cluster)
        todo = [op for op in engine.ops if op.kind == "collective" and sigs[op.d["id"]] not in measured]
        mine = [sigs[op.d["id"]] for op in todo]
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        if any(x != mine for x in everyone):
            raise SystemExit("torchbed: %s: the ranks' collectives differ (a program of several roles?)" % path)
        for op in todo:
            sig = sigs[op.d["id"]]
            if sig in measured:
                continue
            ins = [torch.zeros(engine.tensors[n]["shape"], dtype=engine._dtype(engine.tensors[n]))
                   for n in op.d["inputs"]]
            times = []
            for _ in range(a.reps):
                dist.barrier()
                t0 = time.perf_counter()
                res = engine._collective(op, ins, {})
                if res is not None:
                    for w in res[0]:
                        w.wait()
                    res[1]()
                times.append((time.perf_counter() - t0) * 1e6)
            # The slowest rank's median: a collective ends for the step when it ends everywhere.
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            measured[sig] = float(t[0])
        engine.close()
        if rank == 0:
            print("torchbed: %s: %d collectives timed so far" % (os.path.basename(path), len(measured)),
                  file=sys.stderr, flush=True)
    if rank == 0:
        entries = {}
        if a.profile:
            with open(a.profile) as f:
                for e in json.load(f)["entries"]:
                    entries[(e["device"], e["signature"])] = e["duration_us"]
        for sig, us in measured.items():
            entries[(device, sig)] = us
        os.makedirs(os.path.join(a.out, "gloo"), exist_ok=True)
        with open(os.path.join(a.out, "gloo", "profile.json"), "w") as f:
            json.dump({"format": "concerto-profile", "version": 1, "entries": [
                {"device": d, "signature": sg, "duration_us": us} for (d, sg), us in sorted(entries.items())]}, f,
                indent=1)
        with open(os.path.join(a.out, "gloo", "collectives.json"), "w") as f:
            json.dump({"device": device, "reps": a.reps, "collectives_us": measured}, f, indent=1)
        print("torchbed: %d collectives over gloo -> %s" % (len(measured), os.path.join(a.out, "gloo", "profile.json")),
              file=sys.stderr)
    return _finish()


def cmd_run(a):
    import torch
    import torch.distributed as dist
    rank, world = _start()
    w = WORKLOADS[a.workload]
    if world != w["ranks"]:
        raise SystemExit("torchbed: workload %s needs %d ranks, torchrun started %d" % (a.workload, w["ranks"], world))
    variants = a.variants.split(",") if a.variants else default_variants(a.workload)
    if a.trace and (a.trace not in variants or not a.trace.startswith("engine-")):
        raise SystemExit("torchbed: --trace %s: not an engine variant of this run (%s)" % (a.trace, ",".join(variants)))

    def say(msg):
        if rank == 0:
            print("torchbed: " + msg, file=sys.stderr, flush=True)

    made, feeds = make_variants(a, variants, say)
    record = {v: {"round_median_ms": [], "step_ms": [], "losses": []} for v in variants}
    events = []
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            dist.barrier()
            for k in range(a.warmup + a.steps):
                ids, labels = next(feeds[v])
                timed = k >= a.warmup
                trace = events if (v == a.trace and timed and r == a.rounds - 1) else None
                t0 = time.perf_counter()
                loss = made[v].step(ids, labels, trace=trace) if trace is not None else made[v].step(ids, labels)
                dt = (time.perf_counter() - t0) * 1e3
                record[v]["losses"].append(loss)
                if timed:
                    record[v]["step_ms"].append(dt)
            record[v]["round_median_ms"].append(statistics.median(record[v]["step_ms"][-a.steps:]))
        say("round %d of %d: %s" % (r + 1, a.rounds, ", ".join(
            "%s %.0f ms" % (v, record[v]["round_median_ms"][-1]) for v in variants)))
    if a.trace:
        gathered = [None] * world
        dist.gather_object(events, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            with open(os.path.join(a.out, "trace.json"), "w") as f:
                json.dump({"traceEvents": [e for part in gathered for e in part]}, f)
    if rank == 0:
        for v in variants:
            m = record[v]["round_median_ms"]
            record[v].update(median_ms=statistics.median(m), min_ms=min(m), max_ms=max(m),
                             final_loss=record[v]["losses"][-1])
        out = {"workload": a.workload, "size": a.size, "ranks": world, "threads_per_rank": torch.get_num_threads(),
               "rounds": a.rounds, "warmup": a.warmup, "steps": a.steps, "steps_per_variant":
               a.rounds * (a.warmup + a.steps), "torch": torch.__version__, "variants": record,
               "order": variants}
        with open(os.path.join(a.out, "measured.json"), "w") as f:
            json.dump(out, f, indent=1)
        say("wrote %s" % os.path.join(a.out, "measured.json"))
    return _finish(made)


def _ranked_pairs(rows):
    """Pairs of engine rows whose measured ranges (min-max over the rounds) do not overlap:
    (faster, slower)."""
    out = []
    for i, x in enumerate(rows):
        for y in rows[i + 1:]:
            if x["max_ms"] < y["min_ms"]:
                out.append((x, y))
            elif y["max_ms"] < x["min_ms"]:
                out.append((y, x))
    return out


def summarise(d):
    m = json.load(open(os.path.join(d, "measured.json")))
    rows = []
    for v in m["order"]:
        r = m["variants"][v]
        row = {"variant": v, "median_ms": r["median_ms"], "min_ms": r["min_ms"], "max_ms": r["max_ms"],
               "final_loss": r["final_loss"]}
        # The engine rows' schedules, and our model of torch's own rows (model-<variant>).
        sim = os.path.join(d, (v if v.startswith("engine-") else "model-" + v) + ".simulated.json")
        if os.path.exists(sim):
            s = json.load(open(sim))
            row["predicted_ms"] = s["makespan_us"] / 1e3
            row["error_pct"] = 100.0 * (row["predicted_ms"] - row["median_ms"]) / row["median_ms"]
        rows.append(row)
    losses = [r["final_loss"] for r in rows]
    ref = losses[0]
    loss_diff = max(abs(x - ref) / max(1.0, abs(ref)) for x in losses)
    torch_rows = [r for r in rows if not r["variant"].startswith("engine-")]
    engine_rows = [r for r in rows if r["variant"].startswith("engine-")]
    best_torch = min(torch_rows, key=lambda r: r["median_ms"]) if torch_rows else None
    concerto = next((r for r in rows if r["variant"] == "engine-concerto"), None)
    predicted = [r for r in engine_rows if "predicted_ms" in r]
    modelled = [r for r in torch_rows if "predicted_ms" in r]
    pairs = _ranked_pairs(predicted)
    misranked = [(f["variant"], s["variant"]) for f, s in pairs if not f["predicted_ms"] < s["predicted_ms"]]
    errors = [abs(r["error_pct"]) for r in predicted]
    return {"dir": d, "workload": m["workload"], "size": m["size"], "rounds": m["rounds"], "steps": m["steps"],
            "rows": rows, "max_final_loss_rel_diff": loss_diff,
            "best_torch": best_torch["variant"] if best_torch else None,
            "concerto_vs_best_torch": (best_torch["median_ms"] / concerto["median_ms"]) if best_torch and concerto
            else None,
            "ranked_pairs": len(pairs), "misranked_pairs": misranked,
            "median_abs_error_pct": statistics.median(errors) if errors else None,
            "max_abs_error_pct": max(errors) if errors else None,
            "rows_within_10pct": sum(e <= 10 for e in errors),
            "torch_rows_modelled": len(modelled),
            "torch_rows_within_10pct": sum(abs(r["error_pct"]) <= 10 for r in modelled),
            "torch_ranked_pairs": len(_ranked_pairs(modelled)),
            "torch_misranked_pairs": [(f["variant"], s["variant"]) for f, s in _ranked_pairs(modelled)
                                      if not f["predicted_ms"] < s["predicted_ms"]]}


def cmd_summary(a):
    results = [summarise(d) for d in a.dirs]
    for s in results:
        print("\n### %s (%s)\n" % (s["workload"], s["dir"]))
        print("| variant | median step (ms) | min-max (ms) | final loss | predicted (ms) | error |")
        print("|---|---|---|---|---|---|")
        for r in s["rows"]:
            pred = "%.0f" % r["predicted_ms"] if "predicted_ms" in r else "-"
            err = "%+.1f%%" % r["error_pct"] if "error_pct" in r else "-"
            print("| %s | %.0f | %.0f-%.0f | %.6f | %s | %s |" % (r["variant"], r["median_ms"], r["min_ms"],
                                                                r["max_ms"], r["final_loss"], pred, err))
        ratio = s["concerto_vs_best_torch"]
        print("\nbest of torch's own: %s; concerto's schedule %s; final losses agree within %.2g (relative); "
              "simulator: %d of %d engine rows within 10%%, %d ranked pairs, misranked: %s; our model of torch's "
              "rows: %d of %d within 10%%, misranked: %s"
              % (s["best_torch"], "%.2fx its speed" % ratio if ratio else "-", s["max_final_loss_rel_diff"],
                 s["rows_within_10pct"], sum("predicted_ms" in r and r["variant"].startswith("engine-")
                                             for r in s["rows"]), s["ranked_pairs"],
                 s["misranked_pairs"] or "none", s["torch_rows_within_10pct"], s["torch_rows_modelled"],
                 s["torch_misranked_pairs"] or "none"))
    if a.write:
        with open(a.write, "w") as f:
            json.dump({"workloads": results}, f, indent=1)
    if a.json:
        print(json.dumps({"workloads": results}))
    bad = []
    for s in results:
        if a.max_loss_diff is not None and not s["max_final_loss_rel_diff"] <= a.max_loss_diff:
            bad.append("%s: the variants' final losses differ by %.3g (relative), over --max-loss-diff %g"
                       % (s["dir"], s["max_final_loss_rel_diff"], a.max_loss_diff))
        missing = [r["variant"] for r in s["rows"] if r["variant"].startswith("engine-") and "predicted_ms" not in r]
        if missing:
            bad.append("%s: no prediction for %s (no <variant>.simulated.json)" % (s["dir"], ", ".join(missing)))
    for b in bad:
        print("torchbed: " + b, file=sys.stderr)
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="torchbed.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("prepare", "run", "explain"):
        p = sub.add_parser(name)
        p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
        p.add_argument("--size", default="bench", choices=sorted(SIZES))
        p.add_argument("--out", required=True, help="the workload's folder")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--lr", type=float, default=1e-3)
        if name in ("run", "explain"):
            p.add_argument("--variants", default="", help="comma-separated (default: the workload's torch variants "
                                                          "and engine-{%s})" % ",".join(ENGINE_SCHEDULERS))
            p.add_argument("--rounds", type=int, default=5)
            p.add_argument("--warmup", type=int, default=1, help="untimed steps per variant per round")
            p.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
            p.add_argument("--cluster", default="a800-4x8", help="the machine model engine schedules are made for")
            p.add_argument("--profile", default="", help="measured durations for the engine schedules")
            p.add_argument("--trace", default="", metavar="VARIANT",
                           help="write DIR/trace.json: this engine variant's ops in the last round's timed steps")
    p = sub.add_parser("collectives")
    p.add_argument("--out", required=True, help="the workload's folder (its engine-*.program.json)")
    p.add_argument("--cluster", required=True, help="the cluster the signatures are keyed on")
    p.add_argument("--profile", default="", help="the entries to write the measured ones over")
    p.add_argument("--reps", type=int, default=5)
    p = sub.add_parser("summary")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--write", help="also write the summary JSON here")
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-loss-diff", type=float, default=None,
                   help="fail (exit 1) when a workload's final losses differ by more than this (relative)")
    a = ap.parse_args(argv)
    if a.cmd in ("run", "explain") and not (a.rounds >= 1 and a.steps >= 1 and a.warmup >= 0):
        ap.error("--rounds and --steps must be >= 1, --warmup >= 0")
    if a.cmd == "collectives" and not 1 <= a.reps <= 1000:
        ap.error("--reps must be in [1, 1000]")
    return {"prepare": cmd_prepare, "run": cmd_run, "explain": cmd_explain, "collectives": cmd_collectives,
            "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
