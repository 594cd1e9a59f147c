// GPT lowering for data + Megatron tensor parallelism. The op list, the
// collective placement and the flop conventions are in docs/workloads.md.
#include "concerto/lower/gpt.h"

#include <cassert>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace concerto {
namespace {

using Shape = std::vector<int64_t>;
using Sharding = std::vector<std::vector<std::string>>;
using Attrs = std::map<std::string, double>;

// Flops per element of the non-matmul ops (docs/workloads.md). Attention and
// matmul flops are exact formulas; these are nominal counts for the roofline.
constexpr double kAddFlopsPerElem = 1;
constexpr double kScaleFlopsPerElem = 1;
constexpr double kGeluFlopsPerElem = 8;
constexpr double kGeluGradFlopsPerElem = 12;
constexpr double kLayerNormFlopsPerElem = 8;
constexpr double kLayerNormGradFlopsPerElem = 16;
constexpr double kEmbeddingGradFlopsPerElem = 1;  // scatter-add of dy
constexpr double kReduceMaxFlopsPerElem = 1;
constexpr double kSumExpFlopsPerElem = 3;  // subtract, exp, accumulate
constexpr double kCrossEntropyFlopsPerToken = 4;
constexpr double kCrossEntropyGradFlopsPerElem = 4;
constexpr double kAdamFlopsPerElem = 10;

constexpr double kLayerNormEps = 1e-5;
constexpr double kAdamLr = 1e-4;
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.95;
constexpr double kAdamEps = 1e-8;

/// Appends tensors and ops to one graph. Ops get ids 0..n-1 in program order
/// and the current tags; compute ops get bytes = input + output tensor bytes.
class GraphBuilder {
 public:
  explicit GraphBuilder(Graph* graph) : graph_(graph) { tags_.microbatch = 0; }

  void SetPhase(Phase phase) { tags_.phase = phase; }
  void SetLayer(int layer) { tags_.layer = layer; }

  /// Declares a tensor (local shape) and returns its name.
  std::string AddTensor(const std::string& name, Shape shape, DType dtype, Sharding sharding,
                        std::vector<std::string> partial = {}) {
    assert(sharding.size() == shape.size());
    assert(!tensor_index_.count(name) && "duplicate tensor name");
    tensor_index_.emplace(name, graph_->tensors.size());
    Tensor t;
    t.name = name;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.sharding = std::move(sharding);
    t.partial = std::move(partial);
    graph_->tensors.push_back(std::move(t));
    return name;
  }

  /// The tensor called `name` (must exist).
  const Tensor& Get(const std::string& name) const {
    auto it = tensor_index_.find(name);
    assert(it != tensor_index_.end() && "unknown tensor");
    return graph_->tensors[it->second];
  }

  /// Declares a tensor shaped and sharded like `like`, with its own dtype and partial axes.
  std::string AddLike(const std::string& name, const std::string& like, DType dtype,
                      std::vector<std::string> partial = {}) {
    const Tensor& t = Get(like);
    Shape shape = t.shape;
    Sharding sharding = t.sharding;
    return AddTensor(name, std::move(shape), dtype, std::move(sharding), std::move(partial));
  }

  /// Appends a compute op on stream "compute"; returns its id.
  int AddCompute(const std::string& name, ComputeType type, std::vector<std::string> inputs,
                 std::vector<std::string> outputs, double flops, Attrs attrs = {}) {
    Op& op = NewOp(name, OpKind::kCompute, "compute");
    op.compute_type = type;
    op.inputs = std::move(inputs);
    op.outputs = std::move(outputs);
    op.flops = flops;
    op.attrs = std::move(attrs);
    op.bytes = static_cast<double>(SumBytes(op.inputs) + SumBytes(op.outputs));
    return op.id;
  }

  /// Appends an all-reduce over mesh axis `axis` on stream "comm"; returns its id.
  int AddAllReduce(const std::string& name, const std::string& input, const std::string& output,
                   const std::string& axis, ReduceOp reduce, const std::string& purpose) {
    Op& op = NewOp(name, OpKind::kCollective, "comm");
    op.collective = CollectiveType::kAllReduce;
    op.reduce = reduce;
    op.group.axes = {axis};
    op.inputs = {input};
    op.outputs = {output};
    op.message_bytes = Get(input).Bytes();
    op.tags.purpose = purpose;
    return op.id;
  }

