// Decoder transformers (GPT, LLaMA, and LLaMA blocks with a mixture of
// experts) lowered for dp (plain or ZeRO 1/2/3), Megatron tp and sequence
// parallelism, gradient accumulation over micro-batches, 1F1B pipeline
// stages (plain or interleaved) and expert parallelism (all-to-all dispatch and combine). The op
// list, the collective and send/recv placement and the flop conventions are
// in docs/workloads.md and docs/frontends.md ("MoE / ep").
#include "concerto/ir/op_registry.h"
#include "concerto/lower/transformer.h"
#include "concerto/util/did_you_mean.h"
#include "concerto/util/input_file.h"
#include "concerto/ir/comm_streams.h"
#include "concerto/lower/evoformer.h"
#include "concerto/lower/graph_builder.h"
#include "pipeline_order.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace concerto {
namespace {

using lower::Attrs;
using lower::Axes;
using lower::GraphBuilder;
using lower::Shape;
using lower::Sharding;
using lower::CommEvent;
using lower::InterleavedSchedule;
using lower::OneFOneB;
using lower::PipeStep;
using lower::ScheduleInterleaved;

// Flops of the non-matmul ops come from the op registry (ir/op_registry.h,
// docs/workloads.md); attention and matmul flops are exact formulas.

constexpr double kLayerNormEps = 1e-5;
constexpr double kRmsNormEps = 1e-6;
constexpr double kAdamLr = 1e-4;
constexpr double kAdamBeta1 = 0.9;
constexpr double kAdamBeta2 = 0.95;
constexpr double kAdamEps = 1e-8;

const char* const kActivation = "activation";
const char* const kGradSync = "grad_sync";
const char* const kParamGather = "param_gather";

const char* const kPipeline = "pipeline";

// Pipeline message tags: pairing is by (source, destination, tag) in program
// order, so each direction (and the tied-embedding exchange) gets its own.
constexpr int kTagActivation = 0;
constexpr int kTagActivationGrad = 1;
constexpr int kTagTiedGrad = 2;

/// A pipeline send or recv: `tensor` goes to (send) or comes from (recv) the
/// rank `offset` steps away along the pp axis.
struct P2P {
  OpKind kind = OpKind::kSend;
  std::string name;
  std::string tensor;
  int offset = 0;
  int tag = 0;
  int microbatch = -1;
  Phase phase = Phase::kNone;
  std::string purpose;
};

/// The GraphBuilder of one graph, scoped by micro-batch. Inside micro-batch k
/// (of m > 1) the tensors and ops it adds get the name suffix ".mbK" and ops
/// the tag microbatch = k; in the step scope (k = -1: parameters, per-step
/// gradient syncs, the optimizer) names have no suffix and ops are tagged -1.
/// With one micro-batch nothing is suffixed and every op is tagged 0. It also
/// appends the pipeline sends and recvs that GraphBuilder has no helper for.
class MbBuilder {
 public:
  MbBuilder(Graph* graph, int microbatches)
      : graph_(graph), b_(graph), microbatches_(microbatches) {}

  /// Phase and layer tags of the ops appended from now on.
  void SetPhase(Phase phase) {
    phase_ = phase;
    b_.SetPhase(phase);
  }
  void SetLayer(int layer) { b_.SetLayer(layer); }
  /// Enters micro-batch `k`, or the step scope when `k` is -1.
  void SetMicrobatch(int k) { mb_ = k; }
  int Microbatch() const { return mb_; }
  Phase CurrentPhase() const { return phase_; }

  /// ".mbK" for micro-batch k >= 0 of several; "" otherwise.
  std::string Suffix(int k) const {
    return microbatches_ > 1 && k >= 0 ? ".mb" + std::to_string(k) : "";
  }

  /// Declares a tensor named `name` plus the scope's suffix; returns the full name.
  std::string AddTensor(const std::string& name, Shape shape, DType dtype, Sharding sharding,
                        Axes partial = {}) {
    return b_.AddTensor(name + Suffix(mb_), std::move(shape), dtype, std::move(sharding),
                        std::move(partial));
  }
  /// Declares a per-step tensor (no suffix in any scope): parameters and their shards.
  std::string AddGlobal(const std::string& name, Shape shape, DType dtype, Sharding sharding) {
    return b_.AddTensor(name, std::move(shape), dtype, std::move(sharding));
  }
  /// Declares `name` (+ suffix) shaped and sharded like `like`.
  std::string AddLike(const std::string& name, const std::string& like, DType dtype,
                      Axes partial = {}) {
    return b_.AddLike(name + Suffix(mb_), like, dtype, std::move(partial));
  }
  /// The tensor called `name` (its full name).
  const Tensor& Get(const std::string& name) const { return b_.Get(name); }

  /// GraphBuilder::AddCompute with the scope's suffix and micro-batch tag.
  int AddCompute(const std::string& name, ComputeType type, std::vector<std::string> inputs,
                 std::vector<std::string> outputs, double flops, Attrs attrs = {}) {
    return Tag(b_.AddCompute(name + Suffix(mb_), type, std::move(inputs), std::move(outputs),
                             flops, std::move(attrs)));
  }
  /// GraphBuilder::AddCollective with the scope's suffix and micro-batch tag.
  int AddCollective(const std::string& name, CollectiveType type, const std::string& input,
                    const std::string& output, Axes axes, ReduceOp reduce,
                    const std::string& purpose) {
    return Tag(b_.AddCollective(name + Suffix(mb_), type, input, output, std::move(axes), reduce,
                                purpose));
  }
  void SetBytes(int id, double bytes) { b_.SetBytes(id, bytes); }
  int NumOps() const { return b_.NumOps(); }
  /// GraphBuilder::GateOpsFrom (`tensor`: a full name).
  int GateOpsFrom(int first_op, const std::string& tensor) { return b_.GateOpsFrom(first_op, tensor); }

  /// Appends a send or recv on stream "comm" (named `p.name` plus the
  /// suffix of `p.microbatch`; layer tag -1); its message is the tensor's
  /// bytes. Ids stay 0..n-1 in program order, as GraphBuilder numbers them.
  int AddP2P(const P2P& p) {
    Op op;
    op.id = static_cast<int>(graph_->ops.size());
    op.name = p.name + Suffix(p.microbatch);
    op.kind = p.kind;
    op.stream = "comm";
    (p.kind == OpKind::kSend ? op.inputs : op.outputs) = {p.tensor};
    op.peer.axis = "pp";
    op.peer.offset = p.offset;
    op.tag = p.tag;
    op.message_bytes = Get(p.tensor).Bytes();
    op.tags.phase = p.phase;
    op.tags.microbatch = TagValue(p.microbatch);
    op.tags.purpose = p.purpose;
    graph_->ops.push_back(std::move(op));
    return graph_->ops.back().id;
  }

 private:
  /// The micro-batch tag of scope `k`.
  int TagValue(int k) const { return microbatches_ > 1 ? k : 0; }
  /// Tags op `id` with the current scope's micro-batch; returns `id`.
  int Tag(int id) {
    graph_->ops[id].tags.microbatch = TagValue(mb_);
    return id;
  }

  Graph* graph_;
  GraphBuilder b_;
  int microbatches_;
  int mb_ = -1;
  Phase phase_ = Phase::kNone;
};

/// Enters the step scope of `b` for its lifetime, then restores the micro-batch.
class StepScope {
 public:
  explicit StepScope(MbBuilder* b) : b_(b), saved_(b->Microbatch()) { b_->SetMicrobatch(-1); }
  ~StepScope() { b_->SetMicrobatch(saved_); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  MbBuilder* b_;
  int saved_;
};

/// A trainable parameter and the tensors the step keeps for it.
struct Param {
  std::string name;  // the full local (tp-sharded) tensor that compute ops read
  int layer = -1;
  Axes sync;          // mesh axes its gradient is summed over (the ranks holding it)
  Shape shape;        // local shape of `name`
  Sharding sharding;  // sharding of `name`
  std::string stored;       // what Adam updates: `name`, or `name`.shard under ZeRO
  std::string acc;          // the gradient summed over the micro-batches so far
  std::string grad;         // the synced gradient Adam reads
  bool deferred = false;    // the final sync is left to FinishDeferred
  int gathered_mb = -2;     // ZeRO-3: scope whose forward all-gather was emitted
  int bwd_mb = -2;          // ZeRO-3: scope of the backward all-gather `bwd`
  std::string fwd;          // ZeRO-3: the forward all-gather's output
  std::string bwd;          // ZeRO-3: the backward all-gather's output
};

/// Parameters under data parallelism: declaration, the tensor each use reads
/// (ZeRO-3 all-gathers, per micro-batch), gradient accumulation over
/// micro-batches, gradient synchronization (all-reduce, or reduce-scatter
/// under ZeRO) and the Adam step (plus ZeRO-1/2 all-gathers).
class ParamStore {
 public:
  ParamStore(MbBuilder* b, const ParallelPlan& plan, DType dtype)
      : b_(b), plan_(plan), dtype_(dtype) {}

  /// Declares a parameter of local shape `shape` owned by `layer` (-1:
  /// outside the blocks) the first time; returns its name. Under ZeRO the
  /// graph input holding this rank's dp shard is `name`.shard; ZeRO-1/2 also
  /// keep `name` whole.
  std::string Declare(const std::string& name, Shape shape, Sharding sharding, int layer,
                      bool expert = false) {
    if (index_.count(name)) return name;
    Param p;
    p.name = name;
    p.layer = layer;
    p.sync = SyncAxes(expert);
    p.shape = std::move(shape);
    p.sharding = std::move(sharding);
    p.stored = name;
    if (plan_.zero < 3) b_->AddGlobal(name, p.shape, dtype_, p.sharding);
    if (plan_.zero > 0) p.stored = DeclareShard(p, name + ".shard", true);
    index_.emplace(name, params_.size());
    params_.push_back(std::move(p));
    return name;
  }

  /// Leaves the final synchronization of `name` to FinishDeferred (a tied
  /// gradient that is summed across pipeline stages first).
  void Defer(const std::string& name) { Find(name).deferred = true; }

  /// The tensor forward ops read for `name`. Under ZeRO-3 the first call of
  /// each micro-batch all-gathers the shard over dp ("param_gather") into
  /// `name` (plus the micro-batch suffix).
  std::string Fwd(const std::string& name) {
    Param& p = Find(name);
    if (plan_.zero < 3) return name;
    if (p.gathered_mb == b_->Microbatch()) return p.fwd;
    p.fwd = b_->AddTensor(name, p.shape, dtype_, p.sharding);
    b_->AddCollective(name + ".ag.fwd", CollectiveType::kAllGather, p.stored, p.fwd, {"dp"},
                      ReduceOp::kSum, kParamGather);
    p.gathered_mb = b_->Microbatch();
    return p.fwd;
  }

