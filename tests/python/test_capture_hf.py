"""concerto.torch.capture on HuggingFace `transformers` models: a tiny GPT-2 (GPT2LMHeadModel:
Conv1D as addmm, gelu_new, the causal mask a constant broadcast over the heads, the tied
vocabulary head) and a tiny LLaMA (LlamaForCausalLM: RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU MLP, an embedding with padding_idx), randomly initialised (no weights are
downloaded), each captured in float64 and run for one step on the CPU runtime: the loss, every
parameter's gradient and every Adam-updated parameter equal torch's own float64 step (autograd
and torch.optim.Adam's first step), unsharded and under the data-parallel plans dp=2 and
dp=2,zero=3 (every rank on its half of the batch, gradients synchronised: the whole batch's
step), and under Megatron's tensor and sequence parallelism found on the graph (tp=2, tp=2,sp,
dp=2,tp=2,zero=1, dp=2,tp=2,zero=3). MegatronLayoutTest counts the collectives those plans leave per transformer
layer. Also: the exact compositions become their IR ops (rms_norm, swiglu, gelu with exact 0),
an activation with no exact IR form still fails with the one-line error naming the node, its
ATen target and its source line, and (on small hand-written modules, without transformers)
torch's broadcasting of computed tensors -- a [.., 1] scale, a middle dim, an expand -- and of
constants, with the scalar forms of sub, rsub, pow and div, and torch.where / masked_fill by a
constant boolean mask (-inf in the dropped elements included).

Tolerance (the runtime stores fp32; torch's reference is float64): the loss within 1e-6 of it
(relative); each gradient within 1e-6 of its tensor's largest element; each updated parameter
within 1e-6 of its tensor's largest element wherever the gradient is resolved (above 1e-3 of
its tensor's largest: Adam's first step moves an element by lr * g / (|g| + eps), about lr *
sign(g), so where g is within fp32 noise of 0 -- the key bias, whose gradient is exactly 0 in
exact arithmetic -- the two steps may differ by up to 2 lr, and that is all that is asked there).

The HuggingFace tests run only where transformers imports (scripts/setup_torch.sh's venv)."""
import copy
import unittest

import torch

import concerto
import concerto.torch as ct

try:
    import transformers
except ImportError:  # pragma: no cover - without the venv
    transformers = None

LR = 1e-3
VOCAB, BATCH, SEQ = 64, 2, 16