  /// Overrides the bytes of op `id` (for ops that touch less than whole tensors).
  void SetBytes(int id, double bytes) { graph_->ops[id].bytes = bytes; }

 private:
  Op& NewOp(const std::string& name, OpKind kind, const std::string& stream) {
    Op op;
    op.id = static_cast<int>(graph_->ops.size());
    op.name = name;
    op.kind = kind;
    op.stream = stream;
    op.tags = tags_;
    graph_->ops.push_back(std::move(op));
    return graph_->ops.back();
  }

  int64_t SumBytes(const std::vector<std::string>& names) const {
    int64_t total = 0;
    for (const auto& n : names) total += Get(n).Bytes();
    return total;
  }

  Graph* graph_;
  Tags tags_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

/// Local sizes of one rank under the plan.
struct LocalDims {
  int64_t batch = 0;    // B, sequences per dp rank
  int64_t seq = 0;      // s
  int64_t hidden = 0;   // h
  int64_t hidden_tp = 0;  // h / tp (attention width per rank)
  int64_t ffn_tp = 0;     // ffn_mult * h / tp
  int64_t vocab_tp = 0;   // V / tp
  int64_t heads_tp = 0;   // a / tp
  int64_t tokens() const { return batch * seq; }
};

/// Forward tensors of one block that its backward reads.
struct BlockActs {
  std::string x, ln1, qkv, q, k, v, attn, res1, ln2, fc1, gelu;
};

/// A trainable parameter and the gradient tensor the optimizer reads.
struct Param {
  std::string name;
  int layer = -1;
  std::string grad;  // after the dp all-reduce (when dp > 1)
};

/// Lowers one GPT training step into a graph through a GraphBuilder.
class GptLowering {
 public:
  GptLowering(const GptConfig& config, const DpTpPlan& plan, Graph* graph)
      : cfg_(config), plan_(plan), b_(graph) {
    d_.batch = config.batch;
    d_.seq = config.seq;
    d_.hidden = config.hidden;
    d_.hidden_tp = config.hidden / plan.tp;
    d_.ffn_tp = int64_t{config.ffn_mult} * config.hidden / plan.tp;
    d_.vocab_tp = config.vocab / plan.tp;
    d_.heads_tp = config.heads / plan.tp;
  }

  /// Emits forward, backward and optimizer ops in program order.
  void Build() {
    b_.SetPhase(Phase::kForward);
    DeclareInputs();
    std::string x = EmbedForward();
    for (int l = 0; l < cfg_.layers; ++l) x = BlockForward(l, x);
    LossForward(x);
    b_.SetPhase(Phase::kBackward);
    std::string dx = LossBackward();
    for (int l = cfg_.layers - 1; l >= 0; --l) dx = BlockBackward(l, dx);
    EmbedBackward(dx);
    b_.SetPhase(Phase::kOptimizer);
    for (const Param& p : params_) AdamStep(p);
  }

 private:
  // ---- naming, sharding and partial-sum helpers ---------------------------