  /// The tensor backward ops read for `name`. Under ZeRO-3 the first call of
  /// each micro-batch all-gathers the shard again (the forward copy is
  /// freed) into `name`.bwd.
  std::string Bwd(const std::string& name) {
    Param& p = Find(name);
    if (plan_.zero < 3) return name;
    if (p.bwd_mb == b_->Microbatch()) return p.bwd;
    p.bwd = b_->AddTensor(name + ".bwd", p.shape, dtype_, p.sharding);
    b_->AddCollective(name + ".ag.bwd", CollectiveType::kAllGather, p.stored, p.bwd, {"dp"},
                      ReduceOp::kSum, kParamGather);
    p.bwd_mb = b_->Microbatch();
    return p.bwd;
  }

  /// Declares `grad_name`, a raw gradient of `param`: its local shape, partial
  /// over dp (when dp > 1) and over tp when `tp_partial` (a parameter that is
  /// replicated over tp but sees only this rank's sequence shard).
  std::string NewGrad(const std::string& grad_name, const std::string& param, bool tp_partial) {
    const Param& p = Find(param);
    Axes partial = p.sync;
    if (tp_partial) partial.push_back("tp");
    return b_->AddTensor(grad_name, p.shape, dtype_, p.sharding, std::move(partial));
  }

  /// Folds `raw`, this micro-batch's gradient of `param`, into the step's
  /// gradient. ZeRO-2/3 reduce-scatter every micro-batch's gradient right
  /// away and sum the shards (DeepSpeed's partitioned gradients); plain dp and
  /// ZeRO-1 sum the full gradients and synchronize once, right after the
  /// last micro-batch's contribution (unless deferred).
  void AddGrad(const std::string& param, const std::string& raw) {
    Param& p = Find(param);
    if (PerMicrobatchSync()) {
      Accumulate(p, Sync(p, raw));
      if (LastMicrobatch()) p.grad = p.acc;
      return;
    }
    Accumulate(p, raw);
    if (!LastMicrobatch() || p.deferred) return;
    StepScope step(b_);
    p.grad = Sync(p, p.acc);
  }

  /// The gradient of a deferred parameter summed over all micro-batches
  /// (already reduce-scattered under ZeRO-2/3).
  const std::string& Accumulated(const std::string& param) { return Find(param).acc; }

  /// Completes a deferred parameter with `grad` (Accumulated plus the other
  /// stage's copy): synchronizes it over dp unless that happened per
  /// micro-batch. Emits in the current scope.
  void FinishDeferred(const std::string& param, const std::string& grad) {
    Param& p = Find(param);
    p.grad = PerMicrobatchSync() ? grad : Sync(p, grad);
  }

  /// Adam for every parameter, in declaration order (step scope).
  void EmitOptimizer() {
    StepScope step(b_);
    for (const Param& p : params_) Adam(p);
  }

 private:
  /// The parameter called `name` (must be declared).
  Param& Find(const std::string& name) {
    auto it = index_.find(name);
    assert(it != index_.end() && "unknown parameter");
    return params_[it->second];
  }

  /// ZeRO-2/3 reduce-scatter each micro-batch's gradient.
  bool PerMicrobatchSync() const { return plan_.zero >= 2; }
  /// Whether the current scope is the step's last micro-batch (backwards run
  /// in micro-batch order).
  bool LastMicrobatch() const { return b_->Microbatch() == plan_.microbatches - 1; }

  /// The data-parallel axes a parameter's gradient is summed over (its
  /// raw gradient's pending reduction): {"dp"} when dp > 1; with ep > 1 (mesh
  /// {dp: dp/ep, ep}) {"dp", "ep"} for a replicated parameter and {"dp"} for
  /// an expert's (its replicas differ only along dp); axes of size 1 dropped.
  Axes SyncAxes(bool expert) const {
    Axes axes;
    const int outer = plan_.dp / plan_.ep;
    if (outer > 1) axes.push_back("dp");
    if (plan_.ep > 1 && !expert) axes.push_back("ep");
    return axes;
  }

  /// Whether `tensor` holds a pending partial sum over `axis`.
  bool IsPartialOver(const std::string& tensor, const std::string& axis) const {
    for (const std::string& a : b_->Get(tensor).partial)
      if (a == axis) return true;
    return false;
  }

  /// p.acc += g: the first micro-batch's gradient starts the sum; later ones
  /// are added into `name`.grad.acc (one add op each).
  void Accumulate(Param& p, const std::string& g) {
    if (p.acc.empty()) {
      p.acc = g;
      return;
    }
    const Tensor& t = b_->Get(g);
    Axes partial = t.partial;
    std::string sum = b_->AddLike(p.name + ".grad.acc", g, t.dtype, std::move(partial));
    b_->AddCompute(p.name + ".grad.acc", ComputeType::kAdd, {p.acc, g}, {sum},
                   FlopsPerUnit(ComputeType::kAdd) * b_->Get(sum).NumElements());
    p.acc = sum;
  }

  /// Declares a tensor holding this rank's dp shard of `p`: dim 0 divided by
  /// dp and sharded over dp inside whatever already shards it (tp first).
  /// `global`: a per-step tensor (no micro-batch suffix).
  std::string DeclareShard(const Param& p, const std::string& name, bool global) {
    Shape shape = p.shape;
    Sharding sharding = p.sharding;
    assert(!shape.empty() && shape[0] % plan_.dp == 0);
    shape[0] /= plan_.dp;
    sharding[0].push_back("dp");
    if (global) return b_->AddGlobal(name, std::move(shape), dtype_, std::move(sharding));
    return b_->AddTensor(name, std::move(shape), dtype_, std::move(sharding));
  }

  /// Synchronizes gradient `grad` of `p` in the current scope: an all-reduce
  /// over tp when it is partial there, then over dp an all-reduce (no ZeRO)
  /// or a reduce-scatter into the shard (ZeRO). Returns the result.
  std::string Sync(const Param& p, const std::string& grad) {
    std::string g = grad;
    if (IsPartialOver(g, "tp")) {
      const std::string out =
          b_->AddTensor(p.name + ".grad.tp_ar", p.shape, dtype_, p.sharding, p.sync);
      b_->AddCollective(p.name + ".grad.tp_ar", CollectiveType::kAllReduce, g, out, {"tp"},
                        ReduceOp::kSum, kGradSync);
      g = out;
    }
    if (!p.sync.empty() && plan_.zero == 0) {
      const std::string out = b_->AddTensor(p.name + ".grad.ar", p.shape, dtype_, p.sharding);
      b_->AddCollective(p.name + ".grad.ar", CollectiveType::kAllReduce, g, out, p.sync,
                        ReduceOp::kSum, kGradSync);
      g = out;
    } else if (plan_.zero > 0) {
      const std::string out = DeclareShard(p, p.name + ".grad.rs", false);
      b_->AddCollective(p.name + ".grad.rs", CollectiveType::kReduceScatter, g, out, {"dp"},
                        ReduceOp::kSum, kGradSync);
      g = out;
    }
    return g;
  }

  /// Adam on one parameter (its shard under ZeRO): (param, grad, m, v) ->
  /// (param', m', v'), moments f32; a 16-bit model adds its f32 master copy
  /// ((.., master) -> (.., master')), so the step keeps 2 + 2 + 4 + 4 + 4 = 16
  /// bytes per parameter as mixed-precision training does. ZeRO-1/2 then all-gather the updated
  /// shard into the whole parameter `name`.next (phase opt, "param_gather").
  void Adam(const Param& p) {
    b_->SetLayer(p.layer);
    const std::string& s = p.stored;
    std::string m = b_->AddLike(p.name + ".adam_m", s, DType::kF32);
    std::string v = b_->AddLike(p.name + ".adam_v", s, DType::kF32);
    std::string next = b_->AddLike(s + ".next", s, dtype_);
    std::string m_next = b_->AddLike(p.name + ".adam_m.next", s, DType::kF32);
    std::string v_next = b_->AddLike(p.name + ".adam_v.next", s, DType::kF32);
    std::vector<std::string> inputs = {s, p.grad, m, v}, outputs = {next, m_next, v_next};
    if (DTypeBytes(dtype_) < 4) {  // mixed precision: the f32 master copy Adam updates
      inputs.push_back(b_->AddLike(s + ".master", s, DType::kF32));
      outputs.push_back(b_->AddLike(s + ".master.next", s, DType::kF32));
    }
    const double flops = FlopsPerUnit(ComputeType::kAdam) * b_->Get(s).NumElements();
    b_->AddCompute(p.name + ".adam", ComputeType::kAdam, std::move(inputs), std::move(outputs),
                   flops,
                   {{"lr", kAdamLr}, {"beta1", kAdamBeta1}, {"beta2", kAdamBeta2},
                    {"eps", kAdamEps}, {"step", 1}});
    if (plan_.zero == 1 || plan_.zero == 2) {
      std::string full = b_->AddTensor(p.name + ".next", p.shape, dtype_, p.sharding);
      b_->AddCollective(p.name + ".ag.opt", CollectiveType::kAllGather, next, full, {"dp"},
                        ReduceOp::kSum, kParamGather);
    }
  }

