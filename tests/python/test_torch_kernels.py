"""The torch kernels of the IR's compute types (concerto.torch_kernels) against the C++ CPU runtime.

Checks that KERNELS holds exactly the op registry's compute types in registry order; that every
compute type, in each of its variants (attributes, optional inputs), computes what the fp32 C++
kernels compute: each case is a one-op IR program whose inputs are all graph inputs and whose
outputs are all graph outputs, run by concerto.execute on the same values (ids as exact floats);
that the sharded offsets (embedding, embedding_grad, gather_target, cross_entropy_grad) agree with
two-rank C++ programs and with hand-computed expectations; and that run_kernel names the op when
its type has no kernel.

Tolerance: max |torch - C++| <= 1e-5 * max(1, max |C++|) per output (relative 1e-5; integer
outputs exactly). Runs in a few seconds.
"""
import json
import unittest

import numpy as np
import torch

import concerto

try:
    from concerto import torch_kernels as tk
except ImportError:  # a build whose configure step predates the module: load it from the source tree
    import importlib.util
    import os

    _PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "concerto",
                         "torch_kernels.py")
    _SPEC = importlib.util.spec_from_file_location("concerto.torch_kernels", _PATH)
    tk = importlib.util.module_from_spec(_SPEC)
    _SPEC.loader.exec_module(tk)

RTOL = 1e-5
_IR_DTYPE = {torch.float32: "f32", torch.int64: "i64"}


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def _ids(gen, high, *shape):
    return torch.randint(0, high, shape, generator=gen, dtype=torch.int64)


