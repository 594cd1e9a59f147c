"""Bring a PyTorch module in: ``concerto.torch.capture`` (docs/python.md, "PyTorch models").

``capture(module, example_inputs, labels)`` traces one forward of ``module`` with torch.fx
(``make_fx``: the ATen ops PyTorch runs, on the example tensors, so every shape is concrete),
maps each node to the IR's compute vocabulary (docs/ir.md), appends the loss (mean cross
entropy of the module's output against ``labels``), the backward (the IR's autodiff pass: each
compute type's gradient rule from the op registry) and one Adam step per parameter, and
returns a :class:`Captured`: the unsharded one-rank Program and where every parameter, its
gradient and its updated value live in it. ``Captured.partition`` shards it under a plan
(the SPMD partitioner), ``Captured.run`` executes one step on the CPU runtime with the
module's own parameter values, so the result can be checked against torch's autograd.

Only what the IR can say exactly is mapped; anything else fails with a one-line
:class:`concerto.Error` naming the node, its ATen target and the source line that made it.
Nodes computed only from buffers and constants are evaluated in torch (graph inputs
``const.*``), and a constant an elementwise op broadcasts is broadcast here to the full shape;
a computed operand is broadcast in the IR (ones-matmuls, exact). Compositions of ATen ops that
one IR op computes exactly become that op (_match_patterns: LlamaRMSNorm -> rms_norm, gelu_new
-> gelu with exact 0, silu(g) * u -> swiglu); torch's scaled_dot_product_attention becomes its
definition (matmul, scale, mask, softmax, matmul). Float tensors of every torch dtype (float64
included) are the program's float dtype; conversions between them are nothing.
"""

import inspect
import json
import math
import operator
import os
import re

import torch
from torch.fx.experimental.proxy_tensor import PythonKeyTracer, make_fx

try:  # torch >= 2.0; torch.nn.utils.stateless.functional_call is its deprecated predecessor
    from torch.func import functional_call as _functional_call
except ImportError:  # pragma: no cover - torch 1.13
    from torch.nn.utils.stateless import functional_call as _functional_call

from . import _concerto
from ._concerto import Error

__all__ = ["capture", "Captured", "supported_ops"]

_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
}
# Float tensors of any torch dtype become the program's float dtype (the CPU runtime computes in
# fp32 whatever the IR says); a float64 module is captured as an f32 program by default.
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4}
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)


def _ir_dtype(torch_dtype, float_dtype):
    """The IR dtype of a torch dtype in a program whose float tensors are `float_dtype`; None
    where the IR has none (bool, complex, uint8, ...)."""
    return float_dtype if torch_dtype in _FLOATS else _DTYPES.get(torch_dtype)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class _Value:
    """An fx node's value in the IR: tensor `name` with logical `shape`; with `t` set, the value
    is `name` with its last two dims swapped (a transpose not yet materialised: a matmul folds
    it into transpose_a/transpose_b)."""

    __slots__ = ("name", "shape", "dtype", "t")

    def __init__(self, name, shape, dtype, t=False):
        self.name, self.shape, self.dtype, self.t = name, tuple(shape), dtype, t


class _Unsupported(Exception):
    pass


class _DropoutMask:
    """The random mask make_fx's dropout builds (empty_like -> bernoulli_(1 - p) -> div_(1 - p)),
    until the mul that applies it."""

    def __init__(self):
        self.p = None


def _source_line(node):
    """'file:line `code`' of the innermost frame outside torch and this file, from the stack
    torch.fx recorded for `node` ('' when none was recorded). torch 1.13 records the stack
    innermost frame first, torch 2.x outermost first (and from 2.5 or so only `forward` frames):
    the order is read off the stack itself, from where capture's own frames (`capture` calling
    `step`) stand; without them (forward frames only) it is outermost first."""
    lines = (node.stack_trace or "").splitlines()
    frames, own = [], {}
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in (\S+)', line)
        if not m:
            continue
        path = os.path.abspath(m.group(1))
        if path == _THIS_FILE:
            own.setdefault(m.group(3), len(frames))
            frames.append(None)
            continue
        if path.startswith(_TORCH_DIR + os.sep) or m.group(1).startswith("<"):  # not torchvision's
            frames.append(None)
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
        frames.append("%s:%s%s" % (m.group(1), m.group(2), " `%s`" % code if code else ""))
    if "step" in own:
        # The module's frames lie on the far side of `step` from `capture` (its caller).
        outer_first = own.get("capture", -1) < own["step"]
        inner = frames[own["step"] + 1:] if outer_first else frames[:own["step"]]
    else:
        outer_first, inner = True, frames
    inner = [f for f in inner if f is not None]
    if not inner:
        return ""
    return inner[-1] if outer_first else inner[0]


def _block_of(param_name):
    """The repeated block a parameter belongs to, from its module path: the path up to its first
    numbered component ("layer2.0" of "layer2.0.conv1.weight", "encoder.layers.encoder_layer_3"
    of "...encoder_layer_3.ln_1.weight", "transformer.h.5" of "transformer.h.5.attn.c_attn.weight");
    None outside such blocks (stems, heads, embeddings)."""
    parts = param_name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit() or re.fullmatch(r".*_\d+", part):
            return ".".join(parts[:i + 1])
    return None


class _Graph:
    """The IR graph under construction (the concerto-ir JSON of docs/ir.md)."""

    def __init__(self, flops_table):
        self.tensors = {}
        self.order = []
        self.ops = []
        self.flops_table = flops_table
        self.layer_of = {}  # tensor -> layer tag
        self.param_layer = {}  # parameter tensor -> its block's layer tag (-1: outside the blocks)

    def tensor(self, stem, shape, dtype):
        name, k = stem, 1
        while name in self.tensors:
            k += 1
            name = "%s.%d" % (stem, k)
        self.tensors[name] = {"name": name, "shape": [int(d) for d in shape], "dtype": dtype,
                              "sharding": [[] for _ in shape], "partial": []}
        self.order.append(name)
        return name

    def ones(self, n, dtype):
        """The runtime's all-ones constant "const.ones.<n>" [1, n] (docs/runtime.md)."""
        name = "const.ones.%d" % n
        if name not in self.tensors:
            self.tensors[name] = {"name": name, "shape": [1, n], "dtype": dtype, "sharding": [[], []], "partial": []}
            self.order.append(name)
        return name

    def shape(self, name):
        return self.tensors[name]["shape"]

    def op(self, name, kind, inputs, outputs, flops=None, attrs=None, phase="fwd"):
        if flops is None:
            per, unit = self.flops_table[kind]
            first = outputs[0] if unit == "output element" else inputs[0]
            flops = per * _numel(self.shape(first))
        nbytes = sum(_numel(self.shape(t)) * _ELEM_BYTES[self.tensors[t]["dtype"]] for t in list(inputs) + list(outputs))
        # The layer: its parameters' block (from their module path, _block_of; so the final norm,
        # the output projection and the loss after the last block are -1, as the presets tag
        # them), else the deepest of its inputs'.
        blocks = [self.param_layer[t] for t in inputs if t in self.param_layer]
        layer = max(blocks) if blocks else max([self.layer_of.get(t, -1) for t in inputs] + [-1])
        for t in outputs:
            self.layer_of[t] = layer
        self.ops.append({"id": len(self.ops), "name": name, "kind": "compute", "stream": "compute", "type": kind,
                         "inputs": list(inputs), "outputs": list(outputs), "attrs": attrs or {},
                         "flops": float(flops), "bytes": int(nbytes),
                         "tags": {"phase": phase, "layer": layer, "microbatch": 0, "purpose": ""}})