  static std::string LayerPrefix(int layer) { return "L" + std::to_string(layer) + "."; }
  std::vector<std::string> TpPartial() const {
    return plan_.tp > 1 ? std::vector<std::string>{"tp"} : std::vector<std::string>{};
  }
  std::vector<std::string> DpPartial() const {
    return plan_.dp > 1 ? std::vector<std::string>{"dp"} : std::vector<std::string>{};
  }
  /// [B, s] or [B, s, n]: the batch dim is the dp shard of the global batch.
  static Sharding TokenSharding(int rank, bool last_on_tp) {
    Sharding s(rank);
    s[0] = {"dp"};
    if (last_on_tp) s[rank - 1] = {"tp"};
    return s;
  }
  /// Declares an activation [B, s, width] (last dim sharded on tp if asked).
  std::string Act(const std::string& name, int64_t width, bool on_tp,
                  std::vector<std::string> partial = {}) {
    return b_.AddTensor(name, {d_.batch, d_.seq, width}, cfg_.dtype, TokenSharding(3, on_tp),
                        std::move(partial));
  }
  /// Declares a per-token scalar [B, s].
  std::string TokenScalar(const std::string& name, DType dtype,
                          std::vector<std::string> partial = {}) {
    return b_.AddTensor(name, {d_.batch, d_.seq}, dtype, TokenSharding(2, false),
                        std::move(partial));
  }
  /// Declares a parameter owned by `layer` (-1: outside the blocks).
  std::string AddParam(const std::string& name, Shape shape, Sharding sharding, int layer) {
    b_.AddTensor(name, std::move(shape), cfg_.dtype, std::move(sharding));
    param_index_.emplace(name, params_.size());
    params_.push_back(Param{name, layer, ""});
    return name;
  }
  /// Declares the (dp-partial) gradient of `param` under `name`.
  std::string AddGrad(const std::string& name, const std::string& param) {
    return b_.AddLike(name, param, cfg_.dtype, DpPartial());
  }
  /// Records `grad` as the gradient of `param`, all-reducing it over dp first
  /// (right after its producer) when dp > 1.
  void SyncGrad(const std::string& param, const std::string& grad) {
    std::string reduced = grad;
    if (plan_.dp > 1) {
      reduced = b_.AddLike(param + ".grad.ar", param, cfg_.dtype);
      b_.AddAllReduce(param + ".grad.ar", grad, reduced, "dp", ReduceOp::kSum, "grad_sync");
    }
    params_[param_index_.at(param)].grad = reduced;
  }
  /// All-reduces `partial` over tp into a new tensor `name` + ".out" when
  /// tp > 1 (Megatron's g forward / f backward); returns the reduced tensor.
  std::string TpAllReduce(const std::string& name, const std::string& partial, ReduceOp reduce) {
    if (plan_.tp == 1) return partial;
    const Tensor& t = b_.Get(partial);
    std::string out = b_.AddTensor(name + ".out", t.shape, t.dtype, t.sharding);
    b_.AddAllReduce(name, partial, out, "tp", reduce, "activation");
    return out;
  }

  // ---- op helpers ---------------------------------------------------------

  /// out = x [B, s, k] x w, with w [k, n] (or [n, k] and transpose_w: the
  /// dX of a linear layer, or the tied LM head); 2 * B*s * k * n flops.
  void Linear(const std::string& name, const std::string& x, const std::string& w,
              const std::string& out, bool transpose_w) {
    const Tensor& wt = b_.Get(w);
    double flops = 2.0 * d_.tokens() * wt.shape[0] * wt.shape[1];
    b_.AddCompute(name, ComputeType::kMatmul, {x, w}, {out}, flops,
                  {{"transpose_a", 0}, {"transpose_b", transpose_w ? 1.0 : 0.0}});
  }
  /// grad = x^T dy over all B*s tokens, x [B, s, k], dy [B, s, n] -> [k, n]:
  /// one identity op views both as [B*s, k] and [B*s, n] (row-major views,
  /// bytes 0), then a 2-D matmul with transpose_a.
  void MatmulWeightGrad(const std::string& name, const std::string& x, const std::string& dy,
                        const std::string& grad) {
    std::string x2d = TokenView(name + ".x2d", x);
    std::string dy2d = TokenView(name + ".dy2d", dy);
    int view = b_.AddCompute(name + ".view", ComputeType::kIdentity, {x, dy}, {x2d, dy2d}, 0);
    b_.SetBytes(view, 0);
    const Tensor& g = b_.Get(grad);
    double flops = 2.0 * d_.tokens() * g.shape[0] * g.shape[1];
    b_.AddCompute(name, ComputeType::kMatmul, {x2d, dy2d}, {grad}, flops,
                  {{"transpose_a", 1}, {"transpose_b", 0}});
  }
  /// Declares `name`, a [B*s, n] view of activation `t` [B, s, n] (same sharding
  /// of the token and last dims).
  std::string TokenView(const std::string& name, const std::string& t) {
    const Tensor& src = b_.Get(t);
    Sharding sharding = {src.sharding.front(), src.sharding.back()};
    std::vector<std::string> partial = src.partial;
    return b_.AddTensor(name, {d_.tokens(), src.shape.back()}, src.dtype, std::move(sharding),
                        std::move(partial));
  }
  /// y = layer_norm(x, gamma, beta).
  void LayerNorm(const std::string& name, const std::string& x, const std::string& gamma,
                 const std::string& beta, const std::string& y) {
    double flops = kLayerNormFlopsPerElem * b_.Get(x).NumElements();
    b_.AddCompute(name, ComputeType::kLayerNorm, {x, gamma, beta}, {y}, flops,
                  {{"eps", kLayerNormEps}});
  }
  /// out = x + y (elementwise, same shapes).
  void Add(const std::string& name, const std::string& x, const std::string& y,
           const std::string& out) {
    double flops = kAddFlopsPerElem * b_.Get(out).NumElements();
    b_.AddCompute(name, ComputeType::kAdd, {x, y}, {out}, flops);
  }
  /// Backward of a LayerNorm: dx into a new activation, dgamma/dbeta synced over dp.
  std::string LayerNormGrad(const std::string& name, const std::string& dy, const std::string& x,
                            const std::string& gamma, const std::string& beta) {
    std::string dx = Act(name + ".dx", d_.hidden, false);
    std::string dgamma = AddGrad(gamma + ".grad", gamma);
    std::string dbeta = AddGrad(beta + ".grad", beta);
    double flops = kLayerNormGradFlopsPerElem * b_.Get(x).NumElements();
    b_.AddCompute(name, ComputeType::kLayerNormGrad, {dy, x, gamma}, {dx, dgamma, dbeta}, flops,
                  {{"eps", kLayerNormEps}});
    SyncGrad(gamma, dgamma);
    SyncGrad(beta, dbeta);
    return dx;
  }
  /// Declares gamma (ones) and beta (zeros) of a LayerNorm over h.
  void AddLayerNormParams(const std::string& prefix, int layer) {
    AddParam(prefix + ".gamma", {d_.hidden}, {{}}, layer);
    AddParam(prefix + ".beta", {d_.hidden}, {{}}, layer);
  }
  Attrs AttentionAttrs() const {
    return {{"heads", static_cast<double>(d_.heads_tp)},
            {"kv_heads", static_cast<double>(d_.heads_tp)},
            {"causal", 1}};
  }
  /// Full (non-causal-discounted) attention flops: 4 * B * s^2 * h/tp.
  double AttentionFlops() const {
    return 4.0 * d_.batch * d_.seq * d_.seq * d_.hidden_tp;
  }