  MbBuilder* b_;
  const ParallelPlan& plan_;
  DType dtype_;
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> index_;
};

/// Local sizes of one rank under the plan.
struct LocalDims {
  int64_t batch = 0;      // B, sequences per dp rank
  int64_t seq = 0;        // s
  int64_t seq_local = 0;  // s/tp under sequence parallelism, else s
  int64_t hidden = 0;     // h
  int64_t q_width = 0;    // h/tp (query and attention output width per rank)
  int64_t kv_width = 0;   // kv_heads*d/tp (key and value width per rank)
  int64_t ffn_tp = 0;     // ffn_hidden/tp
  int64_t vocab_tp = 0;   // V/tp
  int64_t heads_tp = 0;   // a/tp
  int64_t kv_heads_tp = 0;  // kv_heads/tp
  int64_t experts = 0;        // E (MoE)
  int64_t experts_local = 0;  // E/ep, the experts this rank holds
  int64_t slots = 0;          // B*C: each expert's buffer rows for this rank's sequences
};

/// Forward tensors of one block that its backward reads. `*_full` are the
/// full-sequence inputs of the tp regions (the gathered ones under sp); under
/// sp the forward keeps only the norms' sequence shards `n1`, `n2` and the
/// backward all-gathers them again (Megatron's sequence-parallel linear
/// layers save the shard, not the gathered input), so `*_full` is empty in
/// what the forward keeps. Under full recomputation the forward keeps `x`
/// alone and the backward re-runs the block (TransformerLowering::Recompute).
struct BlockActs {
  std::string x, n1, n1_full, q, k, v, attn, res1, n2, n2_full;
  std::string up;   // gpt: fc1 output; llama: up projection output
  std::string gate; // llama: gate projection output
  std::string act;  // gpt: gelu output; llama: swiglu output
  // MoE (gate, up and act above are the experts' [E/ep, T, f/tp] tensors):
  std::string probs, gates, ids;  // router softmax [B, s, E]; top-k gates and ids [B, s, k]
  std::string expert_in;          // the experts' input rows [E/ep, T, h]
  std::string expert_out;         // the combine's input, expert outputs [E, B*C, h]
};

/// Forward tensors of one micro-batch that its backward reads.
struct MicrobatchActs {
  std::vector<BlockActs> blocks;  // by layer - first layer of the stage
  std::string tokens, positions, labels;  // graph inputs
  std::string final_x, final_full, logits, max, sum_exp;
  std::string head_table_grad;  // gpt without pp: the tied head's grad
};

/// The part of the model one pipeline stage (pp rank) runs in one of its
/// model chunks: layers [first_layer, end_layer) of virtual stage `vindex` =
/// chunk * stages + index. Virtual stage 0 also runs the embedding, the last
/// one the final norm, the LM head and the loss. Without interleaving
/// (chunks = 1) the virtual stage is the stage.
struct StageSpec {
  int index = 0;   // pp coordinate
  int stages = 1;  // pp
  int chunk = 0;   // model chunk on this rank, 0..chunks-1
  int chunks = 1;  // vstages
  int first_layer = 0;
  int end_layer = 0;
  /// This rank holds the embedding (pp rank 0) / the LM head (the last pp rank).
  bool First() const { return index == 0; }
  bool Last() const { return index == stages - 1; }
  /// The virtual stage index and whether this chunk runs the embedding / the loss.
  int VirtualIndex() const { return chunk * stages + index; }
  bool EmbedChunk() const { return VirtualIndex() == 0; }
  bool HeadChunk() const { return VirtualIndex() == stages * chunks - 1; }
};

/// Chunk `chunk` of stage `index` among `stages` x `chunks` equal shares of
/// the layers.
StageSpec MakeStage(const ModelConfig& model, int index, int stages, int chunk = 0,
                    int chunks = 1) {
  const int per_chunk = model.layers / (stages * chunks);
  const int vindex = chunk * stages + index;
  return StageSpec{index, stages, chunk, chunks, vindex * per_chunk, (vindex + 1) * per_chunk};
}

/// Lowers one training step of a decoder, or of one pipeline stage of it,
/// into a graph.
class TransformerLowering {
 public:
  TransformerLowering(const ModelConfig& model, const ParallelPlan& plan, const StageSpec& stage,
                      Graph* graph)
      : m_(model), plan_(plan), stage_(stage), b_(graph, plan.microbatches),
        params_(&b_, plan, model.dtype),
        acts_(static_cast<size_t>(plan.microbatches) * stage.chunks) {
    const int64_t head_dim = model.hidden / model.heads;
    d_.batch = model.batch;
    d_.seq = model.seq;
    d_.seq_local = plan.sp ? model.seq / plan.tp : model.seq;
    d_.hidden = model.hidden;
    d_.q_width = model.hidden / plan.tp;
    d_.kv_width = head_dim * model.kv_heads / plan.tp;
    d_.ffn_tp = model.ffn_hidden / plan.tp;
    d_.vocab_tp = model.vocab / plan.tp;
    d_.heads_tp = model.heads / plan.tp;
    d_.kv_heads_tp = model.kv_heads / plan.tp;
    d_.experts = model.experts;
    d_.experts_local = model.experts / plan.ep;
    d_.slots = model.batch * MoeCapacity(model);
  }

  /// Emits the stage's forwards and backwards in 1F1B order (interleaved
  /// when the stage has several model chunks), then the cross-stage
  /// tied-gradient sum (gpt, pp > 1) and the optimizer. Without pp and with
  /// one micro-batch: forward, backward, optimizer.
  void Build() {
    if (stage_.chunks > 1) {
      BuildInterleaved();
    } else {
      const std::vector<PipeStep> order =
          OneFOneB(stage_.index, stage_.stages, plan_.microbatches);
      for (size_t i = 0; i < order.size(); ++i) {
        if (order[i].forward) {
          Forward(order[i].microbatch);
        } else {
          const bool forward_next = i + 1 < order.size() && order[i + 1].forward;
          Backward(order[i].microbatch, forward_next);
        }
      }
    }
    b_.SetMicrobatch(-1);
    if (TiedAcrossStages()) ExchangeTiedGrad();
    b_.SetPhase(Phase::kOptimizer);
    params_.EmitOptimizer();
  }

 private:
  /// Interleaved 1F1B (ScheduleInterleaved): each pass in its chunk, with
  /// the sends and recvs the schedule places before it.
  void BuildInterleaved() {
    const InterleavedSchedule schedule = ScheduleInterleaved(
        stage_.index, stage_.stages, stage_.chunks, plan_.microbatches);
    for (size_t i = 0; i <= schedule.steps.size(); ++i) {
      for (const CommEvent& e : schedule.before[i]) EmitCommEvent(e);
      if (i == schedule.steps.size()) break;
      const PipeStep& step = schedule.steps[i];
      SetChunk(step.chunk);
      if (step.forward) {
        Forward(step.microbatch);
      } else {
        Backward(step.microbatch, false);
      }
    }
    SetChunk(0);
  }

  /// Makes `chunk` the model chunk that the next passes run.
  void SetChunk(int chunk) {
    stage_ = MakeStage(m_, stage_.index, stage_.stages, chunk, stage_.chunks);
  }

  /// "pp.<what>", or "pp.chunk<c>.<what>" for chunk c under interleaving.
  std::string P2PName(const std::string& what, int chunk) const {
    return stage_.chunks > 1 ? "pp.chunk" + std::to_string(chunk) + "." + what : "pp." + what;
  }

  /// One send or recv of interleaved 1F1B: a send reads the output its pass
  /// left in `outgoing_`; a recv declares the input its pass will read from
  /// `incoming_`.
  void EmitCommEvent(const CommEvent& e) {
    const std::tuple<bool, int, int> key{e.forward, e.microbatch, e.chunk};
    const std::string dir = e.forward ? "fwd" : "bwd";
    const int tag = e.forward ? kTagActivation : kTagActivationGrad;
    const Phase phase = e.forward ? Phase::kForward : Phase::kBackward;
    std::string tensor;
    if (e.send) {
      tensor = outgoing_.at(key);
    } else {
      b_.SetMicrobatch(e.microbatch);
      b_.SetLayer(-1);
      tensor = ResidAct(P2PName(dir + ".recv.out", e.chunk));
      incoming_[key] = tensor;
    }
    b_.AddP2P({e.send ? OpKind::kSend : OpKind::kRecv,
               P2PName(dir + (e.send ? ".send" : ".recv"), e.chunk), tensor, e.offset, tag,
               e.microbatch, phase, kPipeline});
  }

  /// The forward of micro-batch `k`: the stage input (embedding, or a recv
  /// from the previous stage, after which a deferred activation-grad send
  /// goes out), the stage's blocks, then the loss or a send to the next stage.
  /// Under interleaving the input comes from `incoming_` and the output goes
  /// to `outgoing_` (EmitCommEvent places the recv and the send).
  void Forward(int k) {
    b_.SetMicrobatch(k);
    b_.SetPhase(Phase::kForward);
    DeclareInputs();
    const std::tuple<bool, int, int> key{true, k, stage_.chunk};
    std::string x = stage_.EmbedChunk() ? EmbedForward()
                    : stage_.chunks > 1 ? incoming_.at(key)
                                        : RecvFromPrevious();
    for (int l = stage_.first_layer; l < stage_.end_layer; ++l) x = BlockForward(l, x);
    if (stage_.HeadChunk()) {
      LossForward(x);
    } else if (stage_.chunks > 1) {
      outgoing_[key] = x;
    } else {
      b_.AddP2P({OpKind::kSend, "pp.fwd.send", x, +1, kTagActivation, k, Phase::kForward,
                 kPipeline});
    }
  }

  /// The backward of micro-batch `k`: the loss grad or a recv from the next
  /// stage, the blocks in reverse, then the embedding grads or the send of
  /// d(stage input) to the previous stage. When a forward comes next the send
  /// waits until after that forward's recv (`defer_send`): the previous stage
  /// sends its activation before it receives this grad, and a send and its
  /// recv meet as a rendezvous on one comm stream, so the opposite order
  /// would deadlock.
  void Backward(int k, bool defer_send) {
    b_.SetMicrobatch(k);
    b_.SetPhase(Phase::kBackward);
    const std::tuple<bool, int, int> key{false, k, stage_.chunk};
    std::string dx = stage_.HeadChunk() ? LossBackward()
                     : stage_.chunks > 1 ? incoming_.at(key)
                                         : RecvFromNext(k);
    for (int l = stage_.end_layer - 1; l >= stage_.first_layer; --l) dx = BlockBackward(l, dx);
    if (stage_.EmbedChunk()) {
      EmbedBackward(dx);
    } else if (stage_.chunks > 1) {
      outgoing_[key] = dx;
    } else {
      pending_send_ = {OpKind::kSend, "pp.bwd.send", dx, -1, kTagActivationGrad, k,
                       Phase::kBackward, kPipeline};
      if (!defer_send) FlushPendingSend();
    }
    Acts() = MicrobatchActs();  // its forward tensors are no longer read
  }

  /// Receives this micro-batch's stage input (the previous stage's last
  /// block output, a residual-stream tensor) and then sends the deferred
  /// activation grad, if any.
  std::string RecvFromPrevious() {
    b_.SetLayer(-1);
    std::string x = ResidAct("pp.fwd.recv.out");
    b_.AddP2P({OpKind::kRecv, "pp.fwd.recv", x, -1, kTagActivation, b_.Microbatch(),
               Phase::kForward, kPipeline});
    FlushPendingSend();
    return x;
  }

  /// Receives d(stage output) of micro-batch `k` from the next stage.
  std::string RecvFromNext(int k) {
    b_.SetLayer(-1);
    std::string dy = ResidAct("pp.bwd.recv.out");
    b_.AddP2P({OpKind::kRecv, "pp.bwd.recv", dy, +1, kTagActivationGrad, k, Phase::kBackward,
               kPipeline});
    return dy;
  }

  /// Emits the deferred send of an activation grad, if one is pending.
  void FlushPendingSend() {
    if (pending_send_.tensor.empty()) return;
    b_.AddP2P(pending_send_);
    pending_send_ = P2P();
  }

  /// gpt with pp > 1: the first and the last stage each hold the tied word
  /// table (embedding and LM head).
  bool TiedAcrossStages() const {
    return Gpt() && stage_.stages > 1 && (stage_.First() || stage_.Last());
  }

  /// The Megatron-style sum of the two tied-table gradients (step scope,
  /// after every micro-batch): the first and the last stage exchange their
  /// accumulated gradients with a send and a recv each (tag 2, purpose
  /// "grad_sync"; the first stage sends first, the last receives first) and
  /// add them, so both copies get the same update. A send/recv pair per
  /// (dp, tp) coordinate, because an explicit-ranks group must hold every
  /// rank that runs the graph. Then the usual dp sync.
  void ExchangeTiedGrad() {
    b_.SetPhase(Phase::kBackward);
    b_.SetLayer(-1);
    const std::string table = "embed.word.table";
    const std::string own = params_.Accumulated(table);
    const Tensor& t = b_.Get(own);
    Axes partial = t.partial;
    const DType dtype = t.dtype;
    std::string other = b_.AddLike(table + ".grad.other_stage", own, dtype, partial);
    std::string sum = b_.AddLike(table + ".grad.tied", own, dtype, partial);
    const int offset = stage_.First() ? stage_.stages - 1 : -(stage_.stages - 1);
    P2P send{OpKind::kSend, table + ".grad.send", own, offset, kTagTiedGrad, -1,
             Phase::kBackward, kGradSync};
    P2P recv{OpKind::kRecv, table + ".grad.recv", other, offset, kTagTiedGrad, -1,
             Phase::kBackward, kGradSync};
    if (stage_.First()) {
      b_.AddP2P(send);
      b_.AddP2P(recv);
    } else {
      b_.AddP2P(recv);
      b_.AddP2P(send);
    }
    Add(table + ".grad.tied_add", own, other, sum);
    params_.FinishDeferred(table, sum);
  }