class _Lowering:
    """Maps the nodes of a make_fx graph to IR ops, one handler per ATen op."""

    def __init__(self, graph, float_dtype, dropout="error", sync_bn=False):
        self.g = graph
        self.float_dtype = float_dtype
        self.dropout = dropout
        self.sync_bn = sync_bn
        self.values = {}    # fx node -> _Value (or a tuple of them for multi-output nodes)
        self.node = None
        self.constants = {}    # IR tensor -> torch tensor: the graph inputs capture evaluated in torch
        self.param_names = {}  # IR tensor -> torch parameter name
        self.param_rows = {}   # IR tensor -> (torch parameter name, row): a parameter's row read without a gradient
        self._bcast = {}       # (constant, shape) -> the constant broadcast to shape
        self.raw_constants = {}  # fx node -> torch tensor: constants of a dtype the IR lacks (bool masks)
        self.view_src = {}     # IR tensor made by a reshape -> the _Value it reshapes (view_chain)

    # ---- helpers --------------------------------------------------------------------------
    def fail(self, why):
        raise _Unsupported(why)

    def val(self, a):
        if not isinstance(a, torch.fx.Node):
            self.fail("argument %r is not a tensor" % (a,))
        v = self.values.get(a)
        if v is None and a in self.raw_constants:
            self.fail("reads the constant '%s' of dtype %s (the IR has no such dtype)"
                      % (a.name, self.raw_constants[a].dtype))
        if v is None:
            self.fail("input '%s' has no value in the IR" % a.name)
        if isinstance(v, tuple):
            self.fail("input '%s' has several outputs; expected one" % a.name)
        return v

    def new(self, shape, dtype=None, stem=None):
        return self.g.tensor(stem or self.node.name, shape, dtype or self.float_dtype)

    def emit(self, kind, inputs, outputs, flops=None, attrs=None, suffix=""):
        self.g.op(self.node.name + suffix, kind, inputs, outputs, flops, attrs)

    def materialize(self, v):
        """The name of a tensor holding v's logical value (emits the pending transpose)."""
        if not v.t:
            return v.name
        r = len(v.shape)
        out = self.new(v.shape, v.dtype, self.node.name + ".t")
        self.emit("transpose", [v.name], [out], 0, {"axis0": r - 2, "axis1": r - 1}, ".t")
        return out

    def view_chain(self, v):
        """v and the values it is a reshape of, nearest first (each the same elements in the same
        order, so any of them can stand for v under its own shape)."""
        chain = [v]
        while v.name in self.view_src and self.view_src[v.name].t == v.t:
            v = self.view_src[v.name]
            chain.append(v)
        return chain

    def reshape(self, v, shape, suffix=".view"):
        """v as `shape`. A reshape back to the shape of a value v was reshaped from returns that
        value (torch's view / bmm / view-back of a 4-D matmul then leaves no reshape behind, so a
        sharded head dim is never merged into the batch)."""
        shape = tuple(int(d) for d in shape)
        if _numel(shape) != _numel(v.shape):
            self.fail("reshape of %s to %s changes the element count" % (list(v.shape), list(shape)))
        for u in self.view_chain(v):
            if tuple(u.shape) == shape:
                return u
        if v.t and len(shape) >= 2 and shape[-2:] == tuple(v.shape[-2:]):
            # Only the batch dims change: reshape the stored tensor, keep the transpose pending.
            stored = shape[:-2] + (shape[-1], shape[-2])
            if stored == tuple(self.g.shape(v.name)):
                return _Value(v.name, shape, v.dtype, True)
            out = self.new(stored, v.dtype, self.node.name + suffix)
            self.emit("identity", [v.name], [out], 0, suffix=suffix)
            self.view_src[out] = v
            return _Value(out, shape, v.dtype, True)
        src = self.materialize(v)
        if shape == tuple(self.g.shape(src)):
            return _Value(src, shape, v.dtype)
        out = self.new(shape, v.dtype, self.node.name + suffix)
        self.emit("identity", [src], [out], 0, suffix=suffix)
        self.view_src[out] = _Value(src, v.shape, v.dtype)
        return _Value(out, shape, v.dtype)

    def transpose(self, v, d0, d1):
        r = len(v.shape)
        d0, d1 = d0 % r, d1 % r
        if d0 == d1:
            return v
        shape = list(v.shape)
        shape[d0], shape[d1] = shape[d1], shape[d0]
        if {d0, d1} == {r - 2, r - 1}:
            return _Value(v.name, shape, v.dtype, not v.t)
        src = self.materialize(v)
        out = self.new(shape, v.dtype, self.node.name + ".t%d%d" % (d0, d1))
        self.emit("transpose", [src], [out], 0, {"axis0": d0, "axis1": d1}, ".t%d%d" % (d0, d1))
        return _Value(out, shape, v.dtype)

    def unmerged_batch(self, a, b):
        """(A, B): a and b as the higher-rank values they were reshaped from by merging leading
        (batch) dims, when both were and the batch dims agree (b may be 2-D); else (a, b).
        torch.matmul of [b, h, s, d] tensors reaches make_fx as view [b*h, s, d] / bmm / view
        back; run on the unmerged tensors, a split of h (tensor-parallel heads) carries through."""
        def source(v):
            for u in self.view_chain(v)[1:]:
                if len(u.shape) > len(v.shape) and tuple(u.shape[-2:]) == tuple(v.shape[-2:]):
                    return u
            return None
        if len(b.shape) == 2 and len(a.shape) == 2 and not a.t:
            # x [b, s, h] viewed as [b*s, h] @ w [h, n]: the rows' dims stay dims (a split of s,
            # sequence parallelism, carries through).
            for u in self.view_chain(a)[1:]:
                if len(u.shape) > 2 and not u.t and u.shape[-1] == a.shape[-1]:
                    return u, b
            return a, b
        A = source(a) if len(a.shape) > 2 else None
        if A is None:
            return a, b
        if len(b.shape) == 2:
            return A, b
        B = source(b)
        if B is None or tuple(A.shape[:-2]) != tuple(B.shape[:-2]):
            return a, b
        return A, B

    def matmul(self, a, b, suffix=""):
        """c = a @ b with a [..., m, k], b [k, n] or [..., k, n]; pending transposes fold in."""
        if len(a.shape) < 2 or len(b.shape) < 2:
            self.fail("matmul of shapes %s and %s (both need rank >= 2)" % (list(a.shape), list(b.shape)))
        A, B = self.unmerged_batch(a, b)
        if A is not a:
            c = self.matmul(A, B, suffix)
            return self.reshape(c, tuple(a.shape[:-1]) + (b.shape[-1],), suffix + ".batch")
        if len(b.shape) > 2 and a.shape[:-2] != b.shape[:-2]:
            self.fail("matmul batch dims %s and %s differ" % (list(a.shape[:-2]), list(b.shape[:-2])))
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        shape = tuple(a.shape[:-2]) + (m, n)
        out = self.new(shape, a.dtype, self.node.name + suffix if suffix else None)
        flops = 2.0 * _numel(a.shape[:-2]) * m * n * k
        self.emit("matmul", [a.name, b.name], [out], flops,
                  {"transpose_a": int(a.t), "transpose_b": int(b.t)}, suffix)
        return _Value(out, shape, a.dtype)

    def is_const(self, v):
        return isinstance(v, _Value) and v.name in self.constants and not v.t

    def constant(self, stem, value, dtype=None):
        """A new graph input holding `value` (a torch tensor), evaluated here."""
        dtype = dtype or _ir_dtype(value.dtype, self.float_dtype)
        if dtype is None:
            self.fail("constant of dtype %s (the IR has none)" % value.dtype)
        name = self.g.tensor(stem, value.shape, dtype)
        self.constants[name] = value
        return _Value(name, value.shape, dtype)

    def scalar_const(self, c, like, suffix):
        """The number c as a constant [like's last dim] (what an add broadcasts over leading dims)."""
        shape = tuple(like.shape[-1:])
        dt = torch.float64 if like.dtype not in ("i64", "i32") else torch.int64
        return self.constant("const.%s%s" % (self.node.name, suffix), torch.full(shape, c, dtype=dt), like.dtype)

    def broadcast_to(self, v, shape, suffix=".bcast"):
        """v broadcast to `shape` (torch's rules). A constant is broadcast here, in torch (it
        becomes a constant of the full shape); a computed tensor in the IR: leading dims by a
        ones-matmul (expand_rows), any other dim of size 1 by (v as a column) @ ones[1, n] and a
        transpose that moves the new dim into place; both exact (each element times 1)."""
        shape = tuple(int(d) for d in shape)
        if tuple(v.shape) == shape:
            return v
        src = (1,) * (len(shape) - len(v.shape)) + tuple(v.shape)
        if len(src) != len(shape) or any(a != b and a != 1 for a, b in zip(src, shape)):
            self.fail("broadcast of %s to %s" % (list(v.shape), list(shape)))
        if self.is_const(v):
            key = (v.name, shape)
            if key not in self._bcast:
                value = self.constants[v.name].reshape(src).expand(shape).contiguous()
                self._bcast[key] = self.constant(v.name + ".bcast", value, v.dtype)
            return self._bcast[key]
        grown = [i for i, (a, b) in enumerate(zip(src, shape)) if a != b]
        lead = max(grown) + 1
        if all(src[i] == 1 for i in range(lead)):
            return self.expand_rows(v, _numel(shape[:lead]), shape, suffix)
        cur = self.reshape(v, src, suffix + ".rank")
        for k, d in enumerate(grown):
            # The dims before d stay dims (the matmul's batch), so a sharding of any of them (a
            # tensor-parallel head dim before GQA's repeated key/value heads) carries through;
            # the dims after it are one column: [lead..., q, 1] @ ones[1, n] -> [lead..., q, n].
            lead, q, n = tuple(cur.shape[:d]), _numel(cur.shape[d + 1:]), shape[d]
            sfx = "%s%d" % (suffix, k)
            col = self.materialize(self.reshape(cur, lead + (q, 1), sfx + ".col"))
            ones = self.g.ones(n, cur.dtype)
            out = self.new(lead + (q, n), cur.dtype, self.node.name + sfx)
            self.emit("matmul", [col, ones], [out], 2.0 * _numel(lead) * q * n,
                      {"transpose_a": 0, "transpose_b": 0}, sfx)
            grid = _Value(out, lead + (q, n), cur.dtype)
            if q > 1:  # [lead..., q, n] -> [lead..., n, q]
                grid = self.transpose(grid, -2, -1)
            new_shape = list(cur.shape)
            new_shape[d] = n
            cur = self.reshape(grid, new_shape, sfx + ".out")
        return cur

    def broadcast_pair(self, x, y):
        """x and y brought to their common (torch) shape."""
        try:
            shape = tuple(torch.broadcast_shapes(tuple(x.shape), tuple(y.shape)))
        except RuntimeError:
            self.fail("shapes %s and %s do not broadcast" % (list(x.shape), list(y.shape)))
        return self.broadcast_to(x, shape, ".bcast_a"), self.broadcast_to(y, shape, ".bcast_b")

    def add(self, x, y, suffix=""):
        """x + y with torch's broadcasting: an operand whose shape (without leading 1s) is a
        suffix of the other's is broadcast by the IR's add itself; otherwise each is brought to
        the common shape (broadcast_to)."""
        if tuple(x.shape) != tuple(y.shape):
            for a, b in ((x, y), (y, x)):  # a one-element constant: as a constant of the other's last dim
                if self.is_const(b) and _numel(b.shape) == 1 and len(b.shape) <= len(a.shape) and a.shape:
                    c = self.constants[b.name].reshape(()).item()
                    x, y = a, self.scalar_const(c, a, suffix + ".c")
                    break
        if tuple(x.shape) != tuple(y.shape):
            def core(s):
                s = list(s)
                while len(s) > 1 and s[0] == 1:
                    s.pop(0)
                return tuple(s)
            if not y.shape or not x.shape:  # a 0-d operand: as [1]
                x, y = (self.reshape(x, (1,), suffix + ".1d") if not x.shape else x,
                        self.reshape(y, (1,), suffix + ".1d") if not y.shape else y)
            if tuple(x.shape) == tuple(y.shape):
                pass
            elif len(core(y.shape)) <= len(x.shape) and tuple(x.shape[len(x.shape) - len(core(y.shape)):]) == core(y.shape):
                y = self.reshape(y, core(y.shape), suffix + ".bcast")
            elif len(core(x.shape)) <= len(y.shape) and tuple(y.shape[len(y.shape) - len(core(x.shape)):]) == core(x.shape):
                x, y = y, self.reshape(x, core(x.shape), suffix + ".bcast")
            else:
                x, y = self.broadcast_pair(x, y)
        xs, ys = self.materialize(x), self.materialize(y)
        out = self.new(x.shape, x.dtype, self.node.name + suffix if suffix else None)
        self.emit("add", [xs, ys], [out], suffix=suffix)
        return _Value(out, x.shape, x.dtype)

    def mul(self, x, y, suffix=""):
        """x * y with torch's broadcasting (the IR's mul takes equal shapes)."""
        if tuple(x.shape) != tuple(y.shape):
            x, y = self.broadcast_pair(x, y)
        out = self.new(x.shape, x.dtype, self.node.name + suffix if suffix else None)
        self.emit("mul", [self.materialize(x), self.materialize(y)], [out], suffix=suffix)
        return _Value(out, x.shape, x.dtype)

    def scale(self, x, s, suffix=""):
        out = self.new(x.shape, x.dtype, self.node.name + suffix if suffix else None)
        self.emit("scale", [self.materialize(x)], [out], attrs={"scale": float(s)}, suffix=suffix)
        return _Value(out, x.shape, x.dtype)

    def unary(self, kind, x, attrs=None):
        out = self.new(x.shape, x.dtype)
        self.emit(kind, [self.materialize(x)], [out], attrs=attrs)
        return _Value(out, x.shape, x.dtype)

    def expand_rows(self, x, rows, shape, suffix):
        """x ([1, ...] with M elements) repeated `rows` times as `shape`: ones[rows]^T @ x[1, M]."""
        x2 = self.reshape(x, (1, _numel(x.shape)), suffix + ".row")
        ones = self.g.ones(rows, x.dtype)
        out = self.new((rows, _numel(x.shape)), x.dtype, self.node.name + suffix)
        self.emit("matmul", [ones, x2.name], [out], 2.0 * rows * _numel(x.shape),
                  {"transpose_a": 1, "transpose_b": 0}, suffix)
        return self.reshape(_Value(out, (rows, _numel(x.shape)), x.dtype), shape, suffix + ".out")

    # ---- fused patterns (_match_patterns): compositions of ATen ops one IR op computes --------
    def fused_rms_norm(self, x, gamma, eps):
        v = self.val(x)
        h = v.shape[-1]
        if gamma is None:
            g = self.reshape(_Value(self.g.ones(h, v.dtype), (1, h), v.dtype), (h,), ".gamma")
        else:
            g = self.val(gamma)
            if tuple(g.shape) != (h,):
                self.fail("rms_norm scale of shape %s for rows of %d" % (list(g.shape), h))
        out = self.new(v.shape, v.dtype)
        self.emit("rms_norm", [self.materialize(v), self.materialize(g)], [out], attrs={"eps": float(eps)})
        return _Value(out, v.shape, v.dtype)

    def fused_gelu_tanh(self, x):
        return self.unary("gelu", self.val(x), {"exact": 0})

    def fused_swiglu(self, gate, up):
        g, u = self.val(gate), self.val(up)
        out = self.new(g.shape, g.dtype)
        self.emit("swiglu", [self.materialize(g), self.materialize(u)], [out])
        return _Value(out, g.shape, g.dtype)

    # ---- handlers: one per ATen op packet -------------------------------------------------
    def h_alias(self, x, *rest, **kw):
        return self.val(x)

    def h_view(self, x, size, *rest):
        return self.reshape(self.val(x), self.node.meta["tensor_meta"].shape)

    def h_t(self, x):
        v = self.val(x)
        if len(v.shape) != 2:
            self.fail("t() of a rank-%d tensor" % len(v.shape))
        return self.transpose(v, 0, 1)

    def h_transpose(self, x, d0, d1):
        return self.transpose(self.val(x), d0, d1)

    def h_permute(self, x, dims):
        v = self.val(x)
        r = len(v.shape)
        cur = list(range(r))
        for i, want in enumerate(int(d) % r for d in dims):
            if cur[i] != want:
                j = cur.index(want)
                cur[i], cur[j] = cur[j], cur[i]
                v = self.transpose(v, i, j)
        return v

    def h_unsqueeze(self, x, dim):
        return self.reshape(self.val(x), self.node.meta["tensor_meta"].shape)

    h_squeeze = h_unsqueeze
    h_flatten = h_unsqueeze

    def h_mm(self, a, b):
        return self.matmul(self.val(a), self.val(b))

    h_bmm = h_mm

    def h_addmm(self, bias, a, b, beta=1, alpha=1):
        if beta != 1 or alpha != 1:
            self.fail("addmm with beta=%s alpha=%s (only 1, 1)" % (beta, alpha))
        c = self.matmul(self.val(a), self.val(b), ".mm")
        bv = self.val(bias)
        for u in self.view_chain(c)[1:]:
            # The matmul ran on the unmerged rows (unmerged_batch): the bias too, so the rows' dims
            # stay dims up to the view back that follows.
            if len(u.shape) > len(c.shape) and u.shape[-1] == c.shape[-1] and not u.t and len(bv.shape) == 1:
                return self.reshape(self.add(u, bv), c.shape, ".rows")
        return self.add(c, bv)

    def number(self, a):
        """a as a Python number when it is one, or a single-element constant (a 0-d tensor
        torch made from a number: x / torch.full([], c)); else None."""
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return a
        if isinstance(a, torch.fx.Node):
            v = self.values.get(a)
            if self.is_const(v) and self.constants[v.name].numel() == 1 and self.constants[v.name].is_floating_point():
                return float(self.constants[v.name].reshape(()).item())
        return None

    def h_add(self, x, y, alpha=1):
        c = self.number(y)
        if c is not None and not isinstance(y, torch.fx.Node):
            if c == 0:
                return self.val(x)
            # x + c: c as a constant of x's last dim, which the add broadcasts.
            xv = self.val(x)
            return self.add(xv, self.scalar_const(c * alpha, xv, ".c"))
        yv = self.val(y)
        if alpha != 1:
            yv = self.scale(yv, alpha, ".alpha")
        return self.add(self.val(x), yv)

    def h_sub(self, x, y, alpha=1):
        if not isinstance(y, torch.fx.Node):
            return self.h_add(x, -y, alpha)
        return self.add(self.val(x), self.scale(self.val(y), -alpha, ".neg"))

    def h_rsub(self, x, y, alpha=1):
        """y - alpha x."""
        xv = self.scale(self.val(x), -alpha, ".neg")
        if isinstance(y, torch.fx.Node):
            return self.add(xv, self.val(y))
        return xv if y == 0 else self.add(xv, self.scalar_const(y, xv, ".c"))

    def h_empty_like(self, x, *rest, **kw):
        if not all(_packet(u) in ("bernoulli_", "bernoulli") for u in self.node.users):
            self.fail("empty_like outside a dropout mask (an uninitialised tensor)")
        return _DropoutMask()

    def h_bernoulli_(self, mask, p=0.5, generator=None):
        m = self.values.get(mask)
        if not isinstance(m, _DropoutMask) or isinstance(p, torch.fx.Node):
            self.fail("bernoulli_ outside a dropout mask")
        m.p = 1.0 - float(p)
        if m.p > 0 and self.dropout != "identity":
            self.fail("dropout with p=%g (random masks are not in the IR: set p=0, or capture with "
                      "dropout='identity' to keep its cost and drop its randomness)" % m.p)
        return m

    def h_mul(self, x, y):
        for a, b in ((x, y), (y, x)):
            if isinstance(self.values.get(b), _DropoutMask):
                # Dropout's cost (an elementwise pass) without its randomness (dropout='identity').
                return self.scale(self.val(a), 1.0)
        for a, b in ((x, y), (y, x)):
            c = self.number(b)
            if c is not None and isinstance(a, torch.fx.Node):
                av = self.val(a)
                if not (isinstance(b, torch.fx.Node) and len(self.val(b).shape) > len(av.shape)):
                    return self.scale(av, c)
        return self.mul(self.val(x), self.val(y))

    def h_div(self, x, y, rounding_mode=None):
        if isinstance(self.values.get(x), _DropoutMask):
            return self.values[x]  # the mask's 1 / (1 - p)
        if rounding_mode is not None:
            self.fail("division with rounding_mode=%r" % rounding_mode)
        c = self.number(y)
        if c is not None and not (isinstance(y, torch.fx.Node) and len(self.val(y).shape) > len(self.val(x).shape)):
            if c == 0:
                self.fail("division by zero")
            return self.scale(self.val(x), 1.0 / c)
        yv = self.val(y) if isinstance(y, torch.fx.Node) else None
        if not self.is_const(yv):
            self.fail("division by a computed tensor (only by a number or a constant)")
        # x / c for a constant c: x times the constant 1 / c (as a division by a number is a scale by its inverse).
        return self.mul(self.val(x), self.constant(yv.name + ".recip", 1.0 / self.constants[yv.name], yv.dtype))

    def h_where(self, cond, x, y):
        """torch.where(cond, x, y) for a constant cond (a mask evaluated here) as a gather: the
        operands' elements stacked as the rows of a one-column table (a number as one row, a
        constant as a constant, a computed tensor broadcast to the output's shape), and an
        embedding of it with the constant ids cond selects. A copy of the selected elements
        (exact for any values, inf and nan included); the gradient reaches each computed
        operand where it was selected (embedding_grad, the concat's slices)."""
        if not isinstance(cond, torch.fx.Node) or cond.meta["tensor_meta"].dtype != torch.bool:
            self.fail("where on a condition that is not a boolean tensor")
        mask = self.raw_constants.get(cond)
        if mask is None:
            v = self.values.get(cond)
            mask = self.constants.get(v.name) if self.is_const(v) else None
        if mask is None:
            self.fail("where on a computed condition (only constant ones, evaluated at capture)")
        shape = tuple(self.node.meta["tensor_meta"].shape)
        n = _numel(shape)
        parts, index, rows, dtype = [], [], 0, None
        for k, operand in enumerate((x, y)):
            c = self.number(operand) if not isinstance(operand, torch.fx.Node) else None
            if c is not None:
                value = torch.full((1, 1), c, dtype=torch.float64)
            else:
                v = self.val(operand)
                dtype = dtype or v.dtype
                value = self.constants[v.name].expand(shape).reshape(n, 1) if self.is_const(v) else None
            if value is not None:
                part = self.constant("const.%s.%d" % (self.node.name, k), value.contiguous().to(torch.float64),
                                     dtype or self.float_dtype).name
            else:
                part = self.reshape(self.broadcast_to(v, shape, ".%d" % k), (n, 1), ".%d.col" % k).name
            size = self.g.shape(part)[0]
            index.append(torch.arange(n) % size + rows)  # one row: every element reads it
            parts.append(part)
            rows += size
        dtype = dtype or self.float_dtype
        table = self.new((rows, 1), dtype, self.node.name + ".table")
        self.emit("concat", parts, [table], 0, {"axis": 0}, ".table")
        ids = torch.where(mask.expand(shape).reshape(n), index[0], index[1]).to(torch.int64)
        ids = self.constant("const.%s.ids" % self.node.name, ids, "i64")
        out = self.new((n, 1), dtype, self.node.name + ".gather")
        self.emit("embedding", [table, ids.name], [out], 0, suffix=".gather")
        return self.reshape(_Value(out, (n, 1), dtype), shape, ".out")

    def h_masked_fill(self, x, mask, value):
        return self.h_where(mask, value, x)

    def h_pow(self, x, exponent):
        """x ** n for n = 1, 2, 3 as products (other exponents have no IR form)."""
        if isinstance(exponent, torch.fx.Node) or exponent not in (1, 2, 3):
            self.fail("pow with exponent %r (only 1, 2, 3: products)" % (exponent,))
        v = self.val(x)
        if exponent == 1:
            return v
        sq = self.mul(v, v, ".sq" if exponent == 3 else "")
        return sq if exponent == 2 else self.mul(sq, v)

    def h__to_copy(self, x, *rest, **kw):
        """A dtype conversion: between float dtypes nothing (every float tensor has the program's
        dtype); to or from an integer dtype the IR's cast."""
        v = self.val(x)
        want = _ir_dtype(self.node.meta["tensor_meta"].dtype, self.float_dtype)
        if want is None:
            self.fail("conversion to %s (the IR has no such dtype)" % self.node.meta["tensor_meta"].dtype)
        if want == v.dtype:
            return v
        out = self.new(v.shape, want)
        self.emit("cast", [self.materialize(v)], [out], 0)
        return _Value(out, v.shape, want)

    def h_relu(self, x):
        return self.unary("relu", self.val(x))

    def h_silu(self, x):
        return self.unary("silu", self.val(x))

    def h_neg(self, x):
        return self.scale(self.val(x), -1.0)

    def h_gelu(self, x, approximate="none"):
        return self.unary("gelu", self.val(x), {"exact": 1 if approximate == "none" else 0})

    def h__softmax(self, x, dim, half_to_float=False):
        v = self.val(x)
        if dim % len(v.shape) != len(v.shape) - 1:
            self.fail("softmax over dim %d (only the last)" % dim)
        return self.unary("softmax", v)

    def h_native_layer_norm(self, x, normalized_shape, weight, bias, eps):
        v = self.val(x)
        if len(normalized_shape) != 1 or weight is None or bias is None:
            self.fail("layer_norm over %s dims or without weight and bias (only the last dim, affine)" % len(normalized_shape))
        out = self.new(v.shape, v.dtype)
        self.emit("layer_norm", [self.materialize(v), self.val(weight).name, self.val(bias).name], [out],
                  attrs={"eps": float(eps)})
        return (_Value(out, v.shape, v.dtype), None, None)

    def h_native_batch_norm(self, x, weight, bias, running_mean, running_var, training, momentum, eps):
        v = self.val(x)
        if not training:
            self.fail("batch_norm in eval mode (capture a module in train mode: its step uses batch statistics)")
        if weight is None or bias is None:
            self.fail("batch_norm without affine weight and bias")
        c = v.shape[1]
        src = self.materialize(v)
        out = self.new(v.shape, v.dtype)
        mean = self.new((c,), "f32", self.node.name + ".mean")
        invstd = self.new((c,), "f32", self.node.name + ".invstd")
        ins, attrs = [src, self.val(weight).name, self.val(bias).name], {"eps": float(eps)}
        if self.sync_bn:  # SyncBatchNorm: statistics from sums all-reduced over the data-parallel ranks
            # Two passes, each all-reduced under a plan: the sum (the mean), then the squared deviations
            # from it (sum x^2 - count mean^2 in fp32 loses the variance where mean^2 >> var).
            count = _numel(v.shape) // c
            total = self.new((1, c), "f32", self.node.name + ".sum")
            self.emit("batch_norm_stats", [src], [total], suffix=".sum")
            sqdev = self.new((1, c), "f32", self.node.name + ".sqdev")
            self.emit("batch_norm_stats", [src, total], [sqdev], attrs={"count": count}, suffix=".sqdev")
            ins += [total, sqdev]
            attrs["count"] = count
        self.emit("batch_norm", ins, [out, mean, invstd], attrs=attrs)
        return (_Value(out, v.shape, v.dtype), _Value(mean, (c,), "f32"), _Value(invstd, (c,), "f32"))

    def h_convolution(self, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
        xv, wv = self.val(x), self.val(w)
        if len(xv.shape) != 4 or transposed or groups != 1 or any(d != 1 for d in dilation):
            self.fail("convolution other than 2-d, ungrouped, undilated, not transposed")
        if len(set(stride)) != 1 or len(set(padding)) != 1:
            self.fail("convolution with stride %s, padding %s (only equal in both dims)" % (list(stride), list(padding)))
        shape = tuple(self.node.meta["tensor_meta"].shape)
        n, k, p, q = shape
        c, r, s = wv.shape[1], wv.shape[2], wv.shape[3]
        out = self.new(shape, xv.dtype, self.node.name + (".conv" if bias is not None else ""))
        self.emit("conv2d", [self.materialize(xv), self.materialize(wv)], [out], 2.0 * n * k * p * q * c * r * s,
                  {"stride": int(stride[0]), "padding": int(padding[0])}, ".conv" if bias is not None else "")
        y = _Value(out, shape, xv.dtype)
        if bias is None:
            return y
        # The bias [K] over [N, K, P, Q]: as a [K, P, Q] plane (ones-matmul), added over N.
        b = self.reshape(self.val(bias), (k, 1), ".bias.col")
        ones = self.g.ones(p * q, b.dtype)
        plane = self.new((k, p * q), b.dtype, self.node.name + ".bias.plane")
        self.emit("matmul", [b.name, ones], [plane], 2.0 * k * p * q, {"transpose_a": 0, "transpose_b": 0}, ".bias.plane")
        b3 = self.reshape(_Value(plane, (k, p * q), b.dtype), (k, p, q), ".bias.kpq")
        return self.add(y, b3)

    def h_max_pool2d_with_indices(self, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        v = self.val(x)
        ks = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size] * 2
        st = (list(stride) if isinstance(stride, (list, tuple)) else [stride] * 2) or ks
        pd = list(padding) if isinstance(padding, (list, tuple)) else [padding] * 2
        dl = list(dilation) if isinstance(dilation, (list, tuple)) else [dilation] * 2
        if len(set(ks)) != 1 or len(set(st)) != 1 or len(set(pd)) != 1 or any(d != 1 for d in dl) or ceil_mode:
            self.fail("max_pool2d with kernel %s stride %s padding %s dilation %s ceil_mode %s (only square, undilated, floor)"
                      % (ks, st, pd, dl, ceil_mode))
        n, c, h, w = v.shape
        shape = (n, c, (h + 2 * pd[0] - ks[0]) // st[0] + 1, (w + 2 * pd[0] - ks[0]) // st[0] + 1)
        out = self.new(shape, v.dtype)
        self.emit("max_pool2d", [self.materialize(v)], [out], float(ks[0] * ks[0] * _numel(shape)),
                  {"kernel": int(ks[0]), "stride": int(st[0]), "padding": int(pd[0])})
        return (_Value(out, shape, v.dtype), None)

    def h_mean(self, x, dims=None, keepdim=False, dtype=None):
        """The mean over trailing dims (global average pooling): x [L, R] @ ones[1, R]^T / R."""
        v = self.val(x)
        r = len(v.shape)
        dims = sorted(int(d) % r for d in (dims if dims is not None else range(r)))
        if dims != list(range(r - len(dims), r)):
            self.fail("mean over dims %s (only trailing dims)" % dims)
        red = _numel(v.shape[r - len(dims):])
        rows = _numel(v.shape[:r - len(dims)])
        x2 = self.reshape(v, (rows, red), ".rows")
        ones = self.g.ones(red, v.dtype)
        s = self.new((rows, 1), v.dtype, self.node.name + ".sum")
        self.emit("matmul", [x2.name, ones], [s], 2.0 * rows * red, {"transpose_a": 0, "transpose_b": 1}, ".sum")
        m = self.scale(_Value(s, (rows, 1), v.dtype), 1.0 / red, ".mean")
        return self.reshape(m, self.node.meta["tensor_meta"].shape, ".out")

    def h_split(self, x, split_size, dim=0):
        v = self.val(x)
        dim %= len(v.shape)
        n = v.shape[dim]
        sizes = [min(split_size, n - s) for s in range(0, n, split_size)]
        return self._pieces(v, sizes, dim)

    def h_split_with_sizes(self, x, sizes, dim=0):
        v = self.val(x)
        return self._pieces(v, list(sizes), dim % len(v.shape))

    def _pieces(self, v, sizes, dim):
        src, outs, start = self.materialize(v), [], 0
        for i, n in enumerate(sizes):
            shape = list(v.shape)
            shape[dim] = n
            out = self.new(shape, v.dtype, "%s.%d" % (self.node.name, i))
            self.emit("slice", [src], [out], 0, {"axis": dim, "start": start, "len": n}, ".%d" % i)
            outs.append(_Value(out, shape, v.dtype))
            start += n
        return tuple(outs)

    def h_slice(self, x, dim=0, start=None, end=None, step=1):
        v = self.val(x)
        dim %= len(v.shape)
        n = v.shape[dim]
        begin = 0 if start is None else (start + n if start < 0 else min(start, n))
        stop = n if end is None else (end + n if end < 0 else min(end, n))
        if step != 1:
            self.fail("slice with step %d (only 1)" % step)
        if begin == 0 and stop == n:
            return v
        shape = list(v.shape)
        shape[dim] = stop - begin
        out = self.new(shape, v.dtype)
        self.emit("slice", [self.materialize(v)], [out], 0, {"axis": dim, "start": begin, "len": stop - begin})
        return _Value(out, shape, v.dtype)

    def h_select(self, x, dim, index):
        v = self.val(x)
        dim %= len(v.shape)
        index %= v.shape[dim]
        shape = list(v.shape)
        shape[dim] = 1
        out = self.new(shape, v.dtype, self.node.name + ".slice")
        self.emit("slice", [self.materialize(v)], [out], 0, {"axis": dim, "start": index, "len": 1}, ".slice")
        return self.reshape(_Value(out, shape, v.dtype), self.node.meta["tensor_meta"].shape)

    def h_expand(self, x, size, implicit=False):
        v = self.val(x)
        target = tuple(self.node.meta["tensor_meta"].shape)
        if target == tuple(v.shape):
            return v
        if _numel(target) == _numel(v.shape):
            return self.reshape(v, target)
        return self.broadcast_to(v, target, ".expand")

    def h_cat(self, tensors, dim=0):
        vs = [self.val(t) for t in tensors]
        dim %= len(vs[0].shape)
        shape = tuple(self.node.meta["tensor_meta"].shape)
        out = self.new(shape, vs[0].dtype)
        self.emit("concat", [self.materialize(v) for v in vs], [out], 0, {"axis": dim})
        return _Value(out, shape, vs[0].dtype)

    def h_embedding(self, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        w, ids = self.val(weight), self.val(indices)
        if scale_grad_by_freq or sparse:
            self.fail("embedding with scale_grad_by_freq or sparse")
        if len(w.shape) != 2:
            self.fail("embedding table of rank %d" % len(w.shape))
        shape = tuple(ids.shape) + (w.shape[1],)
        table = self.materialize(w)
        if padding_idx is not None and padding_idx >= 0:
            # torch reads row padding_idx in the forward and gives it no gradient: the table is
            # re-assembled from its other rows (slices, which the gradient reaches) and that row
            # as a graph input of its own holding the parameter's row (Captured.values feeds it),
            # which the autodiff does not differentiate.
            pname = self.param_names.get(w.name)
            if pname is None or w.t:
                self.fail("embedding with padding_idx of a table that is not a parameter")
            vocab, pad = w.shape[0], int(padding_idx)
            row = self.g.tensor("%s.row%d" % (w.name, pad), (1, w.shape[1]), w.dtype)
            self.g.layer_of[row] = self.g.param_layer[row] = self.g.layer_of.get(w.name, -1)
            self.param_rows[row] = (pname, pad)
            parts = []
            for start, n in ((0, pad), (pad, 1), (pad + 1, vocab - pad - 1)):
                if n == 0:
                    continue
                if start == pad:
                    parts.append(row)
                    continue
                piece = self.new((n, w.shape[1]), w.dtype, "%s.rows%d" % (self.node.name, start))
                self.emit("slice", [table], [piece], 0, {"axis": 0, "start": start, "len": n}, ".rows%d" % start)
                parts.append(piece)
            table = self.new(w.shape, w.dtype, self.node.name + ".table")
            self.emit("concat", parts, [table], 0, {"axis": 0}, ".table")
        out = self.new(shape, w.dtype)
        self.emit("embedding", [table, ids.name], [out], 0)
        return _Value(out, shape, w.dtype)

    def attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
        """torch's scaled_dot_product_attention as its definition: softmax(q k^T scale + mask) v
        (matmul, scale, add, softmax, matmul: the scores materialised, as torch 1.13's
        nn.MultiheadAttention computed them). A boolean mask (True: attend) is the additive
        mask 0 / -inf, is_causal the lower-triangular one (query i sees keys j <= i)."""
        q, k, v = self.val(query), self.val(key), self.val(value)
        if len(q.shape) < 2 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
            self.fail("attention of shapes %s, %s, %s" % (list(q.shape), list(k.shape), list(v.shape)))
        if dropout_p and self.dropout != "identity":
            self.fail("attention dropout with p=%g (random masks are not in the IR: set p=0, or capture with "
                      "dropout='identity' to keep its cost and drop its randomness)" % dropout_p)
        if k.shape[:-3] != q.shape[:-3] or (len(q.shape) >= 3 and k.shape[-3] != q.shape[-3]):
            if not (enable_gqa and len(q.shape) >= 3 and q.shape[-3] % k.shape[-3] == 0):
                self.fail("attention with query %s and key %s" % (list(q.shape), list(k.shape)))
            # Grouped-query attention: kv head g serves query heads g*rep .. g*rep + rep - 1.
            rep = q.shape[-3] // k.shape[-3]

            def repeat(t, sfx):
                grown = t.shape[:-2] + (1,) + t.shape[-2:]
                wide = self.broadcast_to(self.reshape(t, grown, sfx + ".g"), t.shape[:-2] + (rep,) + t.shape[-2:], sfx)
                return self.reshape(wide, t.shape[:-3] + (t.shape[-3] * rep,) + t.shape[-2:], sfx + ".heads")
            k, v = repeat(k, ".k_rep"), repeat(v, ".v_rep")
        s = self.matmul(q, self.transpose(k, -2, -1), ".scores")
        s = self.scale(s, scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]), ".scaled")
        lq, lk = q.shape[-2], k.shape[-2]
        if is_causal:
            causal = torch.zeros(lq, lk, dtype=torch.float64).masked_fill(
                ~torch.ones(lq, lk, dtype=torch.bool).tril(), float("-inf"))
            s = self.add(s, self.constant("const.%s.causal" % self.node.name, causal, s.dtype), ".causal")
        if attn_mask is not None:
            if isinstance(attn_mask, torch.fx.Node) and attn_mask in self.raw_constants:  # a boolean mask
                keep = self.raw_constants[attn_mask]
                additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
                mv = self.constant("const.%s.additive" % attn_mask.name, additive, s.dtype)
            else:
                mv = self.val(attn_mask)
            if mv.dtype not in ("f32", "f16", "bf16"):
                self.fail("attention with a computed %s mask (only float masks, or constant boolean ones)" % mv.dtype)
            s = self.add(s, mv, ".mask")
        probs = self.new(s.shape, s.dtype, self.node.name + ".probs")
        self.emit("softmax", [self.materialize(s)], [probs], suffix=".probs")
        probs = _Value(probs, s.shape, s.dtype)
        if dropout_p:
            probs = self.scale(probs, 1.0, ".dropout")  # dropout='identity': its cost, no randomness
        return self.matmul(probs, v)

    def _attention_outputs(self, out):
        val = self.node.meta.get("val")
        return (out,) + (None,) * (len(val) - 1) if isinstance(val, (tuple, list)) else out

    def h_scaled_dot_product_attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                       scale=None, enable_gqa=False):
        return self.attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    def h__scaled_dot_product_flash_attention_for_cpu(self, query, key, value, dropout_p=0.0, is_causal=False,
                                                       attn_mask=None, scale=None):
        return self._attention_outputs(self.attention(query, key, value, attn_mask, dropout_p, is_causal, scale))

    def h__scaled_dot_product_attention_math(self, query, key, value, attn_mask=None, dropout_p=0.0,
                                             is_causal=False, dropout_mask=None, scale=None, enable_gqa=False):
        if dropout_mask is not None:
            self.fail("attention with a dropout mask (random masks are not in the IR)")
        return self._attention_outputs(self.attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                      enable_gqa))

    def h_native_dropout(self, x, p, train):
        return (self.h_dropout(x, p, train), None)

    def h_dropout(self, x, p, train):
        if train and p > 0:
            if self.dropout != "identity":
                self.fail("dropout with p=%g (random masks are not in the IR: set p=0, or capture with "
                          "dropout='identity' to keep its cost and drop its randomness)" % p)
            # Its cost (an elementwise pass) without its randomness: the step no longer matches torch's.
            return self.scale(self.val(x), 1.0)
        return self.val(x)


