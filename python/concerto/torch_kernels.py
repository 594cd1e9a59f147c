"""Torch kernels for the IR's compute types (docs/ir.md section 1.6), for a torch executor of the IR.

``KERNELS`` maps the IR spelling of every compute type of the op registry (``concerto.op_types()``),
in registry order, to a kernel ``kernel(op, inputs, ctx) -> outputs``; ``run_kernel(op, inputs, ctx)``
looks the op's type up and runs it. The semantics are those of the fp32 C++ CPU kernels
(src/runtime/kernels.cc, docs/runtime.md "Kernels"), including the sharded offsets of
``embedding``, ``embedding_grad``, ``gather_target`` and ``cross_entropy_grad``, the slot assignment
of the mixture-of-experts ops, ties of ``top_k`` to the lower id, ``max_pool2d_grad`` to each
window's first maximum (row-major), the synchronised batch-norm variants, ``cast`` truncating
toward zero to integer dtypes and ``adam``'s bias correction and decoupled weight decay.

Conventions:

- ``op`` is the op's dict as in the IR JSON (``Program.to_dict()["graphs"][g]["ops"][i]``); only
  ``attrs`` (missing keys take the documented defaults), and ``id``, ``name``, ``type`` for
  messages, are read. A kernel also accepts a bare attrs dict in place of ``op``.
- Float tensors come in the executor's compute dtype (float32, bfloat16, float16, float64);
  reductions (norms, softmax, loss, statistics, sums over experts) and attention, where the C++
  kernels accumulate in double, run in float32 or better (``_acc``); matmul and conv2d run in the
  input dtype (tensor cores). Integer tensors (ids, labels) are torch.int64.
- Every output is contiguous, has ``ctx.out_shapes[i]`` and ``ctx.out_dtypes[i]``, and never
  shares memory with an input (a view, e.g. an ``identity`` reshape, is copied).
- Kernels run on the inputs' device, without autograd, without host synchronisation (no
  ``.item()``, ``.numpy()`` or data-dependent shapes), except that expert ids outside
  ``[0, E)`` are reported with a :class:`concerto.Error` on CPU tensors only (the C++ kernels'
  error; on an accelerator such ids fail torch's own index check).
"""

import functools
import math

import torch
import torch.nn.functional as F

from ._concerto import Error

__all__ = ["KERNELS", "KernelContext", "run_kernel"]


class KernelContext:
    """What a kernel needs besides the op and its input values; the executor builds one per op.

    out_shapes[i]: local shape of output i; out_dtypes[i]: its torch dtype; in_offsets[i][d] /
    out_offsets[i][d]: the first global index this rank holds of dim d of input / output i
    (ShardOffset, 0 when replicated; None or a short list also reads as 0); step: the 0-based
    training iteration (adam's bias-correction step is attrs["step"] (default 1) + step).
    """

    __slots__ = ("out_shapes", "out_dtypes", "in_offsets", "out_offsets", "step")

    def __init__(self, out_shapes, out_dtypes, in_offsets, out_offsets, step=0):
        self.out_shapes = [tuple(int(d) for d in s) for s in out_shapes]
        self.out_dtypes = list(out_dtypes) if out_dtypes is not None else [None] * len(self.out_shapes)
        self.in_offsets = [list(o) for o in in_offsets] if in_offsets is not None else []
        self.out_offsets = [list(o) for o in out_offsets] if out_offsets is not None else []
        self.step = int(step)

    def __repr__(self):
        return (f"KernelContext(out_shapes={self.out_shapes}, out_dtypes={self.out_dtypes}, "
                f"in_offsets={self.in_offsets}, out_offsets={self.out_offsets}, step={self.step})")


# ---- helpers ------------------------------------------------------------------------------------


def _label(op):
    """The op as messages name it: "op 12 'name': type"."""
    return f"op {op.get('id', '?')} '{op.get('name', '')}': {op.get('type', '?')}"


def _error(op, what):
    """A concerto.Error "op N 'name': <type>: <what>"."""
    return Error(f"{_label(op)}: {what}")


def _attrs(op):
    """The op's attrs (a bare attrs dict is taken as it is)."""
    if "attrs" in op:
        return op["attrs"] or {}
    return {} if "type" in op or "inputs" in op else op


def _attr(op, key, default):
    """Attribute `key` as a float, `default` when absent."""
    v = _attrs(op).get(key)
    return float(default) if v is None else float(v)


def _int_attr(op, key, default=None):
    """Integer attribute `key`; `default` when absent (None: required)."""
    v = _attrs(op).get(key)
    if v is None:
        if default is None:
            raise _error(op, f"missing required attribute '{key}'")
        return int(default)
    return int(v)


def _offset(offsets, i, d):
    """offsets[i][d] (a negative d counts from the end), 0 when not given."""
    if offsets is None or i >= len(offsets) or offsets[i] is None:
        return 0
    o = offsets[i]
    if d < 0:
        d += len(o)
    return int(o[d]) if 0 <= d < len(o) else 0


def _acc_dtype(t):
    """The accumulation dtype of float tensor t: float32 or better."""
    return torch.promote_types(t.dtype, torch.float32)


def _acc(t):
    """t in its accumulation dtype (float32 or better)."""
    return t.to(_acc_dtype(t))


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _check_ids(op, ids, bound, what):
    """On CPU, an Error when an id of `ids` is outside [0, bound) (the C++ kernels' check)."""
    if ids.device.type != "cpu" or ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= bound)
    if bool(bad.any()):
        flat = ids.reshape(-1)
        at = int(torch.nonzero(bad.reshape(-1))[0, 0])
        raise _error(op, f"{what} {int(flat[at])} at index {at} is outside [0, {bound})")


