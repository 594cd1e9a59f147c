"""The PyTorch bridge (concerto.torch, docs/python.md "PyTorch models"): a captured step run on
the CPU runtime equals torch's own autograd and torch.optim.Adam; unsupported ops fail naming
the node and its source line; the captured full-size models' flops equal a hand count.

Runs only where python3-torch and python3-torchvision are installed (scripts/setup.sh installs
them; CMake adds this test when they import)."""
import collections
import copy
import math
import os
import tempfile
import unittest

import torch
import torchvision

import concerto
import concerto.torch as ct

LR = 1e-3


class TinyGpt(torch.nn.Module):
    """A plain-PyTorch GPT block: token embedding + learned positions, causal attention (an
    additive mask buffer), a GELU MLP, a final norm and the vocabulary head."""

    def __init__(self, vocab=50, seq=8, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.1)
        self.ln1, self.ln2, self.lnf = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), -1e4), 1))

    def forward(self, ids):
        b, s = ids.shape
        x = self.tok(ids) + self.pos
        h = self.ln1(x)
        q, k, v = self.qkv(h).split(h.shape[-1], dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + self.mask
        o = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.proj(o)
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(self.lnf(x))


def tiny_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                hidden_dim=16, mlp_dim=32, num_classes=10)


def reduced_wide_resnet():
    """wide_resnet50_2's blocks (Bottleneck, width 2x), one per stage, for 64x64 images."""
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=128)


class SmoothCnn(torch.nn.Module):
    """conv -> batch norm -> GELU twice (the second strided), a global mean, a linear head."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.bn1(self.conv1(x)))
        x = torch.nn.functional.gelu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def vit_preset_view(name, tensors, d):
    """`tensors` (torchvision VisionTransformer names: its parameters or their gradients) laid out as
    the C++ ViT frontend's parameter `name`: Linear weights transposed (the frontend's are [in,
    out]), q, k and v the thirds of in_proj, the class token and positions without their leading 1."""
    fixed = {"patch.w": "conv_proj.weight", "patch.b": "conv_proj.bias", "cls": "class_token",
             "pos": "encoder.pos_embedding", "ln_f.gamma": "encoder.ln.weight", "ln_f.beta": "encoder.ln.bias",
             "head.w": "heads.head.weight", "head.b": "heads.head.bias"}
    if name in fixed:
        t = tensors[fixed[name]]
        return t.t() if name == "head.w" else t.reshape(-1, d) if name in ("cls", "pos") else t
    layer, rest = name.split(".", 1)
    pre = "encoder.layers.encoder_layer_%d." % int(layer[1:])
    for third, key in enumerate(("attn.q", "attn.k", "attn.v")):
        if rest.startswith(key + "."):
            t = tensors[pre + "self_attention.in_proj_" + ("weight" if rest.endswith(".w") else "bias")]
            t = t[third * d:(third + 1) * d]
            return t.t() if rest.endswith(".w") else t
    table = {"ln1.gamma": "ln_1.weight", "ln1.beta": "ln_1.bias", "ln2.gamma": "ln_2.weight", "ln2.beta": "ln_2.bias",
             "attn.o.w": "self_attention.out_proj.weight", "attn.o.b": "self_attention.out_proj.bias",
             "mlp.fc1.w": "mlp.0.weight", "mlp.fc1.b": "mlp.0.bias", "mlp.fc2.w": "mlp.3.weight",
             "mlp.fc2.b": "mlp.3.bias"}
    t = tensors[pre + table[rest]]
    return t.t() if rest.endswith(".w") else t


def randomize(module, seed):
    """Weights away from torch's init (the ViT's zero head would hide its gradients)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            spread = p.std().item() if p.numel() > 1 and p.std().item() > 0 else 0.1
            p.add_((torch.rand(p.shape, generator=g) - 0.5) * spread)