class Logits(torch.nn.Module):
    """The model's logits alone (capture takes a module returning one tensor)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits


def gpt2(activation="gelu_new"):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  activation_function=activation)
    cfg._attn_implementation = "eager"
    return Logits(transformers.GPT2LMHeadModel(cfg)).train().double()


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return Logits(transformers.LlamaForCausalLM(cfg)).train().double()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    ids[0, 3] = ids[1, 9] = 0  # LLaMA's padding id: its embedding row must get no gradient
    return ids, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def torch_step(module, ids, labels):
    """Loss, gradients and Adam-updated parameters of torch's own step on a copy of `module`."""
    module = copy.deepcopy(module)
    module.zero_grad()
    out = module(ids)
    loss = torch.nn.functional.cross_entropy(out.flatten(0, -2), labels.flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    torch.optim.Adam(module.parameters(), lr=LR).step()
    return loss.item(), grads, {n: p.detach().clone() for n, p in module.named_parameters()}


@unittest.skipIf(transformers is None, "transformers is not installed")
class HuggingFaceCaptureTest(unittest.TestCase):
    TOL = 1e-6

    def check(self, make):
        module = make()
        ids, labels = batch()
        cap = ct.capture(module, (ids,), labels, lr=LR)
        want_loss, want_grads, want_updated = torch_step(module, ids, labels)
        names = sorted(n for n, _ in module.named_parameters())
        for plan in (None, "dp=2", "dp=2,zero=3", "tp=2", "tp=2,sp", "dp=2,tp=2,zero=1", "dp=2,tp=2,zero=3"):
            program = cap.partition(plan=plan) if plan else None
            got = cap.run(module, (ids,), labels, program=program)
            self.assertLessEqual(abs(got["loss"] - want_loss), self.TOL * abs(want_loss), "loss (%s)" % plan)
            self.assertEqual(sorted(got["grads"]), names)
            self.assertEqual(sorted(got["updated"]), names)
            for name in names:
                want = want_grads[name]
                scale = want.abs().max().item()
                err = (got["grads"][name].double() - want).abs().max().item()
                self.assertLessEqual(err, self.TOL * scale, "gradient of %s (%s): max error %g, max |g| %g"
                                     % (name, plan, err, scale))
                delta = (got["updated"][name].double() - want_updated[name]).abs()
                top = want_updated[name].abs().max().item()
                resolved = want.abs() > 1e-3 * scale
                self.assertTrue(resolved.any(), name)
                self.assertLessEqual(delta[resolved].max().item(), self.TOL * top, "update of %s (%s)" % (name, plan))
                self.assertLessEqual(delta.max().item(), 2 * LR + self.TOL * top, "update of %s (%s)" % (name, plan))
        return cap, got

    def kinds(self, cap):
        ops = cap.program.to_dict()["graphs"][0]["ops"]
        return [op for op in ops if op["tags"]["phase"] == "fwd"]

    def test_gpt2(self):
        cap, _ = self.check(gpt2)
        fwd = self.kinds(cap)
        gelu = [op for op in fwd if op["type"] == "gelu"]
        self.assertEqual([op["attrs"]["exact"] for op in gelu], [0, 0])  # gelu_new: the tanh form
        self.assertEqual(sum(op["type"] == "layer_norm" for op in fwd), 5)
        # The causal mask [b, 1, s, s] is a constant: broadcast over the heads here, in torch.
        self.assertIn([BATCH, 2, SEQ, SEQ], [list(t.shape) for t in cap.constants.values()])

    def test_llama(self):
        cap, got = self.check(llama)
        fwd = self.kinds(cap)
        self.assertEqual(sum(op["type"] == "rms_norm" for op in fwd), 5)  # 2 per layer and the final one
        self.assertEqual(sum(op["type"] == "swiglu" for op in fwd), 2)
        self.assertEqual([op["attrs"]["eps"] for op in fwd if op["type"] == "rms_norm"], [1e-6] * 5)
        # padding_idx: torch gives row 0 no gradient, and neither does the captured step.
        self.assertEqual(got["grads"]["m.model.embed_tokens.weight"][0].abs().max().item(), 0.0)
        self.assertEqual(list(cap.param_rows.values()), [("m.model.embed_tokens.weight", 0)])

    def test_inexact_activation_names_node_target_and_line(self):
        # gelu_fast's constants (0.7978845608, not sqrt(2/pi) to double precision) are not the IR's gelu.
        ids, labels = batch()
        with self.assertRaises(concerto.Error) as e:
            ct.capture(gpt2("gelu_fast"), (ids,), labels)
        msg = str(e.exception)
        self.assertNotIn("\n", msg)
        self.assertRegex(msg, r"^capture: node 'tanh' \(aten\.tanh\.default\) at \S+\.py:\d+ `[^`]+`: no mapping")


class Broadcasts(torch.nn.Module):
    """Elementwise ops whose operands broadcast, computed and constant."""

    def __init__(self, vocab=16, h=8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.fc = torch.nn.Linear(2 * h, h)
        self.head = torch.nn.Linear(h, vocab)
        self.register_buffer("divisor", torch.linspace(1.0, 2.0, h))
        self.register_buffer("weight", torch.tensor(0.5))

    def forward(self, ids):
        x = self.emb(ids)                                    # [b, s, h]
        x = x * x.mean(-1, keepdim=True)                     # a computed [b, s, 1] scale
        x = x + x[:, :1, :]                                  # a computed [b, 1, h] over the sequence
        x = self.fc(x.unsqueeze(2).expand(-1, -1, 2, -1).reshape(x.shape[0], x.shape[1], -1))
        x = (1 - x) * self.weight + x.pow(3) - 0.25          # rsub, a 0-d constant, pow, a number
        return self.head(x / self.divisor)                   # a constant [h] divisor


class Masked(torch.nn.Module):
    """Attention scores masked by a constant boolean mask three ways: torch.where with a 0-d
    constant (GPT-2 in transformers 4.x), masked_fill with -inf, torch.where with a number."""

    def __init__(self, vocab=16, h=8, s=5):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, h)
        self.qk = torch.nn.Linear(h, 2 * h)
        self.head = torch.nn.Linear(h, vocab)
        self.register_buffer("bias", torch.tril(torch.ones(s, s, dtype=torch.bool)).view(1, s, s))

    def forward(self, ids):
        x = self.emb(ids)
        q, k = self.qk(x).split(x.shape[-1], -1)
        a = q @ k.transpose(-1, -2)
        a = torch.where(self.bias, a, torch.full([], torch.finfo(a.dtype).min, dtype=a.dtype))
        a = a.masked_fill(~self.bias, float("-inf"))
        b = torch.where(self.bias, a, 0.5)  # reads a where it is finite; -inf is dropped exactly
        return self.head((a.softmax(-1) + 0.01 * b) @ x)


class BroadcastTest(unittest.TestCase):
    def check(self, make):
        torch.manual_seed(0)
        module = make().double()
        ids, labels = torch.randint(0, 16, (2, 5)), torch.randint(0, 16, (2, 5))
        cap = ct.capture(module, (ids,), labels, lr=LR)
        want_loss, want_grads, _ = torch_step(module, ids, labels)
        for plan in (None, "dp=2"):
            got = cap.run(module, (ids,), labels, program=cap.partition(plan=plan) if plan else None)
            self.assertLessEqual(abs(got["loss"] - want_loss), 1e-6 * want_loss, plan)
            for name, want in want_grads.items():
                err = (got["grads"][name].double() - want).abs().max().item()
                self.assertLessEqual(err, 1e-6 * want.abs().max().item(), "gradient of %s (%s)" % (name, plan))

    def test_broadcasts_match_torch(self):
        self.check(Broadcasts)

    def test_constant_masks_match_torch(self):
        self.check(Masked)


if __name__ == "__main__":
    unittest.main()


def tiny_lm(kind, heads, kv_heads, layers=3):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=layers, n_head=heads,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                      eos_token_id=0)
        cfg._attn_implementation = "eager"
        return Logits(transformers.GPT2LMHeadModel(cfg)).train()
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=SEQ, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return Logits(transformers.LlamaForCausalLM(cfg)).train()