def _storage_ptr(t):
    """The address of t's storage (None for a tensor without one)."""
    try:
        if hasattr(t, "untyped_storage"):
            return t.untyped_storage().data_ptr()
        return t.storage().data_ptr()  # torch before 2.0
    except (RuntimeError, NotImplementedError):  # a tensor without storage (e.g. a wrapper subclass)
        return None


def _finish(op, outs, inputs, ctx):
    """The outputs as the executor gets them: ctx.out_shapes / ctx.out_dtypes, contiguous, never
    sharing memory with an input."""
    outs = list(outs)
    if len(outs) != len(ctx.out_shapes):
        raise _error(op, f"the kernel made {len(outs)} output(s), the op has {len(ctx.out_shapes)}")
    in_ptrs = {p for p in (_storage_ptr(t) for t in inputs) if p}
    done = []
    for i, t in enumerate(outs):
        shape = ctx.out_shapes[i]
        dtype = ctx.out_dtypes[i] if i < len(ctx.out_dtypes) else None
        if tuple(t.shape) != shape:
            if t.numel() != _numel(shape):
                raise _error(op, f"output {i} has shape {list(t.shape)}, the op's tensor is {list(shape)}")
            t = t.reshape(shape)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        t = t.contiguous()
        if t.numel() and _storage_ptr(t) in in_ptrs:
            t = t.clone()
        done.append(t)
    return done


def _kernel(fn):
    """Kernel `fn(op, inputs, ctx)` with its outputs finished (_finish): as the executor takes them."""

    @functools.wraps(fn)
    def run(op, inputs, ctx):
        return _finish(op, fn(op, inputs, ctx), inputs, ctx)

    return run


def _flat_rows(t):
    """t viewed as [rows, last dim]."""
    return t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)


# ---- matmul and elementwise ---------------------------------------------------------------------

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


@_kernel
def matmul(op, inputs, ctx):
    """c = op(a) @ op(b): op transposes the last two dims when transpose_a / transpose_b is 1; b 2-D
    is broadcast over a's batch dims, or batched like a."""
    a, b = inputs
    if _attr(op, "transpose_a", 0) != 0:
        a = a.transpose(-1, -2)
    if _attr(op, "transpose_b", 0) != 0:
        b = b.transpose(-1, -2)
    return [torch.matmul(a, b)]


@_kernel
def add(op, inputs, ctx):
    """z = x + y, y (x's shape or a suffix of it) broadcast over x's leading dims."""
    x, y = inputs
    return [x + y]


@_kernel
def mul(op, inputs, ctx):
    """z = x * y elementwise."""
    x, y = inputs
    return [x * y]


@_kernel
def scale(op, inputs, ctx):
    """y = x * scale (default 1)."""
    (x,) = inputs
    return [(_acc(x) * _attr(op, "scale", 1.0)).to(x.dtype)]


def _gelu_deriv(x, exact):
    """d gelu / dx (tanh form, or the exact x Phi(x) with exact)."""
    if exact:
        return 0.5 * (1 + torch.erf(x * _INV_SQRT2)) + x * _INV_SQRT2PI * torch.exp(-0.5 * x * x)
    t = torch.tanh(_GELU_C * (x + _GELU_A * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_A * x * x)


@_kernel
def gelu(op, inputs, ctx):
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); with exact 1, x Phi(x)."""
    (x,) = inputs
    exact = _attr(op, "exact", 0) != 0
    return [F.gelu(_acc(x), approximate="none" if exact else "tanh").to(x.dtype)]


@_kernel
def gelu_grad(op, inputs, ctx):
    """dx = dy * gelu'(x), of the form exact selects."""
    dy, x = inputs
    # ATen's fused backward computes dy * gelu'(x) of the same form (_gelu_deriv) in one pass.
    exact = _attr(op, "exact", 0) != 0
    return [torch.ops.aten.gelu_backward(_acc(dy), _acc(x), approximate="none" if exact else "tanh").to(dy.dtype)]


def _silu_deriv(x):
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)."""
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


@_kernel
def silu(op, inputs, ctx):
    """y = x sigmoid(x)."""
    (x,) = inputs
    return [F.silu(_acc(x)).to(x.dtype)]


@_kernel
def silu_grad(op, inputs, ctx):
    """dx = dy * silu'(x)."""
    dy, x = inputs
    return [(_acc(dy) * _silu_deriv(_acc(x))).to(dy.dtype)]


@_kernel
def swiglu(op, inputs, ctx):
    """y = silu(gate) * up."""
    gate, up = inputs
    return [(F.silu(_acc(gate)) * _acc(up)).to(gate.dtype)]


@_kernel
def swiglu_grad(op, inputs, ctx):
    """dgate = dy * up * silu'(gate), dup = dy * silu(gate)."""
    dy, gate, up = inputs
    d, g = _acc(dy), _acc(gate)
    return [(d * _acc(up) * _silu_deriv(g)).to(dy.dtype), (d * F.silu(g)).to(dy.dtype)]


@_kernel
def relu(op, inputs, ctx):
    """y = max(x, 0) (x where x > 0, else 0)."""
    (x,) = inputs
    return [torch.where(x > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))]