  // ---- forward ------------------------------------------------------------

  /// Graph inputs: token ids, positions and labels [B, s] (int32).
  void DeclareInputs() {
    TokenScalar("tokens", DType::kI32);
    TokenScalar("positions", DType::kI32);
    TokenScalar("labels", DType::kI32);
  }

  /// Vocab-parallel word embedding + all-reduce, plus position embedding.
  std::string EmbedForward() {
    b_.SetLayer(-1);
    AddParam("embed.word.table", {d_.vocab_tp, d_.hidden}, {{"tp"}, {}}, -1);
    AddParam("embed.pos.table", {d_.seq, d_.hidden}, {{}, {}}, -1);
    std::string word = Act("embed.word.out", d_.hidden, false, TpPartial());
    int id = b_.AddCompute("embed.word", ComputeType::kEmbedding,
                           {"embed.word.table", "tokens"}, {word}, 0);
    // A gather reads only the selected rows, not the whole table.
    b_.SetBytes(id, 2.0 * b_.Get(word).Bytes() + b_.Get("tokens").Bytes());
    word = TpAllReduce("embed.word.ar", word, ReduceOp::kSum);
    std::string pos = Act("embed.pos.out", d_.hidden, false);
    id = b_.AddCompute("embed.pos", ComputeType::kEmbedding, {"embed.pos.table", "positions"},
                       {pos}, 0);
    b_.SetBytes(id, 2.0 * b_.Get(pos).Bytes() + b_.Get("positions").Bytes());
    std::string sum = Act("embed.out", d_.hidden, false);
    Add("embed.add", word, pos, sum);
    return sum;
  }

  /// One pre-LN transformer block; returns the new residual stream.
  std::string BlockForward(int layer, const std::string& x) {
    b_.SetLayer(layer);
    const std::string p = LayerPrefix(layer);
    BlockActs a;
    a.x = x;
    AddLayerNormParams(p + "ln1", layer);
    a.ln1 = Act(p + "ln1.out", d_.hidden, false);
    LayerNorm(p + "ln1", x, p + "ln1.gamma", p + "ln1.beta", a.ln1);
    std::string attn_out = AttentionForward(layer, &a);
    a.res1 = Act(p + "attn.res.out", d_.hidden, false);
    Add(p + "attn.res", x, attn_out, a.res1);
    AddLayerNormParams(p + "ln2", layer);
    a.ln2 = Act(p + "ln2.out", d_.hidden, false);
    LayerNorm(p + "ln2", a.res1, p + "ln2.gamma", p + "ln2.beta", a.ln2);
    std::string mlp_out = MlpForward(layer, &a);
    std::string res2 = Act(p + "mlp.res.out", d_.hidden, false);
    Add(p + "mlp.res", a.res1, mlp_out, res2);
    blocks_.push_back(a);
    return res2;
  }