def _local_shape(shape, sharding, tp):
    """The local shape of a tensor of global `shape` under `sharding` over mesh axis tp."""
    if not sharding:
        return list(shape)
    return [d // tp if axes else d for d, axes in zip(shape, sharding)]


def _program(op_type, attrs, inputs, outputs, tp=1, per_rank=False, sharding=None):
    """IR text of a program with one compute op: `inputs` {name: global tensor} are graph inputs,
    `outputs` [(name, local shape, torch dtype)] graph outputs. With tp > 1 the mesh is tp=`tp`,
    `sharding` {name: per-dim axis lists} shards tensors over it; with per_rank each rank runs its
    own graph 'r<rank>' whose outputs are named '<name>_r<rank>' (for outputs that differ between
    ranks but are replicated)."""
    sharding = sharding or {}

    def tensor(name, shape, dtype):
        t = {"name": name, "shape": list(shape), "dtype": _IR_DTYPE[dtype]}
        if name in sharding:
            t["sharding"] = sharding[name]
        return t

    def graph(suffix):
        tensors = [tensor(n, _local_shape(v.shape, sharding.get(n), tp), v.dtype) for n, v in inputs.items()]
        tensors += [tensor(n + suffix, s, d) for n, s, d in outputs]
        op = {"id": 0, "name": op_type, "kind": "compute", "type": op_type, "attrs": attrs,
              "inputs": list(inputs), "outputs": [n + suffix for n, _, _ in outputs]}
        return {"name": "r" + suffix[2:] if suffix else "main", "tensors": tensors, "ops": [op]}

    prog = {"format": "concerto-ir", "version": 1, "name": "one_" + op_type,
            "mesh": {"axes": [{"name": "tp", "size": tp}] if tp > 1 else []}}
    if per_rank:
        prog["graphs"] = [graph(f"_r{r}") for r in range(tp)]
        prog["roles"] = [{"name": f"r{r}", "graph": f"r{r}", "ranks": [r]} for r in range(tp)]
    else:
        prog["graphs"] = [graph("")]
    return json.dumps(prog)


def run_cpp(op_type, attrs, inputs, outputs, **kw):
    """The C++ runtime's outputs of the one-op program: {fetched name: float64 tensor (global)}."""
    text = _program(op_type, attrs, inputs, outputs, **kw)
    program = concerto.parse_program(text)
    tp, per_rank = kw.get("tp", 1), kw.get("per_rank", False)
    names = [n + (f"_r{r}" if per_rank else "") for n, _, _ in outputs for r in (range(tp) if per_rank else [0])]
    values = {n: np.ascontiguousarray(v.reshape(-1).numpy().astype(np.float32)) for n, v in inputs.items()}
    res = concerto.execute(program, scheduler="fifo", inputs=values, fetch=names, as_buffers=True)
    out = {}
    for n in names:
        t = res["tensors"][n]
        out[n] = torch.from_numpy(np.frombuffer(t["values"], np.float32).copy()).reshape(t["shape"]).double()
    return out


def run_torch(op_type, attrs, inputs, outputs, step=0, in_offsets=None, out_offsets=None, op_id=0):
    """concerto.torch_kernels' outputs of the op on `inputs` (local tensors, dict order)."""
    op = {"id": op_id, "name": op_type, "type": op_type, "attrs": attrs,
          "inputs": list(inputs), "outputs": [n for n, _, _ in outputs]}
    ctx = tk.KernelContext([tuple(s) for _, s, _ in outputs], [d for _, _, d in outputs],
                           in_offsets or [[0] * v.dim() for v in inputs.values()],
                           out_offsets or [[0] * len(s) for _, s, _ in outputs], step=step)
    return tk.run_kernel(op, list(inputs.values()), ctx)


class Case:
    """One op checked against the C++ runtime: `attrs` for torch, `cpp_attrs` (default the same)
    for the C++ program, `step` the KernelContext's step."""

    def __init__(self, label, op_type, attrs, inputs, outputs, step=0, cpp_attrs=None):
        self.label, self.op_type, self.attrs = label, op_type, attrs
        self.inputs, self.outputs, self.step = inputs, outputs, step
        self.cpp_attrs = attrs if cpp_attrs is None else cpp_attrs


def _f(name, shape):
    return (name, tuple(shape), torch.float32)


def _i(name, shape):
    return (name, tuple(shape), torch.int64)


def _distinct_ids(gen, experts, k, *lead):
    """[*lead, k] ids, distinct within each row (as top_k makes them)."""
    rows = int(np.prod(lead))
    keys = torch.rand(rows, experts, generator=gen)
    return keys.argsort(dim=-1)[:, :k].reshape(*lead, k).contiguous()


def _cases():
    g = torch.Generator().manual_seed(1234)
    r = lambda *s: _randn(g, *s)  # noqa: E731
    cases = []
    add = cases.append

    # matmul: plain with a broadcast 2-D b, each transpose flag, a batched b, both flags batched.
    add(Case("plain", "matmul", {}, {"a": r(2, 3, 4, 5), "b": r(5, 6)}, [_f("c", (2, 3, 4, 6))]))
    add(Case("transpose_a", "matmul", {"transpose_a": 1}, {"a": r(2, 5, 4), "b": r(5, 6)}, [_f("c", (2, 4, 6))]))
    add(Case("transpose_b", "matmul", {"transpose_b": 1}, {"a": r(3, 4), "b": r(6, 4)}, [_f("c", (3, 6))]))
    add(Case("batched_b", "matmul", {}, {"a": r(2, 3, 4), "b": r(2, 4, 5)}, [_f("c", (2, 3, 5))]))
    add(Case("both_flags_batched", "matmul", {"transpose_a": 1, "transpose_b": 1},
             {"a": r(2, 5, 4), "b": r(2, 6, 5)}, [_f("c", (2, 4, 6))]))
    # elementwise
    add(Case("same_shape", "add", {}, {"x": r(3, 4), "y": r(3, 4)}, [_f("z", (3, 4))]))
    add(Case("bias", "add", {}, {"x": r(2, 3, 5), "y": r(5)}, [_f("z", (2, 3, 5))]))
    add(Case("suffix", "add", {}, {"x": r(2, 3, 4), "y": r(3, 4)}, [_f("z", (2, 3, 4))]))
    add(Case("", "mul", {}, {"x": r(3, 4), "y": r(3, 4)}, [_f("z", (3, 4))]))
    add(Case("default", "scale", {}, {"x": r(3, 4)}, [_f("y", (3, 4))]))
    add(Case("scale", "scale", {"scale": -2.5}, {"x": r(3, 4)}, [_f("y", (3, 4))]))
    x = r(4, 6) * 2
    add(Case("tanh", "gelu", {}, {"x": x}, [_f("y", (4, 6))]))
    add(Case("exact", "gelu", {"exact": 1}, {"x": x}, [_f("y", (4, 6))]))
    add(Case("tanh", "gelu_grad", {}, {"dy": r(4, 6), "x": x}, [_f("dx", (4, 6))]))
    add(Case("exact", "gelu_grad", {"exact": 1}, {"dy": r(4, 6), "x": x}, [_f("dx", (4, 6))]))
    add(Case("", "silu", {}, {"x": x}, [_f("y", (4, 6))]))
    add(Case("", "silu_grad", {}, {"dy": r(4, 6), "x": x}, [_f("dx", (4, 6))]))
    add(Case("", "swiglu", {}, {"gate": x, "up": r(4, 6)}, [_f("y", (4, 6))]))
    add(Case("", "swiglu_grad", {}, {"dy": r(4, 6), "gate": x, "up": r(4, 6)},
             [_f("dgate", (4, 6)), _f("dup", (4, 6))]))
    xr = torch.where(x.abs() < 0.5, torch.zeros_like(x), x)  # exact zeros: relu'(0) = 0
    add(Case("", "relu", {}, {"x": xr}, [_f("y", (4, 6))]))
    add(Case("", "relu_grad", {}, {"dy": r(4, 6), "x": xr}, [_f("dx", (4, 6))]))
    # norms and softmax
    xn = r(2, 3, 8) * 3 + 1
    add(Case("default_eps", "layer_norm", {}, {"x": xn, "gamma": r(8), "beta": r(8)}, [_f("y", (2, 3, 8))]))
    add(Case("eps", "layer_norm", {"eps": 1e-2}, {"x": xn, "gamma": r(8), "beta": r(8)}, [_f("y", (2, 3, 8))]))
    add(Case("eps", "layer_norm_grad", {"eps": 1e-3}, {"dy": r(2, 3, 8), "x": xn, "gamma": r(8)},
             [_f("dx", (2, 3, 8)), _f("dgamma", (8,)), _f("dbeta", (8,))]))
    add(Case("default_eps", "rms_norm", {}, {"x": xn, "gamma": r(8)}, [_f("y", (2, 3, 8))]))
    add(Case("eps", "rms_norm_grad", {"eps": 1e-2}, {"dy": r(2, 3, 8), "x": xn, "gamma": r(8)},
             [_f("dx", (2, 3, 8)), _f("dgamma", (8,))]))
    add(Case("", "softmax", {}, {"x": xn}, [_f("y", (2, 3, 8))]))
    add(Case("", "softmax_grad", {}, {"dy": r(2, 3, 8), "y": torch.softmax(xn, -1)}, [_f("dx", (2, 3, 8))]))
    # attention: grouped-query, causal, explicit scale; plain multi-head with the default scale
    b, s, d = 2, 5, 3
    q, k, v, do = r(b, s, 4 * d), r(b, s, 2 * d), r(b, s, 2 * d), r(b, s, 4 * d)
    gqa = {"heads": 4, "kv_heads": 2, "causal": 1, "scale": 0.3}
    add(Case("gqa_causal_scale", "attention", gqa, {"q": q, "k": k, "v": v}, [_f("o", (b, s, 4 * d))]))
    qm, km, vm = r(b, s, 2 * d), r(b, s, 2 * d), r(b, s, 2 * d)
    add(Case("mha", "attention", {"heads": 2}, {"q": qm, "k": km, "v": vm}, [_f("o", (b, s, 2 * d))]))
    grads = [_f("dq", (b, s, 4 * d)), _f("dk", (b, s, 2 * d)), _f("dv", (b, s, 2 * d))]
    add(Case("gqa_causal_scale", "attention_grad", gqa, {"do": do, "q": q, "k": k, "v": v}, grads))
    add(Case("mha", "attention_grad", {"heads": 2}, {"do": r(b, s, 2 * d), "q": qm, "k": km, "v": vm},
             [_f("dq", (b, s, 2 * d)), _f("dk", (b, s, 2 * d)), _f("dv", (b, s, 2 * d))]))
    o = tk.run_kernel({"id": 0, "name": "fwd", "type": "attention", "attrs": gqa}, [q, k, v],
                      tk.KernelContext([(b, s, 4 * d)], [torch.float32], None, None))[0]
    add(Case("gqa_with_forward_output", "attention_grad", gqa, {"do": do, "q": q, "k": k, "v": v, "o": o}, grads))
    # embedding and the loss (one rank: offsets 0)
    ids = _ids(g, 7, 2, 3)
    ids[0, 0] = ids[1, 2]  # a repeated id: embedding_grad sums
    add(Case("", "embedding", {}, {"table": r(7, 4), "ids": ids}, [_f("y", (2, 3, 4))]))
    add(Case("", "embedding_grad", {}, {"dy": r(2, 3, 4), "ids": ids}, [_f("dtable", (7, 4))]))
    logits = r(2, 3, 7) * 2
    m = logits.amax(-1)
    z = torch.exp(logits - m.unsqueeze(-1)).sum(-1)
    labels = _ids(g, 7, 2, 3)
    add(Case("", "reduce_max", {}, {"x": logits}, [_f("m", (2, 3))]))
    add(Case("", "sum_exp", {}, {"x": logits, "m": m}, [_f("z", (2, 3))]))
    add(Case("", "gather_target", {}, {"logits": logits, "labels": labels}, [_f("t", (2, 3))]))
    target = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    add(Case("default_denominator", "cross_entropy", {}, {"m": m, "z": z, "target": target}, [_f("loss", ())]))
    add(Case("denominator", "cross_entropy", {"denominator": 4}, {"m": m, "z": z, "target": target},
             [_f("loss", (1,))]))
    add(Case("default_denominator", "cross_entropy_grad", {}, {"logits": logits, "m": m, "z": z, "labels": labels},
             [_f("dlogits", (2, 3, 7))]))
    add(Case("denominator", "cross_entropy_grad", {"denominator": 12},
             {"logits": logits, "m": m, "z": z, "labels": labels}, [_f("dlogits", (2, 3, 7))]))
    # adam: defaults; weight decay with step 5 = attrs step 2 + ctx.step 3; the f32 master copy
    p, gr, mom, var = r(3, 4), r(3, 4), r(3, 4) * 0.1, r(3, 4).abs() * 0.1
    outs = [_f("p2", (3, 4)), _f("m2", (3, 4)), _f("v2", (3, 4))]
    add(Case("defaults", "adam", {}, {"param": p, "grad": gr, "m": mom, "v": var}, outs))
    hyper = {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1}
    add(Case("weight_decay_step", "adam", dict(hyper, step=2), {"param": p, "grad": gr, "m": mom, "v": var}, outs,
             step=3, cpp_attrs=dict(hyper, step=5)))
    add(Case("master", "adam", dict(hyper, step=1), {"param": p, "grad": gr, "m": mom, "v": var, "pm": p + 0.01},
             outs + [_f("pm2", (3, 4))], step=1, cpp_attrs=dict(hyper, step=2)))
    # data movement
    xs = r(3, 5, 4)
    add(Case("axis1", "slice", {"axis": 1, "start": 1, "len": 3}, {"x": xs}, [_f("y", (3, 3, 4))]))
    add(Case("axis0", "slice", {"axis": 0, "start": 2}, {"x": xs}, [_f("y", (1, 5, 4))]))
    add(Case("three", "concat", {"axis": 1}, {"a": r(2, 1, 3), "b": r(2, 4, 3), "c": r(2, 2, 3)},
             [_f("y", (2, 7, 3))]))
    add(Case("one", "concat", {"axis": 0}, {"a": r(2, 3)}, [_f("y", (2, 3))]))
    xc = r(3, 5) * 4
    xc[0, :3] = torch.tensor([2.0, -2.0, -0.5])  # exact integers and a value in (-1, 0)
    add(Case("float_to_int", "cast", {}, {"x": xc}, [_i("y", (3, 5))]))
    add(Case("int_to_float", "cast", {}, {"x": _ids(g, 100, 3, 5) - 50}, [_f("y", (3, 5))]))
    add(Case("reshape", "identity", {}, {"a": r(2, 3, 4), "b": r(5)}, [_f("a2", (6, 4)), _f("b2", (5, 1))]))
    add(Case("middle_dims", "transpose", {"axis0": 1, "axis1": 2}, {"x": r(2, 3, 4, 5)}, [_f("y", (2, 4, 3, 5))]))
    add(Case("outer_inner", "transpose", {"axis0": 3, "axis1": 0}, {"x": r(2, 3, 4, 5)}, [_f("y", (5, 3, 4, 2))]))
    # mixture of experts: ties in the probabilities; G=2 groups of n=5 tokens, k=2 of E=3 experts,
    # C=2 slots per expert and group: 10 choices for 6 slots per group, so some are dropped
    probs = torch.softmax(torch.round(r(2, 5, 6) * 2) / 2, -1)  # rounded: equal values in a row
    add(Case("ties", "top_k", {"k": 3}, {"probs": probs}, [_f("gates", (2, 5, 3)), _i("ids", (2, 5, 3))]))
    add(Case("normalize", "top_k", {"k": 2, "normalize": 1}, {"probs": probs},
             [_f("gates", (2, 5, 2)), _i("ids", (2, 5, 2))]))
    tids = _distinct_ids(g, 6, 2, 2, 5)
    add(Case("plain", "top_k_grad", {}, {"dgates": r(2, 5, 2), "ids": tids, "probs": probs}, [_f("dprobs", (2, 5, 6))]))
    add(Case("normalize", "top_k_grad", {"normalize": 1}, {"dgates": r(2, 5, 2), "ids": tids, "probs": probs},
             [_f("dprobs", (2, 5, 6))]))
    G, n, h, kk, E, C = 2, 5, 3, 2, 3, 2
    mids = _distinct_ids(g, E, kk, G, n)
    add(Case("drops", "moe_dispatch", {}, {"x": r(G, n, h), "ids": mids}, [_f("buffers", (E, G * C, h))]))
    add(Case("drops", "moe_dispatch_grad", {}, {"dbuffers": r(E, G * C, h), "ids": mids}, [_f("dx", (G, n, h))]))
    add(Case("drops", "moe_combine", {}, {"y": r(E, G * C, h), "ids": mids, "gates": r(G, n, kk)},
             [_f("out", (G, n, h))]))
    add(Case("drops", "moe_combine_grad", {}, {"dout": r(G, n, h), "y": r(E, G * C, h), "ids": mids,
                                               "gates": r(G, n, kk)},
             [_f("dy", (E, G * C, h)), _f("dgates", (G, n, kk))]))
    # convolution and pooling
    xconv, wconv = r(2, 3, 7, 6), r(4, 3, 3, 3)
    add(Case("default", "conv2d", {}, {"x": xconv, "w": wconv}, [_f("y", (2, 4, 5, 4))]))
    add(Case("stride_padding", "conv2d", {"stride": 2, "padding": 1}, {"x": xconv, "w": wconv},
             [_f("y", (2, 4, 4, 3))]))
    add(Case("stride_padding", "conv2d_grad", {"stride": 2, "padding": 1},
             {"dy": r(2, 4, 4, 3), "x": xconv, "w": wconv}, [_f("dx", (2, 3, 7, 6)), _f("dw", (4, 3, 3, 3))]))
    add(Case("default", "conv2d_grad", {}, {"dy": r(2, 4, 5, 4), "x": xconv, "w": wconv},
             [_f("dx", (2, 3, 7, 6)), _f("dw", (4, 3, 3, 3))]))
    xpool = torch.round(r(2, 3, 7, 7))  # few distinct values: windows with tied maxima
    add(Case("padding", "max_pool2d", {"kernel": 3, "stride": 2, "padding": 1}, {"x": xpool},
             [_f("y", (2, 3, 4, 4))]))
    add(Case("default_stride", "max_pool2d", {"kernel": 2}, {"x": xpool}, [_f("y", (2, 3, 3, 3))]))
    add(Case("padding_ties", "max_pool2d_grad", {"kernel": 3, "stride": 2, "padding": 1},
             {"dy": r(2, 3, 4, 4), "x": xpool}, [_f("dx", (2, 3, 7, 7))]))
    add(Case("overlap_ties", "max_pool2d_grad", {"kernel": 3, "stride": 1}, {"dy": r(2, 3, 5, 5), "x": xpool},
             [_f("dx", (2, 3, 7, 7))]))
    # batch norm: plain (rank 4 and rank 2) and synchronised (global sums over `count` elements)
    xb = r(4, 3, 2, 5) * 2 + 3
    bn_out = [_f("y", (4, 3, 2, 5)), _f("mean", (3,)), _f("invstd", (3,))]
    add(Case("plain", "batch_norm", {}, {"x": xb, "gamma": r(3), "beta": r(3)}, bn_out))
    add(Case("rank2_eps", "batch_norm", {"eps": 1e-2}, {"x": r(6, 3), "gamma": r(3), "beta": r(3)},
             [_f("y", (6, 3)), _f("mean", (3,)), _f("invstd", (3,))]))
    total = xb.sum(dim=(0, 2, 3)).reshape(1, 3) * 2  # as if another rank held the same values
    sqdev = ((xb - (total / 80).reshape(1, 3, 1, 1)) ** 2).sum(dim=(0, 2, 3)).reshape(1, 3) * 2
    add(Case("sync", "batch_norm", {"count": 80, "eps": 1e-3},
             {"x": xb, "gamma": r(3), "beta": r(3), "sum": total, "sqdev": sqdev}, bn_out))
    mean_b = xb.mean(dim=(0, 2, 3))
    inv_b = torch.rsqrt(xb.var(dim=(0, 2, 3), unbiased=False) + 1e-5)
    bng_out = [_f("dx", (4, 3, 2, 5)), _f("dgamma", (3,)), _f("dbeta", (3,))]
    dyb = r(4, 3, 2, 5)
    add(Case("plain", "batch_norm_grad", {}, {"dy": dyb, "x": xb, "gamma": r(3), "mean": mean_b, "invstd": inv_b},
             bng_out))
    gsums = r(2, 3) * 5
    add(Case("sync", "batch_norm_grad", {"count": 80},
             {"dy": dyb, "x": xb, "gamma": r(3), "mean": mean_b, "invstd": inv_b, "gsums": gsums}, bng_out))
    add(Case("sum", "batch_norm_stats", {}, {"x": xb}, [_f("s", (1, 3))]))
    add(Case("sqdev", "batch_norm_stats", {"count": 80}, {"x": xb, "sum": total}, [_f("s", (1, 3))]))
    add(Case("", "batch_norm_grad_stats", {}, {"dy": dyb, "x": xb, "mean": mean_b, "invstd": inv_b},
             [_f("gsums", (2, 3))]))
    return cases


class TorchKernelsTest(unittest.TestCase):
    def assertClose(self, got, ref, what):
        """max |got - ref| <= RTOL * max(1, max |ref|) (integer outputs: exactly)."""
        self.assertEqual(tuple(got.shape), tuple(ref.shape), what)
        if not got.is_floating_point():
            self.assertTrue(torch.equal(got.double(), ref), f"{what}: {got} != {ref}")
            return
        err = (got.double() - ref).abs().max().item() if ref.numel() else 0.0
        tol = RTOL * max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
        self.assertLessEqual(err, tol, f"{what}: max error {err:.3g} > {tol:.3g}")

    def test_table_is_the_registry_in_order(self):
        self.assertEqual(list(tk.KERNELS), [t["name"] for t in concerto.op_types()])

    def test_every_type_against_the_cpp_runtime(self):
        cases = _cases()
        self.assertEqual({c.op_type for c in cases}, set(tk.KERNELS), "a compute type without a case")
        for c in cases:
            with self.subTest(op=c.op_type, case=c.label):
                ref = run_cpp(c.op_type, c.cpp_attrs, c.inputs, c.outputs)
                got = run_torch(c.op_type, c.attrs, c.inputs, c.outputs, step=c.step)
                self.assertEqual(len(got), len(c.outputs))
                for (name, shape, dtype), t in zip(c.outputs, got):
                    self.assertEqual(t.dtype, dtype, name)
                    self.assertEqual(tuple(t.shape), shape, name)
                    self.assertTrue(t.is_contiguous(), name)
                    self.assertClose(t, ref[name], f"{c.op_type} {c.label} {name}")

    def test_outputs_never_alias_inputs(self):
        x = torch.arange(12.0).reshape(3, 4)
        for op_type, attrs, shape in [("identity", {}, (12,)), ("slice", {"axis": 0, "start": 0}, (2, 4)),
                                      ("cast", {}, (3, 4))]:
            (y,) = run_torch(op_type, attrs, {"x": x}, [("y", shape, torch.float32)])
            self.assertNotEqual(tk._storage_ptr(y), tk._storage_ptr(x), op_type)
        self.assertEqual(run_torch("identity", {}, {}, []), [])  # a marker

    # ---- sharded offsets --------------------------------------------------------------------
    # Each op on tp=2 ranks, against the C++ runtime (per-rank graphs where the output is
    # replicated but differs between ranks) and against hand-computed expectations.

    def test_embedding_sharded_rows(self):
        g = torch.Generator().manual_seed(7)
        table, ids = _randn(g, 8, 3), _ids(g, 8, 2, 5)  # global table: rank r holds rows [4r, 4r + 4)
        ref = run_cpp("embedding", {}, {"table": table, "ids": ids}, [_f("y", (2, 5, 3))], tp=2, per_rank=True,
                      sharding={"table": [["tp"], []]})
        for r in range(2):
            (y,) = run_torch("embedding", {}, {"table": table[4 * r:4 * r + 4], "ids": ids}, [_f("y", (2, 5, 3))],
                             in_offsets=[[4 * r, 0], [0, 0]])
            mine = (ids >= 4 * r) & (ids < 4 * r + 4)
            expect = torch.where(mine.unsqueeze(-1), table[ids], torch.zeros(()))
            self.assertTrue(torch.equal(y, expect), f"rank {r}")
            self.assertClose(y, ref[f"y_r{r}"], f"rank {r}")

    def test_embedding_grad_sharded_rows(self):
        g = torch.Generator().manual_seed(8)
        dy, ids = _randn(g, 2, 5, 3), _ids(g, 8, 2, 5)
        ref = run_cpp("embedding_grad", {}, {"dy": dy, "ids": ids}, [_f("dtable", (4, 3))], tp=2,
                      sharding={"dtable": [["tp"], []]})["dtable"]
        for r in range(2):
            (dt,) = run_torch("embedding_grad", {}, {"dy": dy, "ids": ids}, [_f("dtable", (4, 3))],
                              out_offsets=[[4 * r, 0]])
            expect = torch.zeros(4, 3)
            for i, v in enumerate(ids.reshape(-1).tolist()):
                if 4 * r <= v < 4 * r + 4:
                    expect[v - 4 * r] += dy.reshape(-1, 3)[i]
            self.assertClose(dt, expect.double(), f"rank {r} by hand")
            self.assertClose(dt, ref[4 * r:4 * r + 4], f"rank {r}")

    def test_gather_target_sharded_vocab(self):
        g = torch.Generator().manual_seed(9)
        logits, labels = _randn(g, 3, 8), _ids(g, 8, 3)  # rank r holds vocab columns [4r, 4r + 4)
        ref = run_cpp("gather_target", {}, {"logits": logits, "labels": labels}, [_f("t", (3,))], tp=2,
                      per_rank=True, sharding={"logits": [[], ["tp"]]})
        for r in range(2):
            (t,) = run_torch("gather_target", {}, {"logits": logits[:, 4 * r:4 * r + 4], "labels": labels},
                             [_f("t", (3,))], in_offsets=[[0, 4 * r], [0]])
            expect = [logits[i, c].item() if 4 * r <= c < 4 * r + 4 else 0.0 for i, c in enumerate(labels.tolist())]
            self.assertEqual(t.tolist(), expect, f"rank {r}")
            self.assertClose(t, ref[f"t_r{r}"], f"rank {r}")

    def test_cross_entropy_grad_sharded_vocab(self):
        g = torch.Generator().manual_seed(10)
        logits, labels = _randn(g, 2, 3, 8), _ids(g, 8, 2, 3)
        m = logits.amax(-1)
        z = torch.exp(logits - m.unsqueeze(-1)).sum(-1)
        ins = {"logits": logits, "m": m, "z": z, "labels": labels}
        ref = run_cpp("cross_entropy_grad", {"denominator": 6}, ins, [_f("dlogits", (2, 3, 4))], tp=2,
                      sharding={"logits": [[], [], ["tp"]], "dlogits": [[], [], ["tp"]]})["dlogits"]
        expect = (torch.softmax(logits.double(), -1) - torch.nn.functional.one_hot(labels, 8)) / 6
        for r in range(2):
            cols = slice(4 * r, 4 * r + 4)
            (dl,) = run_torch("cross_entropy_grad", {"denominator": 6}, dict(ins, logits=logits[..., cols]),
                              [_f("dlogits", (2, 3, 4))], in_offsets=[[0, 0, 4 * r], [0, 0], [0, 0], [0, 0]])
            self.assertClose(dl, expect[..., cols], f"rank {r} by hand")
            self.assertClose(dl, ref[..., cols], f"rank {r}")

    # ---- errors -----------------------------------------------------------------------------

    def test_unknown_type_names_the_op(self):
        ctx = tk.KernelContext([(2,)], [torch.float32], [[0]], [[0]])
        op = {"id": 12, "name": "layer3.fc1", "type": "matmull", "attrs": {}, "inputs": ["x"], "outputs": ["y"]}
        with self.assertRaises(concerto.Error) as cm:
            tk.run_kernel(op, [torch.zeros(2)], ctx)
        self.assertIn("op 12 'layer3.fc1': matmull:", str(cm.exception))

    def test_expert_id_out_of_range_names_the_op(self):
        ids = torch.tensor([[[0], [3]]])
        with self.assertRaises(concerto.Error) as cm:
            run_torch("moe_dispatch", {}, {"x": torch.zeros(1, 2, 2), "ids": ids}, [_f("b", (3, 2, 2))], op_id=5)
        self.assertIn("op 5 'moe_dispatch': moe_dispatch: expert id 3 at index 1 is outside [0, 3)",
                      str(cm.exception))


if __name__ == "__main__":
    unittest.main()