def torch_step(module, xs, labels, chunks=1):
    """Loss, gradients and Adam-updated parameters of one step in torch, computed in float64 on a
    copy of `module` (returned as float32): torch's own fp32 kernels round differently from each
    other (its mkldnn convolution and batch norm gradients of the wide ResNet are 2e-3 off their
    float64 values where the runtime, which accumulates in double, is 4e-7 off), so the reference
    is the exact step and the runtime is held to fp32 tolerances of it. With chunks > 1 the batch
    is split as DDP splits it over ranks (each chunk its own forward, batch norm statistics
    included; the gradients averaged)."""
    module = copy.deepcopy(module).double()
    xs = [x.double() if x.is_floating_point() else x for x in xs]
    module.zero_grad()
    losses = []
    for i in range(chunks):
        part = [x.chunk(chunks)[i] for x in xs]
        out = module(*part)
        loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), labels.chunk(chunks)[i].flatten()) / chunks
        loss.backward()
        losses.append(loss.item())
    grads = {n: p.grad.float() for n, p in module.named_parameters()}
    torch.optim.Adam(module.parameters(), lr=LR).step()
    updated = {n: p.detach().float() for n, p in module.named_parameters()}
    return sum(losses), grads, updated


class NumericsTest(unittest.TestCase):
    """One step on the CPU runtime against torch: loss, every gradient, every updated parameter."""

    def check(self, make, xs, labels, plan=None, chunks=1, seed=0, sync_bn=False):
        torch.manual_seed(seed)
        module = make()
        randomize(module, seed)
        cap = ct.capture(module, xs, labels, lr=LR, sync_bn=sync_bn)
        program = cap.partition(plan=plan) if plan else None
        got = cap.run(module, xs, labels, program=program)
        loss, grads, updated = torch_step(module, xs, labels, chunks)
        self.assertAlmostEqual(got["loss"], loss, delta=1e-5 * max(1.0, abs(loss)))
        self.assertEqual(sorted(got["grads"]), sorted(n for n, _ in module.named_parameters()))
        for name, want in grads.items():
            scale = want.abs().max().item()
            err = (got["grads"][name] - want).abs().max().item()
            self.assertLessEqual(err, 1e-4 * scale + 1e-7, "gradient of %s (%s): max error %g, max |g| %g"
                                 % (name, plan, err, scale))
            # Adam's first step moves each element by about lr * sign(g): where |g| is within
            # fp32 noise of 0 (below 1e-3 of the tensor's largest) the sign is noise and the two
            # updates may differ by up to 2 lr; everywhere else they must agree.
            delta = (got["updated"][name] - updated[name]).abs()
            resolved = want.abs() > 1e-3 * scale
            if resolved.any():
                self.assertLessEqual(delta[resolved].max().item(), 1e-6 + 1e-3 * LR, "update of %s (%s)" % (name, plan))
            self.assertLessEqual(delta.max().item(), 2 * LR + 1e-6, "update of %s (%s)" % (name, plan))
        return program

    def test_vit(self):
        torch.manual_seed(7)
        x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        self.check(tiny_vit, (x,), y)
        p = self.check(tiny_vit, (x,), y, plan="dp=2")
        kinds = collections.Counter(op.get("collective") for op in p.to_dict()["graphs"][0]["ops"])
        self.assertEqual(p.num_ranks, 2)
        self.assertEqual(kinds["all_reduce"], 32)  # one per parameter
        p = self.check(tiny_vit, (x,), y, plan="dp=2,zero=3")
        kinds = collections.Counter(op.get("collective") for op in p.to_dict()["graphs"][0]["ops"])
        self.assertGreater(kinds["reduce_scatter"], 0)
        self.assertGreater(kinds["all_gather"], kinds["reduce_scatter"])  # gathered for forward and backward

    def test_vit_tensor_parallel_through_the_partitioner(self):
        # Megatron's split of the MLP (fc1 by rows, fc2 by columns) as a sharding file.
        x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        tp = {"mesh": {"tp": 2}, "default": "replicated", "tensors": {
            "encoder.layers.*.mlp.0.weight": [["tp"], []], "encoder.layers.*.mlp.0.bias": [["tp"]],
            "encoder.layers.*.mlp.3.weight": [[], ["tp"]]}}
        torch.manual_seed(0)
        module = tiny_vit()
        randomize(module, 0)
        cap = ct.capture(module, (x,), y, lr=LR)
        program = cap.partition(sharding=tp)
        got = cap.run(module, (x,), y, program=program)
        loss, grads, _ = torch_step(module, (x,), y)
        self.assertAlmostEqual(got["loss"], loss, delta=1e-5 * max(1.0, loss))
        for name, want in grads.items():
            self.assertLessEqual((got["grads"][name] - want).abs().max().item(), 1e-4 * want.abs().max().item() + 1e-7, name)
        local = {t["name"]: t["shape"] for t in program.to_dict()["graphs"][0]["tensors"]}
        self.assertEqual(local["encoder.layers.encoder_layer_0.mlp.0.weight"], [16, 16])  # 32 rows / 2

    def test_wide_resnet(self):
        # 4 images per rank under dp=2: with fewer, layer4's batch norm (2x2 maps) normalises over
        # so few values that fp32 rounding is amplified past the tolerance.
        torch.manual_seed(7)
        x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
        self.check(reduced_wide_resnet, (x,), y)
        # Under DDP each rank's batch norm sees its own half of the batch.
        self.check(reduced_wide_resnet, (x,), y, plan="dp=2", chunks=2)
        self.check(reduced_wide_resnet, (x,), y, plan="dp=2,zero=3", chunks=2)
        # SyncBatchNorm on the wide ResNet: the structure (numerics: test_sync_batch_norm). Per batch
        # norm: the sum and the squared deviations all-reduced in the forward, the gradient's two sums
        # in the backward.
        torch.manual_seed(0)
        module = reduced_wide_resnet()
        cap = ct.capture(module, (x,), y, lr=LR, sync_bn=True)
        ops = cap.partition(plan="dp=2").to_dict()["graphs"][0]["ops"]
        sums = [op for op in ops if op.get("collective") == "all_reduce" and op["tags"]["purpose"] == "activation"]
        self.assertEqual(len(sums), 3 * sum(op.get("type") == "batch_norm" for op in ops))

    def test_vit_preset_tensor_parallel_against_torch(self):
        # The C++ ViT frontend (src/lower/vision.cc, from a spec file of the tiny ViT's sizes) under
        # Megatron's full split (q/k/v and fc1 by columns, the heads with them; out-projection and
        # fc2 by rows), loaded with the weights of torchvision's VisionTransformer: one step on the
        # runtime against torch's float64 step. (A captured torchvision ViT splits only its MLP
        # through the partitioner: nn.MultiheadAttention folds the batch into the heads.)
        torch.manual_seed(0)
        module = tiny_vit()
        randomize(module, 0)
        params = {n: p.detach() for n, p in module.named_parameters()}
        d, layers = 16, 2
        with tempfile.TemporaryDirectory() as tmp:
            spec = os.path.join(tmp, "vit-tiny.yaml")
            with open(spec, "w") as f:
                f.write("family: vit\nimage: 32\npatch: 8\nlayers: %d\nhidden: %d\nheads: 2\nmlp: 32\n"
                        "classes: 10\nbatch: 2\ndtype: f32\n" % (layers, d))
            for plan, images in (("dp=1", 2), ("tp=2", 2), ("dp=2,tp=2", 4)):
                torch.manual_seed(3)
                x, y = torch.randn(images, 3, 32, 32), torch.randint(0, 10, (images,))
                program = concerto.lower(spec, plan)
                adam = {op["inputs"][0]: op["inputs"][1] for g in program.to_dict()["graphs"] for op in g["ops"]
                        if op.get("type") == "adam"}
                self.assertEqual(len(adam), 4 + 16 * layers + 4)  # every parameter (16 per layer)
                values = {p: vit_preset_view(p, params, d).float().flatten().tolist() for p in adam}
                values["images"] = x.flatten().tolist()
                values["labels"] = [float(v) for v in y.tolist()]
                r = concerto.execute(program, inputs=values, fetch=list(adam.values()))
                loss, grads, _ = torch_step(module, (x,), y)
                self.assertAlmostEqual(r["loss"], loss, delta=1e-5 * max(1.0, loss), msg=plan)
                if "tp=2" in plan:  # the heads split: q's columns and fc2's rows halved on each rank
                    local = {t["name"]: t["shape"] for t in program.to_dict()["graphs"][0]["tensors"]}
                    self.assertEqual(local["L0.attn.q.w"], [d, d // 2])
                    self.assertEqual(local["L0.mlp.fc2.w"], [16, d])
                for p, g in adam.items():
                    want = vit_preset_view(p, grads, d).flatten()
                    got = torch.tensor(r["tensors"][g]["values"])
                    scale, err = want.abs().max().item(), (got - want).abs().max().item()
                    self.assertLessEqual(err, 1e-4 * scale + 1e-7, "gradient of %s (%s): max error %g, max |g| %g"
                                         % (p, plan, err, scale))

    def test_sync_batch_norm(self):
        # SyncBatchNorm: statistics over the whole batch, so dp=2 (and zero=3) is the whole batch's
        # step. A CNN with smooth activations: behind a ReLU, fp32 rounding of the all-reduced mean
        # (about 1e-7 of y) flips the rare element within that of 0 and one gradient element with
        # it (measured on the reduced wide ResNet: one of 65,536 in layer3's second batch norm, y
        # 6.6e-7 against -4.8e-10), which a max-norm check of 1e-4 cannot tell from a defect.
        torch.manual_seed(7)
        x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        for plan in (None, "dp=2", "dp=2,zero=3"):
            self.check(SmoothCnn, (x,), y, plan=plan, sync_bn=True)

    def test_gpt_block(self):
        torch.manual_seed(7)
        ids, labels = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
        self.check(TinyGpt, (ids,), labels)
        self.check(TinyGpt, (ids,), labels, plan="dp=2")
        self.check(TinyGpt, (ids,), labels, plan="dp=2,zero=1")
        self.check(TinyGpt, (ids,), labels, plan="dp=2,zero=3")


class Cumsum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.cumsum(self.fc(x), dim=1)  # no IR op for this


class ErrorsTest(unittest.TestCase):
    def test_unsupported_op_names_node_target_and_line(self):
        with self.assertRaises(concerto.Error) as e:
            ct.capture(Cumsum(), torch.randn(2, 4))
        msg = str(e.exception)
        self.assertNotIn("\n", msg)
        self.assertRegex(msg, r"^capture: node 'cumsum' \(aten\.cumsum\.default\) at \S*test_torch\.py:\d+ "
                              r"`return torch\.cumsum\(self\.fc\(x\), dim=1\)  # no IR op for this`: no mapping")

    def test_dropout_is_refused_or_priced_without_randomness(self):
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1), torch.nn.Linear(4, 3))
        with self.assertRaisesRegex(concerto.Error, r"node 'bernoulli_' .*dropout with p=0.1 .*dropout='identity'"):
            ct.capture(m, torch.randn(2, 4))
        cap = ct.capture(m, torch.randn(2, 4), dropout="identity")
        kinds = [op["type"] for op in cap.program.to_dict()["graphs"][0]["ops"] if op["tags"]["phase"] == "fwd"]
        self.assertEqual(kinds[:5], ["matmul", "add", "scale", "matmul", "add"])

    def test_in_place_update_read_through_a_view_is_refused(self):
        class Aliased(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)

            def forward(self, x):
                h = self.fc(x)
                v = h[:, :2]
                h.add_(h)  # v sees the update in torch; a functional graph would not
                return torch.cat([h, v], 1)

        with self.assertRaisesRegex(concerto.Error, r"in-place add_ on 'addmm', which 'cat' reads afterwards"):
            ct.capture(Aliased(), torch.randn(2, 4))

    def test_layer_tags_follow_the_module_path(self):
        cap = ct.capture(reduced_wide_resnet(), torch.randn(2, 3, 32, 32))
        layers = {op["tags"]["layer"] for op in cap.program.to_dict()["graphs"][0]["ops"]}
        self.assertEqual(layers, {-1, 0, 1, 2, 3})  # the stem; layer1.0 .. layer4.0

    def test_bad_plans_and_labels(self):
        cap = ct.capture(TinyGpt(), torch.randint(0, 50, (2, 8)))
        with self.assertRaisesRegex(concerto.Error, r"not divisible by dp=3"):
            cap.partition(plan="dp=3")
        with self.assertRaisesRegex(concerto.Error, r"'pp' is not lowered through the partitioner yet"):
            cap.partition(plan="dp=2,pp=2,microbatches=2")
        with self.assertRaisesRegex(concerto.Error, r"unknown key 'tq'"):
            cap.partition(plan="dp=2,tq=2")
        with self.assertRaisesRegex(concerto.Error, r"labels .*expected an integer tensor of shape \[2, 8\]"):
            ct.capture(TinyGpt(), torch.randint(0, 50, (2, 8)), torch.zeros(2, dtype=torch.int64))
        with self.assertRaisesRegex(concerto.Error, r"only cross entropy"):
            ct.capture(TinyGpt(), torch.randint(0, 50, (2, 8)), loss_fn=torch.nn.functional.mse_loss)


    def test_bad_hyperparameters_labels_and_outputs(self):
        ids = torch.randint(0, 50, (2, 8))
        for kw, want in (({"lr": float("nan")}, r"capture: lr nan: must be a finite number"),
                         ({"lr": 0}, r"capture: lr 0: must be > 0"),
                         ({"eps": -1}, r"capture: eps -1: must be > 0"),
                         ({"weight_decay": -0.1}, r"capture: weight_decay -0.1: must be >= 0"),
                         ({"betas": (0.9, 1.0)}, r"capture: betas \(0.9, 1.0\): must be two numbers in \[0, 1\)")):
            with self.subTest(kw=kw):
                with self.assertRaisesRegex(concerto.Error, want):
                    ct.capture(TinyGpt(), ids, **kw)
        # torch's cross_entropy raises on a label outside the classes; so does the capture
        with self.assertRaisesRegex(concerto.Error, r"capture: labels: 50 is outside \[0, 50\)"):
            ct.capture(TinyGpt(), ids, torch.full((2, 8), 50, dtype=torch.int64))
        with self.assertRaisesRegex(concerto.Error, r"capture: labels: -1 is outside \[0, 50\)"):
            ct.capture(TinyGpt(), ids, torch.full((2, 8), -1, dtype=torch.int64))

        class BuffersOnly(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 3)
                self.register_buffer("table", torch.randn(2, 3))

            def forward(self, x):
                return self.table * 2

        with self.assertRaisesRegex(concerto.Error, r"output depends on none of its parameters and inputs"):
            ct.capture(BuffersOnly(), torch.randn(2, 4))