  /// qkv (column parallel) -> split -> attention -> proj (row parallel) + all-reduce.
  std::string AttentionForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "attn.";
    const int64_t hl = d_.hidden_tp;
    std::string w_qkv = AddParam(p + "qkv.w", {d_.hidden, 3 * hl}, {{}, {"tp"}}, layer);
    a->qkv = Act(p + "qkv.out", 3 * hl, true);
    Linear(p + "qkv", a->ln1, w_qkv, a->qkv, false);
    a->q = Slice(p + "q", a->qkv, 0);
    a->k = Slice(p + "k", a->qkv, 1);
    a->v = Slice(p + "v", a->qkv, 2);
    a->attn = Act(p + "core.out", hl, true);
    b_.AddCompute(p + "core", ComputeType::kAttention, {a->q, a->k, a->v}, {a->attn},
                  AttentionFlops(), AttentionAttrs());
    std::string w_proj = AddParam(p + "proj.w", {hl, d_.hidden}, {{"tp"}, {}}, layer);
    std::string proj = Act(p + "proj.out", d_.hidden, false, TpPartial());
    Linear(p + "proj", a->attn, w_proj, proj, false);
    return TpAllReduce(p + "proj.ar", proj, ReduceOp::kSum);
  }

  /// Slice `index` (0 q, 1 k, 2 v) of width h/tp out of the fused qkv tensor.
  std::string Slice(const std::string& name, const std::string& qkv, int index) {
    std::string out = Act(name + ".out", d_.hidden_tp, true);
    b_.AddCompute(name, ComputeType::kSlice, {qkv}, {out}, 0,
                  {{"axis", 2}, {"start", static_cast<double>(index * d_.hidden_tp)},
                   {"len", static_cast<double>(d_.hidden_tp)}});
    return out;
  }

  /// fc1 (column parallel) -> gelu -> fc2 (row parallel) + all-reduce.
  std::string MlpForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    std::string w1 = AddParam(p + "fc1.w", {d_.hidden, d_.ffn_tp}, {{}, {"tp"}}, layer);
    a->fc1 = Act(p + "fc1.out", d_.ffn_tp, true);
    Linear(p + "fc1", a->ln2, w1, a->fc1, false);
    a->gelu = Act(p + "gelu.out", d_.ffn_tp, true);
    b_.AddCompute(p + "gelu", ComputeType::kGelu, {a->fc1}, {a->gelu},
                  kGeluFlopsPerElem * b_.Get(a->fc1).NumElements());
    std::string w2 = AddParam(p + "fc2.w", {d_.ffn_tp, d_.hidden}, {{"tp"}, {}}, layer);
    std::string fc2 = Act(p + "fc2.out", d_.hidden, false, TpPartial());
    Linear(p + "fc2", a->gelu, w2, fc2, false);
    return TpAllReduce(p + "fc2.ar", fc2, ReduceOp::kSum);
  }

  /// Final LayerNorm, tied LM head (logits sharded on vocab) and the
  /// vocab-parallel cross entropy (max, sum-exp and target all-reduced over tp).
  void LossForward(const std::string& x) {
    b_.SetLayer(-1);
    final_x_ = x;
    AddLayerNormParams("final_ln", -1);
    final_ln_ = Act("final_ln.out", d_.hidden, false);
    LayerNorm("final_ln", x, "final_ln.gamma", "final_ln.beta", final_ln_);
    logits_ = Act("head.logits", d_.vocab_tp, true);
    Linear("head", final_ln_, "embed.word.table", logits_, true);  // x [B,s,h] x table^T
    const double logit_elems = static_cast<double>(b_.Get(logits_).NumElements());
    std::string max_local = TokenScalar("loss.max_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.max", ComputeType::kReduceMax, {logits_}, {max_local},
                  kReduceMaxFlopsPerElem * logit_elems);
    max_ = TpAllReduce("loss.max.ar", max_local, ReduceOp::kMax);
    std::string z_local = TokenScalar("loss.sum_exp_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.sum_exp", ComputeType::kSumExp, {logits_, max_}, {z_local},
                  kSumExpFlopsPerElem * logit_elems);
    sum_exp_ = TpAllReduce("loss.sum_exp.ar", z_local, ReduceOp::kSum);
    std::string t_local = TokenScalar("loss.target_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.target", ComputeType::kGatherTarget, {logits_, "labels"}, {t_local}, 0);
    std::string target = TpAllReduce("loss.target.ar", t_local, ReduceOp::kSum);
    std::string loss = b_.AddTensor("loss", {}, DType::kF32, {});
    b_.AddCompute("loss.cross_entropy", ComputeType::kCrossEntropy, {max_, sum_exp_, target},
                  {loss}, kCrossEntropyFlopsPerToken * d_.tokens());
  }

