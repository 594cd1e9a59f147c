#!/usr/bin/env python3
"""Fuzzes ``concerto.torch.capture`` with small generated modules (issue 44; docs/fuzzing.md).

Each module is a random sequence of layers over a [batch, seq, width] activation, drawn from
what capture maps (linear, norms, activations, residuals, scalar arithmetic, views, attention
through matmuls, softmax and masked_fill or through scaled_dot_product_attention, concat,
reductions, buffers, dropout at p=0) and, with some probability, one of a few ops it does not map (cumsum,
sort, flip, exp, abs, sin, clamp, sigmoid, tanh, log_softmax, roll, max), then a linear head and
cross entropy. For every module:

- capture either succeeds or raises ``concerto.Error`` with one line that names the ATen node
  (``node 'x' (aten.x...)``): any other exception, or a message that names no node, is a finding;
- a module whose ops are all mapped must capture;
- a capture that succeeds runs one step on the CPU runtime, and its loss, gradients and updated
  parameters must match torch's autograd and torch.optim.Adam within float32 tolerance.

    python3 scripts/fuzz_capture.py [--seed 0] [--count 200] [--json]

Prints one line per finding and a summary (``--json``: one object); exit 1 on any finding.
Needs torch (the venv of scripts/setup_torch.sh) and the built module on PYTHONPATH
(build/python).
"""
import argparse
import json
import math
import random
import re
import sys
import time
import traceback

import torch

import concerto
import concerto.torch as ct

# Ops capture has no mapping for (the module then must fail with a node-naming error, or, if
# some torch version decomposes one into mapped ops, match torch numerically).
UNMAPPED = {
    "cumsum": lambda h: torch.cumsum(h, dim=-1),
    "sort": lambda h: torch.sort(h, dim=-1).values,
    "flip": lambda h: torch.flip(h, dims=[-1]),
    "exp": torch.exp,
    "abs": torch.abs,
    "sin": torch.sin,
    "clamp": lambda h: torch.clamp(h, -0.5, 0.5),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "log_softmax": lambda h: torch.log_softmax(h, dim=-1),
    "roll": lambda h: torch.roll(h, 1, dims=-1),
    "max": lambda h: torch.max(h, dim=-1, keepdim=True).values + h,
}