  /// The forward tensors of the current micro-batch in the current chunk.
  MicrobatchActs& Acts() {
    return acts_[static_cast<size_t>(stage_.chunk) * plan_.microbatches + b_.Microbatch()];
  }

 private:
  /// gpt family (else llama).
  bool Gpt() const { return m_.family == ModelFamily::kGpt; }

  // ---- tensors ------------------------------------------------------------

  /// "L<layer>.", the prefix of a block's op and tensor names; while
  /// recomputing, "L<layer>.recompute.".
  std::string LayerPrefix(int layer) const {
    std::string prefix = "L";
    prefix += std::to_string(layer);
    prefix += recomputing_ ? ".recompute." : ".";
    return prefix;
  }
  /// {"tp"} when tp > 1: the partial sum a row-parallel matmul leaves.
  Axes TpPartial() const { return plan_.tp > 1 ? Axes{"tp"} : Axes{}; }

  /// The mesh axes the batch is sharded over: {"dp"}, or {"dp", "ep"} with
  /// expert parallelism (the ep group is carved out of the dp ranks).
  Axes DataAxes() const { return plan_.ep > 1 ? Axes{"dp", "ep"} : Axes{"dp"}; }
  /// [B, s(, n)]: the batch dim is this rank's dp share of the global batch;
  /// the sequence dim is sharded over tp when `seq_on_tp`, the last dim (of a
  /// rank-3 tensor) when `last_on_tp`.
  Sharding ActSharding(int rank, bool seq_on_tp, bool last_on_tp) const {
    Sharding s(rank);
    s[0] = DataAxes();
    if (seq_on_tp) s[1] = {"tp"};
    if (last_on_tp && rank == 3) s[2] = {"tp"};
    return s;
  }
  /// A full-sequence activation [B, s, width] (last dim sharded on tp if asked).
  std::string Act(const std::string& name, int64_t width, bool on_tp, Axes partial = {}) {
    return b_.AddTensor(name, {d_.batch, d_.seq, width}, m_.dtype, ActSharding(3, false, on_tp),
                        std::move(partial));
  }
  /// A residual-stream activation [B, s_local, h]: sequence-sharded under sp.
  std::string ResidAct(const std::string& name) {
    return b_.AddTensor(name, {d_.batch, d_.seq_local, d_.hidden}, m_.dtype,
                        ActSharding(3, plan_.sp, false));
  }
  /// A per-token tensor [B, s] (or [B, s/tp] when `seq_sharded`).
  std::string TokenScalar(const std::string& name, DType dtype, Axes partial = {},
                          bool seq_sharded = false) {
    return b_.AddTensor(name, {d_.batch, seq_sharded ? d_.seq_local : d_.seq}, dtype,
                        ActSharding(2, seq_sharded && plan_.sp, false), std::move(partial));
  }

  // ---- tensor-parallel collectives ---------------------------------------

  /// All-reduces `partial` over tp into `name`.out when tp > 1; returns the
  /// reduced tensor (`partial` itself when tp = 1).
  std::string TpAllReduce(const std::string& name, const std::string& partial, ReduceOp reduce) {
    if (plan_.tp == 1) return partial;
    const Tensor& t = b_.Get(partial);
    Shape shape = t.shape;
    Sharding sharding = t.sharding;
    std::string out = b_.AddTensor(name + ".out", std::move(shape), t.dtype, std::move(sharding));
    b_.AddCollective(name, CollectiveType::kAllReduce, partial, out, {"tp"}, reduce, kActivation);
    return out;
  }
  /// Megatron's "g" (and the backward of "f"): turns a tp-partial [B, s, h]
  /// into the residual stream: all-reduce `base`.ar, or under sp a
  /// reduce-scatter `base`.rs onto the sequence dim ([B, s/tp, h]).
  std::string TpReduce(const std::string& base, const std::string& partial) {
    if (!plan_.sp) return TpAllReduce(base + ".ar", partial, ReduceOp::kSum);
    std::string out = ResidAct(base + ".rs.out");
    b_.AddCollective(base + ".rs", CollectiveType::kReduceScatter, partial, out, {"tp"},
                     ReduceOp::kSum, kActivation);
    return out;
  }
  /// Under sp, all-gathers a sequence shard [B, s/tp, h] into [B, s, h]
  /// (`base`.ag); without sp the residual stream is already whole.
  std::string TpGather(const std::string& base, const std::string& shard) {
    if (!plan_.sp) return shard;
    std::string out = Act(base + ".ag.out", d_.hidden, false);
    b_.AddCollective(base + ".ag", CollectiveType::kAllGather, shard, out, {"tp"}, ReduceOp::kSum,
                     kActivation);
    return out;
  }

  // ---- op helpers ---------------------------------------------------------

  /// Tokens (B * sequence length) of activation `t`.
  int64_t Tokens(const std::string& t) const {
    const Tensor& x = b_.Get(t);
    return x.shape[0] * x.shape[1];
  }
  /// out = x [B, s, k] x w, with w [k, n] (or [n, k] and transpose_w: a
  /// linear layer's dX, or an LM head); 2 * B*s * k * n flops.
  void Linear(const std::string& name, const std::string& x, const std::string& w,
              const std::string& out, bool transpose_w) {
    const Tensor& wt = b_.Get(w);
    const double flops = 2.0 * Tokens(x) * wt.shape[0] * wt.shape[1];
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
    const double flops = 2.0 * Tokens(x) * g.shape[0] * g.shape[1];
    b_.AddCompute(name, ComputeType::kMatmul, {x2d, dy2d}, {grad}, flops,
                  {{"transpose_a", 1}, {"transpose_b", 0}});
  }
  /// Declares `name`, a [B*s, n] view of activation `t` [B, s, n] (same
  /// sharding of the token and last dims).
  std::string TokenView(const std::string& name, const std::string& t) {
    const Tensor& src = b_.Get(t);
    Shape shape = {src.shape[0] * src.shape[1], src.shape.back()};
    Sharding sharding = {src.sharding.front(), src.sharding.back()};
    Axes partial = src.partial;
    DType dtype = src.dtype;
    return b_.AddTensor(name, std::move(shape), dtype, std::move(sharding), std::move(partial));
  }
  /// "<linear>.dW": gradient of "<linear>.w" from its input x and output
  /// grad dy, synced right after.
  void WeightGrad(const std::string& linear, const std::string& x, const std::string& dy) {
    const std::string w = linear + ".w";
    std::string grad = params_.NewGrad(w + ".grad", w, false);
    MatmulWeightGrad(linear + ".dW", x, dy, grad);
    params_.AddGrad(w, grad);
  }
  /// out = x + y (elementwise, same shapes).
  void Add(const std::string& name, const std::string& x, const std::string& y,
           const std::string& out) {
    const double flops = FlopsPerUnit(ComputeType::kAdd) * b_.Get(out).NumElements();
    b_.AddCompute(name, ComputeType::kAdd, {x, y}, {out}, flops);
  }
  /// Declares the parameter and returns the tensor forward ops read.
  std::string UseParam(const std::string& name, Shape shape, Sharding sharding, int layer) {
    return ParamRead(params_.Declare(ParamName(name), std::move(shape), std::move(sharding), layer));
  }
  /// The parameter called `name` by a forward's naming: while recomputing,
  /// the names carry "L<layer>.recompute." and the parameter is the
  /// forward's "L<layer>.<...>".
  std::string ParamName(const std::string& name) const {
    if (!recomputing_) return name;
    constexpr std::string_view kTag = ".recompute.";
    const size_t at = name.find(kTag);
    return at == std::string::npos ? name : name.substr(0, at + 1) + name.substr(at + kTag.size());
  }
  /// The tensor a forward op reads for parameter `name`: the forward's copy,
  /// or while recomputing in the backward the backward's (ZeRO-3 gathers
  /// each once per micro-batch and pass).
  std::string ParamRead(const std::string& name) {
    return recomputing_ ? params_.Bwd(ParamName(name)) : params_.Fwd(name);
  }

  /// `prefix`.out = norm(x): LayerNorm (gamma, beta) for gpt, RMSNorm (gamma)
  /// for llama, over h on the residual stream (a sequence shard under sp).
  std::string Norm(const std::string& prefix, const std::string& x, int layer) {
    params_.Declare(ParamName(prefix + ".gamma"), {d_.hidden}, {{}}, layer);
    if (Gpt()) params_.Declare(ParamName(prefix + ".beta"), {d_.hidden}, {{}}, layer);
    std::string y = ResidAct(prefix + ".out");
    std::vector<std::string> inputs = {x, ParamRead(prefix + ".gamma")};
    if (Gpt()) inputs.push_back(ParamRead(prefix + ".beta"));
    const double elems = static_cast<double>(b_.Get(x).NumElements());
    if (Gpt()) {
      b_.AddCompute(prefix, ComputeType::kLayerNorm, std::move(inputs), {y},
                    FlopsPerUnit(ComputeType::kLayerNorm) * elems, {{"eps", kLayerNormEps}});
    } else {
      b_.AddCompute(prefix, ComputeType::kRmsNorm, std::move(inputs), {y},
                    FlopsPerUnit(ComputeType::kRmsNorm) * elems, {{"eps", kRmsNormEps}});
    }
    return y;
  }
  /// Backward of Norm(`prefix`): dx into `prefix`.grad.dx; the parameter
  /// grads are partial over tp under sp (each rank saw its sequence shard)
  /// and are synced right after. Returns dx.
  std::string NormGrad(const std::string& prefix, const std::string& dy, const std::string& x) {
    const std::string name = prefix + ".grad", gamma = prefix + ".gamma", beta = prefix + ".beta";
    std::string dx = ResidAct(name + ".dx");
    std::vector<std::string> outputs = {dx, params_.NewGrad(gamma + ".grad", gamma, plan_.sp)};
    if (Gpt()) outputs.push_back(params_.NewGrad(beta + ".grad", beta, plan_.sp));
    std::string gamma_in = params_.Bwd(gamma);
    const double elems = static_cast<double>(b_.Get(x).NumElements());
    if (Gpt()) {
      b_.AddCompute(name, ComputeType::kLayerNormGrad, {dy, x, gamma_in}, outputs,
                    FlopsPerUnit(ComputeType::kLayerNormGrad) * elems, {{"eps", kLayerNormEps}});
    } else {
      b_.AddCompute(name, ComputeType::kRmsNormGrad, {dy, x, gamma_in}, outputs,
                    FlopsPerUnit(ComputeType::kRmsNormGrad) * elems, {{"eps", kRmsNormEps}});
    }
    params_.AddGrad(gamma, outputs[1]);
    if (Gpt()) params_.AddGrad(beta, outputs[2]);
    return dx;
  }
  /// Local head counts of the attention ops, causal.
  Attrs AttentionAttrs() const {
    Attrs attrs = {{"heads", static_cast<double>(d_.heads_tp)},
                   {"kv_heads", static_cast<double>(d_.kv_heads_tp)},
                   {"causal", 1}};
    if (!m_.fused_attention) attrs["fused"] = 0;  // priced as unfused kernels (docs/cost-model.md)
    return attrs;
  }
  /// Full (non-causal-discounted) attention flops: scores 2*B*s^2*h/tp plus
  /// probabilities x V 2*B*s^2*h/tp (grouped-query attention does not change them).
  double AttentionFlops() const { return 4.0 * d_.batch * d_.seq * d_.seq * d_.q_width; }