  // ---- backward -----------------------------------------------------------

  /// dlogits, the tied head's weight grad, its input grad (+ tp all-reduce)
  /// and the final LayerNorm grad; returns d(last block output).
  std::string LossBackward() {
    b_.SetLayer(-1);
    std::string dlogits = Act("head.logits.grad", d_.vocab_tp, true);
    const double logit_elems = static_cast<double>(b_.Get(logits_).NumElements());
    b_.AddCompute("loss.cross_entropy.grad", ComputeType::kCrossEntropyGrad,
                  {logits_, max_, sum_exp_, "labels"}, {dlogits},
                  kCrossEntropyGradFlopsPerElem * logit_elems);
    if (plan_.dp > 1) {  // the global loss is the mean over dp ranks
      std::string scaled = Act("head.logits.grad.scaled", d_.vocab_tp, true);
      b_.AddCompute("loss.grad_scale", ComputeType::kScale, {dlogits}, {scaled},
                    kScaleFlopsPerElem * logit_elems, {{"scale", 1.0 / plan_.dp}});
      dlogits = scaled;
    }
    std::string dx = Act("head.dX.out", d_.hidden, false, TpPartial());
    Linear("head.dX", dlogits, "embed.word.table", dx, false);
    dx = TpAllReduce("head.dX.ar", dx, ReduceOp::kSum);
    head_table_grad_ = AddGrad("embed.word.table.grad_head", "embed.word.table");
    MatmulWeightGrad("head.dW", dlogits, final_ln_, head_table_grad_);
    return LayerNormGrad("final_ln.grad", dx, final_x_, "final_ln.gamma", "final_ln.beta");
  }

  /// Backward of one block given d(block output); returns d(block input).
  std::string BlockBackward(int layer, const std::string& dy) {
    b_.SetLayer(layer);
    const std::string p = LayerPrefix(layer);
    const BlockActs& a = blocks_[layer];
    std::string dln2 = MlpBackward(layer, a, dy);
    std::string dres1_ln = LayerNormGrad(p + "ln2.grad", dln2, a.res1, p + "ln2.gamma",
                                         p + "ln2.beta");
    std::string dres1 = Act(p + "mlp.res.grad.out", d_.hidden, false);
    Add(p + "mlp.res.grad", dy, dres1_ln, dres1);
    std::string dln1 = AttentionBackward(layer, a, dres1);
    std::string dx_ln = LayerNormGrad(p + "ln1.grad", dln1, a.x, p + "ln1.gamma", p + "ln1.beta");
    std::string dx = Act(p + "attn.res.grad.out", d_.hidden, false);
    Add(p + "attn.res.grad", dres1, dx_ln, dx);
    return dx;
  }