_ALIASES = {"clone", "detach", "contiguous", "alias", "lift_fresh", "lift_fresh_copy"}
_VIEWS = {"view", "_unsafe_view", "_reshape_alias", "reshape"}
_VIEW_OPS = {"view", "_unsafe_view", "_reshape_alias", "reshape", "slice", "select", "t", "transpose", "permute",
             "expand", "unsqueeze", "squeeze", "alias", "split", "split_with_sizes", "detach"}
_INPLACE = {"relu_": "relu", "add_": "add", "mul_": "mul", "div_": "div", "sub_": "sub", "silu_": "silu",
            "masked_fill_": "masked_fill"}


def supported_ops():
    """The ATen ops capture maps (by overload packet name)."""
    names = {n[2:] for n in dir(_Lowering) if n.startswith("h_") and n not in ("h_alias", "h_view")}
    return sorted(names | _ALIASES | _VIEWS | set(_INPLACE))


def _packet(node):
    return str(node.target).split(".")[1] if str(node.target).startswith("aten.") else str(node.target)


def _call(n, *packets):
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and _packet(n) in packets


def _is_float_node(n):
    meta = n.meta.get("tensor_meta") if isinstance(n, torch.fx.Node) else None
    return meta is not None and meta.dtype in _FLOATS


def _through(n, seen):
    """n with the float-to-float conversions and aliases in front of it skipped (added to `seen`)."""
    while (_call(n, "_to_copy", "clone", "alias", "contiguous", "detach") and n.args
           and isinstance(n.args[0], torch.fx.Node)):
        if _packet(n) == "_to_copy" and not (_is_float_node(n) and _is_float_node(n.args[0])):
            break
        seen.add(n)
        n = n.args[0]
    return n