class CommandTest(unittest.TestCase):
    """python3 -m concerto.torch: capture, plan and compare from the command line."""

    def run_cli(self, *args):
        import os
        import subprocess
        import sys
        return subprocess.run([sys.executable, "-m", "concerto.torch", *args], capture_output=True, text=True,
                              env=dict(os.environ), timeout=600)

    def test_json_report(self):
        r = self.run_cli("torchvision.models:resnet18", "--kwargs", '{"num_classes": 10}', "--input", "8x3x32x32",
                         "--plan", "dp=2,zero=3", "--cluster", "a800-4x8", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        import json
        got = json.loads(r.stdout)
        self.assertEqual(got["ranks"], 2)
        # Every scheduler, and concerto held to the best baseline's memory when it held more.
        rows = [x["scheduler"] for x in got["compare"]["results"]]
        self.assertEqual(sorted(r for r in rows if r != "concerto-eqmem"), sorted(concerto.schedulers()))
        self.assertIn("concerto_vs_best_baseline", got["compare"])
        self.assertIn("capturing", r.stderr)  # progress goes to stderr

    def test_errors_exit_2_with_a_message(self):
        r = self.run_cli("torchvision.models:no_such_model", "--input", "2x3x32x32")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot load 'torchvision.models:no_such_model'", r.stderr)
        r = self.run_cli("torchvision.models:resnet18", "--input", "2xAx32")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--input '2xAx32': not a shape", r.stderr)
        r = self.run_cli("torchvision.models:resnet18", "--input", "3x3x32x32", "--plan", "dp=2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("not divisible by dp=2", r.stderr)
        # the user's factory failing, a bad --kwargs or --vocab: one line, exit 2, no traceback
        for args, want in ((("torchvision.models:resnet18", "--kwargs", '{"no_such_arg": 1}', "--input", "2x3x32x32"),
                            "torchvision.models:resnet18(**{\"no_such_arg\": 1}) raised TypeError"),
                           (("torchvision.models:resnet18", "--kwargs", "[1]", "--input", "2x3x32x32"),
                            "--kwargs: a JSON object of keyword arguments is needed, got list"),
                           (("torchvision.models:resnet18", "--input", "2x8", "--input-dtype", "long", "--vocab", "0"),
                            "--vocab 0: must be >= 1"),
                           (("builtins:dict", "--input", "2x3"), "builtins:dict returned dict, not a torch.nn.Module")):
            with self.subTest(args=args):
                r = self.run_cli(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)
                self.assertNotIn("Traceback", r.stderr)


def forward_gemm_flops(program):
    """Flops of the forward's matmul and conv2d ops (the tensor-core work)."""
    return sum(op["flops"] for op in program.to_dict()["graphs"][0]["ops"]
               if op.get("type") in ("matmul", "conv2d") and op["tags"]["phase"] == "fwd")


class FullSizeFlopsTest(unittest.TestCase):
    """The full-size torchvision models, captured at batch n = 2, against a hand count."""

    def test_vit_b_16(self):
        n, s, d, h, hd, m, layers, classes = 2, 197, 768, 12, 64, 3072, 12, 1000
        cap = ct.capture(torchvision.models.vit_b_16(), torch.randn(n, 3, 224, 224), torch.zeros(n, dtype=torch.int64))
        # patch embedding: a 16x16 stride-16 conv, 768 -> 768 per patch, 196 patches per image;
        # its bias as a [768, 196] plane (ones-matmul, 2*768*196, once per step)
        patch = 2 * n * 196 * d * (3 * 16 * 16) + 2 * d * 196
        cls = 2 * n * d  # the class token expanded over the batch (ones-matmul)
        per_layer = (2 * n * s * d * 3 * d       # q, k, v projections (in_proj)
                     + 2 * (2 * n * h * s * s * hd)  # scores q k^T and probs @ v
                     + 2 * n * s * d * d         # out_proj
                     + 2 * (2 * n * s * d * m))  # mlp: fc1 and fc2
        head = 2 * n * d * classes
        want = patch + cls + layers * per_layer + head
        self.assertEqual(forward_gemm_flops(cap.program), want)
        # torchvision's table: 17.56 GFLOPS (multiply-adds) per image.
        self.assertAlmostEqual(want / n / 2 / 1e9, 17.56, delta=0.02)

    def test_wide_resnet50_2(self):
        n, classes = 2, 1000
        cap = ct.capture(torchvision.models.wide_resnet50_2(), torch.randn(n, 3, 224, 224),
                         torch.zeros(n, dtype=torch.int64))

        def conv(cin, cout, k, out_hw):
            return 2 * n * cout * out_hw * out_hw * cin * k * k

        total = conv(3, 64, 7, 112)  # stem: 7x7 stride 2 -> 112x112 (then a 3x3 stride-2 max pool -> 56)
        cin, hw = 64, 56
        for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            width, cout = planes * 2, planes * 4  # wide: the 3x3 conv twice as wide; expansion 4
            for b in range(blocks):
                s = stride if b == 0 else 1
                out = hw // s
                total += conv(cin, width, 1, hw)       # 1x1 reduce
                total += conv(width, width, 3, out)    # 3x3 (stride here, torchvision's v1.5)
                total += conv(width, cout, 1, out)     # 1x1 expand
                if b == 0:
                    total += conv(cin, cout, 1, out)   # downsample projection
                cin, hw = cout, out
        total += 2 * n * 2048 * 7 * 7  # global average pool as a ones-matmul over the 7x7 plane
        total += 2 * n * 2048 * classes  # fc
        self.assertEqual(forward_gemm_flops(cap.program), total)
        # torchvision's table: 11.4 GFLOPS (multiply-adds) per image.
        self.assertAlmostEqual(total / n / 2 / 1e9, 11.4, delta=0.05)

    def test_presets_pinned_to_the_captures(self):
        # The C++ vision frontend's presets (lower/vision.h) against the torchvision models they
        # follow, at the preset's 32 images per rank: the same GEMM and convolution flops (the
        # preset's fused `attention` op is the capture's two batched matmuls) and parameters.
        for preset, make in (("vit-b16", torchvision.models.vit_b_16),
                             ("wide-resnet50-2", torchvision.models.wide_resnet50_2)):
            module = make()
            cap = ct.capture(module, torch.randn(32, 3, 224, 224), torch.zeros(32, dtype=torch.int64))
            lowered = concerto.lower(preset, "dp=1")
            flops = sum(op["flops"] for op in lowered.to_dict()["graphs"][0]["ops"]
                        if op.get("type") in ("matmul", "conv2d", "attention") and op["tags"]["phase"] == "fwd")
            self.assertEqual(flops, forward_gemm_flops(cap.program), preset)
            tensors = lowered.to_dict()["graphs"][0]["tensors"]
            names = {t["name"] for t in tensors}
            params = [t for t in tensors if t["name"] + ".adam_m" in names]
            self.assertEqual(sum(math.prod(t["shape"]) for t in params), sum(p.numel() for p in module.parameters()))


if __name__ == "__main__":
    unittest.main()
