// The sharding rules of the op registry: each compute type's operand
// dimensions as labels (ir/sharding_signature.h). docs/frontends.md
// ("Per-op sharding plans") states them in words.
#include "sharding_rules.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace concerto {
namespace {

using Sig = ShardingSignature;

/// The number of dimensions of global tensor `name`.
size_t RankOf(const ShardingRuleContext& ctx, const std::string& name) {
  return ctx.Global(name).shape.size();
}

/// A signature with one entry per operand of `op`.
Sig Sized(const Op& op) {
  Sig sig;
  sig.in.resize(op.inputs.size());
  sig.out.resize(op.outputs.size());
  return sig;
}

/// `dims` := `r` fresh labels.
void Fresh(Sig& sig, size_t r, std::vector<int>* dims) {
  dims->clear();
  for (size_t i = 0; i < r; ++i) dims->push_back(sig.NewLabel());
}

/// Every operand labelled like input 0.
Sig AllSame(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  for (size_t i = 1; i < sig.in.size(); ++i) sig.in[i] = sig.in[0];
  for (auto& o : sig.out) o = sig.in[0];
  return sig;
}

}  // namespace

Result<ShardingSignature> CopyShardingSignature(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    sig.current_group = static_cast<int>(i);
    Fresh(sig, RankOf(ctx, op.inputs[i]), &sig.in[i]);
    sig.out[i] = sig.in[i];
  }
  sig.linear = Sig::Linear::kPairwise;
  return sig;
}