@unittest.skipIf(transformers is None, "transformers is not installed")
class MegatronLayoutTest(unittest.TestCase):
    """Captured transformers GPT-2 (fused q/k/v as one Conv1D, biases) and LLaMA (separate q/k/v,
    grouped-query attention) of 3 layers under tp=2 and tp=4, with and without sp: the
    partitioner leaves exactly Megatron-LM's activation collectives in every layer but the last
    (whose backward's first gather sits after the final norm, tagged outside the layers):

      per layer      forward                     backward
      tp             2 all-reduce                2 all-reduce
      tp,sp          2 all-gather, 2 reduce-sc.  4 all-gather, 2 reduce-scatter

    (the sp backward: an all-gather for each forward reduce-scatter, a reduce-scatter for each
    forward all-gather, and the column-parallel inputs gathered again for the weight gradients,
    as Megatron does instead of keeping the forward's gathered copies)

    and nothing else over tp: no all-to-all in a layer, no gather of a weight, no reduction of a
    split weight's gradient (under sp only the gradients of replicated parameters -- norms, biases,
    position embeddings -- computed on a token split are all-reduced, as Megatron's
    finalize_model_grads does for the norms). The step's values equal the unsharded
    step's (HuggingFaceCaptureTest checks them against torch)."""

    def counts(self, kind, plan, heads, kv_heads):
        module = tiny_lm(kind, heads, kv_heads)
        ids, labels = batch()
        cap = ct.capture(module, (ids,), labels, dtype="f32")
        d = cap.partition(plan=plan).to_dict()
        g = d["graphs"][0]
        split = {t["name"] for t in g["tensors"] if t["name"] in cap.params.values() and ["tp"] in t["sharding"]}
        per_layer, other = {}, []
        for op in g["ops"]:
            if op["kind"] != "collective" or op["group"].get("axes") != ["tp"]:
                continue
            tags = op["tags"]
            if tags["purpose"] == "activation":
                per_layer.setdefault(tags["layer"], []).append((tags["phase"], op["collective"]))
            else:
                other.append((op["collective"], tags["purpose"], op["inputs"][0]))
        return per_layer, other, split

    def check(self, kind, tp, sp, heads, kv_heads):
        plan = "tp=%d%s" % (tp, ",sp" if sp else "")
        per_layer, other, split = self.counts(kind, plan, heads, kv_heads)
        want = (sorted([("fwd", "all_gather")] * 2 + [("fwd", "reduce_scatter")] * 2 +
                       [("bwd", "all_gather")] * 4 + [("bwd", "reduce_scatter")] * 2) if sp else
                sorted([("fwd", "all_reduce")] * 2 + [("bwd", "all_reduce")] * 2))
        for layer in (0, 1):
            self.assertEqual(sorted(per_layer.get(layer, [])), want, "%s %s layer %d" % (kind, plan, layer))
        for layer, ops in per_layer.items():  # the layers (-1, the embeddings and the head, aside)
            if layer < 0:
                continue
            self.assertNotIn("all_to_all", [c for _, c in ops], "%s %s layer %d" % (kind, plan, layer))
        self.assertTrue(split, "%s %s: no parameter is split over tp" % (kind, plan))
        for collective, purpose, tensor in other:
            # Only gradients of replicated parameters (norms, biases, position embeddings) computed
            # on a token split.
            self.assertTrue(sp and purpose == "grad_sync" and collective == "all_reduce" and
                            not any(tensor.startswith(w + ".") for w in split),
                            "%s %s: %s %s of '%s'" % (kind, plan, collective, purpose, tensor))

    def test_gpt2(self):
        for tp in (2, 4):
            for sp in (False, True):
                self.check("gpt2", tp, sp, heads=4, kv_heads=4)

    def test_llama(self):
        for tp in (2, 4):
            for sp in (False, True):
                self.check("llama", tp, sp, heads=4, kv_heads=4)
        self.check("llama", 2, True, heads=4, kv_heads=2)  # grouped-query: 2 key/value heads

    def test_plan_errors_name_the_key(self):
        module = tiny_lm("llama", 4, 2)
        ids, labels = batch()
        cap = ct.capture(module, (ids,), labels, dtype="f32")
        with self.assertRaisesRegex(concerto.Error, "'pp' is not lowered through the partitioner yet"):
            cap.partition(plan="tp=2,pp=2")
        with self.assertRaisesRegex(concerto.Error, "not divisible by 3"):
            cap.partition(plan="tp=3")
