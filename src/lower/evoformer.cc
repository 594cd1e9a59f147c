// The AlphaFold 2 Evoformer stack (supplement Algorithms 6-15) lowered to the
// IR, alone or under FastFold's dynamic axial parallelism (DAP). The op list,
// the approximations, the layouts and the placement of every collective are in
// docs/evoformer.md; the comments here say what each helper emits.
#include "concerto/ir/op_registry.h"
#include "concerto/lower/evoformer.h"
#include "concerto/ir/comm_streams.h"

#include <cassert>
#include <cmath>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "concerto/lower/graph_builder.h"

namespace concerto {
namespace {

using lower::Axes;
using lower::GraphBuilder;
using lower::Shape;
using lower::Sharding;

// Flops of the non-matmul ops come from the op registry (ir/op_registry.h,
// docs/evoformer.md); matmul and attention flops are exact formulas.

constexpr double kLayerNormEps = 1e-5;
constexpr double kAdamLr = 1e-3;  // AlphaFold 2 training
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.999;
constexpr double kAdamEps = 1e-6;

const char* const kActivation = "activation";
const char* const kGradSync = "grad_sync";
const char* const kDap = "dap";

/// A shape with its sharding: how one op sees a tensor's elements.
struct Layout {
  Shape shape;
  Sharding sharding;
};

/// "16x256x32".
std::string JoinDims(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

/// Replicated parameters: declaration, raw gradients (partial over the
/// gradient-sync axes), the all-reduce right after each gradient's producer,
/// and Adam.
class EvoParams {
 public:
  EvoParams(GraphBuilder* b, DType dtype, Axes sync_axes)
      : b_(b), dtype_(dtype), sync_axes_(std::move(sync_axes)) {}

  /// Declares a replicated parameter of `shape` owned by block `layer`.
  std::string Declare(const std::string& name, Shape shape, int layer) {
    Sharding sharding(shape.size());
    b_->AddTensor(name, std::move(shape), dtype_, std::move(sharding));
    index_.emplace(name, params_.size());
    params_.push_back({name, layer, ""});
    return name;
  }

  /// Declares `param`.grad, the raw gradient: partial over the sync axes
  /// (every rank saw only its dap shard of the activations and its dp sample).
  std::string NewGrad(const std::string& param) {
    return b_->AddLike(param + ".grad", param, dtype_, sync_axes_);
  }

  /// All-reduces `grad` over the sync axes (purpose grad_sync) when there are
  /// any, and records the result as what Adam reads.
  void Sync(const std::string& param, const std::string& grad) {
    Param& p = params_[Find(param)];
    p.grad = grad;
    if (sync_axes_.empty()) return;
    p.grad = b_->AddLike(param + ".grad.ar", param, dtype_);
    b_->AddCollective(p.grad, CollectiveType::kAllReduce, grad, p.grad, sync_axes_,
                      ReduceOp::kSum, kGradSync);
  }

  /// Adam for every parameter, in declaration order; moments in f32.
  void EmitOptimizer() {
    for (const Param& p : params_) Adam(p);
  }

 private:
  struct Param {
    std::string name;
    int layer = -1;
    std::string grad;
  };

  /// Index of parameter `name` (must be declared).
  size_t Find(const std::string& name) const {
    auto it = index_.find(name);
    assert(it != index_.end() && "unknown parameter");
    return it->second;
  }

  /// (param, grad, m, v) -> (param', m', v').
  void Adam(const Param& p) {
    assert(!p.grad.empty() && "parameter without a gradient");
    b_->SetLayer(p.layer);
    std::string m = b_->AddLike(p.name + ".adam_m", p.name, DType::kF32);
    std::string v = b_->AddLike(p.name + ".adam_v", p.name, DType::kF32);
    std::string next = b_->AddLike(p.name + ".next", p.name, dtype_);
    std::string m_next = b_->AddLike(p.name + ".adam_m.next", p.name, DType::kF32);
    std::string v_next = b_->AddLike(p.name + ".adam_v.next", p.name, DType::kF32);
    const double flops = FlopsPerUnit(ComputeType::kAdam) * b_->Get(p.name).NumElements();
    b_->AddCompute(p.name + ".adam", ComputeType::kAdam, {p.name, p.grad, m, v},
                   {next, m_next, v_next}, flops,
                   {{"lr", kAdamLr}, {"beta1", kAdamBeta1}, {"beta2", kAdamBeta2},
                    {"eps", kAdamEps}, {"step", 1}});
  }

  GraphBuilder* b_;
  DType dtype_;
  Axes sync_axes_;
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> index_;
};

/// One gated self-attention module: MSA row (biased by the pair), MSA column
/// (no bias: the attention op) or triangle attention (biased by its own input).
struct AttnSpec {
  std::string prefix;
  int64_t heads = 0, head_dim = 0;
  int64_t rows = 0, len = 0;  // local attention batch and sequence length
  int64_t channels = 0;       // module input/output width
  bool biased = false;        // explicit scores with an additive bias
  bool own_bias = false;      // bias from the module's own normed input (else from z)
};

/// Head-major tensors of a biased attention that its backward reads.
struct CoreActs {
  std::string qs, kh, vh, probs;
};

/// Forward tensors of an attention module.
struct AttnActs {
  std::string x, xn, q, k, v, g, o, go;
  std::string z, bias_x, bias_src;  // bias path: pair input, its normed form, its 2-D view
  CoreActs core;
};

/// Forward tensors of a transition (LayerNorm, widen, gelu, narrow).
struct TransitionActs {
  std::string x, xn, h, act;
};

/// Forward tensors of the outer-product mean.
struct OpmActs {
  std::string mt, mn, a2, b2, outer;
};

/// Forward tensors of a triangle multiplication.
struct TriMulActs {
  std::string x, xn, x2d, lp, lg, rp, rg, left, right, p, pn, po, g;
};

/// Forward tensors of one head (a linear layer and a softmax cross entropy
/// over its last dim) that its backward reads.
struct HeadActs {
  std::string x, logits, labels, max, sum_exp;
};

/// Everything one block's backward reads.
struct BlockActs {
  AttnActs msa_row, msa_col, att_start, att_end;
  TransitionActs msa_tr, pair_tr;
  OpmActs opm;
  TriMulActs mul_out, mul_in;
};

/// Lowers one training step of the stack into one SPMD graph.
class EvoformerLowering {
 public:
  EvoformerLowering(const EvoformerConfig& config, int dp, int dap, Graph* graph)
      : c_(config),
        n_(dap),
        dp_(dp),
        b_(graph),
        params_(&b_, config.dtype, SyncAxes(dp, dap)),
        s_(config.n_seq),
        r_(config.n_res),
        sl_(config.n_seq / dap),
        rl_(config.n_res / dap) {}

  /// Emits forward, backward and the optimizer in program order.
  void Build() {
    b_.SetPhase(Phase::kForward);
    b_.SetLayer(-1);
    std::string m = Act("evo.msa", {{sl_, r_, c_.c_m}, Sh(3, 0)});
    std::string z = Act("evo.pair", {{rl_, r_, c_.c_z}, Sh(3, 0)});
    acts_.resize(c_.blocks);
    for (int l = 0; l < c_.blocks; ++l) std::tie(m, z) = BlockForward(l, m, z);
    SetLayer(-1);
    DistogramForward(z);
    MaskedMsaForward(m);
    b_.SetPhase(Phase::kBackward);
    std::string dm = MaskedMsaBackward();
    std::string dz = DistogramBackward();
    for (int l = c_.blocks - 1; l >= 0; --l) std::tie(dm, dz) = BlockBackward(l, dm, dz);
    b_.SetPhase(Phase::kOptimizer);
    params_.EmitOptimizer();
  }

 private:
  /// The axes a weight gradient is partial over: dp and dap where > 1.
  static Axes SyncAxes(int dp, int dap) {
    Axes axes;
    if (dp > 1) axes.push_back("dp");
    if (dap > 1) axes.push_back(kDap);
    return axes;
  }

  // ---- tensors and layouts -------------------------------------------------

  /// {"dap"} when dap > 1, else none.
  Axes Dap() const { return n_ > 1 ? Axes{kDap} : Axes{}; }
  /// A sharding of `rank` dims with dim `dim` over dap (none for dim < 0).
  Sharding Sh(size_t rank, int dim) const {
    Sharding s(rank);
    if (dim >= 0) s[dim] = Dap();
    return s;
  }
  /// Declares an activation of the config dtype laid out as `layout`.
  std::string Act(const std::string& name, Layout layout, Axes partial = {}) {
    return b_.AddTensor(name, std::move(layout.shape), c_.dtype, std::move(layout.sharding),
                        std::move(partial));
  }
  /// The layout of tensor `x`.
  Layout LayoutOf(const std::string& x) const {
    const Tensor& t = b_.Get(x);
    return {t.shape, t.sharding};
  }
  /// x as [rows, last dim]; only x's first dim may be sharded.
  Layout RowsLayout(const std::string& x) const {
    const Tensor& t = b_.Get(x);
    for (size_t d = 1; d + 1 < t.shape.size(); ++d)
      assert(t.sharding[d].empty() && "rows view of a tensor sharded past dim 0");
    return {{t.NumElements() / t.shape.back(), t.shape.back()}, {t.sharding[0], {}}};
  }
  /// Elements of `x`.
  double Elems(const std::string& x) const { return static_cast<double>(b_.Get(x).NumElements()); }

  /// `name`: x's elements viewed as `layout` (identity, no bytes), keeping
  /// x's partial axes.
  std::string View(const std::string& name, const std::string& x, Layout layout) {
    const Tensor& t = b_.Get(x);
    Axes partial = t.partial;
    const DType dtype = t.dtype;
    b_.AddTensor(name, std::move(layout.shape), dtype, std::move(layout.sharding),
                 std::move(partial));
    b_.SetBytes(b_.AddCompute(name, ComputeType::kIdentity, {x}, {name}, 0), 0);
    return name;
  }

  /// The constant [1, n] all-ones input, a matmul operand that sums rows.
  std::string Ones(int64_t n) {
    const std::string name = "const.ones." + std::to_string(n);
    if (consts_.insert(name).second) b_.AddTensor(name, {1, n}, c_.dtype, {{}, {}});
    return name;
  }

  /// The constant i32 index input of a permutation gather (values in
  /// docs/evoformer.md), shared by every gather with the same key.
  std::string PermIds(const Layout& in, const std::vector<int>& perm, const Layout& ids) {
    std::string name = "const.perm." + JoinDims(in.shape) + ".p";
    for (int p : perm) name += std::to_string(p);
    name += ".i" + JoinDims(ids.shape);
    for (size_t d = 0; d < ids.sharding.size(); ++d)
      if (!ids.sharding[d].empty()) name += ".s" + std::to_string(d);
    if (consts_.insert(name).second) b_.AddTensor(name, ids.shape, DType::kI32, ids.sharding);
    return name;
  }

  // ---- permutations (the vocabulary has no transpose) ----------------------

  /// `name` = x's elements viewed as `in`, permuted (output dim i is input
  /// dim perm[i]) and viewed as `out`: an identity view of x as a [rows, h]
  /// table and an `embedding` row gather with a constant index tensor (h is
  /// the last dim when it stays last, else 1), plus a final view when the
  /// gathered shape is not `out`. Bytes: one read and one write of x.
  std::string Permute(const std::string& name, const std::string& x, const Layout& in,
                      const std::vector<int>& perm, const Layout& out) {
    const size_t n = in.shape.size();
    const bool keep_last = perm.back() == static_cast<int>(n) - 1;
    const int64_t h = keep_last ? in.shape.back() : 1;
    Layout permuted;
    for (int p : perm) {
      permuted.shape.push_back(in.shape[p]);
      permuted.sharding.push_back(in.sharding[p]);
    }
    if (!keep_last) {
      permuted.shape.push_back(1);
      permuted.sharding.push_back({});
    }
    const bool direct = keep_last && out.shape.back() == h;
    Layout gathered = direct ? out : permuted;
    Layout ids = gathered;
    ids.shape.pop_back();
    ids.sharding.pop_back();
    const bool sharded = HasSharding(x);
    Layout table = {{static_cast<int64_t>(Elems(x)) / h, h}, {sharded ? Dap() : Axes{}, {}}};
    std::string rows = View(name + ".table", x, table);
    std::string idx = PermIds(in, perm, ids);
    std::string y = Act(direct ? name : name + ".gather", gathered);
    int id = b_.AddCompute(name + ".gather", ComputeType::kEmbedding, {rows, idx}, {y}, 0);
    b_.SetBytes(id, 2.0 * b_.Get(y).Bytes());
    return direct ? y : View(name, y, out);
  }
  /// Whether any dim of x is sharded.
  bool HasSharding(const std::string& x) const {
    for (const auto& axes : b_.Get(x).sharding)
      if (!axes.empty()) return true;
    return false;
  }

  // ---- DAP collectives -----------------------------------------------------

  /// All-gathers x over dap along `dim` (FastFold's gather); x when dap = 1.
  std::string AllGather(const std::string& name, const std::string& x, int dim) {
    if (n_ == 1) return x;
    Layout l = LayoutOf(x);
    l.shape[dim] *= n_;
    l.sharding[dim] = {};
    Act(name, l);
    b_.AddCollective(name, CollectiveType::kAllGather, x, name, {kDap}, ReduceOp::kSum,
                     kActivation);
    return name;
  }
  /// Reduce-scatters the dap-partial x along `dim`: the all-gather's backward.
  std::string ReduceScatter(const std::string& name, const std::string& x, int dim) {
    if (n_ == 1) return x;
    Layout l = LayoutOf(x);
    l.shape[dim] /= n_;
    l.sharding[dim] = Dap();
    Act(name, l);
    b_.AddCollective(name, CollectiveType::kReduceScatter, x, name, {kDap}, ReduceOp::kSum,
                     kActivation);
    return name;
  }
  /// FastFold's row/column switch as a global transpose of the first two
  /// dims: x [A/N, B, C] (dim 0 sharded) -> [B/N, A, C] (dim 0 sharded). With
  /// dap = 1 a local permute; else pack (each destination's block made
  /// contiguous), all-to-all over dap, unpack. Its own backward.
  std::string Switch(const std::string& name, const std::string& x) {
    const Shape shape = b_.Get(x).shape;
    const int64_t al = shape[0], b = shape[1], c = shape[2], bl = b / n_;
    if (n_ == 1) return Permute(name, x, {shape, Sh(3, -1)}, {1, 0, 2}, {{b, al, c}, Sh(3, -1)});
    Layout packed = {{n_, bl, al, c}, Sh(4, 2)};
    std::string pre = Permute(name + ".pack", x, {{al, n_, bl, c}, Sh(4, 0)}, {1, 2, 0, 3}, packed);
    Layout received = {{n_, bl, al, c}, Sh(4, 1)};
    Act(name + ".a2a", received);
    b_.AddCollective(name + ".a2a", CollectiveType::kAllToAll, pre, name + ".a2a", {kDap},
                     ReduceOp::kSum, kActivation);
    return Permute(name, name + ".a2a", received, {1, 0, 2, 3}, {{bl, n_ * al, c}, Sh(3, 0)});
  }

  // ---- compute helpers -----------------------------------------------------

  /// `name` = op(a) @ op(b) laid out as `out`; 2 * |out| * k flops.
  std::string Matmul(const std::string& name, const std::string& a, const std::string& b,
                     bool ta, bool tb, Layout out, Axes partial = {}) {
    const Shape& as = b_.Get(a).shape;
    const int64_t k = ta ? as[as.size() - 2] : as.back();
    Act(name, std::move(out), std::move(partial));
    b_.AddCompute(name, ComputeType::kMatmul, {a, b}, {name}, 2.0 * Elems(name) * k,
                  {{"transpose_a", ta ? 1.0 : 0.0}, {"transpose_b", tb ? 1.0 : 0.0}});
    return name;
  }
  /// An elementwise op `name` of `type` over `inputs`, output shaped like the first.
  std::string Elementwise(const std::string& name, ComputeType type,
                          std::vector<std::string> inputs, double flops_per_elem,
                          lower::Attrs attrs = {}) {
    b_.AddLike(name, inputs[0], c_.dtype);
    b_.AddCompute(name, type, std::move(inputs), {name}, flops_per_elem * Elems(name),
                  std::move(attrs));
    return name;
  }
  /// `name` = x + y (y broadcast over x's leading dims).
  std::string Add(const std::string& name, const std::string& x, const std::string& y) {
    return Elementwise(name, ComputeType::kAdd, {x, y}, FlopsPerUnit(ComputeType::kAdd));
  }
  /// Running sum of same-shaped `terms` (autograd's gradient accumulation).
  std::string Sum(const std::string& name, const std::vector<std::string>& terms) {
    std::string acc = terms[0];
    for (size_t i = 1; i < terms.size(); ++i)
      acc = Add(i + 1 == terms.size() ? name : name + "." + std::to_string(i), acc, terms[i]);
    return acc;
  }
  /// `name` = x * factor.
  std::string Scale(const std::string& name, const std::string& x, double factor) {
    return Elementwise(name, ComputeType::kScale, {x}, FlopsPerUnit(ComputeType::kScale), {{"scale", factor}});
  }
  /// `name` = silu(gate) * x: AlphaFold's sigmoid gating with silu for sigmoid.
  std::string Gate(const std::string& name, const std::string& gate, const std::string& x) {
    return Elementwise(name, ComputeType::kSwiglu, {gate, x}, FlopsPerUnit(ComputeType::kSwiglu));
  }
  /// Backward of Gate: {dgate, dx}.
  std::pair<std::string, std::string> GateBackward(const std::string& name, const std::string& dy,
                                                   const std::string& gate,
                                                   const std::string& x) {
    std::string dgate = b_.AddLike(name + ".dgate", gate, c_.dtype);
    std::string dx = b_.AddLike(name + ".dx", x, c_.dtype);
    b_.AddCompute(name, ComputeType::kSwigluGrad, {dy, gate, x}, {dgate, dx},
                  FlopsPerUnit(ComputeType::kSwigluGrad) * Elems(dy));
    return {dgate, dx};
  }

  /// `name` = layer_norm(x) over the last dim with `name`.gamma and .beta.
  std::string Norm(const std::string& name, const std::string& x) {
    const int64_t ch = b_.Get(x).shape.back();
    params_.Declare(name + ".gamma", {ch}, layer_);
    params_.Declare(name + ".beta", {ch}, layer_);
    return Elementwise(name, ComputeType::kLayerNorm, {x, name + ".gamma", name + ".beta"},
                       FlopsPerUnit(ComputeType::kLayerNorm), {{"eps", kLayerNormEps}});
  }
  /// Backward of Norm `name` (input x): dx, and the parameter grads, synced.
  std::string NormBackward(const std::string& name, const std::string& x, const std::string& dy) {
    const std::string gamma = name + ".gamma", beta = name + ".beta";
    std::string dx = b_.AddLike(name + ".grad", x, c_.dtype);
    std::string dgamma = params_.NewGrad(gamma), dbeta = params_.NewGrad(beta);
    b_.AddCompute(name + ".grad", ComputeType::kLayerNormGrad, {dy, x, gamma},
                  {dx, dgamma, dbeta}, FlopsPerUnit(ComputeType::kLayerNormGrad) * Elems(x),
                  {{"eps", kLayerNormEps}});
    params_.Sync(gamma, dgamma);
    params_.Sync(beta, dbeta);
    return dx;
  }

  /// `name` = x @ `name`.w ([in, out], declared here): a linear layer without
  /// bias over x's last dim.
  std::string Linear(const std::string& name, const std::string& x, int64_t out) {
    Layout l = LayoutOf(x);
    const int64_t in = l.shape.back();
    l.shape.back() = out;
    params_.Declare(name + ".w", {in, out}, layer_);
    return Matmul(name, x, name + ".w", false, false, std::move(l));
  }
  /// Backward of Linear `name` (input x): dX = dy W^T, then the weight grad.
  std::string LinearBackward(const std::string& name, const std::string& x, const std::string& dy) {
    std::string dx = Matmul(name + ".dX", dy, name + ".w", false, true, LayoutOf(x));
    WeightGrad(name, x, dy);
    return dx;
  }
  /// dW = x^T dy over all rows: one identity op views both as 2-D (no
  /// bytes), a 2-D matmul with transpose_a, then the sync.
  void WeightGrad(const std::string& name, const std::string& x, const std::string& dy) {
    const std::string w = name + ".w";
    std::string x2d = Act(name + ".dW.x2d", RowsLayout(x));
    std::string dy2d = Act(name + ".dW.dy2d", RowsLayout(dy));
    b_.SetBytes(b_.AddCompute(name + ".dW.view", ComputeType::kIdentity, {x, dy}, {x2d, dy2d}, 0),
                0);
    std::string grad = params_.NewGrad(w);
    const int64_t rows = b_.Get(x2d).shape[0];
    const double flops = 2.0 * rows * Elems(w);
    b_.AddCompute(name + ".dW", ComputeType::kMatmul, {x2d, dy2d}, {grad}, flops,
                  {{"transpose_a", 1}, {"transpose_b", 0}});
    params_.Sync(w, grad);
  }

  /// `name` = W^T x2d^T [out, rows] with W `name`.w [in, out]: a projection
  /// of x2d [rows, in] emitted channel-major (one 2-D matmul, both transposed).
  std::string LinearT(const std::string& name, const std::string& x2d, int64_t out) {
    const Tensor& t = b_.Get(x2d);
    const int64_t rows = t.shape[0], in = t.shape[1];
    Layout l = {{out, rows}, {{}, t.sharding[0]}};
    params_.Declare(name + ".w", {in, out}, layer_);
    return Matmul(name, name + ".w", x2d, true, true, std::move(l));
  }
  /// Backward of LinearT `name`: d(x2d) = dyT^T W^T, dW = x2d^T dyT^T (synced).
  std::string LinearTBackward(const std::string& name, const std::string& x2d,
                              const std::string& dyt) {
    const std::string w = name + ".w";
    std::string dx = Matmul(name + ".dX", dyt, w, true, true, LayoutOf(x2d));
    std::string grad = params_.NewGrad(w);
    const double flops = 2.0 * b_.Get(x2d).shape[0] * Elems(w);
    b_.AddCompute(name + ".dW", ComputeType::kMatmul, {x2d, dyt}, {grad}, flops,
                  {{"transpose_a", 1}, {"transpose_b", 1}});
    params_.Sync(w, grad);
    return dx;
  }

  /// `name` = x [rows, ...] summed over its first dim, viewed as `out`:
  /// ones [1, rows] @ x [rows, rest]. Partial over dap (rows are a shard).
  std::string SumRows(const std::string& name, const std::string& x, const Shape& out) {
    const Tensor& t = b_.Get(x);
    const int64_t rows = t.shape[0], rest = t.NumElements() / rows;
    std::string x2d = View(name + ".2d", x, {{rows, rest}, {t.sharding[0], {}}});
    std::string sum = Matmul(name + ".sum", Ones(rows), x2d, false, false, {{1, rest}, {{}, {}}},
                             Dap());
    return View(name, sum, {out, Sharding(out.size())});
  }

  // ---- attention modules ---------------------------------------------------

  /// The pair bias [H, len, len]: a channel-major projection of the normed
  /// pair src2d [rl*r, c_z] to [H, rl*r], viewed [H, rl, r] and all-gathered
  /// over dap on dim 1.
  std::string PairBias(const std::string& p, const std::string& src2d, int64_t heads) {
    std::string bt = LinearT(p, src2d, heads);
    std::string b3 = View(p + ".3d", bt, {{heads, rl_, r_}, Sh(3, 1)});
    return AllGather(p + ".ag", b3, 1);
  }
  /// Backward of PairBias: reduce-scatter of the bias grad, view, projection
  /// backward. Returns d(src2d).
  std::string PairBiasBackward(const std::string& p, const std::string& src2d,
                               const std::string& dbias, int64_t heads) {
    std::string d3 = ReduceScatter(p + ".grad.rs", dbias, 1);
    std::string d2 = View(p + ".grad.2d", d3, {{heads, rl_ * r_}, Sh(2, 1)});
    return LinearTBackward(p, src2d, d2);
  }

  /// Token-major view [rows, len, H, c] of q, k, v or o.
  Layout TokenLayout(const AttnSpec& s) const {
    return {{s.rows, s.len, s.heads, s.head_dim}, Sh(4, 0)};
  }
  /// Head-major layout [rows, H, len, c] of the explicit attention.
  Layout HeadLayout(const AttnSpec& s) const {
    return {{s.rows, s.heads, s.len, s.head_dim}, Sh(4, 0)};
  }
  /// The projections' layout [rows, len, H*c].
  Layout FlatLayout(const AttnSpec& s) const {
    return {{s.rows, s.len, s.heads * s.head_dim}, Sh(3, 0)};
  }

  /// Softmax(q k^T / sqrt(c) + bias) v per row and head, explicitly: q, k, v
  /// permuted head-major, q scaled, scores matmul, bias add (broadcast over
  /// rows), softmax, probabilities x v, permuted back. Returns [rows, len, H*c].
  std::string BiasedAttention(const AttnSpec& s, const AttnActs& a, const std::string& bias,
                              CoreActs* core) {
    const std::string p = s.prefix + ".core";
    const std::vector<int> swap = {0, 2, 1, 3};
    std::string qh = Permute(p + ".q_heads", a.q, TokenLayout(s), swap, HeadLayout(s));
    core->kh = Permute(p + ".k_heads", a.k, TokenLayout(s), swap, HeadLayout(s));
    core->vh = Permute(p + ".v_heads", a.v, TokenLayout(s), swap, HeadLayout(s));
    core->qs = Scale(p + ".q_scale", qh, 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
    Layout scores = {{s.rows, s.heads, s.len, s.len}, Sh(4, 0)};
    std::string logits = Matmul(p + ".scores", core->qs, core->kh, false, true, scores);
    std::string biased = Add(p + ".bias_add", logits, bias);
    core->probs = Elementwise(p + ".softmax", ComputeType::kSoftmax, {biased},
                              FlopsPerUnit(ComputeType::kSoftmax));
    std::string oh = Matmul(p + ".pv", core->probs, core->vh, false, false, HeadLayout(s));
    return Permute(p, oh, HeadLayout(s), swap, FlatLayout(s));
  }
  /// Backward of BiasedAttention: dq, dk, dv [rows, len, H*c] and the bias
  /// grad [H, len, len], summed over this rank's rows (partial over dap).
  void BiasedAttentionBackward(const AttnSpec& s, const CoreActs& core, const std::string& dout,
                               std::string* dq, std::string* dk, std::string* dv,
                               std::string* dbias) {
    const std::string p = s.prefix + ".core.grad";
    const std::vector<int> swap = {0, 2, 1, 3};
    Layout scores = {{s.rows, s.heads, s.len, s.len}, Sh(4, 0)};
    std::string doh = Permute(p + ".do_heads", dout, TokenLayout(s), swap, HeadLayout(s));
    std::string dprobs = Matmul(p + ".dprobs", doh, core.vh, false, true, scores);
    std::string dvh = Matmul(p + ".dv_heads", core.probs, doh, true, false, HeadLayout(s));
    std::string dscores = Elementwise(p + ".softmax", ComputeType::kSoftmaxGrad,
                                      {dprobs, core.probs}, FlopsPerUnit(ComputeType::kSoftmaxGrad));
    *dbias = SumRows(p + ".dbias", dscores, {s.heads, s.len, s.len});
    std::string dqs = Matmul(p + ".dq_scaled", dscores, core.kh, false, false, HeadLayout(s));
    std::string dkh = Matmul(p + ".dk_heads", dscores, core.qs, true, false, HeadLayout(s));
    std::string dqh = Scale(p + ".q_scale", dqs, 1.0 / std::sqrt(static_cast<double>(s.head_dim)));
    *dq = Permute(p + ".dq", dqh, HeadLayout(s), swap, FlatLayout(s));
    *dk = Permute(p + ".dk", dkh, HeadLayout(s), swap, FlatLayout(s));
    *dv = Permute(p + ".dv", dvh, HeadLayout(s), swap, FlatLayout(s));
  }

  /// Attention flops 4 * rows * len^2 * H * c (scores and probabilities x v).
  static double AttentionFlops(const AttnSpec& s) {
    return 4.0 * s.rows * s.len * s.len * s.heads * s.head_dim;
  }
  /// Attributes of the unbiased attention op.
  static lower::Attrs AttentionAttrs(const AttnSpec& s) {
    return {{"heads", static_cast<double>(s.heads)},
            {"kv_heads", static_cast<double>(s.heads)},
            {"causal", 0}};
  }
  /// The unbiased core: one attention op over q, k, v [rows, len, H*c].
  std::string PlainAttention(const AttnSpec& s, const AttnActs& a) {
    const std::string name = s.prefix + ".core";
    b_.AddLike(name, a.q, c_.dtype);
    b_.AddCompute(name, ComputeType::kAttention, {a.q, a.k, a.v}, {name}, AttentionFlops(s),
                  AttentionAttrs(s));
    return name;
  }
  /// Backward of PlainAttention: attention_grad (kAttentionGradFlops x the forward's).
  void PlainAttentionBackward(const AttnSpec& s, const AttnActs& a, const std::string& dout,
                              std::string* dq, std::string* dk, std::string* dv) {
    const std::string name = s.prefix + ".core.grad";
    *dq = b_.AddLike(name + ".dq", a.q, c_.dtype);
    *dk = b_.AddLike(name + ".dk", a.k, c_.dtype);
    *dv = b_.AddLike(name + ".dv", a.v, c_.dtype);
    b_.AddCompute(name, ComputeType::kAttentionGrad, {dout, a.q, a.k, a.v}, {*dq, *dk, *dv},
                  kAttentionGradFlops * AttentionFlops(s), AttentionAttrs(s));
  }

  /// A gated self-attention module on residual stream x (z: the pair that
  /// biases MSA row attention): LayerNorm, q/k/v/gate projections, the core,
  /// gating, output projection, residual add.
  std::string AttentionForward(const AttnSpec& s, const std::string& x, const std::string& z,
                               AttnActs* a) {
    a->x = x;
    a->xn = Norm(s.prefix + ".ln", x);
    std::string bias;
    if (s.biased) {
      a->z = z;
      a->bias_x = s.own_bias ? a->xn : Norm(s.prefix + ".ln_z", z);
      a->bias_src = View(s.prefix + ".bias.src", a->bias_x, RowsLayout(a->bias_x));
      bias = PairBias(s.prefix + ".bias", a->bias_src, s.heads);
    }
    const int64_t width = s.heads * s.head_dim;
    a->q = Linear(s.prefix + ".q", a->xn, width);
    a->k = Linear(s.prefix + ".k", a->xn, width);
    a->v = Linear(s.prefix + ".v", a->xn, width);
    a->g = Linear(s.prefix + ".g", a->xn, width);
    a->o = s.biased ? BiasedAttention(s, *a, bias, &a->core) : PlainAttention(s, *a);
    a->go = Gate(s.prefix + ".gate", a->g, a->o);
    std::string out = Linear(s.prefix + ".out", a->go, s.channels);
    return Add(s.prefix + ".res", x, out);
  }
  /// Backward of AttentionForward given dy; returns dx. For the MSA row
  /// attention *dz receives the grad of the biasing pair.
  std::string AttentionBackward(const AttnSpec& s, const AttnActs& a, const std::string& dy,
                                std::string* dz) {
    std::string dgo = LinearBackward(s.prefix + ".out", a.go, dy);
    auto [dg, dout] = GateBackward(s.prefix + ".gate.grad", dgo, a.g, a.o);
    std::string dq, dk, dv, dbias;
    if (s.biased) {
      BiasedAttentionBackward(s, a.core, dout, &dq, &dk, &dv, &dbias);
    } else {
      PlainAttentionBackward(s, a, dout, &dq, &dk, &dv);
    }
    std::vector<std::string> terms = {LinearBackward(s.prefix + ".q", a.xn, dq),
                                      LinearBackward(s.prefix + ".k", a.xn, dk),
                                      LinearBackward(s.prefix + ".v", a.xn, dv),
                                      LinearBackward(s.prefix + ".g", a.xn, dg)};
    if (s.biased) {
      std::string dsrc2d = PairBiasBackward(s.prefix + ".bias", a.bias_src, dbias, s.heads);
      std::string dsrc = View(s.prefix + ".bias.src.grad", dsrc2d, LayoutOf(a.bias_x));
      if (s.own_bias) {
        terms.push_back(dsrc);
      } else {
        *dz = NormBackward(s.prefix + ".ln_z", a.z, dsrc);
      }
    }
    std::string dxn = Sum(s.prefix + ".ln.dy", terms);
    return Add(s.prefix + ".res.grad", dy, NormBackward(s.prefix + ".ln", a.x, dxn));
  }

  // ---- transitions and the outer-product mean ------------------------------

  /// LayerNorm, widen by transition_mult, gelu (for ReLU), narrow, residual.
  std::string TransitionForward(const std::string& p, const std::string& x, TransitionActs* a) {
    const int64_t ch = b_.Get(x).shape.back();
    a->x = x;
    a->xn = Norm(p + ".ln", x);
    a->h = Linear(p + ".fc1", a->xn, ch * c_.transition_mult);
    a->act = Elementwise(p + ".gelu", ComputeType::kGelu, {a->h}, FlopsPerUnit(ComputeType::kGelu));
    return Add(p + ".res", x, Linear(p + ".fc2", a->act, ch));
  }
  /// Backward of a transition; returns dx.
  std::string TransitionBackward(const std::string& p, const TransitionActs& a,
                                 const std::string& dy) {
    std::string dact = LinearBackward(p + ".fc2", a.act, dy);
    std::string dh = Elementwise(p + ".gelu.grad", ComputeType::kGeluGrad, {dact, a.h},
                                 FlopsPerUnit(ComputeType::kGeluGrad));
    std::string dxn = LinearBackward(p + ".fc1", a.xn, dh);
    return Add(p + ".res.grad", dy, NormBackward(p + ".ln", a.x, dxn));
  }

  /// Outer-product mean from the column-phase MSA mt [rl, s, c_m] into z
  /// [rl, r, c_z]: a, b projections swapped to [s, rl, c]; b all-gathered
  /// over residues; one 2-D matmul a^T b = [rl*c, r*c]; a permute to
  /// [rl, r, c*c]; the output projection; the mean (scale 1/s); residual add.
  std::string OpmForward(const std::string& p, const std::string& mt, const std::string& z,
                         OpmActs* a) {
    const int64_t co = c_.opm_hidden;
    a->mt = mt;
    a->mn = Norm(p + ".ln", mt);
    std::string at = Linear(p + ".a", a->mn, co);
    std::string bt = Linear(p + ".b", a->mn, co);
    Layout col = {{rl_, s_, co}, Sh(3, 0)}, row = {{s_, rl_, co}, Sh(3, 1)};
    std::string as = Permute(p + ".a.swap", at, col, {1, 0, 2}, row);
    std::string bs = Permute(p + ".b.swap", bt, col, {1, 0, 2}, row);
    std::string bg = AllGather(p + ".b.ag", bs, 1);
    a->a2 = View(p + ".a.2d", as, {{s_, rl_ * co}, Sh(2, 1)});
    a->b2 = View(p + ".b.2d", bg, {{s_, r_ * co}, Sh(2, -1)});
    std::string outer = Matmul(p + ".outer", a->a2, a->b2, true, false, {{rl_ * co, r_ * co}, Sh(2, 0)});
    a->outer = Permute(p + ".outer.swap", outer, {{rl_, co, r_, co}, Sh(4, 0)}, {0, 2, 1, 3},
                       {{rl_, r_, co * co}, Sh(3, 0)});
    std::string proj = Linear(p + ".out", a->outer, c_.c_z);
    return Add(p + ".res", z, Scale(p + ".mean", proj, 1.0 / static_cast<double>(s_)));
  }
  /// Backward of the outer-product mean given dz (which also passes the
  /// residual unchanged); returns its contribution to d(mt).
  std::string OpmBackward(const std::string& p, const OpmActs& a, const std::string& dz) {
    const int64_t co = c_.opm_hidden;
    std::string dproj = Scale(p + ".mean.grad", dz, 1.0 / static_cast<double>(s_));
    std::string dx = LinearBackward(p + ".out", a.outer, dproj);
    std::string douter = Permute(p + ".outer.swap.grad", dx, {{rl_, r_, co, co}, Sh(4, 0)},
                                 {0, 2, 1, 3}, {{rl_ * co, r_ * co}, Sh(2, 0)});
    std::string da2 = Matmul(p + ".outer.grad.da", a.b2, douter, false, true, LayoutOf(a.a2));
    std::string db2 = Matmul(p + ".outer.grad.db", a.a2, douter, false, false,
                             {{s_, r_ * co}, Sh(2, -1)}, Dap());
    Layout row = {{s_, rl_, co}, Sh(3, 1)}, col = {{rl_, s_, co}, Sh(3, 0)};
    std::string da = View(p + ".a.grad.3d", da2, row);
    std::string dbg = View(p + ".b.grad.3d", db2, {{s_, r_, co}, Sh(3, -1)});
    std::string db = ReduceScatter(p + ".b.grad.rs", dbg, 1);
    std::string dat = Permute(p + ".a.swap.grad", da, row, {1, 0, 2}, col);
    std::string dbt = Permute(p + ".b.swap.grad", db, row, {1, 0, 2}, col);
    std::string dmn = Add(p + ".ln.dy", LinearBackward(p + ".a", a.mn, dat),
                          LinearBackward(p + ".b", a.mn, dbt));
    return NormBackward(p + ".ln", a.mt, dmn);
  }

  // ---- triangle multiplication ---------------------------------------------

  /// One gated channel-major projection pair of a triangle multiplication
  /// ("a" or "b"): silu(gate) * proj as [c, rl*r].
  std::string TriProjection(const std::string& p, const std::string& which,
                            const std::string& x2d, std::string* proj, std::string* gate) {
    *proj = LinearT(p + "." + which + "_proj", x2d, c_.tri_mul_hidden);
    *gate = LinearT(p + "." + which + "_gate", x2d, c_.tri_mul_hidden);
    return Gate(p + "." + which, *gate, *proj);
  }

  /// Triangle multiplication on a row-sharded pair x [rl, r, c_z] in the
  /// outgoing form out[i, j] = sum_k left[i, k] * right[j, k] per channel:
  /// outgoing on z (left = a, right = b), incoming on the transposed pair
  /// (left = b, right = a). right is all-gathered over dap.
  std::string TriMulForward(const std::string& p, bool incoming, const std::string& x,
                            TriMulActs* a) {
    const int64_t ct = c_.tri_mul_hidden;
    a->x = x;
    a->xn = Norm(p + ".ln_in", x);
    a->x2d = View(p + ".ln_in.2d", a->xn, RowsLayout(a->xn));
    std::string l2 = TriProjection(p, incoming ? "b" : "a", a->x2d, &a->lp, &a->lg);
    std::string r2 = TriProjection(p, incoming ? "a" : "b", a->x2d, &a->rp, &a->rg);
    Layout part = {{ct, rl_, r_}, Sh(3, 1)};
    a->left = View(l2 + ".3d", l2, part);
    a->right = AllGather(r2 + ".ag", View(r2 + ".3d", r2, part), 1);
    std::string pt = Matmul(p + ".core", a->left, a->right, false, true, part);
    a->p = Permute(p + ".core.swap", pt, part, {1, 2, 0}, {{rl_, r_, ct}, Sh(3, 0)});
    a->pn = Norm(p + ".ln_out", a->p);
    a->po = Linear(p + ".out", a->pn, c_.c_z);
    a->g = Linear(p + ".g", a->xn, c_.c_z);
    return Add(p + ".res", x, Gate(p + ".gate", a->g, a->po));
  }
  /// Backward of TriMulForward given dy; returns dx.
  std::string TriMulBackward(const std::string& p, bool incoming, const TriMulActs& a,
                             const std::string& dy) {
    const int64_t ct = c_.tri_mul_hidden;
    const std::string ln = incoming ? "b" : "a", rn = incoming ? "a" : "b";
    auto [dg, dpo] = GateBackward(p + ".gate.grad", dy, a.g, a.po);
    std::string dpn = LinearBackward(p + ".out", a.pn, dpo);
    std::string dp = NormBackward(p + ".ln_out", a.p, dpn);
    Layout part = {{ct, rl_, r_}, Sh(3, 1)}, flat = {{ct, rl_ * r_}, Sh(2, 1)};
    std::string dpt = Permute(p + ".core.swap.grad", dp, LayoutOf(a.p), {2, 0, 1}, part);
    std::string dl = Matmul(p + ".core.grad.dl", dpt, a.right, false, false, part);
    std::string dr = Matmul(p + ".core.grad.dr", dpt, a.left, true, false,
                            {{ct, r_, r_}, Sh(3, -1)}, Dap());
    std::string drs = ReduceScatter(p + "." + rn + ".grad.rs", dr, 1);
    auto [dlg, dlp] = GateBackward(p + "." + ln + ".grad", View(p + "." + ln + ".grad.2d", dl, flat),
                                   a.lg, a.lp);
    auto [drg, drp] = GateBackward(p + "." + rn + ".grad",
                                   View(p + "." + rn + ".grad.2d", drs, flat), a.rg, a.rp);
    std::string dx2d = Sum(p + ".proj.dX", {LinearTBackward(p + "." + ln + "_proj", a.x2d, dlp),
                                            LinearTBackward(p + "." + ln + "_gate", a.x2d, dlg),
                                            LinearTBackward(p + "." + rn + "_proj", a.x2d, drp),
                                            LinearTBackward(p + "." + rn + "_gate", a.x2d, drg)});
    std::string dxn = Add(p + ".ln_in.dy", View(p + ".proj.dX.3d", dx2d, LayoutOf(a.xn)),
                          LinearBackward(p + ".g", a.xn, dg));
    return Add(p + ".res.grad", dy, NormBackward(p + ".ln_in", a.x, dxn));
  }

  // ---- blocks --------------------------------------------------------------

  /// MSA row attention of the block with prefix p: rows s/N, length r, biased by z.
  AttnSpec MsaRowSpec(const std::string& p) const {
    return {p + "msa_row", c_.msa_heads, c_.msa_head_dim, sl_, r_, c_.c_m, true, false};
  }
  /// MSA column attention: rows r/N, length s, unbiased (the attention op).
  AttnSpec MsaColSpec(const std::string& p) const {
    return {p + "msa_col", c_.msa_heads, c_.msa_head_dim, rl_, s_, c_.c_m, false, false};
  }
  /// Triangle attention `name`: rows r/N, length r, biased by its own input.
  AttnSpec TriAttSpec(const std::string& name) const {
    return {name, c_.tri_heads, c_.tri_head_dim, rl_, r_, c_.c_z, true, true};
  }

  /// One Evoformer block on the row-sharded MSA m [s/N, r, c_m] and pair z
  /// [r/N, r, c_z]; returns both, row-sharded. "_t" is the transposed
  /// (column-phase) layout: MSA [r/N, s, c_m], pair [r/N(j), r(i), c_z].
  std::pair<std::string, std::string> BlockForward(int l, const std::string& m0,
                                                   const std::string& z0) {
    SetLayer(l);
    BlockActs& a = acts_[l];
    const std::string p = "b" + std::to_string(l) + ".";
    std::string m1 = AttentionForward(MsaRowSpec(p), m0, z0, &a.msa_row);      // all-gather 1
    std::string mt1 = Switch(p + "msa.to_col", m1);                             // all-to-all 1
    std::string mt2 = AttentionForward(MsaColSpec(p), mt1, "", &a.msa_col);
    std::string mt3 = TransitionForward(p + "msa_transition", mt2, &a.msa_tr);
    std::string z1 = OpmForward(p + "opm", mt3, z0, &a.opm);                    // all-gather 2
    std::string m_out = Switch(p + "msa.to_row", mt3);                          // all-to-all 2
    std::string z2 = TriMulForward(p + "tri_mul_out", false, z1, &a.mul_out);   // all-gather 3
    std::string zt2 = Switch(p + "pair.to_col1", z2);                           // all-to-all 3
    std::string zt3 = TriMulForward(p + "tri_mul_in", true, zt2, &a.mul_in);    // all-gather 4
    std::string z3 = Switch(p + "pair.to_row1", zt3);                           // all-to-all 4
    std::string z4 = AttentionForward(TriAttSpec(p + "tri_att_start"), z3, "", &a.att_start);
    std::string zt4 = Switch(p + "pair.to_col2", z4);                           // all-to-all 5
    std::string zt5 = AttentionForward(TriAttSpec(p + "tri_att_end"), zt4, "", &a.att_end);
    std::string zt6 = TransitionForward(p + "pair_transition", zt5, &a.pair_tr);
    return {m_out, Switch(p + "pair.to_row2", zt6)};                            // all-to-all 6
  }

  /// Backward of block `l` given the grads of its outputs; returns the grads
  /// of its inputs. Mirrors BlockForward: each switch's backward is a switch,
  /// each all-gather's a reduce-scatter.
  std::pair<std::string, std::string> BlockBackward(int l, const std::string& dm_out,
                                                    const std::string& dz_out) {
    SetLayer(l);
    const BlockActs& a = acts_[l];
    const std::string p = "b" + std::to_string(l) + ".";
    const std::string g = ".grad";
    std::string dmt3_skip = Switch(p + "msa.to_row" + g, dm_out);
    std::string dzt6 = Switch(p + "pair.to_row2" + g, dz_out);
    std::string dzt5 = TransitionBackward(p + "pair_transition", a.pair_tr, dzt6);
    std::string dzt4 = AttentionBackward(TriAttSpec(p + "tri_att_end"), a.att_end, dzt5, nullptr);
    std::string dz4 = Switch(p + "pair.to_col2" + g, dzt4);
    std::string dz3 = AttentionBackward(TriAttSpec(p + "tri_att_start"), a.att_start, dz4, nullptr);
    std::string dzt3 = Switch(p + "pair.to_row1" + g, dz3);
    std::string dzt2 = TriMulBackward(p + "tri_mul_in", true, a.mul_in, dzt3);
    std::string dz2 = Switch(p + "pair.to_col1" + g, dzt2);
    std::string dz1 = TriMulBackward(p + "tri_mul_out", false, a.mul_out, dz2);
    std::string dmt3 = Add(p + "msa.dy", dmt3_skip, OpmBackward(p + "opm", a.opm, dz1));
    std::string dmt2 = TransitionBackward(p + "msa_transition", a.msa_tr, dmt3);
    std::string dmt1 = AttentionBackward(MsaColSpec(p), a.msa_col, dmt2, nullptr);
    std::string dm1 = Switch(p + "msa.to_col" + g, dmt1);
    std::string dz_bias;
    std::string dm0 = AttentionBackward(MsaRowSpec(p), a.msa_row, dm1, &dz_bias);
    return {dm0, Add(p + "pair.dy", dz1, dz_bias)};
  }

  // ---- heads and loss ------------------------------------------------------

  /// The softmax cross entropy of `logits` [rows..., classes] (row-sharded
  /// over dap like `labels`) against the integer graph input `labels`:
  /// max, sum of exponentials and target logit per row (f32), then
  /// `name`.cross_entropy -> scalar `name`, the mean over this rank's rows
  /// (the runtime's StepLoss averages these over ranks).
  void CrossEntropy(const std::string& name, const std::string& logits,
                    const std::string& labels, HeadActs* a) {
    Layout rows = LayoutOf(logits);
    rows.shape.pop_back();
    rows.sharding.pop_back();
    const double elems = Elems(logits);
    const double local_rows = elems / b_.Get(logits).shape.back();
    a->logits = logits;
    a->labels = b_.AddTensor(labels, rows.shape, DType::kI32, rows.sharding);
    a->max = b_.AddTensor(name + ".max", rows.shape, DType::kF32, rows.sharding);
    b_.AddCompute(name + ".max", ComputeType::kReduceMax, {logits}, {a->max},
                  FlopsPerUnit(ComputeType::kReduceMax) * elems);
    a->sum_exp = b_.AddTensor(name + ".sum_exp", rows.shape, DType::kF32, rows.sharding);
    b_.AddCompute(name + ".sum_exp", ComputeType::kSumExp, {logits, a->max}, {a->sum_exp},
                  FlopsPerUnit(ComputeType::kSumExp) * elems);
    std::string target = b_.AddTensor(name + ".target", rows.shape, DType::kF32, rows.sharding);
    b_.AddCompute(name + ".target", ComputeType::kGatherTarget, {logits, a->labels}, {target}, 0);
    std::string loss = b_.AddTensor(name, {}, DType::kF32, {});
    b_.AddCompute(name + ".cross_entropy", ComputeType::kCrossEntropy, {a->max, a->sum_exp, target},
                  {loss}, FlopsPerUnit(ComputeType::kCrossEntropy) * local_rows, {{"denominator", local_rows}});
  }
  /// Gradient of `weight` x the mean cross entropy over every rank's rows
  /// (all dap shards of all dp samples): cross_entropy_grad with the global
  /// label count as denominator, then `name`.weight scales it by `weight`.
  std::string CrossEntropyBackward(const std::string& name, const HeadActs& a, double weight) {
    const double elems = Elems(a.logits);
    const double global_rows =
        elems / b_.Get(a.logits).shape.back() * static_cast<double>(n_) * dp_;
    std::string dlogits = b_.AddLike(a.logits + ".grad", a.logits, c_.dtype);
    b_.AddCompute(name + ".cross_entropy.grad", ComputeType::kCrossEntropyGrad,
                  {a.logits, a.max, a.sum_exp, a.labels}, {dlogits},
                  FlopsPerUnit(ComputeType::kCrossEntropyGrad) * elems, {{"denominator", global_rows}});
    return Scale(name + ".weight", dlogits, weight);
  }

  /// AlphaFold's distogram head on the final pair z [r/N, r, c_z]: a linear
  /// layer to distogram_bins, symmetrised (logits_ij = h_ij + h_ji; the
  /// transpose is a switch, an all-to-all under dap), and its cross entropy
  /// against the graph input evo.distogram.labels [r/N, r].
  void DistogramForward(const std::string& z) {
    distogram_.x = z;
    std::string half = Linear("head.distogram", z, c_.distogram_bins);
    std::string mirror = Switch("head.distogram.mirror", half);
    CrossEntropy("loss.distogram", Add("head.distogram.logits", half, mirror),
                 "evo.distogram.labels", &distogram_);
  }
  /// Backward of the distogram head: d h = d logits + (d logits)^T (the same
  /// switch), then the linear layer. Returns d(z).
  std::string DistogramBackward() {
    std::string dlogits = CrossEntropyBackward("loss.distogram", distogram_, c_.distogram_weight);
    std::string dmirror = Switch("head.distogram.mirror.grad", dlogits);
    std::string dhalf = Add("head.distogram.grad", dlogits, dmirror);
    return LinearBackward("head.distogram", distogram_.x, dhalf);
  }
  /// AlphaFold's masked-MSA head on the final MSA m [s/N, r, c_m]: a linear
  /// layer to msa_classes and its cross entropy against the graph input
  /// evo.masked_msa.labels [s/N, r] (every position counts: no mask input).
  void MaskedMsaForward(const std::string& m) {
    masked_msa_.x = m;
    CrossEntropy("loss.masked_msa", Linear("head.masked_msa", m, c_.msa_classes),
                 "evo.masked_msa.labels", &masked_msa_);
  }
  /// Backward of the masked-MSA head. Returns d(m).
  std::string MaskedMsaBackward() {
    std::string dlogits =
        CrossEntropyBackward("loss.masked_msa", masked_msa_, c_.masked_msa_weight);
    return LinearBackward("head.masked_msa", masked_msa_.x, dlogits);
  }

  /// Tags the ops and parameters that follow with block `l`.
  void SetLayer(int l) {
    layer_ = l;
    b_.SetLayer(l);
  }

  const EvoformerConfig& c_;
  const int64_t n_;  // dap degree
  const int dp_;
  GraphBuilder b_;
  EvoParams params_;
  const int64_t s_, r_, sl_, rl_;  // n_seq, n_res and their dap shards
  int layer_ = -1;
  std::vector<BlockActs> acts_;
  HeadActs distogram_, masked_msa_;
  std::unordered_set<std::string> consts_;
};

// ---- presets and validation --------------------------------------------------

/// The tiny test preset: one block, small channels, dap up to 8 divides both axes.
EvoformerConfig TinyPreset() {
  EvoformerConfig c;
  c.name = "evoformer-tiny";
  c.blocks = 1;
  c.n_seq = 8;
  c.n_res = 16;
  c.c_m = 16;
  c.c_z = 8;
  c.msa_heads = 2;
  c.msa_head_dim = 4;
  c.tri_heads = 2;
  c.tri_head_dim = 4;
  c.opm_hidden = 4;
  c.tri_mul_hidden = 8;
  return c;
}

/// "evoformer 'x': <what>".
Status ConfigError(const EvoformerConfig& c, const std::string& what) {
  return Status::Error("evoformer '" + c.name + "': " + what);
}

}  // namespace

std::vector<std::string> EvoformerPresetNames() { return {"evoformer-tiny", "evoformer"}; }

Result<EvoformerConfig> EvoformerPreset(const std::string& name) {
  if (name == "evoformer") return EvoformerConfig{};
  if (name == "evoformer-tiny") return TinyPreset();
  return Status::Error("evoformer: unknown preset '" + name +
                       "' (known: evoformer-tiny, evoformer)");
}

Status ValidateEvoformer(const EvoformerConfig& c) {
  const std::pair<const char*, int> sizes[] = {
      {"blocks", c.blocks},         {"n_seq", c.n_seq},
      {"n_res", c.n_res},           {"c_m", c.c_m},
      {"c_z", c.c_z},               {"msa_heads", c.msa_heads},
      {"msa_head_dim", c.msa_head_dim}, {"tri_heads", c.tri_heads},
      {"tri_head_dim", c.tri_head_dim}, {"opm_hidden", c.opm_hidden},
      {"tri_mul_hidden", c.tri_mul_hidden}, {"transition_mult", c.transition_mult},
      {"batch", c.batch},           {"distogram_bins", c.distogram_bins},
      {"msa_classes", c.msa_classes}};
  for (const auto& [field, value] : sizes)
    if (value <= 0)
      return ConfigError(c, std::string(field) + " must be positive, got " + std::to_string(value));
  if (!(c.distogram_weight > 0) || !(c.masked_msa_weight > 0))
    return ConfigError(c, "loss weights must be positive, got distogram_weight " +
                              std::to_string(c.distogram_weight) + ", masked_msa_weight " +
                              std::to_string(c.masked_msa_weight));
  if (c.batch != 1)
    return ConfigError(c, "batch must be 1 (one sample per dp rank, as AlphaFold and FastFold "
                          "train; use dp for more), got " + std::to_string(c.batch));
  if (c.dtype == DType::kI32 || c.dtype == DType::kI64)
    return ConfigError(c, "dtype must be bf16, f16 or f32");
  return Status::Ok();
}

Status ValidateEvoformerPlan(const EvoformerConfig& c, int dp, int dap) {
  if (dp < 1) return ConfigError(c, "dp must be >= 1, got " + std::to_string(dp));
  if (dap < 1) return ConfigError(c, "dap must be >= 1, got " + std::to_string(dap));
  if (c.n_res % dap != 0)
    return ConfigError(c, "dap (" + std::to_string(dap) + ") must divide n_res (" +
                              std::to_string(c.n_res) + "): DAP shards the residue axis");
  if (c.n_seq % dap != 0)
    return ConfigError(c, "dap (" + std::to_string(dap) + ") must divide n_seq (" +
                              std::to_string(c.n_seq) + "): DAP shards the MSA sequence axis");
  return Status::Ok();
}

int64_t EvoformerBlockParameterCount(const EvoformerConfig& c) {
  const int64_t cm = c.c_m, cz = c.c_z, t = c.transition_mult;
  const int64_t msa_w = int64_t{c.msa_heads} * c.msa_head_dim;
  const int64_t tri_w = int64_t{c.tri_heads} * c.tri_head_dim;
  const int64_t co = c.opm_hidden, ct = c.tri_mul_hidden;
  const int64_t row = 2 * cm + 2 * cz + 4 * cm * msa_w + cz * c.msa_heads + msa_w * cm;
  const int64_t col = 2 * cm + 4 * cm * msa_w + msa_w * cm;
  const int64_t msa_transition = 2 * cm + 2 * t * cm * cm;
  const int64_t opm = 2 * cm + 2 * cm * co + co * co * cz;
  const int64_t tri_mul = 2 * cz + 4 * cz * ct + 2 * ct + ct * cz + cz * cz;
  const int64_t tri_att = 2 * cz + 4 * cz * tri_w + cz * c.tri_heads + tri_w * cz;
  const int64_t pair_transition = 2 * cz + 2 * t * cz * cz;
  return row + col + msa_transition + opm + 2 * tri_mul + 2 * tri_att + pair_transition;
}

int64_t EvoformerHeadParameterCount(const EvoformerConfig& c) {
  return int64_t{c.c_z} * c.distogram_bins + int64_t{c.c_m} * c.msa_classes;
}

Result<Program> LowerEvoformer(const EvoformerConfig& config, int dp, int dap) {
  CONCERTO_RETURN_IF_ERROR(ValidateEvoformer(config));
  CONCERTO_RETURN_IF_ERROR(ValidateEvoformerPlan(config, dp, dap));
  Program program;
  program.name = config.name + ".dp" + std::to_string(dp) + ".dap" + std::to_string(dap);
  program.mesh.axes = {{"dp", dp}, {kDap, dap}};
  Graph graph;
  graph.name = "main";
  graph.streams = {"compute", "comm"};
  EvoformerLowering(config, dp, dap, &graph).Build();
  program.graphs.push_back(std::move(graph));
  Role role{"spmd", "main", {}};
  for (int r = 0; r < program.mesh.NumRanks(); ++r) role.ranks.push_back(r);
  program.roles.push_back(std::move(role));
  AssignCommunicatorStreams(program);
  return program;
}

}  // namespace concerto