namespace sharding_rules {

/// [batch.., m, k] x [(batch..,) k, n] -> [batch.., m, n]; k contracted.
Result<ShardingSignature> Matmul(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const bool ta = op.Attr("transpose_a", 0) != 0, tb = op.Attr("transpose_b", 0) != 0;
  const size_t ra = RankOf(ctx, op.inputs[0]), rb = RankOf(ctx, op.inputs[1]);
  std::vector<int> batch;
  for (size_t i = 0; i + 2 < ra; ++i) batch.push_back(sig.NewLabel());
  const int m = sig.NewLabel(), k = sig.NewLabel(), n = sig.NewLabel();
  sig.in[0] = batch;
  sig.in[0].push_back(ta ? k : m);
  sig.in[0].push_back(ta ? m : k);
  sig.in[1] = rb == 2 ? std::vector<int>{} : batch;
  sig.in[1].push_back(tb ? n : k);
  sig.in[1].push_back(tb ? k : n);
  sig.out[0] = batch;
  sig.out[0].push_back(m);
  sig.out[0].push_back(n);
  sig.linear = Sig::Linear::kOne;
  return sig;
}

/// x + y, y labelled like x's trailing dims (broadcast).
Result<ShardingSignature> Add(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  const size_t ry = RankOf(ctx, op.inputs[1]);
  sig.in[1].assign(sig.in[0].end() - static_cast<std::ptrdiff_t>(ry), sig.in[0].end());
  sig.out[0] = sig.in[0];
  sig.linear = Sig::Linear::kSame;
  return sig;
}

/// x * constant: linear, a partial input stays partial.
Result<ShardingSignature> Scale(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = AllSame(op, ctx);
  sig.linear = Sig::Linear::kPairwise;
  return sig;
}

/// Elementwise over same-shaped operands (not linear).
Result<ShardingSignature> Elementwise(const Op& op, const ShardingRuleContext& ctx) {
  return AllSame(op, ctx);
}

/// Elementwise, with the last dim (the softmax's row) whole.
Result<ShardingSignature> Softmax(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = AllSame(op, ctx);
  sig.whole[sig.in[0].back()] = true;
  return sig;
}

/// layer/rms norm and their gradients: x's labels, the hidden dim whole;
/// rank-1 operands (gamma, beta and their grads) carry the hidden label.
Result<ShardingSignature> Norm(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const bool grad = op.compute_type == ComputeType::kLayerNormGrad || op.compute_type == ComputeType::kRmsNormGrad;
  const size_t x = grad ? 1 : 0;
  Fresh(sig, RankOf(ctx, op.inputs[x]), &sig.in[x]);
  const int h = sig.in[x].back();
  sig.whole[h] = true;
  for (size_t i = 0; i < sig.in.size(); ++i)
    sig.in[i] = RankOf(ctx, op.inputs[i]) == 1 ? std::vector<int>{h} : sig.in[x];
  for (size_t o = 0; o < sig.out.size(); ++o)
    sig.out[o] = RankOf(ctx, op.outputs[o]) == 1 ? std::vector<int>{h} : sig.in[x];
  return sig;
}

/// [b, s, heads*d] everywhere; the sequence whole, the hidden split by heads.
Result<ShardingSignature> Attention(const Op& op, const ShardingRuleContext&) {
  Sig sig = Sized(op);
  const int b = sig.NewLabel(), s = sig.NewLabel(true), h = sig.NewLabel();
  for (auto& i : sig.in) i = {b, s, h};
  for (auto& o : sig.out) o = {b, s, h};
  sig.head_label = h;
  return sig;
}

/// table [V, H], ids [...] -> [..., H]; V is a lookup, not iterated over.
Result<ShardingSignature> Embedding(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const int v = sig.NewLabel(), h = sig.NewLabel();
  sig.lookup[v] = true;
  Fresh(sig, RankOf(ctx, op.inputs[1]), &sig.in[1]);
  sig.in[0] = {v, h};
  sig.out[0] = sig.in[1];
  sig.out[0].push_back(h);
  return sig;
}

/// dy [..., H], ids [...] -> dtable [V, H], laid out like the table of the
/// lookup that reads the same ids.
Result<ShardingSignature> EmbeddingGrad(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const int v = sig.NewLabel(), h = sig.NewLabel();
  sig.lookup[v] = true;
  Fresh(sig, RankOf(ctx, op.inputs[1]), &sig.in[1]);
  sig.in[0] = sig.in[1];
  sig.in[0].push_back(h);
  sig.out[0] = {v, h};
  for (const Op& other : ctx.graph().ops)
    if (other.kind == OpKind::kCompute && other.compute_type == ComputeType::kEmbedding &&
        other.inputs[1] == op.inputs[1] &&
        ctx.Global(other.inputs[0]).shape == ctx.Global(op.outputs[0]).shape) {
      sig.hints[v] = ctx.CurrentDim(other.inputs[0], 0);
      break;
    }
  return sig;
}

/// reduce_max, sum_exp, gather_target: x [..., V] (and [...]) -> [...]; V
/// contracted (a pending max for reduce_max).
Result<ShardingSignature> RowReduction(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  std::vector<int> lead(sig.in[0].begin(), sig.in[0].end() - 1);
  if (sig.in.size() > 1) sig.in[1] = lead;
  sig.out[0] = lead;
  sig.contract_max = op.compute_type == ComputeType::kReduceMax;
  return sig;
}

/// (m, z, target) -> the mean loss; every label whole, the loss is this rank's.
Result<ShardingSignature> CrossEntropy(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  for (size_t i = 1; i < sig.in.size(); ++i) sig.in[i] = sig.in[0];
  Fresh(sig, RankOf(ctx, op.outputs[0]), &sig.out[0]);
  for (int l : sig.out[0]) sig.whole[l] = true;
  sig.no_output_partial = true;
  return sig;
}

/// logits [..., V], m, z, labels [...] -> dlogits [..., V].
Result<ShardingSignature> CrossEntropyGrad(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  std::vector<int> lead(sig.in[0].begin(), sig.in[0].end() - 1);
  for (size_t i = 1; i < sig.in.size(); ++i) sig.in[i] = lead;
  sig.out[0] = sig.in[0];
  return sig;
}

/// x -> x[start:start+len] on `axis`: a whole segment of a segmented axis
/// keeps its sharding (each rank slices its block); otherwise the axis is whole.
Result<ShardingSignature> Slice(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const size_t axis = static_cast<size_t>(op.Attr("axis", 0));
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  sig.out[0] = sig.in[0];
  const int a_in = sig.in[0][axis], a_out = sig.NewLabel();
  sig.out[0][axis] = a_out;
  sig.renamed.insert(a_in);
  sig.linear = Sig::Linear::kPairwise;
  const DimSharding& have = ctx.CurrentDim(op.inputs[0], axis);
  const int64_t start = static_cast<int64_t>(op.Attr("start", 0));
  const int64_t len = ctx.Global(op.outputs[0]).shape[axis];
  int64_t offset = 0;
  bool aligned = false;
  for (int64_t seg : have.segments) {
    if (offset == start && seg == len) aligned = true;
    offset += seg;
  }
  if (aligned && !have.axes.empty()) {
    sig.forced[a_in] = have;
    sig.forced[a_out] = DimSharding{have.axes, {}};
  } else {
    sig.whole[a_in] = sig.whole[a_out] = true;
  }
  return sig;
}

/// Inputs concatenated on `axis`: inputs sharded alike on it give a
/// segmented output (each rank concatenates its blocks); otherwise whole.
Result<ShardingSignature> Concat(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const size_t nin = op.inputs.size();
  const size_t axis = static_cast<size_t>(op.Attr("axis", 0));
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  std::vector<int> axis_labels = {sig.in[0][axis]};
  for (size_t i = 1; i < nin; ++i) {
    sig.in[i] = sig.in[0];
    sig.in[i][axis] = sig.NewLabel();
    axis_labels.push_back(sig.in[i][axis]);
  }
  sig.out[0] = sig.in[0];
  sig.out[0][axis] = sig.NewLabel();
  sig.renamed.insert(axis_labels.begin(), axis_labels.end());
  sig.linear = Sig::Linear::kSame;
  const DimSharding first = ctx.CurrentDim(op.inputs[0], axis);
  bool same = !first.axes.empty() && first.segments.empty();
  DimSharding out{first.axes, {}};
  for (size_t i = 0; i < nin; ++i) {
    const DimSharding& d = ctx.CurrentDim(op.inputs[i], axis);
    same = same && d == first;
    out.segments.push_back(ctx.Global(op.inputs[i]).shape[axis]);
  }
  if (same) {
    for (int l : axis_labels) sig.forced[l] = first;
    sig.forced[sig.out[0][axis]] = out;
  } else {
    for (int l : axis_labels) sig.whole[l] = true;
    sig.whole[sig.out[0][axis]] = true;
  }
  return sig;
}

/// Pairwise reshapes: groups of dims with equal products; only a group's
/// first dim of size above 1 may be sharded (so [1, n] <-> [n] keeps n's split).
Result<ShardingSignature> Identity(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const auto& a = ctx.Global(op.inputs[i]).shape;
    const auto& b = ctx.Global(op.outputs[i]).shape;
    sig.current_group = static_cast<int>(i);
    Fresh(sig, a.size(), &sig.in[i]);
    if (a == b) {
      sig.out[i] = sig.in[i];
      continue;
    }
    sig.out[i].assign(b.size(), -1);
    size_t x = 0, y = 0;
    while (x < a.size() || y < b.size()) {
      const size_t x0 = x, y0 = y;
      int64_t pa = x < a.size() ? a[x++] : 1, pb = y < b.size() ? b[y++] : 1;
      while (pa != pb) {
        if (pa < pb && x < a.size()) pa *= a[x++];
        else if (pb < pa && y < b.size()) pb *= b[y++];
        else return Status::Error("identity shapes do not regroup");
      }
      // The group's leading dim on each side, skipping dims of size 1.
      size_t xs = x0, ys = y0;
      while (xs + 1 < x && a[xs] == 1) ++xs;
      while (ys + 1 < y && b[ys] == 1) ++ys;
      for (size_t k = x0; k < x; ++k)
        if (k != xs) sig.whole[sig.in[i][k]] = true;
      if (ys < b.size()) sig.out[i][ys] = xs < a.size() ? sig.in[i][xs] : sig.NewLabel(true);
      for (size_t k = y0; k < y; ++k)
        if (k != ys) sig.out[i][k] = sig.NewLabel(true);
      if (xs < a.size() && ys >= b.size()) sig.whole[sig.in[i][xs]] = true;
    }
  }
  sig.linear = Sig::Linear::kPairwise;
  return sig;
}