def _num(a):
    return a if isinstance(a, (int, float)) and not isinstance(a, bool) else None


def _alpha_is_one(n):
    return n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1) == 1


def _rms_core(n):
    """n = x * rsqrt(mean(x ** 2, -1, keepdim) + eps) (LlamaRMSNorm without its scale):
    (x, eps, the nodes in between) or None."""
    if not _call(n, "mul") or len(n.args) != 2:
        return None
    for xs, rs in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
        seen = set()
        r = _through(rs, seen)
        if not _call(r, "rsqrt"):
            continue
        a = _through(r.args[0], seen)
        if not (_call(a, "add") and _num(a.args[1]) is not None and _alpha_is_one(a)):
            continue
        m = _through(a.args[0], seen)
        if not _call(m, "mean") or len(m.args) < 2 or m.kwargs.get("dtype") is not None:
            continue
        keepdim = m.args[2] if len(m.args) > 2 else m.kwargs.get("keepdim", False)
        src = m.args[0]
        rank = len(src.meta["tensor_meta"].shape) if isinstance(src, torch.fx.Node) and "tensor_meta" in src.meta else 0
        if not keepdim or rank == 0 or [int(d) % rank for d in m.args[1]] != [rank - 1]:
            continue
        sq = _through(src, seen)
        if _call(sq, "pow") and sq.args[1] == 2:
            base = sq.args[0]
        elif _call(sq, "mul") and sq.args[0] is sq.args[1]:
            base = sq.args[0]
        else:
            continue
        if not isinstance(xs, torch.fx.Node) or not isinstance(base, torch.fx.Node):
            continue
        x = _through(xs, seen)
        if _through(base, seen) is not x:
            continue
        return x, a.args[1], seen | {r, a, m, sq}
    return None


