"""The torch engine: one rank's part of a scheduled IR program run with torch ops and
torch.distributed, for many steps (docs/python.md, "Training in PyTorch").

An :class:`Engine` is made once per rank process (torchrun's, or any process group the caller
initialised) from the program and its schedule file (docs/ir.md; ``concerto.schedule``). It

- refuses a schedule the verifier rejects before anything runs;
- makes one torch.distributed process group per communicator of the program (every distinct
  member set of a collective, on every rank in one agreed order, as ``new_group`` requires) and
  one more for send/recv;
- holds the rank's state (parameters, their shards, optimizer moments, constants) on the device
  between steps: every graph input ``X`` for which the graph writes ``X.next`` takes that value
  after a step (Adam writes ``P.next``, ``P.adam_m.next``, ``P.adam_v.next``), and Adam's bias
  correction counts the steps taken;
- runs a step by following the schedule exactly: one issue position per IR stream, an op issued
  when it heads its stream's order and its predecessors are done (data and control edges), compute
  through ``concerto.torch_kernels``, every collective with ``async_op=True`` (waited on where its
  outputs are first needed), send/recv with ``isend``/``irecv`` (those issued together batched);
- on CUDA gives every IR stream its own ``torch.cuda.Stream``: a collective is issued on its
  stream (NCCL's stream waits for it) and the stream waits for the collective's end, so the order
  per stream holds on the device; cross-stream edges are CUDA events, and the host never blocks on
  the device inside a step. On CPU (gloo) compute runs on the calling thread while each
  communication stream's waiter thread waits for its collective (a blocking wait on the calling
  thread could deadlock two ranks whose streams wait on each other's), as the C++ runtime runs a
  thread per stream.

A Python executor pays Python dispatch per op (measured in docs/results.md, "The torch engine");
it was chosen over ATen kernels behind the C++ executor because the same code then runs on any
torch 2.x and device without a compiled extension per torch version.
"""

import json
import math
import queue
import threading
import time

import numpy
import torch
import torch.distributed as dist

from . import _concerto
from . import torch_kernels
from ._concerto import Error

__all__ = ["Engine", "StepResult", "TORCH_DTYPES"]

# The IR's dtypes as the engine holds them: floats in the engine's compute dtype (see Engine),
# integers (ids, labels, positions) as int64.
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
                "i32": torch.int64, "i64": torch.int64}


def _is_int(dtype):
    return dtype in ("i32", "i64")


class StepResult:
    """One step's outcome on this rank: `loss` (the mean of this rank's cross_entropy outputs, or
    None when it computes none), `losses` (each of them), `time_s` (host time of the step, device
    work finished), and `fetched` {tensor: torch tensor} for the names asked for."""

    __slots__ = ("loss", "losses", "time_s", "fetched")

    def __init__(self, loss, losses, time_s, fetched):
        self.loss, self.losses, self.time_s, self.fetched = loss, losses, time_s, fetched

    def __repr__(self):
        return "<StepResult loss=%s time=%.3f s>" % (self.loss, self.time_s)


class _Op:
    """An op of this rank's graph, resolved once: its kind, stream, predecessors (op indices),
    and what issuing it needs (kernel context, process group, peer)."""

    __slots__ = ("index", "d", "kind", "stream", "preds", "ctx", "group", "pg", "peer", "label", "view")

    def __init__(self, index, d):
        self.index, self.d = index, d
        self.kind = d["kind"]
        self.stream = d.get("stream") or ("compute" if self.kind in ("compute", "copy") else "comm")
        self.preds, self.ctx, self.group, self.pg, self.peer = [], None, None, None, None
        self.view = False
        self.label = "op %d '%s'" % (d["id"], d.get("name", ""))