@_kernel
def relu_grad(op, inputs, ctx):
    """dx = dy where x > 0, else 0."""
    dy, x = inputs
    return [torch.where(x > 0, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))]


# ---- norms and softmax --------------------------------------------------------------------------


def _row_stats(x, eps):
    """Mean and 1/sqrt(biased var + eps) over the last dim (x in its accumulation dtype)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return mean, torch.rsqrt(var + eps)


@_kernel
def layer_norm(op, inputs, ctx):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim (biased var; eps 1e-5)."""
    x, gamma, beta = inputs
    xa = _acc(x)
    mean, rstd = _row_stats(xa, _attr(op, "eps", 1e-5))
    return [((xa - mean) * rstd * _acc(gamma) + _acc(beta)).to(x.dtype)]


@_kernel
def layer_norm_grad(op, inputs, ctx):
    """(dy, x, gamma) -> (dx, dgamma, dbeta) of layer_norm: dx = rstd (g - mean(g) - xhat mean(g xhat))
    with g = dy gamma; dgamma = sum dy xhat, dbeta = sum dy over all leading dims."""
    dy, x, gamma = inputs
    h = x.shape[-1]
    xa, da = _flat_rows(_acc(x)), _flat_rows(_acc(dy))
    mean, rstd = _row_stats(xa, _attr(op, "eps", 1e-5))
    xhat = (xa - mean) * rstd
    g = da * _acc(gamma)
    mean_g = g.mean(dim=-1, keepdim=True)
    mean_gx = (g * xhat).mean(dim=-1, keepdim=True)
    dx = rstd * (g - mean_g - xhat * mean_gx)
    dgamma = (da * xhat).sum(dim=0)
    dbeta = da.sum(dim=0)
    return [dx.reshape(x.shape).to(dy.dtype), dgamma.reshape(h).to(gamma.dtype), dbeta.reshape(h).to(gamma.dtype)]


def _rms_scale(x, eps):
    """1/sqrt(mean(x^2) + eps) over the last dim (x in its accumulation dtype)."""
    return torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)


@_kernel
def rms_norm(op, inputs, ctx):
    """y = x / sqrt(mean(x^2) + eps) * gamma over the last dim (eps 1e-6)."""
    x, gamma = inputs
    xa = _acc(x)
    return [(xa * _rms_scale(xa, _attr(op, "eps", 1e-6)) * _acc(gamma)).to(x.dtype)]


@_kernel
def rms_norm_grad(op, inputs, ctx):
    """(dy, x, gamma) -> (dx, dgamma) of rms_norm: dx = r dy gamma - x r^3 mean(dy gamma x);
    dgamma = sum dy x r over all leading dims."""
    dy, x, gamma = inputs
    h = x.shape[-1]
    xa, da, ga = _flat_rows(_acc(x)), _flat_rows(_acc(dy)), _acc(gamma)
    r = _rms_scale(xa, _attr(op, "eps", 1e-6))
    gx = (da * ga * xa).sum(dim=-1, keepdim=True)
    dx = r * da * ga - (r * r * r * gx / h) * xa
    dgamma = (da * xa * r).sum(dim=0)
    return [dx.reshape(x.shape).to(dy.dtype), dgamma.reshape(h).to(gamma.dtype)]


@_kernel
def softmax(op, inputs, ctx):
    """Softmax over the last dim (max-subtracted)."""
    (x,) = inputs
    return [torch.softmax(_acc(x), dim=-1).to(x.dtype)]


@_kernel
def softmax_grad(op, inputs, ctx):
    """dx = y * (dy - sum(dy * y)) over the last dim."""
    dy, y = inputs
    da, ya = _acc(dy), _acc(y)
    dot = (da * ya).sum(dim=-1, keepdim=True)
    return [(ya * (da - dot)).to(dy.dtype)]


# ---- attention ----------------------------------------------------------------------------------


def _attn_dims(op, q):
    """(heads, kv_heads, d, causal, scale) of attention op `op` with query q [b, s, heads*d]."""
    heads = _int_attr(op, "heads")
    kv_heads = _int_attr(op, "kv_heads", heads)
    if heads < 1 or kv_heads < 1 or heads % kv_heads != 0 or q.dim() != 3 or q.shape[2] % heads != 0:
        raise _error(op, "heads must divide q's last dim and kv_heads must divide heads")
    d = q.shape[2] // heads
    causal = _attr(op, "causal", 0) != 0
    scale_ = _attr(op, "scale", 1.0 / math.sqrt(d) if d else 1.0)
    return heads, kv_heads, d, causal, scale_


def _split_q(t, kv_heads, rep, d):
    """[b, s, heads*d] -> [b, kv_heads, rep, s, d] (query head h = g * rep + r), accumulation dtype."""
    b, s = t.shape[0], t.shape[1]
    return _acc(t).reshape(b, s, kv_heads, rep, d).permute(0, 2, 3, 1, 4)


def _split_kv(t, kv_heads, d):
    """[b, s, kv_heads*d] -> [b, kv_heads, 1, s, d], accumulation dtype."""
    b, s = t.shape[0], t.shape[1]
    return _acc(t).reshape(b, s, kv_heads, d).permute(0, 2, 1, 3).unsqueeze(2)


def _merge_q(t):
    """[b, kv_heads, rep, s, d] -> [b, s, heads*d]."""
    b, g, r, s, d = t.shape
    return t.permute(0, 3, 1, 2, 4).reshape(b, s, g * r * d)