/// conv2d: x [n, c, h, w] * w [k, c, r, s] -> y [n, k, p, q], c contracted;
/// conv2d_grad: (dy [n, k, p, q], x, w) -> (dx [n, c, h, w], dw [k, c, r, s]),
/// dx summed over k, dw over n (the data-parallel weight gradient). The batch
/// and the channels split freely; the spatial dims stay whole (no halo exchange).
Result<ShardingSignature> Conv2d(const Op& op, const ShardingRuleContext&) {
  Sig sig = Sized(op);
  const int n = sig.NewLabel(), c = sig.NewLabel(), k = sig.NewLabel();
  const int h = sig.NewLabel(true), w = sig.NewLabel(true), r = sig.NewLabel(true), s = sig.NewLabel(true);
  const int p = sig.NewLabel(true), q = sig.NewLabel(true);
  const std::vector<int> x = {n, c, h, w}, wt = {k, c, r, s}, y = {n, k, p, q};
  if (op.compute_type == ComputeType::kConv2dGrad) {
    sig.in = {y, x, wt};
    sig.out = {x, wt};
  } else {
    sig.in = {x, wt};
    sig.out = {y};
    sig.linear = Sig::Linear::kOne;
  }
  return sig;
}

/// max_pool2d: x [n, c, h, w] -> y [n, c, p, q]; its gradient (dy, x) -> dx.
/// Batch and channels split freely; the windows' spatial dims stay whole.
Result<ShardingSignature> Pool2d(const Op& op, const ShardingRuleContext&) {
  Sig sig = Sized(op);
  const int n = sig.NewLabel(), c = sig.NewLabel();
  const int h = sig.NewLabel(true), w = sig.NewLabel(true), p = sig.NewLabel(true), q = sig.NewLabel(true);
  const std::vector<int> x = {n, c, h, w}, y = {n, c, p, q};
  if (op.compute_type == ComputeType::kMaxPool2dGrad) {
    sig.in = {y, x};
    sig.out = {x};
  } else {
    sig.in = {x};
    sig.out = {y};
  }
  return sig;
}

