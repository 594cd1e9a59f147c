"""Training a PyTorch module with a concerto schedule, for many steps (docs/python.md, "Training
in PyTorch").

:class:`Trainer` captures the module's training step (``concerto.torch.capture``), partitions it
under a plan, schedules it (any scheduler: ``concerto``, the baselines), and runs it on the torch
engine (``concerto.engine.Engine``) in every process of a torch.distributed job (torchrun's):
the parameters come from the module's own values, sharded per the plan; Adam's moments and step
count live on the ranks between steps; each step takes a global batch from the caller (every rank
keeps its part per the plan's layout) and returns the step's loss; the trained parameters are
gathered back into the module on request; ``save``/``load`` write and read a sharded checkpoint
(one file per rank).

    import torch.distributed as dist
    from concerto.train import Trainer
    dist.init_process_group("gloo")          # torchrun sets the rank and world size
    t = Trainer(model, (ids,), labels, plan="dp=4", scheduler="concerto")
    for ids, labels in batches:
        loss = t.step((ids,), labels)
    t.load_into(model)
"""

import json
import os

import torch
import torch.distributed as dist

from . import _concerto
from .engine import Engine
from ._concerto import Error

__all__ = ["Trainer"]


def _world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _agree(obj):
    """Rank 0's `obj` on every rank (a schedule must be the same everywhere: a search with a time
    limit need not give the same answer twice)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Trainer:
    """Trains `module` under `plan` ("dp=N[,zero=1|2|3]", or with tp and sp Megatron's layout:
    Captured.partition) or `sharding` (a sharding file's dict:
    any mesh, the SPMD partitioner) with `scheduler`'s schedule (made on rank 0 for `cluster`'s
    machine model, or a cluster file, and `profile`'s measured durations when given; sent to the
    others).

    `example_inputs`/`labels`: one global batch of the shapes every step will have (the capture's
    shapes). The optimizer is Adam (AdamW when `weight_decay` > 0: decoupled, as
    torch.optim.AdamW), `lr`, `betas`, `eps`. Gradient clipping is not in the IR yet: a module
    trained with it differs. `dtype`: the engine's compute dtype ("f32", "f64" for checking
    numerics, "ir"). `device`: as Engine's (cpu on gloo, the rank's GPU on NCCL)."""

    def __init__(self, module, example_inputs, labels, plan=None, sharding=None, scheduler="concerto",
                 cluster="a800-4x8", options=None, profile="", lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, dtype="f32", device=None, timeout_s=300.0):
        from . import torch as ct  # the bridge imports torch.fx machinery; only the trainer needs it
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        self.module = module
        rank, world = _world()
        if plan is None and sharding is None:
            plan = "dp=%d" % world
        cap = ct.capture(module, tuple(example_inputs), labels, lr=lr, betas=betas, eps=eps,
                         weight_decay=weight_decay)
        program = cap.partition(plan=plan) if sharding is None else cap.partition(sharding=sharding)
        if program.num_ranks != world:
            raise Error("trainer: plan %r has %d ranks, the job %d (torchrun --nproc-per-node %d)"
                        % (plan or "sharding", program.num_ranks, world, program.num_ranks))
        job = None
        if rank == 0:
            scheduled, sched = _concerto.schedule(program, cluster=cluster, scheduler=scheduler, options=options or {},
                                                 profile=profile or "")
            job = (scheduled.to_json(), json.dumps(sched))
        text, sched = _agree(job)
        self.program = _concerto.parse_program(text, "<%s schedule of %s>" % (scheduler, program.name))
        self.schedule = json.loads(sched)
        self.capture = cap
        # The module's parameters, the constants of the capture the program was made from, and
        # the example batch: each rank keeps its part.
        values = cap.values(module, tuple(example_inputs), labels, program=program)
        self.engine = Engine(self.program, self.schedule, device=device, dtype=dtype, values=values,
                             timeout_s=timeout_s)
        self.input_names = list(cap.inputs)
        self.label_name = cap.labels

    @property
    def steps_done(self):
        return self.engine.steps_done

    def step(self, inputs, labels, trace=None):
        """One training step on the global batch (`inputs`: a tensor or a tuple, `labels`): the
        step's loss (the mean over the ranks' losses, every rank gets it). `trace`: a list the
        step's ops are appended to as Chrome trace events (Engine.step's)."""
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if len(inputs) != len(self.input_names):
            raise Error("trainer: step got %d inputs, the module was captured with %d"
                        % (len(inputs), len(self.input_names)))
        from .torch import check_labels
        check_labels(labels, self.capture.classes, "trainer")
        data = dict(zip(self.input_names, inputs))
        data[self.label_name] = labels
        r = self.engine.step(data, trace=trace)
        total = torch.tensor([sum(r.losses), float(len(r.losses))], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(total)
        return float(total[0] / total[1])

    def parameters(self):
        """{torch parameter name: global tensor} of the trained values (collective: every rank
        calls it)."""
        got = self.engine.gather(list(self.capture.params.values()))
        return {name: got[ir] for name, ir in self.capture.params.items()}

    def load_into(self, module=None):
        """Copies the trained parameters into `module` (default: the one trained)."""
        module = module or self.module
        trained = self.parameters()
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name in trained:
                    p.copy_(trained[name].reshape(p.shape).to(p.dtype))

    def save(self, directory):
        """A sharded checkpoint: directory/rank<R>.pt per rank (its parameters or shards, Adam's
        moments, the step count)."""
        os.makedirs(directory, exist_ok=True)
        torch.save(self.engine.state_dict(), os.path.join(directory, "rank%d.pt" % self.engine.rank))
        if dist.is_initialized():
            dist.barrier()

    def load(self, directory):
        """Restores a checkpoint `save` wrote for the same program and number of ranks."""
        path = os.path.join(directory, "rank%d.pt" % self.engine.rank)
        if not os.path.exists(path):
            raise Error("trainer: checkpoint %s: no file for rank %d" % (directory, self.engine.rank))
        self.engine.load_state_dict(torch.load(path, weights_only=True))


# ---- the command line: python -m concerto.train (under torchrun) ---------------------------------

def _gpt2_tiny(seq):
    import transformers
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=seq, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg), 256


def _llama_tiny(seq):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg), 256


class _Logits(torch.nn.Module):
    """A transformers causal LM as capture takes it: input ids in, logits out."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