def _merge_kv(t):
    """[b, kv_heads, s, d] -> [b, s, kv_heads*d]."""
    b, g, s, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b, s, g * d)


def _attn_probs(qg, kg, causal, scale_):
    """P = softmax(scale q k^T + mask) per (batch, query head), masked entries 0: [b, G, rep, s, s]."""
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * scale_
    if causal:
        s = scores.shape[-1]
        idx = torch.arange(s, device=scores.device)
        hidden = idx.unsqueeze(0) > idx.unsqueeze(1)  # key j after query i
        scores = scores.masked_fill(hidden, float("-inf"))
    return torch.softmax(scores, dim=-1)


@_kernel
def attention(op, inputs, ctx):
    """o = softmax(scale q_h k_g^T + mask) v_g per batch and query head h, kv head g = h / (heads /
    kv_heads); causal 1: query i sees keys j <= i; scale default 1/sqrt(d)."""
    q, k, v = inputs
    heads, kv_heads, d, causal, scale_ = _attn_dims(op, q)
    rep = heads // kv_heads
    qg = _split_q(q, kv_heads, rep, d)
    kg, vg = _split_kv(k, kv_heads, d), _split_kv(v, kv_heads, d)
    p = _attn_probs(qg, kg, causal, scale_)
    return [_merge_q(torch.matmul(p, vg)).to(q.dtype)]


@_kernel
def attention_grad(op, inputs, ctx):
    """(do, q, k, v[, o]) -> (dq, dk, dv) of attention, recomputing the probabilities P:
    dS = P (do v^T - rowsum(P do v^T)) (with the forward output o: rowsum(do o), as FlashAttention),
    dq = scale dS k, dk = scale dS^T q and dv = P^T do summed over the query heads of a kv head."""
    do, q, k, v = inputs[:4]
    heads, kv_heads, d, causal, scale_ = _attn_dims(op, q)
    rep = heads // kv_heads
    qg, dog = _split_q(q, kv_heads, rep, d), _split_q(do, kv_heads, rep, d)
    kg, vg = _split_kv(k, kv_heads, d), _split_kv(v, kv_heads, d)
    p = _attn_probs(qg, kg, causal, scale_)
    dp = torch.matmul(dog, vg.transpose(-1, -2))
    if len(inputs) == 5:
        rowdot = (dog * _split_q(inputs[4], kv_heads, rep, d)).sum(dim=-1, keepdim=True)
    else:
        rowdot = (dp * p).sum(dim=-1, keepdim=True)
    ds = p * (dp - rowdot)
    dq = torch.matmul(ds, kg) * scale_
    dk = (torch.matmul(ds.transpose(-1, -2), qg) * scale_).sum(dim=2)
    dv = torch.matmul(p.transpose(-1, -2), dog).sum(dim=2)
    return [_merge_q(dq).to(q.dtype), _merge_kv(dk).to(k.dtype), _merge_kv(dv).to(v.dtype)]


# ---- embedding and loss -------------------------------------------------------------------------


@_kernel
def embedding(op, inputs, ctx):
    """y[i] = table[ids[i] - row0], row0 = the first global row this rank holds of table (its dim-0
    offset); ids outside [row0, row0 + V) give a zero row."""
    table, ids = inputs
    rows, h = table.shape
    if rows == 0:
        return [torch.zeros(tuple(ids.shape) + (h,), dtype=table.dtype, device=table.device)]
    r = ids.to(torch.int64) - _offset(ctx.in_offsets, 0, 0)
    inside = (r >= 0) & (r < rows)
    y = table[r.clamp(0, rows - 1)]
    return [torch.where(inside.unsqueeze(-1), y, torch.zeros((), dtype=y.dtype, device=y.device))]


@_kernel
def embedding_grad(op, inputs, ctx):
    """dtable[v] = sum of dy[i] over ids[i] - row0 == v (row0: dtable's dim-0 offset), 0 elsewhere."""
    dy, ids = inputs
    rows, h = ctx.out_shapes[0]
    r = ids.reshape(-1).to(torch.int64) - _offset(ctx.out_offsets, 0, 0)
    r = torch.where((r >= 0) & (r < rows), r, torch.full_like(r, rows))  # outside: a discarded row
    acc = torch.zeros((rows + 1, h), dtype=_acc_dtype(dy), device=dy.device)
    acc.index_add_(0, r, _acc(dy).reshape(-1, h))
    return [acc[:rows].to(dy.dtype)]


@_kernel
def reduce_max(op, inputs, ctx):
    """m = max over the last dim (-inf for an empty row)."""
    (x,) = inputs
    if x.shape[-1] == 0:
        return [torch.full(tuple(x.shape[:-1]), float("-inf"), dtype=x.dtype, device=x.device)]
    return [x.amax(dim=-1)]


@_kernel
def sum_exp(op, inputs, ctx):
    """z = sum(exp(x - m)) over the last dim, m broadcast."""
    x, m = inputs
    e = _acc(x) - _acc(m).unsqueeze(-1)  # a new tensor: exponentiated in place
    return [e.exp_().sum(dim=-1).to(x.dtype)]