def _gelu_tanh(n):
    """n = x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))) (HF's gelu_new, the IR's
    gelu with exact 0): (x, the nodes in between) or None."""
    if not _call(n, "mul") or len(n.args) != 2:
        return None

    def near(a, want):
        return _num(a) is not None and abs(a - want) <= 1e-12 * want

    def scaled(m, want):  # m = y * want: y
        if _call(m, "mul") and len(m.args) == 2:
            for y, c in ((m.args[0], m.args[1]), (m.args[1], m.args[0])):
                if isinstance(y, torch.fx.Node) and near(c, want):
                    return y
        return None

    for hs, ts in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
        seen = set()
        h = _through(hs, seen) if isinstance(hs, torch.fx.Node) else None
        x = scaled(h, 0.5)
        one = _through(ts, seen) if isinstance(ts, torch.fx.Node) else None
        if x is None or not (_call(one, "add") and _num(one.args[1]) == 1 and _alpha_is_one(one)):
            continue
        t = _through(one.args[0], seen)
        if not _call(t, "tanh"):
            continue
        m3 = _through(t.args[0], seen)
        inner = scaled(m3, math.sqrt(2.0 / math.pi))
        a6 = _through(inner, seen) if inner is not None else None
        if not (_call(a6, "add") and _alpha_is_one(a6) and all(isinstance(a, torch.fx.Node) for a in a6.args[:2])):
            continue
        x = _through(x, seen)
        for xa, ca in ((a6.args[0], a6.args[1]), (a6.args[1], a6.args[0])):
            cube = scaled(_through(ca, seen), 0.044715)
            pw = _through(cube, seen) if cube is not None else None
            if _through(xa, seen) is x and _call(pw, "pow") and pw.args[1] == 3 and _through(pw.args[0], seen) is x:
                return x, seen | {h, one, t, m3, a6, _through(ca, seen), pw}
    return None


def _match_patterns(nodes, live, const_values):
    """The compositions of ATen ops that one IR op computes exactly: {root node: (kind, args)}
    and the nodes between (absorbed: computed by the root's op, lowered no further). Each is
    taken only where nothing outside it reads the nodes in between.

    - rms_norm: w * (x * rsqrt(mean(x ** 2, -1, keepdim=True) + eps)) (LlamaRMSNorm; its
      float32 up-casts are conversions between float dtypes), or without w (a ones scale);
    - gelu (exact 0): x * 0.5 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x ** 3))) (gelu_new);
    - swiglu: silu(g) * u of equal shapes (the LLaMA MLP)."""
    fused, absorbed = {}, set()

    def absorbable(root, inner, outside):
        """The nodes of `inner` (between `outside`, the pattern's operands, and `root`) that the
        root's op absorbs, or None where something else reads one of them. A conversion of an
        operand that something else reads too stays (it is lowered as usual, an alias)."""
        inner = set(inner) - set(outside)
        if any(m in absorbed or m in fused or m in const_values or m.op != "call_function" for m in inner):
            return None
        for m in list(inner):
            if all(u is root or u in inner for u in m.users if u in live):
                continue
            chain, k = [], m
            while k in inner and _through(k, set()) is not k:
                chain.append(k)
                k = k.args[0]
            if k not in outside:
                return None
            inner -= set(chain)
        return inner

    def shape(n):
        return tuple(n.meta["tensor_meta"].shape) if isinstance(n, torch.fx.Node) and "tensor_meta" in n.meta else None

    for n in reversed(nodes):
        if n not in live or n in const_values or n in absorbed or not _call(n, "mul") or len(n.args) != 2:
            continue
        found, inner = None, None
        for inner_src, gamma in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
            seen = set()
            norm = _through(inner_src, seen) if isinstance(inner_src, torch.fx.Node) else None
            core = _rms_core(norm) if norm is not None else None
            if core and isinstance(gamma, torch.fx.Node) and shape(gamma) == shape(core[0])[-1:] \
                    and shape(n) == shape(core[0]):
                inner = absorbable(n, core[2] | seen | {norm}, [core[0], gamma])
                if inner is not None:
                    found = ("rms_norm", (core[0], gamma, core[1]))
                    break
        if found is None:
            g = _gelu_tanh(n)
            inner = absorbable(n, g[1], [g[0]]) if g else None
            if inner is not None:
                found = ("gelu_tanh", (g[0],))
        if found is None:
            for ss, up in ((n.args[0], n.args[1]), (n.args[1], n.args[0])):
                seen = set()
                sl = _through(ss, seen) if isinstance(ss, torch.fx.Node) else None
                if _call(sl, "silu") and isinstance(up, torch.fx.Node) and shape(sl) == shape(up) == shape(n):
                    inner = absorbable(n, seen | {sl}, [up])
                    if inner is not None:
                        found = ("swiglu", (sl.args[0], up))
                        break
        if found is None:
            core = _rms_core(n)
            inner = absorbable(n, core[2], [core[0]]) if core else None
            if inner is not None:
                found = ("rms_norm", (core[0], None, core[1]))
        if found is not None:
            fused[n] = found
            absorbed |= inner - {n}
    return fused, absorbed


def _flops_table():
    return {t["name"]: (t["flops"], t["flops_per"]) for t in _concerto.op_types()}