  // ---- forward ------------------------------------------------------------

  /// This micro-batch's graph inputs: token ids [B, s] (int32) on the first
  /// stage, gpt positions there too ([B, s/tp] under sp: the positions of
  /// this rank's sequence shard), labels [B, s] on the last stage.
  void DeclareInputs() {
    MicrobatchActs& acts = Acts();
    if (stage_.EmbedChunk()) acts.tokens = TokenScalar("tokens", DType::kI32);
    if (stage_.EmbedChunk() && Gpt())
      acts.positions = TokenScalar("positions", DType::kI32, {}, true);
    if (stage_.HeadChunk()) acts.labels = TokenScalar("labels", DType::kI32);
  }

  /// An embedding lookup; its bytes count the gathered rows, not the table.
  void Embedding(const std::string& name, const std::string& table, const std::string& ids,
                 const std::string& out) {
    int id = b_.AddCompute(name, ComputeType::kEmbedding, {table, ids}, {out}, 0);
    b_.SetBytes(id, 2.0 * b_.Get(out).Bytes() + b_.Get(ids).Bytes());
  }

  /// Vocab-parallel word embedding + tp reduction (all-reduce, or
  /// reduce-scatter onto the sequence under sp); gpt adds position embeddings.
  std::string EmbedForward() {
    b_.SetLayer(-1);
    params_.Declare("embed.word.table", {d_.vocab_tp, d_.hidden}, {{"tp"}, {}}, -1);
    if (TiedAcrossStages()) params_.Defer("embed.word.table");
    if (Gpt()) params_.Declare("embed.pos.table", {d_.seq, d_.hidden}, {{}, {}}, -1);
    std::string word = Act("embed.word.out", d_.hidden, false, TpPartial());
    Embedding("embed.word", params_.Fwd("embed.word.table"), Acts().tokens, word);
    word = TpReduce("embed.word", word);
    if (!Gpt()) return word;
    std::string pos = ResidAct("embed.pos.out");
    Embedding("embed.pos", params_.Fwd("embed.pos.table"), Acts().positions, pos);
    std::string sum = ResidAct("embed.out");
    Add("embed.add", word, pos, sum);
    return sum;
  }

  /// One pre-norm block; keeps what its backward reads (BlockActs) and
  /// returns the new residual stream.
  std::string BlockForward(int layer, const std::string& x) {
    BlockActs a;
    std::string out = RunBlock(layer, x, &a);
    if (plan_.recompute == Recompute::kFull) {
      a = BlockActs{};
      a.x = x;  // the checkpoint: the layer's input
    } else if (plan_.sp) {
      a.n1_full.clear();  // the shards n1, n2 are kept and gathered again
      a.n2_full.clear();
    }
    Acts().blocks.push_back(a);
    return out;
  }

  /// The ops of one block's forward, filling `a`. While recomputing it stops
  /// once every tensor the backward reads exists (before the MLP's output
  /// projection, its tp reduction and the residual add, whose outputs the
  /// backward does not read; PyTorch's non-reentrant checkpoint stops there
  /// too) and returns "".
  std::string RunBlock(int layer, const std::string& x, BlockActs* a) {
    b_.SetLayer(layer);
    const std::string p = LayerPrefix(layer);
    a->x = x;
    a->n1 = Norm(p + "ln1", x, layer);
    a->n1_full = TpGather(p + "ln1", a->n1);
    std::string attn_out = Gpt() ? GptAttentionForward(layer, a) : LlamaAttentionForward(layer, a);
    a->res1 = ResidAct(p + "attn.res.out");
    Add(p + "attn.res", x, attn_out, a->res1);
    a->n2 = Norm(p + "ln2", a->res1, layer);
    a->n2_full = TpGather(p + "ln2", a->n2);
    std::string mlp_out = Gpt()          ? GptMlpForward(layer, a)
                          : IsMoe(m_)    ? MoeForward(layer, a)
                                         : LlamaMlpForward(layer, a);
    if (recomputing_) return "";
    std::string res2 = ResidAct(p + "mlp.res.out");
    Add(p + "mlp.res", a->res1, mlp_out, res2);
    return res2;
  }

  /// Full recomputation: re-runs block `layer`'s forward from its kept input
  /// `x` at the start of its backward (ops "L<layer>.recompute.*", phase
  /// backward; the caller gates them on d(block output): GraphBuilder::GateOpsFrom)
  /// and returns the tensors the backward reads.
  BlockActs Recompute(int layer, const std::string& x) {
    recomputing_ = true;
    BlockActs a;
    RunBlock(layer, x, &a);
    recomputing_ = false;
    return a;
  }

  /// The full-sequence input of a tp region: `full` when the forward kept it,
  /// else (sp) the kept shard all-gathered again (`base`.bwd.ag).
  std::string FullInput(const std::string& base, const std::string& shard, const std::string& full) {
    return full.empty() ? TpGather(base + ".bwd", shard) : full;
  }

  /// The attention core (heads/tp query heads, kv_heads/tp key/value heads).
  void AttentionCore(const std::string& p, BlockActs* a) {
    a->attn = Act(p + "core.out", d_.q_width, true);
    b_.AddCompute(p + "core", ComputeType::kAttention, {a->q, a->k, a->v}, {a->attn},
                  AttentionFlops(), AttentionAttrs());
  }

  /// gpt: fused qkv (column parallel) -> slices -> attention -> proj (row
  /// parallel) -> tp reduction.
  std::string GptAttentionForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "attn.";
    const int64_t qw = d_.q_width, kvw = d_.kv_width;
    std::string w_qkv = UseParam(p + "qkv.w", {d_.hidden, qw + 2 * kvw}, {{}, {"tp"}}, layer);
    std::string qkv = Act(p + "qkv.out", qw + 2 * kvw, true);
    Linear(p + "qkv", a->n1_full, w_qkv, qkv, false);
    a->q = Slice(p + "q", qkv, 0, qw);
    a->k = Slice(p + "k", qkv, qw, kvw);
    a->v = Slice(p + "v", qkv, qw + kvw, kvw);
    AttentionCore(p, a);
    std::string w_proj = UseParam(p + "proj.w", {qw, d_.hidden}, {{"tp"}, {}}, layer);
    std::string proj = Act(p + "proj.out", d_.hidden, false, TpPartial());
    Linear(p + "proj", a->attn, w_proj, proj, false);
    return TpReduce(p + "proj", proj);
  }

  /// Columns [start, start + len) of the fused qkv tensor.
  std::string Slice(const std::string& name, const std::string& qkv, int64_t start, int64_t len) {
    std::string out = Act(name + ".out", len, true);
    b_.AddCompute(name, ComputeType::kSlice, {qkv}, {out}, 0,
                  {{"axis", 2}, {"start", static_cast<double>(start)},
                   {"len", static_cast<double>(len)}});
    return out;
  }

  /// A column-parallel projection "<p><what>": weight [h, width] sharded on
  /// its columns, output [B, s, width] sharded on tp.
  std::string ColumnLinear(const std::string& p, const std::string& what, const std::string& x,
                           int64_t width, int layer) {
    std::string w = UseParam(p + what + ".w", {d_.hidden, width}, {{}, {"tp"}}, layer);
    std::string out = Act(p + what + ".out", width, true);
    Linear(p + what, x, w, out, false);
    return out;
  }
  /// A row-parallel projection "<p><what>": weight [width, h] sharded on its
  /// rows, output [B, s, h] partial over tp.
  std::string RowLinear(const std::string& p, const std::string& what, const std::string& x,
                        int64_t width, int layer) {
    std::string w = UseParam(p + what + ".w", {width, d_.hidden}, {{"tp"}, {}}, layer);
    std::string out = Act(p + what + ".out", d_.hidden, false, TpPartial());
    Linear(p + what, x, w, out, false);
    return out;
  }

  /// llama: q [h, h/tp], k and v [h, kv*d/tp] (column parallel) -> grouped-
  /// query attention -> o [h/tp, h] (row parallel) -> tp reduction.
  std::string LlamaAttentionForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "attn.";
    a->q = ColumnLinear(p, "q", a->n1_full, d_.q_width, layer);
    a->k = ColumnLinear(p, "k", a->n1_full, d_.kv_width, layer);
    a->v = ColumnLinear(p, "v", a->n1_full, d_.kv_width, layer);
    AttentionCore(p, a);
    return TpReduce(p + "o", RowLinear(p, "o", a->attn, d_.q_width, layer));
  }