class Layer(torch.nn.Module):
    """One generated step: `kind` with its own parameters; [B, S, w_in] -> [B, S, w_out]."""

    def __init__(self, kind, w_in, rng):
        super().__init__()
        self.kind, self.w_in, self.w_out = kind, w_in, w_in
        if kind in ("linear", "linear_nobias"):
            self.w_out = rng.randint(2, 8)
            self.fc = torch.nn.Linear(w_in, self.w_out, bias=kind == "linear")
        elif kind == "residual":
            self.fc = torch.nn.Linear(w_in, w_in)
        elif kind == "layernorm":
            self.norm = torch.nn.LayerNorm(w_in)
        elif kind in ("attention", "sdpa"):
            self.heads = 2 if w_in % 2 == 0 else 1
            self.q, self.k, self.v = (torch.nn.Linear(w_in, w_in, bias=False) for _ in range(3))
            self.causal = rng.random() < 0.5
        elif kind == "buffer_add":
            self.register_buffer("offset", torch.randn(w_in))
        elif kind == "dropout0":
            self.drop = torch.nn.Dropout(0.0)
        elif kind == "concat":
            self.w_out = 2 * w_in
        elif kind == "swiglu":
            self.gate, self.up = torch.nn.Linear(w_in, 4, bias=False), torch.nn.Linear(w_in, 4, bias=False)
            self.down = torch.nn.Linear(4, w_in, bias=False)
        self.scalar = round(rng.uniform(0.5, 2.0), 3)

    def forward(self, h):
        k = self.kind
        if k in ("linear", "linear_nobias", "residual_inner"):
            return self.fc(h)
        if k == "residual":
            return h + self.fc(h)
        if k == "layernorm":
            return self.norm(h)
        if k == "relu":
            return torch.relu(h)
        if k == "gelu":
            return torch.nn.functional.gelu(h)
        if k == "gelu_tanh":
            return torch.nn.functional.gelu(h, approximate="tanh")
        if k == "silu":
            return torch.nn.functional.silu(h)
        if k == "softmax":
            return torch.softmax(h, dim=-1)
        if k == "scale":
            return h * self.scalar
        if k == "shift":
            return h + self.scalar
        if k == "divide":
            return h / self.scalar
        if k == "negate":
            return -h
        if k == "square":
            return h.pow(2)
        if k == "rsub":
            return 1.0 - h
        if k == "transpose_back":
            return h.transpose(1, 2).contiguous().transpose(1, 2)
        if k == "reshape_back":
            b, s, w = h.shape
            return h.reshape(b, s * w).reshape(b, s, w)
        if k == "mean_center":
            return h - h.mean(dim=-1, keepdim=True)
        if k == "dropout0":
            return self.drop(h)
        if k == "buffer_add":
            return h + self.offset * 2.0
        if k == "concat":
            return torch.cat([h, h * 0.5], dim=-1)
        if k == "swiglu":
            return self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))
        if k in ("attention", "sdpa"):
            b, s, w = h.shape
            split = lambda t: t.view(b, s, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
            q, kk, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
            if k == "sdpa":
                o = torch.nn.functional.scaled_dot_product_attention(q, kk, v, is_causal=self.causal)
            else:
                scores = q @ kk.transpose(-2, -1) / math.sqrt(w // self.heads)
                if self.causal:
                    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
                    scores = scores.masked_fill(mask, float("-inf"))
                o = torch.softmax(scores, dim=-1) @ v
            return h + o.transpose(1, 2).reshape(b, s, w)
        return UNMAPPED[k](h)


MAPPED = ["linear", "linear_nobias", "residual", "layernorm", "relu", "gelu", "gelu_tanh", "silu", "softmax",
          "scale", "shift", "divide", "negate", "square", "rsub", "transpose_back", "reshape_back",
          "mean_center", "dropout0", "buffer_add", "concat", "swiglu", "attention", "sdpa"]


class Generated(torch.nn.Module):
    def __init__(self, kinds, width, classes, rng, embed_vocab=0):
        super().__init__()
        self.kinds = kinds
        self.embed = torch.nn.Embedding(embed_vocab, width) if embed_vocab else None
        layers, w = [], width
        for kind in kinds:
            layer = Layer(kind, w, rng)
            layers.append(layer)
            w = layer.w_out
        self.layers = torch.nn.ModuleList(layers)
        self.head = torch.nn.Linear(w, classes)

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def make_case(rng):
    """A module, its inputs and labels, and whether it holds an op capture does not map."""
    batch, seq, width, classes = rng.randint(1, 3), rng.randint(1, 5), rng.choice([2, 4, 6, 8]), rng.randint(2, 6)
    kinds = [rng.choice(MAPPED) for _ in range(rng.randint(1, 5))]
    unmapped = rng.random() < 0.3
    if unmapped:
        kinds.insert(rng.randint(0, len(kinds)), rng.choice(sorted(UNMAPPED)))
    embed_vocab = rng.choice([0, 0, 11])
    seed = rng.randrange(2 ** 31)
    torch.manual_seed(seed)
    module = Generated(kinds, width, classes, rng, embed_vocab)
    x = torch.randint(0, embed_vocab, (batch, seq)) if embed_vocab else torch.randn(batch, seq, width)
    labels = torch.randint(0, classes, (batch, seq))
    return module, (x,), labels, unmapped


def torch_step(module, inputs, labels, lr):
    """Loss, gradients and Adam-updated parameters of one step in torch."""
    import copy
    m = copy.deepcopy(module)
    opt = torch.optim.Adam(m.parameters(), lr=lr)
    out = m(*inputs)
    loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), labels.flatten())
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    opt.step()
    return float(loss.detach()), grads, {n: p.detach().clone() for n, p in m.named_parameters()}