class Captured:
    """A captured training step: `program` (one graph, one rank: forward, loss, backward, Adam),
    and the names in it: `params` {torch parameter name: IR tensor}, `grads` and `updated`
    (the gradient and the Adam-updated value of each parameter), `inputs` (the IR names of the
    example inputs, in order), `labels`, `loss`, `constants` {IR tensor: torch tensor} (the
    module's buffers and constants the step reads) and `param_rows` {IR tensor: (parameter name,
    row)}: a parameter's row the step reads without differentiating it (an embedding's
    padding_idx row), fed from the parameter's current value (`constants` holds it too, as a
    view of the captured module's parameter)."""

    def __init__(self, program, params, grads, updated, inputs, labels, loss, constants, param_rows=None):
        self.program = program
        self.params, self.grads, self.updated = params, grads, updated
        self.inputs, self.labels, self.loss = inputs, labels, loss
        self.constants = constants
        self.param_rows = dict(param_rows or {})
        self._locals = {}  # name of a program partition() made -> the per-rank capture it runs

    def __repr__(self):
        return "<concerto.torch.Captured %r: %d ops, %d parameters>" % (
            self.program.name, self.program.num_ops, len(self.params))

    def values(self, module, example_inputs, labels, program=None):
        """Every input of the step as {IR name: flat float32 numpy array}: the module's
        parameters, its constants, the example inputs and the labels (what Captured.run feeds
        the runtime; concerto.execute takes the arrays' buffers without a copy to Python
        floats). For a `program` that partition(plan=...) made, the constants are those of its
        per-rank capture (a mask broadcast over the per-rank batch)."""
        def flat(t):
            return t.detach().float().contiguous().flatten().numpy()

        local = self._locals.get(program.name) if program is not None else None
        local = local or self
        out = {}
        named = dict(module.named_parameters())
        for tname, ir in self.params.items():
            out[ir] = flat(named[tname])
        for ir, t in local.constants.items():
            out[ir] = flat(t)
        for ir, (tname, row) in local.param_rows.items():
            out[ir] = flat(named[tname][row:row + 1])
        for ir, t in zip(self.inputs, example_inputs):
            out[ir] = flat(t)
        out[self.labels] = flat(labels)
        return out

    def partition(self, plan=None, sharding=None):
        """This step under a plan, as a Program.

        `plan` "dp=N[,zero=1|2|3]" builds the data-parallel step as DDP and DeepSpeed run it:
        every rank runs the captured graph on its 1/N of the batch (captured again at that
        batch), the gradients are all-reduced; with zero=1 or 2 they are reduce-scattered, each
        rank updates its 1/N of every parameter (its own optimizer state and parameter shard)
        and all-gathers the result (the two stages give the same program: they differ in when
        DeepSpeed frees the full gradients, which is not modelled apart); with zero=3 only the
        1/N shards are kept, all-gathered before the forward and again before the backward. A parameter whose dim 0 does not divide by N is all-reduced and
        updated whole. Batch norm keeps per-rank statistics, as torch's BatchNorm under DDP, or,
        captured with `sync_bn`, all-reduces its statistics' sums (SyncBatchNorm).

        With tp=N (and sp, dp, zero beside it) the plan goes through the SPMD partitioner:
        Megatron-LM's layout is found on the captured graph (concerto's ShardingFromPlan:
        linears reading a whole activation split by output features, those reading a split one
        by input features, a fused q/k/v split per part, a word embedding by vocabulary; under
        sp the residual stream split by tokens), the data inputs split by dp, and the
        partitioner inserts only the collectives that remain: per transformer layer Megatron's
        2 all-reduces forward and 2 backward, or with sp 2 all-gathers and 2 reduce-scatters
        each way (docs/frontends.md, 'Plans through the partitioner'); zero=1|2|3 beside tp
        shard the optimizer state (and with 3 the parameters) over dp.

        `sharding` (a sharding file's dict or JSON text, docs/frontends.md 'Per-op sharding
        plans') runs the SPMD partitioner on the unsharded step instead: any mesh and tensor
        shardings, every collective derived, the same values as the unsharded step (batch
        norm's batch is then gathered)."""
        if (plan is None) == (sharding is None):
            raise Error("partition: give exactly one of plan= and sharding=")
        if sharding is not None:
            text = sharding if isinstance(sharding, str) else json.dumps(sharding)
            program, _ = _concerto.partition(self.program, text, "<sharding>")
            return program
        fields = {}
        for part in plan.split(","):
            m = re.fullmatch(r"\s*(dp|zero)\s*=\s*(\d+)\s*", part)
            if not m:
                # Any other key (tp, sp, ...): Megatron's layout found on the graph
                # (ShardingFromPlan), completed by the partitioner; it names a key it cannot lower.
                program, _ = _concerto.partition_plan(self.program, plan, list(self.inputs) + [self.labels])
                return program
            fields[m.group(1)] = int(m.group(2))
        dp, zero = fields.get("dp", 1), fields.get("zero", 0)
        if dp < 1 or zero not in (0, 1, 2, 3):
            raise Error("partition: plan '%s': dp must be >= 1 and zero one of 0, 1, 2, 3" % plan)
        xs, ys = self._example
        for i, x in enumerate(list(xs) + [ys]):
            if x.dim() == 0 or x.shape[0] % dp:
                raise Error("partition: plan '%s': the batch (dim 0 of %s, %s) is not divisible by dp=%d"
                            % (plan, "input %d" % i if i < len(xs) else "the labels",
                               x.shape[0] if x.dim() else "a scalar", dp))
        rows = ys.shape[0] // dp
        local = self._recapture(tuple(x[:rows] for x in xs), ys[:rows])
        program = _data_parallel(local, dp, zero, _numel(ys.shape), plan)
        self._locals[program.name] = local  # its constants are what run() feeds the program
        return program

    def run(self, module, example_inputs, labels, program=None, scheduler="fifo", cluster="a800-4x8", options=None):
        """One step of `program` (default: the unsharded one) on the CPU runtime with the
        module's parameter values: {'loss': float, 'grads': {param: tensor}, 'updated': {param:
        tensor}} with torch tensors shaped like the parameters."""
        named = dict(module.named_parameters())
        program = program or self.program
        # The gradient each Adam op reads and the value it writes (a partitioned program
        # reduces a partial gradient into a new tensor first).
        adam = {}
        for g in program.to_dict()["graphs"]:
            for op in g["ops"]:
                if op.get("type") == "adam":
                    adam[op["name"]] = (op["inputs"][1], op["outputs"][0])
        grads, updated = {}, {}
        for p, ir in self.params.items():
            if ir + ".adam" in adam:
                grads[p], updated[p] = adam[ir + ".adam"]
        fetch = list(grads.values()) + list(updated.values())
        r = _concerto.execute(program, scheduler=scheduler, cluster=cluster, options=options or {},
                              inputs=self.values(module, example_inputs, labels, program), fetch=fetch,
                              as_buffers=True)

        def tensor(ir, like):
            got = r["tensors"][ir]
            values = torch.frombuffer(bytearray(got["values"]), dtype=torch.float32)
            return values.reshape(like.shape)

        return {"loss": r["loss"],
                "grads": {p: tensor(g, named[p]) for p, g in grads.items()},
                "updated": {p: tensor(u, named[p]) for p, u in updated.items()}}