/// batch_norm and its gradient: the channel dim (1) splits freely and the
/// rank-1 operands (gamma, beta, mean, invstd and their gradients) carry it.
/// Every other dim stays whole, since the statistics run over them (a
/// batch-sharded input is gathered first) -- unless `local_stats` is 1: then
/// each rank normalises with the statistics of its own part (DDP's BatchNorm
/// without SyncBatchNorm), the forward's mean and invstd are that rank's (not
/// partial sums), and the gradient's dgamma and dbeta are partial over the
/// batch -- or the op is synchronised (the forward's [1, C] sum and squared
/// deviations of batch_norm_stats, the gradient's [2, C] sums of
/// batch_norm_grad_stats, each all-reduced by the partitioner where the batch
/// is split): then the batch splits freely and every [C] output is the
/// global one.
Result<ShardingSignature> BatchNorm(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const bool grad = op.compute_type == ComputeType::kBatchNormGrad;
  const size_t first_sums = grad ? 5 : 3;  // the synchronised form's sums operands
  const bool sync = op.inputs.size() == (grad ? 6u : 5u);
  const bool local = op.Attr("local_stats", 0) != 0;
  const size_t x = grad ? 1 : 0;
  const size_t rank = RankOf(ctx, op.inputs[x]);
  std::vector<int> dims;
  for (size_t d = 0; d < rank; ++d) dims.push_back(sig.NewLabel(d != 1 && !local && !sync));
  const int c = dims.size() > 1 ? dims[1] : dims[0];
  for (size_t i = 0; i < sig.in.size(); ++i) {
    const size_t r = RankOf(ctx, op.inputs[i]);
    sig.in[i] = r == 1 ? std::vector<int>{c} : (sync && i >= first_sums) ? std::vector<int>{sig.NewLabel(true), c} : dims;
  }
  for (size_t o = 0; o < sig.out.size(); ++o)
    sig.out[o] = RankOf(ctx, op.outputs[o]) == 1 ? std::vector<int>{c} : dims;
  sig.no_output_partial = sync || (local && !grad);
  return sig;
}

/// batch_norm_stats (x[, sum]) and batch_norm_grad_stats (dy, x, mean,
/// invstd): x's dims split freely, the [C] operands and the [1, C] global
/// sum carry the channel; the [1, C] or [2, C] sums out are partial over
/// every other split dim (the partitioner's all-reduce makes them the global
/// sums sync-BN needs).
Result<ShardingSignature> BatchNormStats(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  const size_t x = op.compute_type == ComputeType::kBatchNormGradStats ? 1 : 0;
  std::vector<int> dims;
  Fresh(sig, RankOf(ctx, op.inputs[x]), &dims);
  const int c = dims[1];
  for (size_t i = 0; i < sig.in.size(); ++i)
    sig.in[i] = RankOf(ctx, op.inputs[i]) == 1 ? std::vector<int>{c}
                : i == x                       ? dims
                : op.compute_type == ComputeType::kBatchNormStats ? std::vector<int>{sig.NewLabel(true), c}
                                                                  : dims;
  sig.out[0] = {sig.NewLabel(true), c};
  return sig;
}

/// transpose: y's labels are x's with dims axis0 and axis1 swapped; every
/// dim splits freely (each rank transposes its block); linear.
Result<ShardingSignature> Transpose(const Op& op, const ShardingRuleContext& ctx) {
  Sig sig = Sized(op);
  Fresh(sig, RankOf(ctx, op.inputs[0]), &sig.in[0]);
  sig.out[0] = sig.in[0];
  const auto a0 = static_cast<size_t>(op.Attr("axis0", 0)), a1 = static_cast<size_t>(op.Attr("axis1", 0));
  if (a0 >= sig.out[0].size() || a1 >= sig.out[0].size())
    return Status::Error("transpose axes " + std::to_string(a0) + ", " + std::to_string(a1) + " outside rank " +
                         std::to_string(sig.out[0].size()));
  std::swap(sig.out[0][a0], sig.out[0][a1]);
  sig.linear = Sig::Linear::kPairwise;
  return sig;
}

}  // namespace sharding_rules
}  // namespace concerto