  /// fc2 dX/dW, gelu grad, fc1 dX (+ tp all-reduce) and dW; returns d(ln2 out).
  std::string MlpBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    std::string dgelu = Act(p + "fc2.dX.out", d_.ffn_tp, true);
    Linear(p + "fc2.dX", dy, p + "fc2.w", dgelu, true);
    WeightGrad(p + "fc2", a.gelu, dy);
    std::string dfc1 = Act(p + "gelu.grad.out", d_.ffn_tp, true);
    b_.AddCompute(p + "gelu.grad", ComputeType::kGeluGrad, {dgelu, a.fc1}, {dfc1},
                  kGeluGradFlopsPerElem * b_.Get(dfc1).NumElements());
    std::string dln2 = Act(p + "fc1.dX.out", d_.hidden, false, TpPartial());
    Linear(p + "fc1.dX", dfc1, p + "fc1.w", dln2, true);
    dln2 = TpAllReduce(p + "fc1.dX.ar", dln2, ReduceOp::kSum);
    WeightGrad(p + "fc1", a.ln2, dfc1);
    return dln2;
  }

  /// proj dX/dW, attention grad, concat, qkv dX (+ tp all-reduce) and dW;
  /// returns d(ln1 out).
  std::string AttentionBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "attn.";
    const int64_t hl = d_.hidden_tp;
    std::string dattn = Act(p + "proj.dX.out", hl, true);
    Linear(p + "proj.dX", dy, p + "proj.w", dattn, true);
    WeightGrad(p + "proj", a.attn, dy);
    std::string dq = Act(p + "core.grad.dq", hl, true);
    std::string dk = Act(p + "core.grad.dk", hl, true);
    std::string dv = Act(p + "core.grad.dv", hl, true);
    b_.AddCompute(p + "core.grad", ComputeType::kAttentionGrad, {dattn, a.q, a.k, a.v},
                  {dq, dk, dv}, 2.0 * AttentionFlops(), AttentionAttrs());
    std::string dqkv = Act(p + "qkv.grad.out", 3 * hl, true);
    b_.AddCompute(p + "qkv.grad.concat", ComputeType::kConcat, {dq, dk, dv}, {dqkv}, 0,
                  {{"axis", 2}});
    std::string dln1 = Act(p + "qkv.dX.out", d_.hidden, false, TpPartial());
    Linear(p + "qkv.dX", dqkv, p + "qkv.w", dln1, true);
    dln1 = TpAllReduce(p + "qkv.dX.ar", dln1, ReduceOp::kSum);
    WeightGrad(p + "qkv", a.ln1, dqkv);
    return dln1;
  }

  /// "<linear>.dW": gradient of "<linear>.w" from its input x and output grad dy.
  void WeightGrad(const std::string& linear, const std::string& x, const std::string& dy) {
    const std::string w = linear + ".w";
    std::string grad = AddGrad(w + ".grad", w);
    MatmulWeightGrad(linear + ".dW", x, dy, grad);
    SyncGrad(w, grad);
  }

  /// Position and word embedding grads; the tied table's two grads are summed.
  void EmbedBackward(const std::string& dx) {
    b_.SetLayer(-1);
    const double dx_elems = static_cast<double>(b_.Get(dx).NumElements());
    std::string dpos = AddGrad("embed.pos.table.grad", "embed.pos.table");
    b_.AddCompute("embed.pos.grad", ComputeType::kEmbeddingGrad, {dx, "positions"}, {dpos},
                  kEmbeddingGradFlopsPerElem * dx_elems);
    SyncGrad("embed.pos.table", dpos);
    std::string dword = AddGrad("embed.word.table.grad_embed", "embed.word.table");
    b_.AddCompute("embed.word.grad", ComputeType::kEmbeddingGrad, {dx, "tokens"}, {dword},
                  kEmbeddingGradFlopsPerElem * dx_elems);
    std::string dtable = AddGrad("embed.word.table.grad", "embed.word.table");
    Add("embed.word.grad.tied_add", head_table_grad_, dword, dtable);
    SyncGrad("embed.word.table", dtable);
  }

  // ---- optimizer ----------------------------------------------------------

  /// Adam on one parameter: (param, grad, m, v) -> (param', m', v'); m, v fp32.
  void AdamStep(const Param& p) {
    b_.SetLayer(p.layer);
    std::string m = b_.AddLike(p.name + ".adam_m", p.name, DType::kF32);
    std::string v = b_.AddLike(p.name + ".adam_v", p.name, DType::kF32);
    std::string next = b_.AddLike(p.name + ".next", p.name, cfg_.dtype);
    std::string m_next = b_.AddLike(p.name + ".adam_m.next", p.name, DType::kF32);
    std::string v_next = b_.AddLike(p.name + ".adam_v.next", p.name, DType::kF32);
    double flops = kAdamFlopsPerElem * b_.Get(p.name).NumElements();
    b_.AddCompute(p.name + ".adam", ComputeType::kAdam, {p.name, p.grad, m, v},
                  {next, m_next, v_next}, flops,
                  {{"lr", kAdamLr}, {"beta1", kAdamBeta1}, {"beta2", kAdamBeta2},
                   {"eps", kAdamEps}, {"step", 1}});
  }

  const GptConfig& cfg_;
  const DpTpPlan& plan_;
  GraphBuilder b_;
  LocalDims d_;
  std::vector<BlockActs> blocks_;
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> param_index_;
  std::string final_x_, final_ln_, logits_, max_, sum_exp_, head_table_grad_;
};