  /// gpt: fc1 (column parallel) -> gelu -> fc2 (row parallel) -> tp reduction.
  std::string GptMlpForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    a->up = ColumnLinear(p, "fc1", a->n2_full, d_.ffn_tp, layer);
    a->act = Act(p + "gelu.out", d_.ffn_tp, true);
    b_.AddCompute(p + "gelu", ComputeType::kGelu, {a->up}, {a->act},
                  FlopsPerUnit(ComputeType::kGelu) * b_.Get(a->up).NumElements());
    if (recomputing_) return "";
    return TpReduce(p + "fc2", RowLinear(p, "fc2", a->act, d_.ffn_tp, layer));
  }

  /// llama: gate and up (column parallel) -> swiglu -> down (row parallel)
  /// -> tp reduction.
  std::string LlamaMlpForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    a->gate = ColumnLinear(p, "gate", a->n2_full, d_.ffn_tp, layer);
    a->up = ColumnLinear(p, "up", a->n2_full, d_.ffn_tp, layer);
    a->act = Act(p + "swiglu.out", d_.ffn_tp, true);
    b_.AddCompute(p + "swiglu", ComputeType::kSwiglu, {a->gate, a->up}, {a->act},
                  FlopsPerUnit(ComputeType::kSwiglu) * b_.Get(a->act).NumElements());
    if (recomputing_) return "";
    return TpReduce(p + "down", RowLinear(p, "down", a->act, d_.ffn_tp, layer));
  }

  // ---- mixture of experts ---------------------------------------------------

  /// Expert buffers [E, B*C, h]: every expert's C slots for each of this
  /// rank's B sequences (dim 1 sharded like the batch).
  std::string ExpertBuffer(const std::string& name) {
    return b_.AddTensor(name, {d_.experts, d_.slots, d_.hidden}, m_.dtype, {{}, DataAxes(), {}});
  }
  /// The local experts' rows [E/ep, ep*B*C, width]: dim 0 sharded over ep,
  /// dim 1 (the slots of the ep group's sequences, in data-rank order) over
  /// dp, the last over tp when `on_tp`.
  std::string ExpertRows(const std::string& name, int64_t width, bool on_tp, Axes partial = {}) {
    Sharding sharding = {plan_.ep > 1 ? Axes{"ep"} : Axes{}, {"dp"}, on_tp ? Axes{"tp"} : Axes{}};
    return b_.AddTensor(name, {d_.experts_local, plan_.ep * d_.slots, width}, m_.dtype,
                        std::move(sharding), std::move(partial));
  }
  /// A row-major view (identity, no bytes moved).
  void View(const std::string& name, const std::string& in, const std::string& out) {
    const int id = b_.AddCompute(name, ComputeType::kIdentity, {in}, {out}, 0);
    b_.SetBytes(id, 0);
  }
  /// Expert buffers [E, B*C, h] -> the local experts' rows [E/ep, ep*B*C, h].
  /// With ep > 1: an all-to-all over ep (`base`.a2a: chunk j, experts
  /// [j E/ep, (j+1) E/ep), goes to ep rank j, which receives [ep, E/ep, B*C,
  /// h] by source), a transpose to [E/ep, ep, B*C, h] and a view. With ep = 1
  /// the buffers are the rows.
  std::string ToExperts(const std::string& base, const std::string& buffers) {
    if (plan_.ep == 1) return buffers;
    const int64_t ep = plan_.ep, el = d_.experts_local;
    std::string recv = b_.AddTensor(base + ".a2a.out", {ep, el, d_.slots, d_.hidden}, m_.dtype,
                                    {{}, {"ep"}, {"dp"}, {}});
    b_.AddCollective(base + ".a2a", CollectiveType::kAllToAll, buffers, recv, {"ep"},
                     ReduceOp::kSum, kActivation);
    std::string by_expert = b_.AddTensor(base + ".transpose.out", {el, ep, d_.slots, d_.hidden},
                                         m_.dtype, {{"ep"}, {}, {"dp"}, {}});
    b_.AddCompute(base + ".transpose", ComputeType::kTranspose, {recv}, {by_expert}, 0,
                  {{"axis0", 0}, {"axis1", 1}});
    std::string rows = ExpertRows(base + ".rows", d_.hidden, false);
    View(base + ".view", by_expert, rows);
    return rows;
  }
  /// The inverse of ToExperts: the local experts' rows [E/ep, ep*B*C, h] back
  /// to this rank's expert buffers [E, B*C, h] (view, transpose, all-to-all
  /// `base`.a2a over ep).
  std::string FromExperts(const std::string& base, const std::string& rows) {
    if (plan_.ep == 1) return rows;
    const int64_t ep = plan_.ep, el = d_.experts_local;
    std::string by_expert = b_.AddTensor(base + ".view.out", {el, ep, d_.slots, d_.hidden},
                                         m_.dtype, {{"ep"}, {}, {"dp"}, {}});
    View(base + ".view", rows, by_expert);
    std::string send = b_.AddTensor(base + ".transpose.out", {ep, el, d_.slots, d_.hidden},
                                    m_.dtype, {{}, {"ep"}, {"dp"}, {}});
    b_.AddCompute(base + ".transpose", ComputeType::kTranspose, {by_expert}, {send}, 0,
                  {{"axis0", 0}, {"axis1", 1}});
    std::string buffers = ExpertBuffer(base + ".a2a.out");
    b_.AddCollective(base + ".a2a", CollectiveType::kAllToAll, send, buffers, {"ep"},
                     ReduceOp::kSum, kActivation);
    return buffers;
  }
  /// out = x [E/ep, T, k] x w [E/ep, k, n] (w [E/ep, n, k] with transpose_w),
  /// batched over the local experts: 2 * E/ep * T * k * n flops.
  void ExpertMatmul(const std::string& name, const std::string& x, const std::string& w,
                    const std::string& out, bool transpose_w) {
    const Tensor& xt = b_.Get(x);
    const double flops =
        2.0 * xt.shape[0] * xt.shape[1] * xt.shape[2] * b_.Get(out).shape[2];
    b_.AddCompute(name, ComputeType::kMatmul, {x, w}, {out}, flops,
                  {{"transpose_a", 0}, {"transpose_b", transpose_w ? 1.0 : 0.0}});
  }
  /// "<linear>.dW": the gradient [E/ep, k, n] of expert weight "<linear>.w"
  /// = x^T dy per local expert (x [E/ep, T, k], dy [E/ep, T, n]), synced
  /// over the expert's data-parallel replicas right after.
  void ExpertWeightGrad(const std::string& linear, const std::string& x, const std::string& dy) {
    const std::string w = linear + ".w";
    std::string grad = params_.NewGrad(w + ".grad", w, false);
    const Tensor& xt = b_.Get(x);
    const double flops = 2.0 * xt.shape[0] * xt.shape[1] * xt.shape[2] * b_.Get(dy).shape[2];
    b_.AddCompute(linear + ".dW", ComputeType::kMatmul, {x, dy}, {grad}, flops,
                  {{"transpose_a", 1}, {"transpose_b", 0}});
    params_.AddGrad(w, grad);
  }
  /// Declares an expert weight of local shape [E/ep, rows, cols] (dim 0
  /// sharded over ep, `tp_dim` over tp) and returns the tensor forward ops read.
  std::string ExpertParam(const std::string& name, int64_t rows, int64_t cols, int tp_dim,
                          int layer) {
    Sharding sharding = {plan_.ep > 1 ? Axes{"ep"} : Axes{}, {}, {}};
    sharding[tp_dim] = {"tp"};
    return ParamRead(
        params_.Declare(ParamName(name), {d_.experts_local, rows, cols}, std::move(sharding), layer, true));
  }
  /// Elements of tensor `t`.
  double Elems(const std::string& t) const { return static_cast<double>(b_.Get(t).NumElements()); }
  /// B*s*k*h: one token row per (token, routing choice).
  double ChoiceRowElems() const {
    return static_cast<double>(d_.batch) * d_.seq * m_.top_k * d_.hidden;
  }

  /// The MoE layer that replaces a llama block's MLP: router [h, E] ->
  /// softmax -> top-k (gates normalized over the k choices, expert ids) ->
  /// dispatch into expert buffers [E, B*C, h] (C slots per expert and
  /// sequence, later choices dropped) -> to the experts (all-to-all over ep)
  /// -> SwiGLU experts batched over the local experts (gate/up column- and
  /// down row-parallel over tp, whose partial sums are all-reduced over tp)
  /// -> back (all-to-all over ep) -> gate-weighted combine. Returns the
  /// layer's output [B, s, h], whole (no tp reduction follows).
  std::string MoeForward(int layer, BlockActs* a) {
    const std::string p = LayerPrefix(layer) + "moe.", e = p + "experts.";
    const int64_t h = d_.hidden, f = d_.ffn_tp;
    std::string router = UseParam(p + "router.w", {h, d_.experts}, {{}, {}}, layer);
    std::string logits = Act(p + "router.out", d_.experts, false);
    Linear(p + "router", a->n2_full, router, logits, false);
    a->probs = Act(p + "softmax.out", d_.experts, false);
    b_.AddCompute(p + "softmax", ComputeType::kSoftmax, {logits}, {a->probs},
                  FlopsPerUnit(ComputeType::kSoftmax) * Elems(logits));
    a->gates = Act(p + "top_k.gates", m_.top_k, false);
    a->ids = b_.AddTensor(p + "top_k.ids", {d_.batch, d_.seq, m_.top_k}, DType::kI32,
                          ActSharding(3, false, false));
    b_.AddCompute(p + "top_k", ComputeType::kTopK, {a->probs}, {a->gates, a->ids},
                  FlopsPerUnit(ComputeType::kTopK) * Elems(a->probs),
                  {{"k", static_cast<double>(m_.top_k)}, {"normalize", 1}});
    std::string buffers = ExpertBuffer(p + "dispatch.out");
    b_.AddCompute(p + "dispatch", ComputeType::kMoeDispatch, {a->n2_full, a->ids}, {buffers}, 0);
    a->expert_in = ToExperts(p + "dispatch", buffers);
    const std::string w_gate = ExpertParam(e + "gate.w", h, f, 2, layer);
    const std::string w_up = ExpertParam(e + "up.w", h, f, 2, layer);
    const std::string w_down = ExpertParam(e + "down.w", f, h, 1, layer);
    a->gate = ExpertRows(e + "gate.out", f, true);
    ExpertMatmul(e + "gate", a->expert_in, w_gate, a->gate, false);
    a->up = ExpertRows(e + "up.out", f, true);
    ExpertMatmul(e + "up", a->expert_in, w_up, a->up, false);
    a->act = ExpertRows(e + "swiglu.out", f, true);
    b_.AddCompute(e + "swiglu", ComputeType::kSwiglu, {a->gate, a->up}, {a->act},
                  FlopsPerUnit(ComputeType::kSwiglu) * Elems(a->act));
    std::string down = ExpertRows(e + "down.out", h, false, TpPartial());
    ExpertMatmul(e + "down", a->act, w_down, down, false);
    // (The combine's input, expert_out, is read by the backward: a
    // recomputation runs through the all-to-all back and stops before the combine.)
    a->expert_out = FromExperts(p + "combine", TpAllReduce(e + "down.ar", down, ReduceOp::kSum));
    if (recomputing_) return "";
    std::string out = Act(p + "combine.out", h, false);
    b_.AddCompute(p + "combine", ComputeType::kMoeCombine, {a->expert_out, a->ids, a->gates},
                  {out}, FlopsPerUnit(ComputeType::kMoeCombine) * ChoiceRowElems());
    return out;
  }

  /// The LM head's weight: the word table (gpt, tied) or head.w (llama), [V/tp, h].
  std::string HeadWeight() const { return Gpt() ? "embed.word.table" : "head.w"; }

  /// Declares the LM head's weight: llama's head.w; gpt's tied word table
  /// only where the embedding did not (the last of several stages holds its
  /// own copy, whose gradient ExchangeTiedGrad sums with the first stage's).
  void DeclareHeadWeight() {
    if (Gpt() && stage_.First()) return;
    params_.Declare(HeadWeight(), {d_.vocab_tp, d_.hidden}, {{"tp"}, {}}, -1);
    if (TiedAcrossStages()) params_.Defer(HeadWeight());
  }

  /// Final norm, LM head (logits sharded on vocab) and the vocab-parallel
  /// cross entropy (max, sum-exp and target all-reduced over tp).
  void LossForward(const std::string& x) {
    b_.SetLayer(-1);
    MicrobatchActs& a = Acts();
    a.final_x = x;
    a.final_full = TpGather("final_ln", Norm("final_ln", x, -1));
    DeclareHeadWeight();
    a.logits = Act("head.logits", d_.vocab_tp, true);
    Linear("head", a.final_full, params_.Fwd(HeadWeight()), a.logits, true);  // x [B,s,h] x W^T
    const double logit_elems = static_cast<double>(b_.Get(a.logits).NumElements());
    std::string max_local = TokenScalar("loss.max_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.max", ComputeType::kReduceMax, {a.logits}, {max_local},
                  FlopsPerUnit(ComputeType::kReduceMax) * logit_elems);
    a.max = TpAllReduce("loss.max.ar", max_local, ReduceOp::kMax);
    std::string z_local = TokenScalar("loss.sum_exp_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.sum_exp", ComputeType::kSumExp, {a.logits, a.max}, {z_local},
                  FlopsPerUnit(ComputeType::kSumExp) * logit_elems);
    a.sum_exp = TpAllReduce("loss.sum_exp.ar", z_local, ReduceOp::kSum);
    std::string t_local = TokenScalar("loss.target_local", DType::kF32, TpPartial());
    b_.AddCompute("loss.target", ComputeType::kGatherTarget, {a.logits, a.labels}, {t_local}, 0);
    std::string target = TpAllReduce("loss.target.ar", t_local, ReduceOp::kSum);
    std::string loss = b_.AddTensor("loss", {}, DType::kF32, {});
    b_.AddCompute("loss.cross_entropy", ComputeType::kCrossEntropy, {a.max, a.sum_exp, target},
                  {loss}, FlopsPerUnit(ComputeType::kCrossEntropy) * d_.batch * d_.seq);
  }

  // ---- backward -----------------------------------------------------------

  /// dlogits (scaled by 1/(dp*m) when dp*m > 1: the loss is the mean over
  /// every rank's micro-batches), the head's input grad (+ tp reduction), its
  /// weight grad and the final norm's grad; returns d(last block output).
  std::string LossBackward() {
    b_.SetLayer(-1);
    MicrobatchActs& a = Acts();
    std::string dlogits = Act("head.logits.grad", d_.vocab_tp, true);
    const double logit_elems = static_cast<double>(b_.Get(a.logits).NumElements());
    b_.AddCompute("loss.cross_entropy.grad", ComputeType::kCrossEntropyGrad,
                  {a.logits, a.max, a.sum_exp, a.labels}, {dlogits},
                  FlopsPerUnit(ComputeType::kCrossEntropyGrad) * logit_elems);
    const int replicas = plan_.dp * plan_.microbatches;
    if (replicas > 1) {
      std::string scaled = Act("head.logits.grad.scaled", d_.vocab_tp, true);
      b_.AddCompute("loss.grad_scale", ComputeType::kScale, {dlogits}, {scaled},
                    FlopsPerUnit(ComputeType::kScale) * logit_elems, {{"scale", 1.0 / replicas}});
      dlogits = scaled;
    }
    std::string dx = Act("head.dX.out", d_.hidden, false, TpPartial());
    Linear("head.dX", dlogits, params_.Bwd(HeadWeight()), dx, false);
    dx = TpReduce("head.dX", dx);
    HeadWeightGrad(dlogits);
    return NormGrad("final_ln", dx, a.final_x);
  }

  /// The LM head's weight grad. gpt without pp keeps it to add to the
  /// embedding's grad (EmbedBackward); otherwise it is this stage's gradient
  /// of its head weight (tied copy or head.w).
  void HeadWeightGrad(const std::string& dlogits) {
    MicrobatchActs& a = Acts();
    const std::string w = HeadWeight();
    std::string grad = params_.NewGrad(w + (Gpt() ? ".grad_head" : ".grad"), w, false);
    MatmulWeightGrad("head.dW", dlogits, a.final_full, grad);
    if (Gpt() && stage_.First()) {
      a.head_table_grad = grad;
    } else {
      params_.AddGrad(w, grad);
    }
  }

  /// Backward of one block given d(block output); returns d(block input).
  std::string BlockBackward(int layer, const std::string& dy) {
    b_.SetLayer(layer);
    const std::string p = LayerPrefix(layer);
    BlockActs a = Acts().blocks[layer - stage_.first_layer];
    if (plan_.recompute == Recompute::kFull) {
      const int first = b_.NumOps();
      a = Recompute(layer, a.x);
      b_.GateOpsFrom(first, dy);
    }
    std::string dn2 = Gpt()       ? GptMlpBackward(layer, a, dy)
                      : IsMoe(m_) ? MoeBackward(layer, a, dy)
                                  : LlamaMlpBackward(layer, a, dy);
    std::string dres1_norm = NormGrad(p + "ln2", dn2, a.res1);
    std::string dres1 = ResidAct(p + "mlp.res.grad.out");
    Add(p + "mlp.res.grad", dy, dres1_norm, dres1);
    std::string dn1 = Gpt() ? GptAttentionBackward(layer, a, dres1)
                            : LlamaAttentionBackward(layer, a, dres1);
    std::string dx_norm = NormGrad(p + "ln1", dn1, a.x);
    std::string dx = ResidAct(p + "attn.res.grad.out");
    Add(p + "attn.res.grad", dres1, dx_norm, dx);
    return dx;
  }

  /// dX of a row-parallel "<p><what>" (dy [B,s,h] x W^T -> [B,s,width] on
  /// tp), then its weight grad from input `x`.
  std::string RowLinearBackward(const std::string& p, const std::string& what,
                                const std::string& x, const std::string& dy, int64_t width) {
    std::string dx = Act(p + what + ".dX.out", width, true);
    Linear(p + what + ".dX", dy, params_.Bwd(p + what + ".w"), dx, true);
    WeightGrad(p + what, x, dy);
    return dx;
  }
  /// dX of a column-parallel "<p><what>": dy [B,s,width] x W^T -> [B,s,h],
  /// partial over tp (the weight grad comes after the tp reduction).
  std::string ColumnLinearDx(const std::string& p, const std::string& what,
                             const std::string& dy) {
    std::string dx = Act(p + what + ".dX.out", d_.hidden, false, TpPartial());
    Linear(p + what + ".dX", dy, params_.Bwd(p + what + ".w"), dx, true);
    return dx;
  }
  /// Sum of two tp-partial [B,s,h] input grads into `name`.out.
  std::string AddPartial(const std::string& name, const std::string& x, const std::string& y) {
    std::string out = Act(name + ".out", d_.hidden, false, TpPartial());
    Add(name, x, y, out);
    return out;
  }

  /// gpt: fc2 dX/dW, gelu grad, fc1 dX (+ tp reduction) and dW; returns d(ln2 out).
  std::string GptMlpBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    std::string dy_full = TpGather(p + "dy", dy);
    std::string dgelu = RowLinearBackward(p, "fc2", a.act, dy_full, d_.ffn_tp);
    std::string dfc1 = Act(p + "gelu.grad.out", d_.ffn_tp, true);
    b_.AddCompute(p + "gelu.grad", ComputeType::kGeluGrad, {dgelu, a.up}, {dfc1},
                  FlopsPerUnit(ComputeType::kGeluGrad) * b_.Get(dfc1).NumElements());
    std::string n2_full = FullInput(LayerPrefix(layer) + "ln2", a.n2, a.n2_full);
    std::string dn2 = TpReduce(p + "fc1.dX", ColumnLinearDx(p, "fc1", dfc1));
    WeightGrad(p + "fc1", n2_full, dfc1);
    return dn2;
  }

  /// llama: down dX/dW, swiglu grad, gate and up dX (summed, + tp
  /// reduction) and dW; returns d(ln2 out).
  std::string LlamaMlpBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "mlp.";
    std::string dy_full = TpGather(p + "dy", dy);
    std::string dact = RowLinearBackward(p, "down", a.act, dy_full, d_.ffn_tp);
    std::string dgate = Act(p + "swiglu.grad.dgate", d_.ffn_tp, true);
    std::string dup = Act(p + "swiglu.grad.dup", d_.ffn_tp, true);
    b_.AddCompute(p + "swiglu.grad", ComputeType::kSwigluGrad, {dact, a.gate, a.up},
                  {dgate, dup}, FlopsPerUnit(ComputeType::kSwigluGrad) * b_.Get(dact).NumElements());
    std::string n2_full = FullInput(LayerPrefix(layer) + "ln2", a.n2, a.n2_full);
    std::string dx_gate = ColumnLinearDx(p, "gate", dgate);
    std::string dx_up = ColumnLinearDx(p, "up", dup);
    std::string dn2 = TpReduce(p + "gate_up.dX", AddPartial(p + "gate_up.dX", dx_gate, dx_up));
    WeightGrad(p + "gate", n2_full, dgate);
    WeightGrad(p + "up", n2_full, dup);
    return dn2;
  }

  /// Backward of MoeForward given d(layer output) `dy`: combine grad (d
  /// expert outputs, d gates) -> to the experts (all-to-all over ep) -> down
  /// dX and dW, swiglu grad, gate and up dX (summed, all-reduced over tp) and
  /// dW -> back (all-to-all over ep) -> dispatch grad; gates -> top-k grad ->
  /// softmax grad -> router dX and dW; returns d(ln2 out), the two input
  /// grads summed.
  std::string MoeBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "moe.", e = p + "experts.";
    const int64_t h = d_.hidden, f = d_.ffn_tp;
    std::string dbuffers = ExpertBuffer(p + "combine.grad.dy");
    std::string dgates = Act(p + "combine.grad.dgates", m_.top_k, false);
    b_.AddCompute(p + "combine.grad", ComputeType::kMoeCombineGrad,
                  {dy, a.expert_out, a.ids, a.gates}, {dbuffers, dgates},
                  FlopsPerUnit(ComputeType::kMoeCombineGrad) * ChoiceRowElems());
    std::string drows = ToExperts(p + "combine.grad", dbuffers);
    std::string dact = ExpertRows(e + "down.dX.out", f, true);
    ExpertMatmul(e + "down.dX", drows, params_.Bwd(e + "down.w"), dact, true);
    ExpertWeightGrad(e + "down", a.act, drows);
    std::string dgate = ExpertRows(e + "swiglu.grad.dgate", f, true);
    std::string dup = ExpertRows(e + "swiglu.grad.dup", f, true);
    b_.AddCompute(e + "swiglu.grad", ComputeType::kSwigluGrad, {dact, a.gate, a.up}, {dgate, dup},
                  FlopsPerUnit(ComputeType::kSwigluGrad) * Elems(dact));
    std::string dx_gate = ExpertRows(e + "gate.dX.out", h, false, TpPartial());
    ExpertMatmul(e + "gate.dX", dgate, params_.Bwd(e + "gate.w"), dx_gate, true);
    std::string dx_up = ExpertRows(e + "up.dX.out", h, false, TpPartial());
    ExpertMatmul(e + "up.dX", dup, params_.Bwd(e + "up.w"), dx_up, true);
    std::string dx_rows = ExpertRows(e + "gate_up.dX.out", h, false, TpPartial());
    Add(e + "gate_up.dX", dx_gate, dx_up, dx_rows);
    dx_rows = TpAllReduce(e + "gate_up.dX.ar", dx_rows, ReduceOp::kSum);
    ExpertWeightGrad(e + "gate", a.expert_in, dgate);
    ExpertWeightGrad(e + "up", a.expert_in, dup);
    std::string dx_buffers = FromExperts(p + "dispatch.grad", dx_rows);
    std::string dx_experts = Act(p + "dispatch.grad.out", h, false);
    b_.AddCompute(p + "dispatch.grad", ComputeType::kMoeDispatchGrad, {dx_buffers, a.ids},
                  {dx_experts}, FlopsPerUnit(ComputeType::kMoeDispatchGrad) * ChoiceRowElems());
    std::string dprobs = Act(p + "top_k.grad.out", d_.experts, false);
    b_.AddCompute(p + "top_k.grad", ComputeType::kTopKGrad, {dgates, a.ids, a.probs}, {dprobs},
                  FlopsPerUnit(ComputeType::kTopKGrad) * Elems(dgates), {{"normalize", 1}});
    std::string dlogits = Act(p + "softmax.grad.out", d_.experts, false);
    b_.AddCompute(p + "softmax.grad", ComputeType::kSoftmaxGrad, {dprobs, a.probs}, {dlogits},
                  FlopsPerUnit(ComputeType::kSoftmaxGrad) * Elems(dlogits));
    std::string dx_router = Act(p + "router.dX.out", h, false);
    Linear(p + "router.dX", dlogits, params_.Bwd(p + "router.w"), dx_router, true);
    WeightGrad(p + "router", a.n2_full, dlogits);
    std::string dn2 = Act(p + "dX.out", h, false);
    Add(p + "dX", dx_experts, dx_router, dn2);
    return dn2;
  }

  /// attention_grad (do, q, k, v, o) -> dq, dk, dv (2.5x the forward flops:
  /// FlashAttention's backward recomputes Q K^T, five matmuls to the
  /// forward's two), flash-style: it reads the forward output o for its row sums. Under
  /// selective recomputation o is first recomputed from q, k, v
  /// ("L<layer>.recompute.attn.core"), as Megatron re-runs a checkpointed
  /// core attention when the backward reaches it; the kept output still
  /// feeds the output projection's weight grad.
  void AttentionCoreBackward(int layer, const BlockActs& a, const std::string& dattn,
                             std::string* dq, std::string* dk, std::string* dv) {
    const std::string p = LayerPrefix(layer) + "attn.";
    std::string o = a.attn;
    if (plan_.recompute == Recompute::kSelective) {
      recomputing_ = true;
      BlockActs r = a;
      const int first = b_.NumOps();
      AttentionCore(LayerPrefix(layer) + "attn.", &r);
      b_.GateOpsFrom(first, dattn);
      recomputing_ = false;
      o = r.attn;
    }
    *dq = Act(p + "core.grad.dq", d_.q_width, true);
    *dk = Act(p + "core.grad.dk", d_.kv_width, true);
    *dv = Act(p + "core.grad.dv", d_.kv_width, true);
    b_.AddCompute(p + "core.grad", ComputeType::kAttentionGrad, {dattn, a.q, a.k, a.v, o},
                  {*dq, *dk, *dv}, kAttentionGradFlops * AttentionFlops(), AttentionAttrs());
  }

  /// gpt: proj dX/dW, attention grad, concat, qkv dX (+ tp reduction) and
  /// dW; returns d(ln1 out).
  std::string GptAttentionBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "attn.";
    std::string dy_full = TpGather(p + "dy", dy);
    std::string dattn = RowLinearBackward(p, "proj", a.attn, dy_full, d_.q_width);
    std::string dq, dk, dv;
    AttentionCoreBackward(layer, a, dattn, &dq, &dk, &dv);
    std::string dqkv = Act(p + "qkv.grad.out", d_.q_width + 2 * d_.kv_width, true);
    b_.AddCompute(p + "qkv.grad.concat", ComputeType::kConcat, {dq, dk, dv}, {dqkv}, 0,
                  {{"axis", 2}});
    std::string n1_full = FullInput(LayerPrefix(layer) + "ln1", a.n1, a.n1_full);
    std::string dn1 = TpReduce(p + "qkv.dX", ColumnLinearDx(p, "qkv", dqkv));
    WeightGrad(p + "qkv", n1_full, dqkv);
    return dn1;
  }

  /// llama: o dX/dW, attention grad, q/k/v dX (summed, + tp reduction) and
  /// dW; returns d(ln1 out).
  std::string LlamaAttentionBackward(int layer, const BlockActs& a, const std::string& dy) {
    const std::string p = LayerPrefix(layer) + "attn.";
    std::string dy_full = TpGather(p + "dy", dy);
    std::string dattn = RowLinearBackward(p, "o", a.attn, dy_full, d_.q_width);
    std::string dq, dk, dv;
    AttentionCoreBackward(layer, a, dattn, &dq, &dk, &dv);
    std::string n1_full = FullInput(LayerPrefix(layer) + "ln1", a.n1, a.n1_full);
    std::string dx_q = ColumnLinearDx(p, "q", dq);
    std::string dx_k = ColumnLinearDx(p, "k", dk);
    std::string dx_v = ColumnLinearDx(p, "v", dv);
    std::string dx_qk = AddPartial(p + "qk.dX", dx_q, dx_k);
    std::string dn1 = TpReduce(p + "qkv.dX", AddPartial(p + "qkv.dX", dx_qk, dx_v));
    WeightGrad(p + "q", n1_full, dq);
    WeightGrad(p + "k", n1_full, dk);
    WeightGrad(p + "v", n1_full, dv);
    return dn1;
  }

  /// Embedding grads: gpt's position table (from the sequence shard under
  /// sp, so partial over tp) and the word table (from the whole sequence,
  /// all-gathered under sp; gpt adds the tied head's grad first).
  void EmbedBackward(const std::string& dx) {
    b_.SetLayer(-1);
    if (Gpt()) {
      std::string dpos = params_.NewGrad("embed.pos.table.grad", "embed.pos.table", plan_.sp);
      b_.AddCompute("embed.pos.grad", ComputeType::kEmbeddingGrad, {dx, Acts().positions}, {dpos},
                    FlopsPerUnit(ComputeType::kEmbeddingGrad) * b_.Get(dx).NumElements());
      params_.AddGrad("embed.pos.table", dpos);
    }
    std::string dx_full = TpGather("embed.dx", dx);
    const std::string table = "embed.word.table";
    std::string dword = params_.NewGrad(table + (Gpt() ? ".grad_embed" : ".grad"), table, false);
    b_.AddCompute("embed.word.grad", ComputeType::kEmbeddingGrad, {dx_full, Acts().tokens},
                  {dword}, FlopsPerUnit(ComputeType::kEmbeddingGrad) * b_.Get(dx_full).NumElements());
    if (Gpt() && stage_.Last()) {  // one stage: add the tied head's grad
      std::string dtable = params_.NewGrad(table + ".grad", table, false);
      Add("embed.word.grad.tied_add", Acts().head_table_grad, dword, dtable);
      dword = dtable;
    }
    params_.AddGrad(table, dword);
  }

  const ModelConfig& m_;
  const ParallelPlan& plan_;
  StageSpec stage_;
  MbBuilder b_;
  ParamStore params_;
  LocalDims d_;
  std::vector<MicrobatchActs> acts_;  // by chunk, then micro-batch
  P2P pending_send_;                  // an activation-grad send deferred past a recv
  // Interleaved 1F1B: (forward, micro-batch, chunk) -> a pass's received
  // input and its output waiting for its send.
  std::map<std::tuple<bool, int, int>, std::string> incoming_, outgoing_;
  bool recomputing_ = false;  // emitting a forward again in the backward (LayerPrefix)
};