@_kernel
def gather_target(op, inputs, ctx):
    """t[i] = logits[i, labels[i] - col0] (col0: logits' last-dim offset), 0 when the label is
    outside this rank's vocab shard."""
    logits, labels = inputs
    vocab = logits.shape[-1]
    if vocab == 0:
        return [torch.zeros(tuple(labels.shape), dtype=logits.dtype, device=logits.device)]
    c = labels.to(torch.int64) - _offset(ctx.in_offsets, 0, -1)
    inside = (c >= 0) & (c < vocab)
    t = torch.gather(logits, -1, c.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1)
    return [torch.where(inside, t, torch.zeros((), dtype=t.dtype, device=t.device))]


@_kernel
def cross_entropy(op, inputs, ctx):
    """loss = sum(log z + m - target) / denominator (default: the element count of target)."""
    m, z, target = inputs
    denom = _attr(op, "denominator", target.numel())
    total = (torch.log(_acc(z)) + _acc(m) - _acc(target)).sum()
    return [(total / denom).to(m.dtype)]


@_kernel
def cross_entropy_grad(op, inputs, ctx):
    """dlogits = (exp(logits - m) / z - onehot(labels - col0)) / denominator (col0: logits' last-dim
    offset; denominator default: the element count of labels)."""
    logits, m, z, labels = inputs
    denom = _attr(op, "denominator", labels.numel())
    vocab = logits.shape[-1]
    # In place on one new tensor (no one-hot matrix): p = exp(logits - m) / z, minus 1 at each
    # row's label when this rank holds it, over the denominator.
    p = _acc(logits) - _acc(m).unsqueeze(-1)
    p.exp_().div_(_acc(z).unsqueeze(-1))
    c = (labels.to(torch.int64) - _offset(ctx.in_offsets, 0, -1)).reshape(-1, 1)
    inside = ((c >= 0) & (c < vocab)).to(p.dtype)
    if vocab:
        p.view(-1, vocab).scatter_add_(1, c.clamp(0, vocab - 1), -inside)
    return [p.div_(denom).to(logits.dtype)]


@_kernel
def adam(op, inputs, ctx):
    """One Adam step: m' = b1 m + (1-b1) g, v' = b2 v + (1-b2) g^2, param' = param - lr (m'/(1-b1^t)) /
    (sqrt(v'/(1-b2^t)) + eps) - lr wd param with t = step (1) + ctx.step; with a fifth input (the
    f32 master copy) the update reads the master and writes param' and master'."""
    param, grad, m, v = inputs[:4]
    lr, b1, b2 = _attr(op, "lr", 1e-3), _attr(op, "beta1", 0.9), _attr(op, "beta2", 0.999)
    eps, wd = _attr(op, "eps", 1e-8), _attr(op, "weight_decay", 0.0)
    t = _attr(op, "step", 1) + ctx.step
    c1, c2 = 1.0 - b1 ** t, 1.0 - b2 ** t
    master = len(inputs) == 5
    p = _acc(inputs[4] if master else param)
    g = _acc(grad)
    # The same arithmetic with few temporaries (in place on the new tensors only).
    m2 = _acc(m) * b1
    m2.add_(g, alpha=1 - b1)
    v2 = _acc(v) * b2
    v2.addcmul_(g, g, value=1 - b2)
    step = (v2 / c2).sqrt_().add_(eps)
    step = torch.div(m2, c1).div_(step).mul_(lr)
    nxt = p - step
    if wd:
        nxt.sub_(p, alpha=lr * wd)
    outs = [nxt.to(param.dtype), m2.to(m.dtype), v2.to(v.dtype)]
    if master:
        outs.append(nxt.to(inputs[4].dtype))
    return outs


# ---- data movement ------------------------------------------------------------------------------


@_kernel
def slice_(op, inputs, ctx):
    """y = x[start : start + len] along axis (len: y's size on axis)."""
    (x,) = inputs
    axis, start = _int_attr(op, "axis"), _int_attr(op, "start")
    return [x.narrow(axis, start, ctx.out_shapes[0][axis])]


@_kernel
def concat(op, inputs, ctx):
    """y = the inputs concatenated along axis, in input order."""
    return [torch.cat(list(inputs), dim=_int_attr(op, "axis"))]


@_kernel
def cast(op, inputs, ctx):
    """y = x in y's dtype: round to nearest even between floats, truncation toward zero from a float
    to an integer dtype."""
    (x,) = inputs
    dtype = ctx.out_dtypes[0] or x.dtype
    if x.is_floating_point() and not dtype.is_floating_point and dtype != torch.bool:
        x = torch.trunc(x)
    return [x.to(dtype)]


@_kernel
def identity(op, inputs, ctx):
    """y_i = x_i reinterpreted row-major in y_i's shape (a copy; no outputs for a marker)."""
    if len(inputs) != len(ctx.out_shapes):
        raise _error(op, f"identity takes as many outputs as inputs, got {len(inputs)} and {len(ctx.out_shapes)}")
    return [x.reshape(shape) for x, shape in zip(inputs, ctx.out_shapes)]


@_kernel
def transpose(op, inputs, ctx):
    """y = x with dims axis0 and axis1 swapped (a strided copy)."""
    (x,) = inputs
    return [x.transpose(_int_attr(op, "axis0"), _int_attr(op, "axis1"))]


# ---- mixture of experts -------------------------------------------------------------------------