NODE = re.compile(r"node '[^']+' \(aten\.")


def check_case(module, inputs, labels, unmapped, lr=1e-2):
    """(outcome, finding): outcome "captured" or "refused" (capture raised concerto.Error), finding
    None when the module passes, else what went wrong (one line)."""
    try:
        cap = ct.capture(module, inputs, labels, lr=lr)
    except concerto.Error as e:
        msg = str(e)
        if "\n" in msg:
            return "refused", "error message spans lines: %r" % msg[:200]
        if not unmapped:
            return "refused", "every op is mapped but capture failed: %s" % msg
        if not NODE.search(msg):
            return "refused", "error names no ATen node: %s" % msg
        return "refused", None
    except Exception:  # noqa: BLE001 - any other exception is the finding
        return "refused", "capture raised %s" % traceback.format_exc().strip().splitlines()[-1]
    try:
        got = cap.run(module, inputs, labels)
    except concerto.Error as e:
        return "captured", "captured, but the step failed: %s" % str(e).splitlines()[0]
    except Exception:  # noqa: BLE001
        return "captured", "run raised %s" % traceback.format_exc().strip().splitlines()[-1]
    loss, grads, updated = torch_step(module, inputs, labels, lr)
    if not math.isclose(got["loss"], loss, rel_tol=1e-4, abs_tol=1e-5):
        return "captured", "loss %.6g, torch %.6g" % (got["loss"], loss)
    for name, g in grads.items():
        if name not in got["grads"]:
            return "captured", "no gradient for %s" % name
        err = (got["grads"][name] - g).abs().max().item()
        if err > 1e-4 * max(1.0, g.abs().max().item()):
            return "captured", "gradient of %s off by %.3g" % (name, err)
    # Adam's first step moves each element by lr g / (|g| + eps): where |g| is near eps the
    # step is ill-conditioned (float32 noise in g of 1e-9 decides it), so those elements are
    # compared by their gradients above only.
    for name, p in updated.items():
        if name in got["updated"] and name in grads:
            settled = grads[name].abs() > 1e3 * 1e-8
            err = ((got["updated"][name] - p).abs() * settled).max().item()
            if err > 1e-5 + 1e-3 * lr:
                return "captured", "updated %s off by %.3g" % (name, err)
    return "captured", None


def fuzz(seed, count, progress=None):
    """Runs `count` generated modules from `seed`; returns the summary (findings included)."""
    rng = random.Random(seed)
    stats = {"seed": seed, "modules": 0, "captured": 0, "refused": 0, "with_unmapped_op": 0, "findings": []}
    t0 = time.time()
    for i in range(count):
        module, inputs, labels, unmapped = make_case(rng)
        stats["modules"] += 1
        stats["with_unmapped_op"] += int(unmapped)
        outcome, finding = check_case(module, inputs, labels, unmapped)
        stats[outcome] += 1
        if finding:
            stats["findings"].append({"module": i, "layers": module.kinds, "finding": finding})
        if progress and (i + 1) % 25 == 0:
            progress("fuzz_capture: %d/%d modules, %d findings (%.0f s)" % (i + 1, count, len(stats["findings"]),
                                                                          time.time() - t0))
    return stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the generator's seed (default 0)")
    ap.add_argument("--count", type=int, default=200, help="modules to generate (default 200)")
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    a = ap.parse_args(argv)
    if a.count < 1:
        ap.error("--count must be at least 1")
    stats = fuzz(a.seed, a.count, progress=lambda s: print(s, file=sys.stderr))
    if a.json:
        print(json.dumps(stats))
    else:
        for f in stats["findings"]:
            print("FINDING module %d %s: %s" % (f["module"], f["layers"], f["finding"]))
        print("%d modules (%d with an unmapped op), %d findings" % (stats["modules"], stats["with_unmapped_op"],
                                                                  len(stats["findings"])))
    return 1 if stats["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