/// "not implemented yet" for the plan features this frontend parses and
/// validates but does not lower.
Status CheckImplemented(const ParallelPlan& plan) {
  auto missing = [&](const std::string& what) {
    return Status::Error("plan '" + PlanToString(plan) + "': " + what +
                         " is not implemented yet in this frontend (docs/frontends.md)");
  };
  if (plan.dap > 1) return missing("dynamic axial parallelism (dap)");
  return Status::Ok();
}

/// "<model>.dp4.tp8[.pp4][.ep2][.sp][.zeroN][.mb8][.vs2][.order-dp-tp-pp][.rc-full]".
std::string ProgramName(const ModelConfig& model, const ParallelPlan& plan) {
  std::string name = model.name.empty() ? std::string(ToString(model.family)) : model.name;
  name += ".dp" + std::to_string(plan.dp) + ".tp" + std::to_string(plan.tp);
  if (plan.pp > 1) name += ".pp" + std::to_string(plan.pp);
  if (plan.ep > 1) name += ".ep" + std::to_string(plan.ep);
  if (plan.sp) name += ".sp";
  if (plan.zero > 0) name += ".zero" + std::to_string(plan.zero);
  if (plan.microbatches > 1) name += ".mb" + std::to_string(plan.microbatches);
  if (plan.vstages > 1) name += ".vs" + std::to_string(plan.vstages);
  if (!plan.order.empty()) {
    name += ".order";
    for (const std::string& axis : plan.order) name += "-" + axis;
  }
  if (plan.recompute != Recompute::kNone) name += ".rc-" + std::string(ToString(plan.recompute));
  return name;
}