# Modules defined by transformers (tiny configs, random init: nothing is downloaded).
TORCH_MODELS = {"hf-gpt2-tiny": _gpt2_tiny, "hf-llama-tiny": _llama_tiny}


def hf_model(name="hf-gpt2-tiny", seq=16):
    """A module of TORCH_MODELS as capture takes it (ids in, logits out), for the capture CLI:
    python3 -m concerto.torch concerto.train:hf_model --kwargs '{"name": "hf-llama-tiny"}'
    --input 4x16 --input-dtype long --vocab 256 --plan tp=2,sp."""
    if name not in TORCH_MODELS:
        raise ValueError("hf_model: unknown model '%s' (known: %s)" % (name, ", ".join(sorted(TORCH_MODELS))))
    lm, _ = TORCH_MODELS[name](seq)
    return _Logits(lm).train()


def _parse_args(argv):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python -m concerto.train",
        description="Train with a concerto schedule on the torch engine, one process per rank: start it with "
                    "torchrun (torchrun --nproc-per-node N -m concerto.train ...), which sets the rank, the world "
                    "size and the rendezvous; a one-rank job also runs without it. A torch module (--model "
                    "hf-gpt2-tiny, hf-llama-tiny: transformers models at tiny sizes, random init) is captured, "
                    "partitioned under --plan and scheduled by --scheduler; its batches are random ids from "
                    "--seed, a new one each step. An IR program (--model PRESET|FILE.yaml with --plan, or "
                    "--program with --schedule as `concerto run --engine torch` writes them) trains on its "
                    "initialised inputs (the same batch every step).")
    ap.add_argument("--model", help="hf-gpt2-tiny, hf-llama-tiny, or a preset / model file of the C++ frontends")
    ap.add_argument("--plan", default=None, help="parallel plan: dp=N, tp=N, sp, zero=K for a torch module (default dp=WORLD); "
                                                  "any plan string or plan file for a preset")
    ap.add_argument("--scheduler", default="concerto", help="the schedule (default concerto)")
    ap.add_argument("--cluster", default="a800-4x8", help="machine model the schedule is made for")
    ap.add_argument("--program", help="a scheduled IR program (with --schedule)")
    ap.add_argument("--schedule", help="its schedule file (verified before anything runs)")
    ap.add_argument("--model-layouts", default="",
                    help="with --program: the preset or model file it was lowered from (its fused tensors' layouts)")
    ap.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    ap.add_argument("--batch", type=int, default=8, help="global batch of a torch module (default 8)")
    ap.add_argument("--seq", type=int, default=32, help="sequence length of a torch module (default 32)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the module's init and the batches (default 0)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f64", "ir"], help="compute dtype (default f32)")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when it is there)")
    ap.add_argument("--check", action="store_true",
                    help="torch module only: rank 0 also trains it in one process with torch.optim.Adam on the same "
                         "batches and reports the largest loss and parameter differences")
    ap.add_argument("--save", help="write a sharded checkpoint here after training")
    ap.add_argument("--load", help="start from a checkpoint --save wrote")
    ap.add_argument("--json", action="store_true", help="print one JSON object (rank 0)")
    a = ap.parse_args(argv)
    if not (1 <= a.steps <= 1000000):
        ap.error("--steps %d: must be in [1, 1000000]" % a.steps)
    if (a.program is None) != (a.schedule is None):
        ap.error("--program and --schedule go together")
    if (a.program is None) == (a.model is None):
        ap.error("give --model, or --program with --schedule")
    if a.check and a.model not in TORCH_MODELS:
        ap.error("--check needs a torch module (--model %s)" % " or ".join(TORCH_MODELS))
    return a


