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
"""

import inspect
import json
import operator
import os
import re

import torch
from torch.fx.experimental.proxy_tensor import PythonKeyTracer, make_fx
from torch.nn.utils import stateless

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
_ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4}
_TORCH_DIR = os.path.dirname(torch.__file__)
_THIS_FILE = os.path.abspath(__file__)


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
    torch.fx recorded for `node` (innermost frame first; '' when none was recorded)."""
    lines = (node.stack_trace or "").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+), in ', line)
        if not m:
            continue
        path = os.path.abspath(m.group(1))
        if path.startswith(_TORCH_DIR) or path == _THIS_FILE or m.group(1).startswith("<"):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
        return "%s:%s%s" % (m.group(1), m.group(2), " `%s`" % code if code else "")
    return ""


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
        # The layer: the deepest of its inputs' (a parameter's from its module path, _block_of).
        layer = max([self.layer_of.get(t, -1) for t in inputs] + [-1])
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

    # ---- helpers --------------------------------------------------------------------------
    def fail(self, why):
        raise _Unsupported(why)

    def val(self, a):
        if not isinstance(a, torch.fx.Node):
            self.fail("argument %r is not a tensor" % (a,))
        v = self.values.get(a)
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

    def reshape(self, v, shape, suffix=".view"):
        shape = tuple(int(d) for d in shape)
        if _numel(shape) != _numel(v.shape):
            self.fail("reshape of %s to %s changes the element count" % (list(v.shape), list(shape)))
        src = self.materialize(v)
        if shape == tuple(self.g.shape(src)):
            return _Value(src, shape, v.dtype)
        out = self.new(shape, v.dtype, self.node.name + suffix)
        self.emit("identity", [src], [out], 0, suffix=suffix)
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

    def matmul(self, a, b, suffix=""):
        """c = a @ b with a [..., m, k], b [k, n] or [..., k, n]; pending transposes fold in."""
        if len(a.shape) < 2 or len(b.shape) < 2:
            self.fail("matmul of shapes %s and %s (both need rank >= 2)" % (list(a.shape), list(b.shape)))
        if len(b.shape) > 2 and a.shape[:-2] != b.shape[:-2]:
            self.fail("matmul batch dims %s and %s differ" % (list(a.shape[:-2]), list(b.shape[:-2])))
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        shape = tuple(a.shape[:-2]) + (m, n)
        out = self.new(shape, a.dtype, self.node.name + suffix if suffix else None)
        flops = 2.0 * _numel(a.shape[:-2]) * m * n * k
        self.emit("matmul", [a.name, b.name], [out], flops,
                  {"transpose_a": int(a.t), "transpose_b": int(b.t)}, suffix)
        return _Value(out, shape, a.dtype)

    def add(self, x, y, suffix=""):
        """x + y where one operand's shape (without leading 1s) is a suffix of the other's."""
        if tuple(x.shape) != tuple(y.shape):
            def core(s):
                s = list(s)
                while len(s) > 1 and s[0] == 1:
                    s.pop(0)
                return tuple(s)
            if len(core(y.shape)) <= len(x.shape) and tuple(x.shape[len(x.shape) - len(core(y.shape)):]) == core(y.shape):
                y = self.reshape(y, core(y.shape), suffix + ".bcast")
            elif len(core(x.shape)) <= len(y.shape) and tuple(y.shape[len(y.shape) - len(core(x.shape)):]) == core(x.shape):
                x, y = y, self.reshape(x, core(x.shape), suffix + ".bcast")
            else:
                self.fail("broadcast of %s with %s (only a trailing-dims operand broadcasts)" % (list(x.shape), list(y.shape)))
        xs, ys = self.materialize(x), self.materialize(y)
        out = self.new(x.shape, x.dtype, self.node.name + suffix if suffix else None)
        self.emit("add", [xs, ys], [out], suffix=suffix)
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
        return self.add(c, self.val(bias))

    def h_add(self, x, y, alpha=1):
        if not isinstance(y, torch.fx.Node):
            if y == 0:
                return self.val(x)
            self.fail("adding the constant %r (only tensors)" % (y,))
        yv = self.val(y)
        if alpha != 1:
            yv = self.scale(yv, alpha, ".alpha")
        return self.add(self.val(x), yv)

    def h_sub(self, x, y, alpha=1):
        if not isinstance(y, torch.fx.Node):
            self.fail("subtracting the constant %r (only tensors)" % (y,))
        return self.add(self.val(x), self.scale(self.val(y), -alpha, ".neg"))

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
        if not isinstance(y, torch.fx.Node):
            return self.scale(self.val(x), y)
        xv, yv = self.val(x), self.val(y)
        if xv.shape != yv.shape:
            self.fail("elementwise product of shapes %s and %s (broadcasting is not supported)" % (list(xv.shape), list(yv.shape)))
        out = self.new(xv.shape, xv.dtype)
        self.emit("mul", [self.materialize(xv), self.materialize(yv)], [out])
        return _Value(out, xv.shape, xv.dtype)

    def h_div(self, x, y, rounding_mode=None):
        if isinstance(self.values.get(x), _DropoutMask):
            return self.values[x]  # the mask's 1 / (1 - p)
        if isinstance(y, torch.fx.Node) or rounding_mode is not None:
            self.fail("division by a tensor (only by a constant)")
        return self.scale(self.val(x), 1.0 / y)

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
        src = (1,) * (len(target) - len(v.shape)) + tuple(v.shape)
        grown = [i for i, (a, b) in enumerate(zip(src, target)) if a != b]
        if not grown:
            return self.reshape(v, target)
        lead = max(grown) + 1
        if any(src[i] != 1 for i in range(lead)):
            self.fail("expand of %s to %s (only leading dims of size 1 grow)" % (list(v.shape), list(target)))
        return self.expand_rows(v, _numel(target[:lead]), target, ".expand")

    def h_cat(self, tensors, dim=0):
        vs = [self.val(t) for t in tensors]
        dim %= len(vs[0].shape)
        shape = tuple(self.node.meta["tensor_meta"].shape)
        out = self.new(shape, vs[0].dtype)
        self.emit("concat", [self.materialize(v) for v in vs], [out], 0, {"axis": dim})
        return _Value(out, shape, vs[0].dtype)

    def h_embedding(self, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        w, ids = self.val(weight), self.val(indices)
        if scale_grad_by_freq or sparse or padding_idx not in (-1, None):
            self.fail("embedding with padding_idx, scale_grad_by_freq or sparse")
        shape = tuple(ids.shape) + (w.shape[1],)
        out = self.new(shape, w.dtype)
        self.emit("embedding", [w.name, ids.name], [out], 0)
        return _Value(out, shape, w.dtype)

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
_INPLACE = {"relu_": "relu", "add_": "add", "mul_": "mul", "div_": "div", "sub_": "sub", "silu_": "silu"}


def supported_ops():
    """The ATen ops capture maps (by overload packet name)."""
    names = {n[2:] for n in dir(_Lowering) if n.startswith("h_") and n not in ("h_alias", "h_view")}
    return sorted(names | _ALIASES | _VIEWS | set(_INPLACE))


def _packet(node):
    return str(node.target).split(".")[1] if str(node.target).startswith("aten.") else str(node.target)


def _flops_table():
    return {t["name"]: (t["flops"], t["flops_per"]) for t in _concerto.op_types()}


class Captured:
    """A captured training step: `program` (one graph, one rank: forward, loss, backward, Adam),
    and the names in it: `params` {torch parameter name: IR tensor}, `grads` and `updated`
    (the gradient and the Adam-updated value of each parameter), `inputs` (the IR names of the
    example inputs, in order), `labels`, `loss`, and `constants` {IR tensor: torch tensor} (the
    module's buffers and constants the step reads)."""

    def __init__(self, program, params, grads, updated, inputs, labels, loss, constants):
        self.program = program
        self.params, self.grads, self.updated = params, grads, updated
        self.inputs, self.labels, self.loss = inputs, labels, loss
        self.constants = constants

    def __repr__(self):
        return "<concerto.torch.Captured %r: %d ops, %d parameters>" % (
            self.program.name, self.program.num_ops, len(self.params))

    def values(self, module, example_inputs, labels):
        """Every input of the step as {IR name: flat float32 numpy array}: the module's
        parameters, its constants, the example inputs and the labels (what Captured.run feeds
        the runtime; concerto.execute takes the arrays' buffers without a copy to Python
        floats)."""
        def flat(t):
            return t.detach().float().contiguous().flatten().numpy()

        out = {}
        named = dict(module.named_parameters())
        for tname, ir in self.params.items():
            out[ir] = flat(named[tname])
        for ir, t in self.constants.items():
            out[ir] = flat(t)
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
                raise Error("partition: plan '%s': '%s' is not dp=N or zero=1|2|3 (use sharding= for other plans)"
                            % (plan, part.strip()))
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
        return _data_parallel(local, dp, zero, _numel(ys.shape), plan)

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
                              inputs=self.values(module, example_inputs, labels), fetch=fetch,
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
    split on dim 0, each gradient synchronised before its Adam op (Captured.partition)."""
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


def capture(module, example_inputs, labels=None, loss_fn="cross_entropy", name=None, lr=1e-3,
            betas=(0.9, 0.999), eps=1e-8, dtype=None, dropout="error", sync_bn=False):
    """Captures one training step of `module` (in train mode) on `example_inputs` (a tensor or a
    tuple of them) as a :class:`Captured`.

    The loss is `loss_fn` of the module's output and `labels`: only "cross_entropy" (also given
    as torch.nn.functional.cross_entropy or an nn.CrossEntropyLoss with mean reduction): the
    mean over every position of the output's last dim as classes, as
    F.cross_entropy(out.flatten(0, -2), labels.flatten()). `labels` (integer, the output's shape
    without its last dim) defaults to zeros. The optimizer step is Adam (`lr`, `betas`, `eps`, no
    weight decay), as torch.optim.Adam's first step. `dtype` ("f32", "bf16", "f16") declares the
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
        return stateless.functional_call(module, {**p, **b}, xs)

    saved = PythonKeyTracer.record_stack_traces if hasattr(PythonKeyTracer, "record_stack_traces") else False
    PythonKeyTracer.record_stack_traces = True
    try:
        with torch.no_grad():
            gm = make_fx(step, tracing_mode="fake")(params, buffers, *example_inputs)
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
            graph.layer_of[pname] = blocks.get(_block_of(pname), -1)
    try:
        arg_names = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        arg_names = []
    ir_inputs = []
    for i, (n, x) in enumerate(zip(placeholders[len(pnames) + len(bnames):], example_inputs)):
        stem = arg_names[i] if i < len(arg_names) and arg_names[i] not in ("args", "kwargs") else "input%d" % i
        xd = _DTYPES.get(x.dtype)
        if xd is None:
            raise Error("capture: example input %d has dtype %s (supported: %s)" % (i, x.dtype, sorted(map(str, _DTYPES))))
        xd = dtype if xd in ("f32", "f16", "bf16") else xd
        low.values[n] = _Value(graph.tensor(stem, x.shape, xd), x.shape, xd)
        ir_inputs.append(low.values[n].name)
    constants = {}
    order = {n: i for i, n in enumerate(nodes)}
    for n in nodes:
        if n.op not in ("call_function", "get_attr", "placeholder") or n in low.values or n not in live:
            continue
        feeds_data = any(u in live and u not in const_values for u in n.users)
        if n in const_values:
            if not feeds_data:
                continue
            value = const_values[n]
            if not isinstance(value, torch.Tensor):
                continue
            cd = _DTYPES.get(value.dtype)
            if cd is None:
                raise Error("capture: constant '%s' has dtype %s" % (n.name, value.dtype))
            cd = dtype if cd in ("f32", "f16", "bf16") else cd
            ir = graph.tensor("const." + n.name, value.shape, cd)
            low.values[n] = _Value(ir, value.shape, cd)
            constants[ir] = value
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
    logits = low.values[outs[0]]
    low.node = out_node
    lname = low.materialize(logits)
    lshape = tuple(logits.shape)
    if labels is None:
        labels = torch.zeros(lshape[:-1], dtype=torch.int64)
    if tuple(labels.shape) != lshape[:-1] or labels.dtype not in (torch.int64, torch.int32):
        raise Error("capture: labels %s %s: expected an integer tensor of shape %s (the output's without its last dim)"
                    % (labels.dtype, list(labels.shape), list(lshape[:-1])))
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
                                   "weight_decay": 0},
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
    cap = Captured(program, ir_params, param_grads, updated, ir_inputs, lab, loss, constants)
    cap._recapture = lambda xs, ys: capture(module, xs, ys, loss_fn=loss_fn, name=name, lr=lr, betas=betas, eps=eps,
                                            dtype=dtype, dropout=dropout, sync_bn=sync_bn)
    cap._example = (example_inputs, labels)
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
        description="Capture a PyTorch model's training step (concerto.torch.capture), apply a data-parallel "
                    "plan and compare every scheduler on it on a cluster preset.")
    ap.add_argument("factory", help="MODULE:CALLABLE that returns the nn.Module, e.g. torchvision.models:vit_b_16")
    ap.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments for the callable")
    ap.add_argument("--input", action="append", required=True, metavar="SHAPE",
                    help="an example input's shape, e.g. 256x3x224x224 (global batch first); repeat for more inputs")
    ap.add_argument("--input-dtype", choices=["float", "long"], default="float",
                    help="float: random normal inputs; long: token ids in [0, --vocab)")
    ap.add_argument("--vocab", type=int, default=1000, help="id range of long inputs (default 1000)")
    ap.add_argument("--plan", default="dp=1", help="dp=N[,zero=1|2|3] (default dp=1: the unsharded step)")
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
    mod_name, attr = args.factory.split(":", 1)
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        return fail("cannot load '%s': %s" % (args.factory, e))
    try:
        kwargs = json.loads(args.kwargs)
    except ValueError as e:
        return fail("--kwargs: not JSON: %s" % e)
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
        module = factory(**kwargs)
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
        program.write(args.write_program)
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