def _data_parallel(local, dp, zero, label_count, plan):
    """The program of `local` (a capture at the per-rank batch) on `dp` ranks: inputs and labels
    split on dim 0, each gradient synchronised before its Adam op (Captured.partition). The
    constants are `local`'s, the same on every rank (they depend on shapes, never on the data:
    a causal mask broadcast over the per-rank batch)."""
    d = local.program.to_dict()
    g = d["graphs"][0]
    d["name"] = "%s.%s" % (d["name"], plan.replace(" ", "").replace(",", "."))
    d["mesh"] = {"axes": [{"name": "dp", "size": dp}]}
    d["roles"] = [{"name": "spmd", "graph": g["name"], "ranks": list(range(dp))}]
    g["streams"] = list(g["streams"]) + ["comm.dp"]
    tensors = {t["name"]: t for t in g["tensors"]}
    for name in list(local.inputs) + [local.labels]:
        tensors[name]["sharding"] = [["dp"]] + [[] for _ in tensors[name]["shape"][1:]]
    ops, next_id = g["ops"], max(op["id"] for op in g["ops"]) + 1
    for op in ops:  # the mean over the global batch: each rank's gradient is its share of the sum
        if op.get("type") == "cross_entropy_grad":
            op["attrs"]["denominator"] = float(label_count)
        if op.get("type") in ("batch_norm", "batch_norm_grad", "batch_norm_stats") and "count" in op.get("attrs", {}):
            op["attrs"]["count"] = op["attrs"]["count"] * dp  # SyncBatchNorm: elements over every rank
    # Gradients a synchronised batch_norm_grad computes from all-reduced sums are already global.
    global_grads = {o for op in ops if op.get("type") == "batch_norm_grad" and len(op["inputs"]) == 6
                    for o in op["outputs"][1:]}
    adam = {op["name"]: op for op in ops if op.get("type") == "adam"}
    new_ops, after = [], {}  # ops to insert right after the op with a given name

    def declare(name, like, shape=None, sharded=False, partial=False):
        shape = list(shape if shape is not None else tensors[like]["shape"])
        t = {"name": name, "shape": shape, "dtype": tensors[like]["dtype"],
             "sharding": [["dp"] if (sharded and i == 0) else [] for i in range(len(shape))],
             "partial": ["dp"] if partial else []}
        g["tensors"].append(t)
        tensors[name] = t
        return name

    def collective(name, kind, src, dst, phase, purpose):
        nonlocal next_id
        op = {"id": next_id, "name": name, "kind": "collective", "stream": "comm.dp", "collective": kind,
              "reduce": "sum", "group": {"axes": ["dp"]}, "inputs": [src], "outputs": [dst],
              "tags": {"phase": phase, "layer": -1, "microbatch": 0, "purpose": purpose}}
        next_id += 1
        return op

    producer = {}
    for op in ops:
        for o in op["outputs"]:
            producer[o] = op["name"]
    for pname, ir in local.params.items():
        op = adam.get(ir + ".adam")
        if op is None:
            continue
        grad = op["inputs"][1]
        shape = tensors[ir]["shape"]
        if grad in global_grads:  # sync-BN's gamma and beta: the whole update everywhere, no reduction
            continue
        tensors[grad]["partial"] = ["dp"]
        split = zero >= 1 and shape and shape[0] % dp == 0
        if not split:  # DDP: the gradient all-reduced, the whole parameter updated everywhere
            red = declare(grad + ".ar", grad)
            after.setdefault(producer[grad], []).append(collective(grad + ".ar", "all_reduce", grad, red, "bwd", "grad_sync"))
            op["inputs"][1] = red
            continue
        sshape = [shape[0] // dp] + list(shape[1:])
        red = declare(grad + ".rs", grad, sshape, sharded=True)
        after.setdefault(producer[grad], []).append(collective(grad + ".rs", "reduce_scatter", grad, red, "bwd", "grad_sync"))
        for k in (2, 3):  # the Adam moments: 1/dp each
            tensors[op["inputs"][k]]["shape"] = sshape
            tensors[op["inputs"][k]]["sharding"] = [["dp"]] + [[] for _ in sshape[1:]]
            tensors[op["outputs"][k - 1]]["shape"] = sshape
            tensors[op["outputs"][k - 1]]["sharding"] = [["dp"]] + [[] for _ in sshape[1:]]
        shard = declare(ir + ".shard", ir, sshape, sharded=True)
        op["inputs"][1] = red
        nxt = op["outputs"][0]
        op["outputs"][0] = declare(ir + ".shard.next", nxt, sshape, sharded=True)
        if len(op["inputs"]) > 4:  # the fp32 master copy
            for lst, k in ((op["inputs"], 4), (op["outputs"], 3)):
                tensors[lst[k]]["shape"] = sshape
                tensors[lst[k]]["sharding"] = [["dp"]] + [[] for _ in sshape[1:]]
        op["inputs"][0] = shard
        if zero in (1, 2):  # the parameter stays whole; Adam updates this rank's shard (its own state), gathered after
            after.setdefault(op["name"], []).append(collective(ir + ".ag", "all_gather", op["outputs"][0], nxt, "opt",
                                                               "param_gather"))
        else:  # zero=3: only the shard is an input; gathered before the forward and the backward
            tensors[ir]["shape"] = shape
            users = [o for o in ops if ir in o["inputs"] and o is not op]
            fwd = [o for o in users if o["tags"]["phase"] == "fwd"]
            bwd = [o for o in users if o["tags"]["phase"] != "fwd"]
            for phase, group, target in (("fwd", fwd, ir), ("bwd", bwd, declare(ir + ".bwd", ir))):
                if not group:
                    continue
                for o in group:
                    o["inputs"] = [target if i == ir else i for i in o["inputs"]]
                new_ops.append((group[0]["name"], collective(ir + ".ag." + phase, "all_gather", shard, target, phase,
                                                             "param_gather")))
            # the shard is the graph input now; the whole parameter is produced by the gather
            tensors[ir]["sharding"] = [[] for _ in shape]
            tensors[nxt]["shape"] = shape
            g["tensors"] = [t for t in g["tensors"] if t["name"] != nxt]
            del tensors[nxt]
    for op in ops:  # SyncBatchNorm's sums: all-reduced before the batch norm that reads them
        if op.get("type") not in ("batch_norm_stats", "batch_norm_grad_stats"):
            continue
        sums = op["outputs"][0]
        tensors[sums]["partial"] = ["dp"]
        total = declare(sums + ".ar", sums)
        after.setdefault(op["name"], []).append(collective(sums + ".ar", "all_reduce", sums, total, op["tags"]["phase"],
                                                           "activation"))
        for o in ops:
            if o is not op and sums in o["inputs"]:
                o["inputs"] = [total if i == sums else i for i in o["inputs"]]
    before = {}
    for name, o in new_ops:
        before.setdefault(name, []).append(o)
    out = []
    for op in ops:
        out.extend(before.get(op["name"], []))
        out.append(op)
        out.extend(after.get(op["name"], []))
    g["ops"] = out
    program = _concerto.parse_program(json.dumps(d), "<%s of %s>" % (plan, d["name"]))
    problems = program.verify()
    if problems:
        raise Error("partition: plan '%s': the program does not verify: %s" % (plan, "; ".join(problems[:3])))
    return program


def _check_optimizer(lr, betas, eps, weight_decay):
    """Adam's hyperparameters as torch.optim.Adam accepts them, else a concerto.Error naming the
    argument."""
    def bad(what, value, want):
        raise Error("capture: %s %r: %s" % (what, value, want))
    for what, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            bad(what, v, "must be a finite number")
    if lr <= 0:
        bad("lr", lr, "must be > 0")
    if eps <= 0:
        bad("eps", eps, "must be > 0")
    if weight_decay < 0:
        bad("weight_decay", weight_decay, "must be >= 0")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and
            all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        bad("betas", betas, "must be two numbers in [0, 1)")


def check_labels(labels, classes, who):
    """Raises concerto.Error when an integer label lies outside [0, classes) (torch's
    cross_entropy raises there; the IR's loss would silently give the label's logit 0)."""
    if labels.numel() == 0:
        return
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= classes:
        raise Error("%s: labels: %d is outside [0, %d) (the output's last dim, the classes)"
                    % (who, lo if lo < 0 else hi, classes))


def capture(module, example_inputs, labels=None, loss_fn="cross_entropy", name=None, lr=1e-3,
            betas=(0.9, 0.999), eps=1e-8, dtype=None, dropout="error", sync_bn=False, weight_decay=0.0):
    """Captures one training step of `module` (in train mode) on `example_inputs` (a tensor or a
    tuple of them) as a :class:`Captured`.

    The loss is `loss_fn` of the module's output and `labels`: only "cross_entropy" (also given
    as torch.nn.functional.cross_entropy or an nn.CrossEntropyLoss with mean reduction): the
    mean over every position of the output's last dim as classes, as
    F.cross_entropy(out.flatten(0, -2), labels.flatten()). `labels` (integer, the output's shape
    without its last dim) defaults to zeros. The optimizer step is Adam (`lr`, `betas`, `eps`), as
    torch.optim.Adam's first step; with `weight_decay` > 0 AdamW's (decoupled: param -= lr wd
    param), as torch.optim.AdamW's. `dtype` ("f32", "bf16", "f16") declares the
    float tensors of the program (the cost model prices them; the CPU runtime computes in fp32);
    default: the module's parameter dtype. Dropout with p > 0 is an error unless `dropout` is
    "identity": then it is priced as an elementwise pass and computes nothing (the step's values
    then differ from torch's). With `sync_bn` batch norm is SyncBatchNorm: its statistics (and
    their gradients) come from per-channel sums that a data-parallel plan all-reduces
    (batch_norm_stats: the sum, then the squared deviations from its mean; batch_norm_grad_stats),
    so every rank normalises with the whole batch's
    statistics; without it a plan keeps per-rank statistics (DDP's BatchNorm). Ops carry layer tags from the parameters' module paths (the first
    numbered component: "layer2.0", "encoder.layers.encoder_layer_3"). Raises concerto.Error naming
    the node, its ATen target and its source line when something cannot be mapped."""
    if dropout not in ("error", "identity"):
        raise Error("capture: dropout '%s' (one of 'error', 'identity')" % dropout)
    _check_optimizer(lr, betas, eps, weight_decay)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    if not (loss_fn == "cross_entropy" or loss_fn is torch.nn.functional.cross_entropy or
            (isinstance(loss_fn, torch.nn.CrossEntropyLoss) and loss_fn.reduction == "mean"
             and loss_fn.label_smoothing == 0 and loss_fn.weight is None)):
        raise Error("capture: loss_fn %r: only cross entropy with mean reduction is supported" % (loss_fn,))
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    if dtype is None:
        first = next(iter(params.values()), None)
        dtype = _DTYPES.get(first.dtype, "f32") if first is not None else "f32"
    if dtype not in ("f32", "bf16", "f16"):
        raise Error("capture: dtype '%s' (one of f32, bf16, f16)" % dtype)

    def step(p, b, *xs):
        return _functional_call(module, {**p, **b}, xs)

    # Each node's Python stack (for the error messages): make_fx's record_stack_traces where it
    # has one (torch >= 2.5 or so; its tracer is made per call), else the tracer class's flag.
    trace_kw = {}
    try:
        if "record_stack_traces" in inspect.signature(make_fx).parameters:
            trace_kw["record_stack_traces"] = True
    except (TypeError, ValueError):
        pass
    saved = PythonKeyTracer.record_stack_traces if hasattr(PythonKeyTracer, "record_stack_traces") else False
    PythonKeyTracer.record_stack_traces = True
    try:
        with torch.no_grad():
            gm = make_fx(step, tracing_mode="fake", **trace_kw)(params, buffers, *example_inputs)
    finally:
        PythonKeyTracer.record_stack_traces = saved
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    pnames, bnames = list(params), list(buffers)
    if len(placeholders) != len(pnames) + len(bnames) + len(example_inputs):
        raise Error("capture: the traced graph has %d inputs, expected %d parameters + %d buffers + %d inputs"
                    % (len(placeholders), len(pnames), len(bnames), len(example_inputs)))
    out_node = next(n for n in nodes if n.op == "output")
    outs = out_node.args[0]
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    if len(outs) != 1 or not isinstance(outs[0], torch.fx.Node):
        raise Error("capture: the module returns %d values; it must return one tensor (the logits)" % len(outs))

    graph = _Graph(_flops_table())
    low = _Lowering(graph, dtype, dropout, sync_bn)
    # Only what the output depends on is lowered (running-statistics updates, unused outputs are not).
    live, stack = set(), [outs[0]]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(n.all_input_nodes)
    # Constants: buffers, get_attr tensors and nodes computed only from them; evaluated here.
    const_values = {}
    for n, bname in zip(placeholders[len(pnames):len(pnames) + len(bnames)], bnames):
        const_values[n] = buffers[bname]
    for n in nodes:
        if n.op == "get_attr":
            const_values[n] = getattr(gm, n.target)
        elif n.op == "call_function" and n.all_input_nodes and all(a in const_values for a in n.all_input_nodes):
            args = torch.fx.node.map_arg(n.args, lambda a: const_values[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: const_values[a])
            const_values[n] = n.target(*args, **kwargs)
        elif n.op == "call_function" and not n.all_input_nodes and n in live:
            const_values[n] = n.target(*n.args, **n.kwargs)

    used_names = set()
    ir_params = {}
    blocks = {}
    for pname in pnames:  # layer numbers in module order
        b = _block_of(pname)
        if b is not None and b not in blocks:
            blocks[b] = len(blocks)
    for n, pname in zip(placeholders[:len(pnames)], pnames):
        if n in live:
            t = params[pname]
            low.values[n] = _Value(graph.tensor(pname, t.shape, dtype), t.shape, dtype)
            ir_params[pname] = low.values[n].name
            low.param_names[low.values[n].name] = pname
            graph.layer_of[pname] = graph.param_layer[pname] = blocks.get(_block_of(pname), -1)
    try:
        arg_names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        arg_names = []
    ir_inputs = []
    for i, (n, x) in enumerate(zip(placeholders[len(pnames) + len(bnames):], example_inputs)):
        stem = arg_names[i] if i < len(arg_names) and arg_names[i] not in ("args", "kwargs") else "input%d" % i
        xd = _ir_dtype(x.dtype, dtype)
        if xd is None:
            raise Error("capture: example input %d has dtype %s (supported: %s)"
                        % (i, x.dtype, sorted(map(str, set(_DTYPES) | set(_FLOATS)))))
        low.values[n] = _Value(graph.tensor(stem, x.shape, xd), x.shape, xd)
        ir_inputs.append(low.values[n].name)
    order = {n: i for i, n in enumerate(nodes)}
    fused, absorbed = _match_patterns(nodes, live, const_values)
    for n in nodes:
        if n.op not in ("call_function", "get_attr", "placeholder") or n in low.values or n not in live:
            continue
        if n in absorbed:  # computed by the fused op of a pattern (_match_patterns)
            continue
        readers = [u for u in n.users if u in live and u not in const_values and u not in absorbed]
        if n in const_values:
            if not readers:
                continue
            value = const_values[n]
            if not isinstance(value, torch.Tensor):
                continue
            cd = _ir_dtype(value.dtype, dtype)
            if cd is None:  # a boolean mask: only a handler that evaluates it here reads it (where)
                low.raw_constants[n] = value
                continue
            ir = graph.tensor("const." + n.name, value.shape, cd)
            low.values[n] = _Value(ir, value.shape, cd)
            low.constants[ir] = value
            continue
        if n.op != "call_function":
            continue
        low.node = n
        packet = _packet(n)
        try:
            if n.target is operator.getitem:
                src = low.values.get(n.args[0])
                if not isinstance(src, tuple) or src[n.args[1]] is None:
                    raise _Unsupported("output %d of '%s' has no value in the IR" % (n.args[1], n.args[0].name))
                low.values[n] = src[n.args[1]]
                continue
            if packet.endswith("_") and n.args and isinstance(n.args[0], torch.fx.Node):
                # An in-place op: later reads of its input must go through its result (make_fx
                # rewires them), else something reads the tensor under another name (a view).
                aliases, stack = set(), [n.args[0]]
                while stack:  # the input and the views of it made before the in-place op
                    a = stack.pop()
                    if a in aliases:
                        continue
                    aliases.add(a)
                    stack.extend(u for u in a.users if order[u] < order[n] and
                                 (_packet(u) in _VIEW_OPS or u.target is operator.getitem))
                later = [u for a in aliases for u in a.users if u is not n and order[u] > order[n]]
                if later:
                    raise _Unsupported("in-place %s on '%s', which '%s' reads afterwards through another "
                                       "name (a view): not supported" % (packet, n.args[0].name, later[0].name))
            packet = _INPLACE.get(packet, packet)
            if n in fused:
                kind, args = fused[n]
                low.values[n] = getattr(low, "fused_" + kind)(*args)
                continue
            if packet in _ALIASES:
                handler = low.h_alias
            elif packet in _VIEWS:
                handler = low.h_view
            else:
                handler = getattr(low, "h_" + packet, None)
            if handler is None:
                raise _Unsupported("no mapping to the IR (concerto.torch.supported_ops() lists the mapped ops)")
            low.values[n] = handler(*n.args, **n.kwargs)
        except _Unsupported as e:
            where = _source_line(n)
            raise Error("capture: node '%s' (%s)%s: %s" % (n.name, n.target, " at " + where if where else "", e)) from None

    # The loss: mean cross entropy of the output (logits [..., V]) against the labels.
    if outs[0] not in low.values:
        raise Error("capture: the module's output depends on none of its parameters and inputs (only on buffers "
                    "and constants): there is nothing to train")
    logits = low.values[outs[0]]
    low.node = out_node
    lname = low.materialize(logits)
    lshape = tuple(logits.shape)
    if labels is None:
        labels = torch.zeros(lshape[:-1], dtype=torch.int64)
    if tuple(labels.shape) != lshape[:-1] or labels.dtype not in (torch.int64, torch.int32):
        raise Error("capture: labels %s %s: expected an integer tensor of shape %s (the output's without its last dim)"
                    % (labels.dtype, list(labels.shape), list(lshape[:-1])))
    check_labels(labels, lshape[-1], "capture")
    lab = graph.tensor("labels", lshape[:-1], _DTYPES[labels.dtype])
    rows = lshape[:-1]
    m = graph.tensor("loss.max", rows, "f32")
    z = graph.tensor("loss.sum_exp", rows, "f32")
    tgt = graph.tensor("loss.target", rows, "f32")
    loss = graph.tensor("loss", (), "f32")
    graph.op("loss.max", "reduce_max", [lname], [m])
    graph.op("loss.sum_exp", "sum_exp", [lname, m], [z])
    graph.op("loss.target", "gather_target", [lname, lab], [tgt], 0)
    # No denominator attribute: each rank's loss is the mean over its own rows (the step loss
    # averages them) and the partitioner gives the gradient the global count.
    graph.op("loss", "cross_entropy", [m, z, tgt], [loss])

    # Ops nothing reads towards the loss (reshapes superseded by view_chain) are dropped.
    needed, kept = {loss}, []
    for op in reversed(graph.ops):
        if any(o in needed for o in op["outputs"]):
            kept.append(op)
            needed.update(op["inputs"])
    alive = {id(op) for op in kept}
    dead = [op for op in graph.ops if id(op) not in alive]
    graph.ops = kept[::-1]
    for t in {o for op in dead for o in op["outputs"]} - needed:
        del graph.tensors[t]
        graph.order.remove(t)

    # A parameter's row read without a gradient is also listed with the constants, as a view of
    # the parameter (what a consumer that feeds every constant reads: the parameter's value now);
    # Captured.values feeds it from the module it is given.
    for row, (pname, index) in low.param_rows.items():
        low.constants[row] = params[pname].detach()[index:index + 1]
    # Constants no op reads (broadcast here into others, or read only by fused patterns) are dropped.
    read = {t for op in graph.ops for t in op["inputs"]}
    for ir in [c for c in low.constants if c not in read]:
        del low.constants[ir], graph.tensors[ir]
        graph.order.remove(ir)

    doc = {"format": "concerto-ir", "version": 1, "name": name or type(module).__name__,
           "mesh": {"axes": []},
           "graphs": [{"name": "main", "streams": ["compute"],
                       "tensors": [graph.tensors[t] for t in graph.order], "ops": graph.ops}]}
    program = _concerto.parse_program(json.dumps(doc), "<capture of %s>" % doc["name"])
    program, grads = _concerto.differentiate(program, [(loss, 1.0)], list(ir_params.values()))

    # One Adam step per parameter (torch.optim.Adam's first step: moments start at zero).
    d = program.to_dict()
    g = d["graphs"][0]
    next_id = max(op["id"] for op in g["ops"]) + 1
    by_name = {t["name"]: t for t in g["tensors"]}
    updated, param_grads = {}, {}
    for pname, ir in ir_params.items():
        if ir not in grads:
            continue
        shape = by_name[ir]["shape"]

        def declare(tname, tdtype):
            by_name[tname] = {"dtype": tdtype}
            g["tensors"].append({"name": tname, "shape": shape, "dtype": tdtype, "sharding": [[] for _ in shape],
                                 "partial": []})
            return tname

        ins = [ir, grads[ir], declare(ir + ".adam_m", "f32"), declare(ir + ".adam_v", "f32")]
        outs_ = [declare(ir + ".next", dtype), declare(ir + ".adam_m.next", "f32"), declare(ir + ".adam_v.next", "f32")]
        if dtype != "f32":
            ins.append(declare(ir + ".master", "f32"))
            outs_.append(declare(ir + ".master.next", "f32"))
        n = _numel(shape)
        g["ops"].append({"id": next_id, "name": ir + ".adam", "kind": "compute", "stream": "compute", "type": "adam",
                         "inputs": ins, "outputs": outs_,
                         "attrs": {"lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps, "step": 1,
                                   "weight_decay": weight_decay},
                         "flops": 10.0 * n,
                         "bytes": int(sum(_numel(shape) * _ELEM_BYTES[by_name[t]["dtype"]]
                                          for t in ins + outs_)),
                         "tags": {"phase": "opt", "layer": -1, "microbatch": 0, "purpose": ""}})
        next_id += 1
        updated[pname] = ir + ".next"
        param_grads[pname] = grads[ir]
    program = _concerto.parse_program(json.dumps(d), "<capture of %s>" % doc["name"])
    problems = program.verify()
    if problems:
        raise Error("capture: the captured program does not verify: %s" % "; ".join(problems[:3]))
    cap = Captured(program, ir_params, param_grads, updated, ir_inputs, lab, loss, low.constants, low.param_rows)
    cap._recapture = lambda xs, ys: capture(module, xs, ys, loss_fn=loss_fn, name=name, lr=lr, betas=betas, eps=eps,
                                            dtype=dtype, dropout=dropout, sync_bn=sync_bn, weight_decay=weight_decay)
    cap._example = (example_inputs, labels)
    cap.classes = lshape[-1]  # the output's last dim: labels lie in [0, classes)
    return cap



def _main(argv=None):
    """python3 -m concerto.torch MODULE:FACTORY ...: capture a model, apply a plan, compare every
    scheduler on it (docs/python.md, 'From the command line')."""
    import argparse
    import importlib
    import sys
    import time

    ap = argparse.ArgumentParser(
        prog="python3 -m concerto.torch",
        description="Capture a PyTorch model's training step (concerto.torch.capture), apply a parallel "
                    "plan (data, tensor, sequence parallel, ZeRO) and compare every scheduler on it on a cluster "
                    "preset.")
    ap.add_argument("factory", help="MODULE:CALLABLE that returns the nn.Module, e.g. torchvision.models:vit_b_16")
    ap.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the callable")
    ap.add_argument("--input", action="append", required=True, metavar="SHAPE",
                    help="an example input's shape, e.g. 256x3x224x224 (global batch first); repeat for more inputs")
    ap.add_argument("--input-dtype", choices=["float", "long"], default="float",
                    help="float: random normal inputs; long: token ids in [0, --vocab)")
    ap.add_argument("--vocab", type=int, default=1000, help="id range of long inputs (default 1000)")
    ap.add_argument("--plan", default="dp=1",
                    help="dp=N, tp=N, sp, zero=1|2|3, comma-separated (default dp=1: the unsharded step); tp and sp "
                         "lay the model out as Megatron-LM does, found on the captured graph")
    ap.add_argument("--cluster", default="a800-4x8", help="a cluster preset or file (default a800-4x8)")
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="bf16",
                    help="the program's float tensors (default bf16, mixed precision)")
    ap.add_argument("--dropout", choices=["error", "identity"], default="error",
                    help="dropout with p > 0: refuse (default) or price it without randomness")
    ap.add_argument("--write-program", metavar="FILE", help="also write the planned program (concerto-ir JSON)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)

    def fail(msg):
        print("python3 -m concerto.torch: " + msg, file=sys.stderr)
        return 2

    if ":" not in args.factory:
        return fail("'%s' is not MODULE:CALLABLE" % args.factory)
    if args.vocab < 1:
        return fail("--vocab %d: must be >= 1" % args.vocab)
    mod_name, attr = args.factory.split(":", 1)
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        return fail("cannot load '%s': %s" % (args.factory, e))
    try:
        kwargs = json.loads(args.kwargs)
    except ValueError as e:
        return fail("--kwargs: not JSON: %s" % e)
    if not isinstance(kwargs, dict):
        return fail("--kwargs: a JSON object of keyword arguments is needed, got %s" % type(kwargs).__name__)
    inputs = []
    for text in args.input:
        try:
            shape = [int(d) for d in text.lower().split("x")]
        except ValueError:
            return fail("--input '%s': not a shape like 256x3x224x224" % text)
        if not shape or min(shape) < 1:
            return fail("--input '%s': every dim must be >= 1" % text)
        inputs.append(torch.randint(0, args.vocab, shape) if args.input_dtype == "long" else torch.randn(shape))
    try:
        t0 = time.time()
        try:
            module = factory(**kwargs)
        except Exception as e:  # the user's code: its failure in one line, not a traceback
            return fail("%s(**%s) raised %s: %s" % (args.factory, args.kwargs, type(e).__name__, e))
        if not isinstance(module, torch.nn.Module):
            return fail("%s returned %s, not a torch.nn.Module" % (args.factory, type(module).__name__))
        module.train()
        print("capturing %s ..." % args.factory, file=sys.stderr)
        cap = capture(module, tuple(inputs), dtype=args.dtype, dropout=args.dropout, name=attr)
        t1 = time.time()
        print("captured %d ops in %.1f s; planning %s ..." % (cap.program.num_ops, t1 - t0, args.plan), file=sys.stderr)
        program = cap.program if args.plan.replace(" ", "") in ("dp=1", "") else cap.partition(plan=args.plan)
        t2 = time.time()
        print("comparing every scheduler on %s ..." % args.cluster, file=sys.stderr)
        table = _concerto.compare(program, cluster=args.cluster)
        t3 = time.time()
    except Error as e:
        return fail(str(e))
    if args.write_program:
        try:
            program.write(args.write_program)
        except Error as e:
            return fail(str(e))
    if args.json:
        print(json.dumps({"model": args.factory, "plan": args.plan, "cluster": args.cluster, "ops": program.num_ops,
                          "ranks": program.num_ranks, "capture_s": t1 - t0, "partition_s": t2 - t1,
                          "compare_s": t3 - t2, "compare": table}))
        return 0
    runs = {r["scheduler"]: r for r in table["results"]}
    print("%s, plan %s, %s: %d ranks, %d ops per rank (capture %.1f s, plan %.1f s, compare %.1f s)" % (
        args.factory, args.plan, args.cluster, program.num_ranks, program.num_ops, t1 - t0, t2 - t1, t3 - t2))
    print("%-22s %12s %10s %14s" % ("scheduler", "step_ms", "vs_best", "peak_mem_GiB"))
    best = min(r["makespan_us"] for r in runs.values())
    for name, r in runs.items():
        print("%-22s %12.3f %9.3fx %14.2f" % (name, r["makespan_us"] / 1e3, r["makespan_us"] / best,
                                              r.get("peak_memory_bytes", 0) / 2**30))
    return 0


if __name__ == "__main__":
    import sys as _sys
    _sys.exit(_main())