@_kernel
def top_k(op, inputs, ctx):
    """Per row of the last dim: ids of the k largest probabilities, largest first, ties to the lower
    id, gates = those values (with normalize 1 divided by their sum); k from gates' shape."""
    (probs,) = inputs
    k = ctx.out_shapes[0][-1] if ctx.out_shapes else _int_attr(op, "k")
    # A stable descending sort keeps equal values in id order: the lower id first.
    values, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    values, ids = values[..., :k], ids[..., :k]
    if _attr(op, "normalize", 0) != 0:
        va = _acc(values)
        values = (va / va.sum(dim=-1, keepdim=True)).to(probs.dtype)
    return [values, ids.to(torch.int64)]


@_kernel
def top_k_grad(op, inputs, ctx):
    """dprobs[ids_j] += dgates_j (0 for experts not chosen); with normalize 1, S = sum_j probs[ids_j],
    g_j = probs[ids_j] / S: dprobs[ids_i] += (dgates_i - sum_j dgates_j g_j) / S."""
    dgates, ids, probs = inputs
    ids = ids.to(torch.int64)
    _check_ids(op, ids, probs.shape[-1], "expert id")
    dg = _acc(dgates)
    if _attr(op, "normalize", 0) != 0:
        p = torch.gather(_acc(probs), -1, ids)
        total = p.sum(dim=-1, keepdim=True)
        dot = (dg * p / total).sum(dim=-1, keepdim=True)
        dg = (dg - dot) / total
    out = torch.zeros(probs.shape, dtype=dg.dtype, device=probs.device)
    out.scatter_add_(-1, ids, dg)
    return [out.to(probs.dtype)]


def _moe_slots(op, ids, experts, groups, capacity):
    """Per (group, token, choice) in row-major order, the row e*G*C + g*C + c of the expert buffers
    it takes (slots handed out per group in token order, then choice order, up to C per expert),
    or E*G*C (one past the end) when dropped: a flat int64 tensor."""
    ids = ids.to(torch.int64)
    _check_ids(op, ids, experts, "expert id")
    if ids.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=ids.device)
    e = ids.reshape(groups, -1)  # [G, n*k], the pairs of a group in token then choice order
    n = e.numel()
    dev = ids.device
    key = (torch.arange(groups, device=dev).unsqueeze(1) * experts + e).reshape(-1)
    # The rank of a pair among the earlier pairs of its (group, expert): a stable sort by key
    # keeps pairs of one key in order, so the rank is the position minus the key's first position.
    sorted_key, order = torch.sort(key, stable=True)
    rank_sorted = torch.arange(n, device=dev) - torch.searchsorted(sorted_key, sorted_key)
    rank = torch.empty_like(rank_sorted)
    rank[order] = rank_sorted
    g = torch.arange(groups, device=dev).repeat_interleave(e.shape[1])
    flat_e = e.reshape(-1)
    row = flat_e * (groups * capacity) + g * capacity + rank
    return torch.where(rank < capacity, row, torch.full_like(row, experts * groups * capacity))


def _moe_sizes(x_shape, ids, buf_shape):
    """(G, n, h, k, E, C) from tokens [G, n, h], ids [G, n, k] and buffers [E, G*C, h]."""
    groups, tokens, h = (int(d) for d in x_shape)
    k = int(ids.shape[2])
    experts = int(buf_shape[0])
    capacity = int(buf_shape[1]) // groups if groups else 0
    return groups, tokens, h, k, experts, capacity


def _with_zero_row(rows):
    """[N, h] -> [N + 1, h] with a zero last row (what a dropped choice reads)."""
    return torch.cat([rows, torch.zeros((1, rows.shape[1]), dtype=rows.dtype, device=rows.device)])


@_kernel
def moe_dispatch(op, inputs, ctx):
    """buffers [E, G*C, h]: each kept (token, choice) pair (g, i, j) copies x[g, i] into slot g*C + c
    of expert ids[g, i, j]; dropped pairs and unused slots are 0."""
    x, ids = inputs
    out_shape = ctx.out_shapes[0]
    groups, tokens, h, k, experts, capacity = _moe_sizes(x.shape, ids, out_shape)
    rows = _moe_slots(op, ids, experts, groups, capacity)
    src = x.reshape(groups * tokens, h).repeat_interleave(k, dim=0)
    buf = torch.zeros((experts * groups * capacity + 1, h), dtype=x.dtype, device=x.device)
    buf.index_copy_(0, rows, src)
    return [buf[:-1].reshape(out_shape)]


@_kernel
def moe_dispatch_grad(op, inputs, ctx):
    """dx[g, i] = the sum of dbuffers[e, slot] over the kept choices of token (g, i)."""
    dbuf, ids = inputs
    out_shape = ctx.out_shapes[0]
    groups, tokens, h, k, experts, capacity = _moe_sizes(out_shape, ids, dbuf.shape)
    rows = _moe_slots(op, ids, experts, groups, capacity)
    table = _with_zero_row(_acc(dbuf).reshape(-1, h))
    dx = table[rows].reshape(groups, tokens, k, h).sum(dim=2)
    return [dx.to(dbuf.dtype)]


@_kernel
def moe_combine(op, inputs, ctx):
    """out[g, i] = sum_j gates[g, i, j] * y[e_j, slot_j] over the kept choices of token (g, i)."""
    y, ids, gates = inputs
    out_shape = ctx.out_shapes[0]
    groups, tokens, h, k, experts, capacity = _moe_sizes(out_shape, ids, y.shape)
    rows = _moe_slots(op, ids, experts, groups, capacity)
    table = _with_zero_row(_acc(y).reshape(-1, h))
    picked = table[rows].reshape(groups, tokens, k, h)
    out = (picked * _acc(gates).unsqueeze(-1)).sum(dim=2)
    return [out.to(y.dtype)]