/// "what (value) must ..." when `value` is not positive.
Status CheckPositive(const std::string& what, int64_t value) {
  if (value > 0) return Status::Ok();
  return Status::Error("gpt: " + what + " must be positive, got " + std::to_string(value));
}

/// Error unless `divisor` divides `value`.
Status CheckDivides(const std::string& divisor_name, int64_t divisor,
                    const std::string& value_name, int64_t value) {
  if (value % divisor == 0) return Status::Ok();
  return Status::Error("gpt: " + divisor_name + " (" + std::to_string(divisor) +
                       ") must divide " + value_name + " (" + std::to_string(value) + ")");
}

}  // namespace

std::vector<std::string> GptPresetNames() {
  return {"gpt-tiny", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-39b"};
}

Result<GptConfig> GptPreset(const std::string& name) {
  // name, layers, hidden, heads, seq, vocab, batch (Alpa / Megatron sizes).
  if (name == "gpt-tiny") return GptConfig{name, 2, 256, 4, 64, 512, 2};
  if (name == "gpt-1.3b") return GptConfig{name, 24, 2048, 32, 2048, 51200, 8};
  if (name == "gpt-2.7b") return GptConfig{name, 32, 2560, 32, 2048, 51200, 8};
  if (name == "gpt-6.7b") return GptConfig{name, 32, 4096, 32, 2048, 51200, 8};
  if (name == "gpt-13b") return GptConfig{name, 40, 5120, 40, 2048, 51200, 8};
  if (name == "gpt-39b") return GptConfig{name, 48, 8192, 64, 2048, 51200, 8};
  std::string known;
  for (const auto& n : GptPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::Error("gpt: unknown preset '" + name + "' (known: " + known + ")");
}

Status ValidateGpt(const GptConfig& c, const DpTpPlan& plan) {
  CONCERTO_RETURN_IF_ERROR(CheckPositive("layers", c.layers));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("hidden", c.hidden));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("heads", c.heads));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("seq", c.seq));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("vocab", c.vocab));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("batch", c.batch));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("ffn_mult", c.ffn_mult));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("dp", plan.dp));
  CONCERTO_RETURN_IF_ERROR(CheckPositive("tp", plan.tp));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("heads", c.heads, "hidden", c.hidden));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("tp", plan.tp, "heads", c.heads));
  CONCERTO_RETURN_IF_ERROR(CheckDivides("tp", plan.tp, "vocab", c.vocab));
  CONCERTO_RETURN_IF_ERROR(
      CheckDivides("tp", plan.tp, "ffn_mult * hidden", int64_t{c.ffn_mult} * c.hidden));
  return Status::Ok();
}

int64_t GptParameterCount(const GptConfig& c) {
  const int64_t h = c.hidden;
  const int64_t per_layer = (4 + 2 * int64_t{c.ffn_mult}) * h * h + 4 * h;
  return c.layers * per_layer + int64_t{c.vocab} * h + int64_t{c.seq} * h + 2 * h;
}

Result<Program> LowerGpt(const GptConfig& config, const DpTpPlan& plan) {
  CONCERTO_RETURN_IF_ERROR(ValidateGpt(config, plan));
  Program program;
  program.name = (config.name.empty() ? std::string("gpt") : config.name) + ".dp" +
                 std::to_string(plan.dp) + ".tp" + std::to_string(plan.tp);
  program.mesh.axes = {{"dp", plan.dp}, {"tp", plan.tp}};
  Graph graph;
  graph.name = "main";
  graph.streams = {"compute", "comm"};
  GptLowering(config, plan, &graph).Build();
  program.graphs.push_back(std::move(graph));
  Role role{"spmd", "main", {}};
  for (int r = 0; r < program.mesh.NumRanks(); ++r) role.ranks.push_back(r);
  program.roles.push_back(std::move(role));
  return program;
}

}  // namespace concerto