class Engine:
    """Rank `rank`'s part of `program` under `schedule` (a schedule file's dict or JSON text).

    `device`: "cpu" (gloo) or "cuda[:i]" (NCCL); default: cuda when the default process group is
    NCCL, else cpu. `dtype`: the float dtype tensors are computed in: "f32" (default: every float
    tensor in fp32, as the CPU runtime computes), "f64" (for checking numerics against a float64
    torch reference) or "ir" (each tensor in its IR dtype: bf16 programs in bf16 on a GPU). `values`: global values of graph inputs by init key ({name: torch
    tensor or array}), e.g. a module's parameters; the others are initialised from `seed` as the
    CPU runtime does (docs/runtime.md). `model`: the preset or model file the program was lowered
    from (its fused layouts). `timeout_s`: a step whose collectives have not finished after this
    long fails naming the ops it waits for.

    Needs torch.distributed initialised with the program's number of ranks (a one-rank program
    runs without it)."""

    def __init__(self, program, schedule, device=None, dtype="f32", values=None, seed=None, model="",
                 timeout_s=300.0):
        self.program = program
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        if self.world != program.num_ranks:
            raise Error("engine: program '%s' has %d ranks but the process group has %d (torchrun --nproc-per-node %d)"
                        % (program.name, program.num_ranks, self.world, program.num_ranks))
        if dtype not in ("f32", "f64", "ir"):
            raise Error("engine: dtype '%s' (one of 'f32', 'f64', 'ir')" % dtype)
        if not (timeout_s > 0 and timeout_s < 1e7):
            raise Error("engine: timeout_s %r must be in (0, 1e7) seconds" % (timeout_s,))
        self.timeout_s = float(timeout_s)
        if device is None:
            nccl = dist.is_initialized() and dist.get_backend() == "nccl"
            device = "cuda:%d" % torch.cuda.current_device() if nccl else "cpu"
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        problems = program.verify()
        if problems:
            raise Error("engine: program '%s' does not verify: %s" % (program.name, "; ".join(problems[:3])))
        text = schedule if isinstance(schedule, str) else json.dumps(schedule)
        problems = _concerto.verify_schedule(program, text)
        if problems:
            raise Error("engine: schedule is refused: it fails verification: %s%s"
                        % ("; ".join(problems[:3]), " (and %d more)" % (len(problems) - 3) if len(problems) > 3 else ""))
        sched = json.loads(text)
        self.scheduler = sched.get("scheduler", "")
        doc = program.to_dict()
        self.layout = _concerto.rank_layout(program, self.rank)
        graph = next(g for g in doc["graphs"] if g["name"] == self.layout["graph"])
        self.graph_name = graph["name"]
        self.tensors = {t["name"]: t for t in graph["tensors"]}
        self.float_dtype = {"f32": torch.float32, "f64": torch.float64, "ir": None}[dtype]
        self.ops = [_Op(i, d) for i, d in enumerate(graph["ops"])]
        by_id = {op.d["id"]: op for op in self.ops}
        producer = {}
        for op in self.ops:
            for o in op.d.get("outputs", []):
                producer[o] = op.index
        self.consumers = {}
        for op in self.ops:
            preds = {producer[i] for i in op.d.get("inputs", []) if i in producer}
            preds.update(by_id[c].index for c in op.d.get("control_deps", []))
            op.preds = sorted(preds)
            for i in op.d.get("inputs", []):
                self.consumers[i] = self.consumers.get(i, 0) + 1
        role = next(r for r in sched["roles"] if r["role"] == self.layout["role"])
        self.streams = [[by_id[i] for i in s["ops"]] for s in role["streams"]]
        self.stream_names = [s["stream"] for s in role["streams"]]
        self.inputs = [n for n in self.tensors if n not in producer]
        self.carry = {n + ".next": n for n in self.inputs if n + ".next" in producer}
        self.losses = [op.d["outputs"][0] for op in self.ops if op.d.get("type") == "cross_entropy"]
        self._groups()
        for op in self.ops:
            op.view = op.kind == "compute" and op.d.get("type") == "identity" and \
                len(op.d.get("inputs", [])) == len(op.d.get("outputs", []))
            if op.kind == "compute":
                ins = [self.tensors[t] for t in op.d["inputs"]]
                outs = [self.tensors[t] for t in op.d["outputs"]]
                op.ctx = torch_kernels.KernelContext(
                    [tuple(t["shape"]) for t in outs], [self._dtype(t) for t in outs],
                    [self.layout["offsets"][t["name"]] for t in ins], [self.layout["offsets"][t["name"]] for t in outs])
            elif op.kind in ("send", "recv"):
                op.peer = self.layout["peers"][op.d["id"]]
        if self.cuda:
            self.cuda_streams = {name: torch.cuda.Stream(device=self.device) for name in self.stream_names}
        self.model = model
        self._index_cache = {}
        self.steps_done = 0
        self._waiters, self._completed = {}, queue.SimpleQueue()
        self.state = {}
        self._init_state(values or {}, seed, model)

    # ---- set-up ------------------------------------------------------------------------------

    def _dtype(self, t):
        if _is_int(t["dtype"]):
            return torch.int64
        return self.float_dtype or TORCH_DTYPES[t["dtype"]]

    def _groups(self):
        """One process group per member set of a collective, made on every rank in one order
        (new_group is collective over the whole world), and one for send/recv."""
        self.pgs, self.p2p = {}, None
        if not dist.is_initialized():
            for op in self.ops:
                if op.kind == "collective":
                    op.group = self.layout["groups"][op.d["id"]]
            return
        for members in _concerto.collective_groups(self.program):
            pg = dist.new_group(members)
            if self.rank in members:
                self.pgs[tuple(members)] = pg
        self.p2p = dist.new_group(list(range(self.world))) if any(o.kind in ("send", "recv") for o in self.ops) else None
        for op in self.ops:
            if op.kind == "collective":
                op.group = tuple(self.layout["groups"][op.d["id"]])
                op.pg = self.pgs.get(op.group)

    def _init_state(self, values, seed, model):
        """The rank's graph inputs: the given global values where named (by init key), the runtime's
        initialisation for the rest."""
        flat = {}
        for k, v in values.items():
            if isinstance(v, torch.Tensor):
                v = v.detach().to("cpu", torch.float32).contiguous().flatten().numpy()
            flat[k] = numpy.ascontiguousarray(numpy.asarray(v, dtype=numpy.float32).reshape(-1))
        kw = {"model": model, "inputs": flat}
        if seed is not None:
            kw["seed"] = seed
        raw = _concerto.rank_inputs(self.program, self.rank, **kw)
        for name, b in raw.items():
            t = self.tensors[name]
            x = torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(t["shape"])
            self.state[name] = x.to(self.device, self._dtype(t))

    def local_slice(self, name, value):
        """This rank's local part of graph input `name` given its global value (a tensor)."""
        if name not in self.tensors:
            raise Error("engine: rank %d (graph '%s') has no tensor '%s'" % (self.rank, self.graph_name, name))
        t = self.tensors[name]
        gshape = self.layout["global_shapes"][name]
        if list(value.shape) != list(gshape):
            raise Error("engine: input '%s' has shape %s; the program's global shape is %s"
                        % (name, list(value.shape), gshape))
        local = value.reshape(-1)[self._global_indices(name).to(value.device)].reshape(t["shape"])
        return local.to(self.device, self._dtype(t))

    def _global_indices(self, name):
        """Per local element of `name` (row-major), its index in the global tensor (cached)."""
        if name not in self._index_cache:
            b = _concerto.global_indices(self.program, self.rank, name, self.model)
            self._index_cache[name] = torch.from_numpy(numpy.frombuffer(b, dtype=numpy.int64).copy())
        return self._index_cache[name]

    # ---- a step --------------------------------------------------------------------------------

    def step(self, data=None, fetch=(), trace=None):
        """Runs one step. `data` {graph input: global value} replaces those inputs for this step
        (a batch; each rank takes its part), `fetch` names tensors to return. Returns a StepResult;
        afterwards every carried input holds its `.next` value.

        `trace`: a list to which the step's ops are appended as Chrome trace events, in the form
        `concerto run --trace` writes (ph "X", pid the rank, tid the stream's index, name the op's
        name, args.id its id, ts/dur in microseconds of the host's monotonic clock), so that
        `concerto profile --from-trace` reads them. A compute op's event is its kernel's time; a
        collective's or transfer's runs from its issue to the moment its end is seen. CPU only (a
        GPU's host issue times say nothing of its kernels)."""
        if trace is not None and self.cuda:
            raise Error("engine: trace: only a CPU run can be traced (this engine runs on %s)" % self.device)
        values = dict(self.state)
        for name, v in (data or {}).items():
            # The input itself and its finer split "<name>.shard" (the partitioner's, e.g. token
            # ids split by sequence under sp): both hold parts of the same global value.
            targets = [n for n in (name, name + ".shard") if n in self.state]
            if not targets:
                raise Error("engine: data '%s' is not a graph input of rank %d (graph '%s')"
                            % (name, self.rank, self.graph_name))
            for n in targets:
                values[n] = self.local_slice(n, v)
        keep = set(fetch) | set(self.carry) | set(self.losses)
        for name in fetch:
            if name not in self.tensors:
                raise Error("engine: fetch '%s': rank %d (graph '%s') has no such tensor"
                            % (name, self.rank, self.graph_name))
        start = time.perf_counter()
        with torch.no_grad():
            if self.cuda:
                self._run_cuda(values, keep)
            else:
                self._run_cpu(values, keep, trace)
        if self.cuda:
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        for nxt, name in self.carry.items():
            self.state[name] = values[nxt]
        self.steps_done += 1
        losses = [float(values[n].reshape(-1)[0]) for n in self.losses]
        loss = sum(losses) / len(losses) if losses else None
        return StepResult(loss, losses, elapsed, {n: values[n] for n in fetch})

    def _run_cpu(self, values, keep, trace=None):
        """Issue loop on the host: a stream's head is issued when the op's predecessors are done and
        the stream is idle, or, for a collective, when the stream's earlier ops are issued (a comm
        stream's collectives queue in its order instead of each waiting for the one before to end:
        no gap while the host runs a kernel); streams take turns, one kernel each per pass, and
        completions are looked at after every kernel. Compute runs here; a collective or transfer is handed to its
        stream's waiter thread, which waits for its end while this thread goes on (gloo's
        send/recv and reduce_scatter works never report is_completed, so nothing is polled; its
        reduce_scatter runs inside wait).
        Sends and recvs that become ready in one pass are issued as one batch_isend_irecv."""
        done = [False] * len(self.ops)
        busy = [None] * len(self.streams)  # per stream: the op index in flight
        pending = {}  # op index -> (finish, stream)
        remaining = dict(self.consumers)
        heads = [0] * len(self.streams)
        left = len(self.ops)
        deadline = time.perf_counter() + self.timeout_s
        issued_at = {}  # op index -> perf_counter at issue (traced collectives and transfers)

        def record(op, t0, t1):
            trace.append({"name": op.d["name"], "cat": op.kind, "ph": "X", "pid": self.rank,
                          "tid": self.stream_names.index(op.stream) if op.stream in self.stream_names else 0,
                          "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6, "args": {"id": op.d["id"]}})

        def complete(idx, err):
            nonlocal left
            finish, s = pending.pop(idx)
            if err is not None:
                raise Error("engine: rank %d: %s failed: %s" % (self.rank, self.ops[idx].label, err))
            if trace is not None:
                record(self.ops[idx], issued_at.pop(idx), time.perf_counter())
            finish()
            done[idx] = True
            if busy[s] == idx:
                busy[s] = None
            left -= 1

        while left:
            progressed = False
            while True:
                try:
                    idx, err = self._completed.get_nowait()
                except queue.Empty:
                    break
                complete(idx, err)
                progressed = True
            batch = []
            for s, order in enumerate(self.streams):
                while busy[s] is None and heads[s] < len(order):
                    op = order[heads[s]]
                    if not all(done[p] for p in op.preds):
                        break
                    heads[s] += 1
                    progressed = True
                    if op.kind in ("send", "recv"):
                        batch.append((s, op))
                        busy[s] = op.index
                        break
                    t0 = time.perf_counter()
                    res = self._issue(op, values)
                    if trace is not None:
                        if res is None:
                            record(op, t0, time.perf_counter())
                        else:
                            issued_at[op.index] = t0
                    if res is None:
                        done[op.index] = True
                        left -= 1
                        self._release(op, values, remaining, keep)
                        # One kernel per stream per pass: the other streams (a collective whose
                        # gradient this kernel made) issue now, not after this stream's whole run
                        # of ready kernels (the backward), and ended collectives are seen.
                        break
                    else:
                        # A collective: the stream's next one is issued as soon as its inputs are
                        # ready, not when this one ends (gloo runs a group's works in issue order
                        # on its own threads, as DDP's buckets); the waiter sees them end in order.
                        pending[op.index] = (self._finisher(op, res[1], values, remaining, keep), s)
                        self._waiter(s).put((op.index, res[0]))
            if batch:
                t0 = time.perf_counter()
                made = [(s, op) + self._p2p(op, values) for s, op in batch]
                if trace is not None:
                    issued_at.update((op.index, t0) for _, op in batch)
                works = dist.batch_isend_irecv([m[2] for m in made])
                for (s, op, _, fin), w in zip(made, works):
                    pending[op.index] = (self._finisher(op, fin, values, remaining, keep), s)
                    self._waiter(s).put((op.index, [w]))
            if progressed:
                deadline = time.perf_counter() + self.timeout_s
            elif pending:
                try:
                    idx, err = self._completed.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    waiting = ", ".join(self.ops[i].label for i in sorted(pending)[:4])
                    raise Error("engine: rank %d: step %d timed out after %g s waiting for %s"
                                % (self.rank, self.steps_done, self.timeout_s, waiting)) from None
                complete(idx, err)
            else:
                stuck = [order[heads[s]].label for s, order in enumerate(self.streams) if heads[s] < len(order)]
                raise Error("engine: rank %d: no op can run (a dependency cycle through the schedule): %s"
                            % (self.rank, ", ".join(stuck[:4])))

    def _waiter(self, s):
        """Stream s's waiter thread (made on first use, kept over the steps): waits for each
        work handed to it, in order, and reports (op index, error or None) on _completed."""
        q = self._waiters.get(s)
        if q is None:
            q = queue.SimpleQueue()

            def loop():
                while True:
                    item = q.get()
                    if item is None:
                        return
                    idx, works = item
                    try:
                        for w in works:
                            w.wait()
                        self._completed.put((idx, None))
                    except Exception as e:  # reported to the issuing thread with the op's name
                        self._completed.put((idx, e))

            threading.Thread(target=loop, name="concerto-stream-%s" % self.stream_names[s], daemon=True).start()
            self._waiters[s] = q
        return q

    def close(self):
        """Ends the waiter threads (also at exit: they are daemons)."""
        for q in self._waiters.values():
            q.put(None)
        self._waiters = {}

    def _run_cuda(self, values, keep):
        """Issue loop on the host for CUDA: every op is issued on its stream once its
        predecessors are issued (their events order the device); nothing blocks the host."""
        issued = [False] * len(self.ops)
        events = [None] * len(self.ops)
        # The state and this step's data were written on the current stream (the constructor,
        # local_slice, load_state_dict): every IR stream starts after them.
        current = torch.cuda.current_stream(self.device)
        for stream in self.cuda_streams.values():
            stream.wait_stream(current)
        heads = [0] * len(self.streams)
        left = len(self.ops)
        remaining = dict(self.consumers)
        while left:
            progressed = False
            for s, order in enumerate(self.streams):
                stream = self.cuda_streams[self.stream_names[s]]
                while heads[s] < len(order):
                    op = order[heads[s]]
                    if not all(issued[p] for p in op.preds):
                        break
                    heads[s] += 1
                    progressed = True
                    with torch.cuda.stream(stream):
                        for p in op.preds:
                            if events[p] is not None and self.ops[p].stream != op.stream:
                                stream.wait_event(events[p])
                        for name in op.d.get("inputs", []):
                            t = values.get(name)
                            if t is not None and t.is_cuda:
                                t.record_stream(stream)
                        if op.kind in ("send", "recv"):
                            o, fin = self._p2p(op, values)
                            for w in dist.batch_isend_irecv([o]):
                                w.wait()
                            fin()
                        else:
                            res = self._issue(op, values)
                            if res is not None:
                                for w in res[0]:
                                    w.wait()  # the stream (not the host) waits for the collective
                                res[1]()
                        ev = torch.cuda.Event()
                        ev.record(stream)
                        events[op.index] = ev
                    issued[op.index] = True
                    left -= 1
                    self._release(op, values, remaining, keep)
            if not progressed:
                stuck = [order[heads[s]].label for s, order in enumerate(self.streams) if heads[s] < len(order)]
                raise Error("engine: rank %d: no op can run (a dependency cycle through the schedule): %s"
                            % (self.rank, ", ".join(stuck[:4])))
        for stream in self.cuda_streams.values():  # what reads the results next runs on the current stream
            current.wait_stream(stream)

    def _release(self, op, values, remaining, keep):
        """Drops the tensors whose last reader `op` was (the step's memory stays near its live set)."""
        for name in op.d.get("inputs", []):
            n = remaining.get(name, 0) - 1
            remaining[name] = n
            if n <= 0 and name not in keep and name not in self.state:
                values.pop(name, None)

    def _finisher(self, op, fin, values, remaining, keep):
        def finish():
            fin()
            self._release(op, values, remaining, keep)
        return finish

    # ---- issuing ops ---------------------------------------------------------------------------

    def _issue(self, op, values):
        """Runs a compute or copy op (returns None), or issues a collective: returns (works,
        finish) where finish() stores its outputs once the works have completed."""
        d = op.d
        try:
            ins = [values[n] for n in d.get("inputs", [])]
        except KeyError as e:
            raise Error("engine: rank %d: %s reads tensor %s, which has no value (freed or never written)"
                        % (self.rank, op.label, e)) from None
        if op.kind == "compute":
            if op.view and all(x.is_contiguous() and dt in (x.dtype, None) and x.numel() == math.prod(shape)
                               for x, shape, dt in zip(ins, op.ctx.out_shapes, op.ctx.out_dtypes)):
                # The engine never writes into a value, so a reshape that is a view needs no copy
                # (the kernel table's identity copies: its other callers may write into outputs).
                for n, x, shape in zip(d["outputs"], ins, op.ctx.out_shapes):
                    values[n] = x.view(shape)
                return None
            op.ctx.step = self.steps_done
            outs = torch_kernels.run_kernel(d, ins, op.ctx)
            for n, v in zip(d["outputs"], outs):
                values[n] = v
            return None
        if op.kind == "copy":
            for n, v in zip(d["outputs"], ins):
                values[n] = v.clone()
            return None
        if op.kind == "collective":
            return self._collective(op, ins, values)
        raise Error("engine: %s: kind '%s' cannot be issued here" % (op.label, op.kind))

    def _out_meta(self, op):
        return [self.tensors[n] for n in op.d["outputs"]]

    def _collective(self, op, ins, values):
        d = op.d
        kind = d["collective"]
        outs = self._out_meta(op)
        n = len(op.group)
        dtype = ins[0].dtype
        if any(x.dtype != dtype for x in ins):
            raise Error("engine: %s: a fused collective over tensors of different dtypes" % op.label)
        if n == 1:  # the rank alone: the output is the input
            for name, x, t in zip(d["outputs"], ins, outs):
                values[name] = x.reshape(t["shape"]).clone()
            return None
        pg = op.pg
        rop = dist.ReduceOp.MAX if d.get("reduce") == "max" else dist.ReduceOp.SUM
        if kind in ("all_reduce", "broadcast"):
            buf = torch.cat([x.reshape(-1) for x in ins]) if len(ins) > 1 else ins[0].reshape(-1).clone()
            if kind == "all_reduce":
                w = dist.all_reduce(buf, op=rop, group=pg, async_op=True)
            else:
                w = dist.broadcast(buf, src=op.group[0], group=pg, async_op=True)
            return [w], lambda: _store_segments(values, d["outputs"], outs, buf)
        if kind == "all_gather":
            buf = torch.cat([x.reshape(-1) for x in ins]) if len(ins) > 1 else ins[0].reshape(-1).contiguous()
            out = torch.empty(n * buf.numel(), dtype=dtype, device=buf.device)
            w = dist.all_gather_into_tensor(out, buf, group=pg, async_op=True)

            def finish():
                blocks = out.reshape(n, -1)
                off = 0
                for name, x, t in zip(d["outputs"], ins, outs):
                    k = x.numel()
                    values[name] = _place_blocks(blocks[:, off:off + k], list(x.shape), t["shape"], op.label)
                    off += k
            return [w], finish
        if kind == "reduce_scatter":
            packed = torch.cat([_member_blocks(x, list(x.shape), t["shape"], n, op.label) for x, t in zip(ins, outs)],
                               dim=1)
            out = torch.empty(packed.shape[1], dtype=dtype, device=packed.device)
            w = dist.reduce_scatter_tensor(out, packed.reshape(-1).contiguous(), op=rop, group=pg, async_op=True)
            return [w], lambda: _store_segments(values, d["outputs"], outs, out)
        if kind == "all_to_all":
            packed = torch.cat([x.reshape(n, -1) for x in ins], dim=1).contiguous()
            out = torch.empty_like(packed)
            w = dist.all_to_all_single(out, packed, group=pg, async_op=True)

            def finish():
                off = 0
                for name, x, t in zip(d["outputs"], ins, outs):
                    k = x.numel() // n
                    values[name] = out[:, off:off + k].reshape(t["shape"])
                    off += k
            return [w], finish
        raise Error("engine: %s: collective '%s' is not supported" % (op.label, kind))

    def _p2p(self, op, values):
        """The P2POp of a send (its inputs concatenated) or recv, and what stores a recv's outputs."""
        d = op.d
        tag = int(d.get("tag", 0))
        if op.kind == "send":
            ins = [values[n] for n in d["inputs"]]
            buf = torch.cat([x.reshape(-1) for x in ins]) if len(ins) > 1 else ins[0].reshape(-1).contiguous()
            return dist.P2POp(dist.isend, buf, op.peer, group=self.p2p, tag=tag), (lambda: None)
        outs = self._out_meta(op)
        dtypes = {self._dtype(t) for t in outs}
        if len(dtypes) != 1:
            raise Error("engine: %s: a recv of tensors of different dtypes" % op.label)
        buf = torch.empty(sum(math.prod(t["shape"]) for t in outs), dtype=dtypes.pop(), device=self.device)
        return (dist.P2POp(dist.irecv, buf, op.peer, group=self.p2p, tag=tag),
                lambda: _store_segments(values, d["outputs"], outs, buf))

    # ---- state -----------------------------------------------------------------------------------

    def state_dict(self):
        """This rank's persistent state: {graph input: tensor} (parameters, shards, optimizer
        moments, constants, the last data) and the steps taken."""
        return {"steps_done": self.steps_done, "program": self.program.name, "rank": self.rank,
                "world": self.world, "tensors": {k: v.detach().cpu() for k, v in self.state.items()}}

    def load_state_dict(self, sd):
        """Restores what state_dict() returned on the same rank of the same program."""
        if sd.get("program") != self.program.name or sd.get("world") != self.world or sd.get("rank") != self.rank:
            raise Error("engine: checkpoint of program '%s', rank %s of %s does not fit program '%s', rank %d of %d"
                        % (sd.get("program"), sd.get("rank"), sd.get("world"), self.program.name, self.rank,
                           self.world))
        for name, v in sd["tensors"].items():
            if name not in self.state:
                raise Error("engine: checkpoint tensor '%s' is not a graph input of rank %d" % (name, self.rank))
            if list(v.shape) != list(self.state[name].shape):
                raise Error("engine: checkpoint tensor '%s' has shape %s, the program's is %s"
                            % (name, list(v.shape), list(self.state[name].shape)))
            self.state[name] = v.to(self.device, self.state[name].dtype)
        self.steps_done = int(sd["steps_done"])

    def gather(self, names):
        """The global values of `names` (init keys of graph inputs: a parameter `P` is read from
        `P` or, where only a shard is held, `P.shard`), assembled from every rank's part, as
        float64 tensors; every rank gets them (collective: every rank must call it with the same
        names)."""
        mine = {}
        for key in names:
            local = key if key in self.state else (key + ".shard" if key + ".shard" in self.state else None)
            if local is None:
                continue
            mine[key] = (self.layout["global_shapes"][local], self._global_indices(local).numpy(),
                         self.state[local].detach().double().cpu().reshape(-1).numpy())
        parts = [mine]
        if dist.is_initialized() and self.world > 1:
            parts = [None] * self.world
            dist.all_gather_object(parts, mine)
        out = {}
        for key in names:
            full = None
            for part in parts:
                if key not in part:
                    continue
                shape, idx, vals = part[key]
                if full is None:
                    full = numpy.zeros(math.prod(shape), dtype=numpy.float64)
                    gshape = shape
                full[idx] = vals
            if full is None:
                raise Error("engine: no rank holds '%s' (or '%s.shard')" % (key, key))
            out[key] = torch.from_numpy(full).reshape(gshape)
        return out


def _store_segments(values, names, metas, flat):
    """values[names[i]] = the i-th consecutive segment of `flat`, in the shape of metas[i] (what
    a fused collective or a message of several tensors received)."""
    off = 0
    for name, t in zip(names, metas):
        k = math.prod(t["shape"])
        values[name] = flat[off:off + k].reshape(t["shape"])
        off += k


def _split_dim(in_shape, out_shape, label):
    """The one dim where a gather's (or scatter's) two shapes differ."""
    diff = [i for i, (a, b) in enumerate(zip(in_shape, out_shape)) if a != b]
    if len(in_shape) != len(out_shape) or len(diff) > 1:
        raise Error("engine: %s: shapes %s and %s differ in more than one dim" % (label, in_shape, out_shape))
    return diff[0] if diff else 0


def _place_blocks(blocks, in_shape, out_shape, label):
    """all_gather's output: member m's block (row m of `blocks`) placed at block m of the one dim
    where `out_shape` and `in_shape` differ."""
    n = blocks.shape[0]
    d = _split_dim(in_shape, out_shape, label)
    x = blocks.reshape([n] + in_shape).movedim(0, d)
    return x.reshape(out_shape)


def _member_blocks(x, in_shape, out_shape, n, label):
    """reduce_scatter's input laid out member-major: [n, block] with block m the m-th slice of
    the dim where `in_shape` and `out_shape` differ."""
    d = _split_dim(in_shape, out_shape, label)
    shape = in_shape[:d] + [n, in_shape[d] // n] + in_shape[d + 1:]
    return x.reshape(shape).movedim(d, 0).reshape(n, -1)