@_kernel
def moe_combine_grad(op, inputs, ctx):
    """dy[e, slot] = gates[g, i, j] * dout[g, i] for the kept choice in that slot (unused slots 0);
    dgates[g, i, j] = dot(dout[g, i], y[e, slot]), 0 when dropped."""
    dout, y, ids, gates = inputs
    groups, tokens, h, k, experts, capacity = _moe_sizes(dout.shape, ids, y.shape)
    rows = _moe_slots(op, ids, experts, groups, capacity)
    d = _acc(dout).reshape(groups * tokens, h).repeat_interleave(k, dim=0)  # [G*n*k, h]
    ga = _acc(gates).reshape(-1, 1)
    dy = torch.zeros((experts * groups * capacity + 1, h), dtype=d.dtype, device=d.device)
    dy.index_copy_(0, rows, ga * d)
    table = _with_zero_row(_acc(y).reshape(-1, h))
    dgates = (d * table[rows]).sum(dim=-1)
    return [dy[:-1].reshape(y.shape).to(y.dtype), dgates.reshape(gates.shape).to(gates.dtype)]


# ---- convolution, pooling, batch norm (NCHW) ----------------------------------------------------


@_kernel
def conv2d(op, inputs, ctx):
    """y[n, k, p, q] = sum_{c, i, j} x[n, c, p stride - padding + i, q stride - padding + j] w[k, c, i, j]
    (zero outside x; stride 1, padding 0)."""
    x, w = inputs
    stride, padding = _int_attr(op, "stride", 1), _int_attr(op, "padding", 0)
    return [F.conv2d(x, w, stride=stride, padding=padding)]


@_kernel
def conv2d_grad(op, inputs, ctx):
    """(dy, x, w) -> (dx, dw): the gradients of conv2d with the same stride and padding."""
    dy, x, w = inputs
    stride, padding = _int_attr(op, "stride", 1), _int_attr(op, "padding", 0)
    dx = torch.nn.grad.conv2d_input(tuple(x.shape), w, dy, stride=stride, padding=padding)
    dw = torch.nn.grad.conv2d_weight(x, tuple(w.shape), dy, stride=stride, padding=padding)
    return [dx, dw]


def _pool_dims(op):
    """(kernel, stride, padding) of a pooling op: stride defaults to kernel, padding to 0."""
    kernel = _int_attr(op, "kernel")
    return kernel, _int_attr(op, "stride", kernel), _int_attr(op, "padding", 0)


@_kernel
def max_pool2d(op, inputs, ctx):
    """y[n, c, p, q] = the maximum of the kernel x kernel window at (p stride - padding,
    q stride - padding) of x (padding never wins)."""
    (x,) = inputs
    kernel, stride, padding = _pool_dims(op)
    return [F.max_pool2d(x, kernel, stride=stride, padding=padding)]


@_kernel
def max_pool2d_grad(op, inputs, ctx):
    """dx: each dy[n, c, p, q] added at its window's first maximum of x (row-major in the window;
    padding never wins), summed where windows overlap."""
    dy, x = inputs
    kernel, stride, padding = _pool_dims(op)
    n, c, h, w = x.shape
    p, q = dy.shape[2], dy.shape[3]
    xa = x.reshape(n * c, 1, h, w)
    if padding:
        xa = F.pad(xa, (padding, padding, padding, padding), value=float("-inf"))
    windows = F.unfold(xa, kernel, stride=stride)  # [N*C, kernel*kernel, P*Q], taps row-major
    tap = windows.argmax(dim=1)  # the first maximum of each window
    top = (torch.arange(p, device=x.device) * stride - padding).repeat_interleave(q)
    left = (torch.arange(q, device=x.device) * stride - padding).repeat(p)
    at = (top + torch.div(tap, kernel, rounding_mode="floor")) * w + left + tap % kernel
    dx = torch.zeros((n * c, h * w), dtype=_acc_dtype(dy), device=dy.device)
    dx.scatter_add_(1, at, _acc(dy).reshape(n * c, p * q))
    return [dx.reshape(x.shape).to(dy.dtype)]


def _channels(x):
    """x [N, C, ...] viewed as [N, C, inner]."""
    return x.reshape(x.shape[0], x.shape[1], _numel(x.shape[2:]))


@_kernel
def batch_norm(op, inputs, ctx):
    """(x, gamma, beta[, sum, sqdev]) -> (y, mean, invstd): per channel (dim 1) over every other dim,
    mean and invstd = 1 / sqrt(biased var + eps) (eps 1e-5), y = (x - mean) invstd gamma + beta;
    synchronised (with sum, sqdev [1, C]): mean = sum / count, var = max(0, sqdev / count)."""
    x, gamma, beta = inputs[:3]
    eps = _attr(op, "eps", 1e-5)
    xa = _channels(_acc(x))
    if len(inputs) == 5:
        count = _attr(op, "count", 1)
        mean = _acc(inputs[3]).reshape(-1) / count
        var = torch.clamp(_acc(inputs[4]).reshape(-1) / count, min=0.0)
    else:
        count = xa.shape[0] * xa.shape[2]
        mean = xa.sum(dim=(0, 2)) / max(count, 1)
        var = ((xa - mean.reshape(1, -1, 1)) ** 2).sum(dim=(0, 2)) / max(count, 1)
    invstd = torch.rsqrt(var + eps)
    y = (xa - mean.reshape(1, -1, 1)) * (invstd * _acc(gamma)).reshape(1, -1, 1) + _acc(beta).reshape(1, -1, 1)
    return [y.reshape(x.shape).to(x.dtype), mean.to(x.dtype), invstd.to(x.dtype)]