def _init_dist(device):
    """The process group torchrun describes in the environment (gloo on CPU, NCCL on GPUs)."""
    if "RANK" not in os.environ or dist.is_initialized():
        return
    cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")


def _main(argv=None):
    import statistics
    import sys
    import time
    a = _parse_args(argv)
    _init_dist(a.device)
    rank, world = _world()
    device = a.device or ("cuda:%d" % torch.cuda.current_device() if torch.cuda.is_available() else "cpu")

    def say(msg):
        if rank == 0:
            print("concerto.train: " + msg, file=sys.stderr, flush=True)

    out = {"ranks": world, "steps": a.steps, "device": device, "dtype": a.dtype}
    losses, times = [], []
    try:
        if a.model in TORCH_MODELS:
            torch.manual_seed(a.seed)
            lm, vocab = TORCH_MODELS[a.model](a.seq)
            module = _Logits(lm).train()
            if a.dtype == "f64":
                module = module.double()
            gen = torch.Generator().manual_seed(a.seed)

            def batch():
                ids = torch.randint(0, vocab, (a.batch, a.seq), generator=gen)
                return ids, torch.randint(0, vocab, (a.batch, a.seq), generator=gen)

            ids, labels = batch()
            say("capturing %s (batch %d, seq %d), plan %s, scheduler %s" % (a.model, a.batch, a.seq,
                                                                            a.plan or "dp=%d" % world, a.scheduler))
            reference = None
            if a.check and rank == 0:
                import copy
                reference = copy.deepcopy(module)
            trainer = Trainer(module, (ids,), labels, plan=a.plan, scheduler=a.scheduler, cluster=a.cluster,
                              lr=a.lr, dtype=a.dtype, device=device)
            if a.load:
                trainer.load(a.load)
            gen.manual_seed(a.seed)
            batches = [batch() for _ in range(a.steps)]
            for k, (x, y) in enumerate(batches):
                t0 = time.perf_counter()
                losses.append(trainer.step((x,), y))
                times.append(time.perf_counter() - t0)
                say("step %d loss %.6f (%.1f ms)" % (k + 1, losses[-1], times[-1] * 1e3))
            out.update(model=a.model, plan=trainer.program.name, scheduler=a.scheduler)
            trained = trainer.parameters()
            if reference is not None:
                out["check"] = _check(reference, batches, losses, trained, a.lr)
                say("check against one-process torch: largest loss difference %.3g, parameter %.3g (relative)"
                    % (out["check"]["max_loss_rel_diff"], out["check"]["max_param_rel_diff"]))
            if a.save:
                trainer.save(a.save)
            engine = trainer.engine
        else:
            from . import _concerto as c
            if a.program:
                program = c.read_program(a.program)
                with open(a.schedule) as f:
                    schedule = f.read()
            else:
                job = None
                if rank == 0:
                    p, s = c.schedule(c.lower(a.model, a.plan or "dp=1"), cluster=a.cluster, scheduler=a.scheduler)
                    job = (p.to_json(), json.dumps(s))
                text, schedule = _agree(job)
                program = c.parse_program(text, "<%s>" % a.model)
            engine = Engine(program, schedule, device=device, dtype=a.dtype, model=a.model or a.model_layouts,
                            seed=a.seed or None)
            if a.load:
                engine.load_state_dict(torch.load(os.path.join(a.load, "rank%d.pt" % rank), weights_only=True))
            for k in range(a.steps):
                r = engine.step()
                total = torch.tensor([sum(r.losses), float(len(r.losses))], dtype=torch.float64)
                if world > 1:
                    dist.all_reduce(total)
                losses.append(float(total[0] / total[1]) if total[1] else None)
                times.append(r.time_s)
                say("step %d loss %s (%.1f ms)" % (k + 1, "%.6f" % losses[-1] if losses[-1] is not None else "-",
                                                  r.time_s * 1e3))
            out.update(model=a.model or a.model_layouts or program.name, plan=program.name, scheduler=engine.scheduler)
            if a.save:
                os.makedirs(a.save, exist_ok=True)
                torch.save(engine.state_dict(), os.path.join(a.save, "rank%d.pt" % rank))
        engine.close()
    except Error as e:
        print("concerto.train: rank %d: %s" % (rank, e), file=sys.stderr, flush=True)
        return 1
    out["losses"] = losses
    out["step_times_ms"] = [t * 1e3 for t in times]
    out["median_step_ms"] = statistics.median(times) * 1e3
    if rank == 0:
        if a.json:
            print(json.dumps(out, indent=2))
        else:
            print("%s, plan %s, scheduler %s, %d ranks on %s: loss %.6f -> %.6f over %d steps, median step %.1f ms"
                  % (out["model"], out["plan"], out["scheduler"], world, device, losses[0] or 0, losses[-1] or 0,
                     a.steps, out["median_step_ms"]))
    if dist.is_initialized():
        dist.barrier()  # rank 0 may still be checking: gloo aborts a process group torn down under it
        dist.destroy_process_group()
    return 0


def _check(module, batches, losses, trained, lr):
    """The same training in one process with torch.optim.Adam: the largest relative differences of
    the step losses and of the final parameters."""
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    ref_losses = []
    for x, y in batches:
        opt.zero_grad()
        out = module(x)
        loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())
        loss.backward()
        opt.step()
        ref_losses.append(float(loss.detach()))
    dl = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, ref_losses))
    dp = 0.0
    for name, p in module.named_parameters():
        if name in trained:
            ref = p.detach().double()
            dp = max(dp, float((trained[name].double().reshape(ref.shape) - ref).abs().max()) /
                     max(1.0, float(ref.abs().max())))
    return {"reference_losses": ref_losses, "max_loss_rel_diff": dl, "max_param_rel_diff": dp}


if __name__ == "__main__":
    import sys
    sys.exit(_main())