/// The graph of stage `index` (all layers when pp = 1), named `name`.
Graph LowerStage(const ModelConfig& model, const ParallelPlan& plan, int index,
                 const std::string& name) {
  Graph graph;
  graph.name = name;
  graph.streams = {"compute", "comm"};
  TransformerLowering(model, plan, MakeStage(model, index, plan.pp, 0, plan.vstages), &graph)
      .Build();
  return graph;
}

}  // namespace

Result<Program> LowerTransformer(const ModelConfig& model, const ParallelPlan& plan) {
  CONCERTO_RETURN_IF_ERROR(ValidateModel(model));
  CONCERTO_RETURN_IF_ERROR(ValidatePlan(model, plan));
  CONCERTO_RETURN_IF_ERROR(CheckImplemented(plan));
  Program program;
  program.name = ProgramName(model, plan);
  // {pp, dp, tp} by default, or as plan.order places them; with ep > 1 the
  // data-parallel ranks are dp/ep replicas x ep experts groups.
  program.mesh.axes = PlanMeshAxes(plan);
  if (plan.pp == 1) {
    program.graphs.push_back(LowerStage(model, plan, 0, "main"));
    Role role{"spmd", "main", {}};
    for (int r = 0; r < program.mesh.NumRanks(); ++r) role.ranks.push_back(r);
    program.roles.push_back(std::move(role));
    AssignCommunicatorStreams(program);
    return program;
  }
  // Stage i's role holds the ranks whose pp coordinate is i (contiguous
  // when pp is outermost, the default).
  const int pp_axis = program.mesh.AxisIndex("pp");
  for (int i = 0; i < plan.pp; ++i) {
    const std::string name = "stage" + std::to_string(i);
    program.graphs.push_back(LowerStage(model, plan, i, name));
    Role role{name, name, {}};
    for (int r = 0; r < program.mesh.NumRanks(); ++r)
      if (program.mesh.Coords(r)[pp_axis] == i) role.ranks.push_back(r);
    program.roles.push_back(std::move(role));
  }
  AssignCommunicatorStreams(program);
  return program;
}

}  // namespace concerto