@_kernel
def batch_norm_grad(op, inputs, ctx):
    """(dy, x, gamma, mean, invstd[, gsums]) -> (dx, dgamma, dbeta): xhat = (x - mean) invstd,
    dbeta = sum dy, dgamma = sum dy xhat (synchronised: gsums[0], gsums[1]),
    dx = gamma invstd (dy - (dbeta + xhat dgamma) / count), count = N * spatial or the count attr."""
    dy, x, gamma, mean, invstd = inputs[:5]
    da, xa = _channels(_acc(dy)), _channels(_acc(x))
    mean_, inv = _acc(mean).reshape(1, -1, 1), _acc(invstd).reshape(1, -1, 1)
    xhat = (xa - mean_) * inv
    if len(inputs) == 6:
        count = _attr(op, "count", 1)
        gs = _acc(inputs[5]).reshape(2, -1)
        dbeta, dgamma = gs[0], gs[1]
    else:
        count = xa.shape[0] * xa.shape[2]
        dbeta = da.sum(dim=(0, 2))
        dgamma = (da * xhat).sum(dim=(0, 2))
    dx = (_acc(gamma).reshape(1, -1, 1) * inv) * (
        da - (dbeta.reshape(1, -1, 1) + xhat * dgamma.reshape(1, -1, 1)) / max(count, 1))
    return [dx.reshape(x.shape).to(dy.dtype), dgamma.to(gamma.dtype), dbeta.to(gamma.dtype)]


@_kernel
def batch_norm_stats(op, inputs, ctx):
    """(x) -> s [1, C] = per channel sum x over this rank's part; (x, sum) -> s = sum (x - sum /
    count)^2, the squared deviations from the global mean."""
    x = inputs[0]
    xa = _channels(_acc(x))
    if len(inputs) == 2:
        mean = _acc(inputs[1]).reshape(1, -1, 1) / _attr(op, "count", 1)
        s = ((xa - mean) ** 2).sum(dim=(0, 2))
    else:
        s = xa.sum(dim=(0, 2))
    return [s.reshape(1, -1).to(x.dtype)]


@_kernel
def batch_norm_grad_stats(op, inputs, ctx):
    """(dy, x, mean, invstd) -> gsums [2, C]: per channel sum dy and sum dy (x - mean) invstd."""
    dy, x, mean, invstd = inputs
    da, xa = _channels(_acc(dy)), _channels(_acc(x))
    xhat = (xa - _acc(mean).reshape(1, -1, 1)) * _acc(invstd).reshape(1, -1, 1)
    return [torch.stack([da.sum(dim=(0, 2)), (da * xhat).sum(dim=(0, 2))]).to(dy.dtype)]


# ---- the table ----------------------------------------------------------------------------------

#: The kernel of every compute type, keyed by its IR spelling, in the op registry's order
#: (include/concerto/ir/ir.h, enum ComputeType).
KERNELS = {
    "matmul": matmul,
    "add": add,
    "mul": mul,
    "scale": scale,
    "gelu": gelu,
    "gelu_grad": gelu_grad,
    "silu": silu,
    "silu_grad": silu_grad,
    "swiglu": swiglu,
    "swiglu_grad": swiglu_grad,
    "layer_norm": layer_norm,
    "layer_norm_grad": layer_norm_grad,
    "rms_norm": rms_norm,
    "rms_norm_grad": rms_norm_grad,
    "softmax": softmax,
    "softmax_grad": softmax_grad,
    "attention": attention,
    "attention_grad": attention_grad,
    "embedding": embedding,
    "embedding_grad": embedding_grad,
    "reduce_max": reduce_max,
    "sum_exp": sum_exp,
    "gather_target": gather_target,
    "cross_entropy": cross_entropy,
    "cross_entropy_grad": cross_entropy_grad,
    "adam": adam,
    "slice": slice_,
    "concat": concat,
    "cast": cast,
    "identity": identity,
    "top_k": top_k,
    "top_k_grad": top_k_grad,
    "moe_dispatch": moe_dispatch,
    "moe_dispatch_grad": moe_dispatch_grad,
    "moe_combine": moe_combine,
    "moe_combine_grad": moe_combine_grad,
    "transpose": transpose,
    "relu": relu,
    "relu_grad": relu_grad,
    "conv2d": conv2d,
    "conv2d_grad": conv2d_grad,
    "max_pool2d": max_pool2d,
    "max_pool2d_grad": max_pool2d_grad,
    "batch_norm": batch_norm,
    "batch_norm_grad": batch_norm_grad,
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_grad_stats": batch_norm_grad_stats,
}


def run_kernel(op, inputs, ctx):
    """The outputs of compute op `op` (its IR dict) on `inputs`: KERNELS[op["type"]](op, inputs, ctx),
    each contiguous with ctx.out_shapes[i] and ctx.out_dtypes[i]. Raises concerto.Error
    "op N 'name': <type>: ..." for a type without a kernel."""
    kernel = KERNELS.get(op.get("type"))
    if kernel is None:
        raise _error(op, "no torch kernel for this compute type")
    return kernel(op, list(inputs), ctx)
