// A parallel plan as sharding annotations (include/concerto/lower/plan_sharding.h):
// the roles Megatron-LM gives a transformer's linears, found by walking the
// forward graph, and DDP/ZeRO's split of the data and the optimizer state.
#include "concerto/lower/plan_sharding.h"

#include <map>
#include <optional>
#include <set>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

class PlanAnnotator {
 public:
  PlanAnnotator(const Program& p, const ParallelPlan& plan, const std::vector<std::string>& data)
      : program_(p), graph_(p.graphs.front()), plan_(plan), data_(data), index_(GraphIndex::Build(graph_)) {}

  Result<ShardingPlan> Run() {
    CONCERTO_RETURN_IF_ERROR(CheckPlan());
    CONCERTO_RETURN_IF_ERROR(FindParameters());
    CONCERTO_RETURN_IF_ERROR(SplitData());
    if (plan_.tp > 1) CONCERTO_RETURN_IF_ERROR(TensorParallel());
    if (plan_.sp) CONCERTO_RETURN_IF_ERROR(SequenceParallel());
    if (plan_.zero > 0 && plan_.dp > 1) {
      if (plan_.zero == 3) ShardParameters();
      else ShardOptimizerState();
    }
    ShardingPlan out;
    out.source = "plan '" + PlanToString(plan_) + "'";
    out.mesh.axes = PlanMeshAxes(plan_);
    for (const auto& [t, dims] : annotations_) {
      ShardingRule rule;
      rule.pattern = graph_.tensors[t].name;
      rule.exact = true;
      rule.dims = dims;
      rule.regather = regather_.count(t) > 0;
      out.rules.push_back(std::move(rule));
    }
    return out;
  }

 private:
  using Dims = std::vector<DimSharding>;

  Status Fail(const std::string& what) const {
    return Status::Error("plan '" + PlanToString(plan_) + "' on '" + program_.name + "': " + what);
  }

  /// Keys this route lowers: dp, tp, sp, zero 0-2.
  Status CheckPlan() const {
    if (program_.graphs.size() != 1 || program_.mesh.NumRanks() != 1)
      return Fail("takes an unsharded program (one graph, one rank)");
    auto refuse = [&](const std::string& key) {
      return Fail("'" + key + "' is not lowered through the partitioner yet (issue 40); dp, tp, sp and "
                  "zero=1|2 are");
    };
    if (plan_.pp > 1) return refuse("pp");
    if (plan_.ep > 1) return refuse("ep");
    if (plan_.vstages > 1) return refuse("vstages");
    if (plan_.dap > 1) return refuse("dap");
    if (plan_.microbatches > 1) return refuse("microbatches");
    if (plan_.recompute != Recompute::kNone) return refuse("recompute");
    if (plan_.zero > 0 && plan_.dp < 2) return Fail("zero=" + std::to_string(plan_.zero) + " needs dp > 1");
    return Status::Ok();
  }

  int TensorIndex(const std::string& name) const { return index_.tensor.at(name); }
  const Tensor& T(int t) const { return graph_.tensors[t]; }
  bool IsParam(int t) const { return adam_of_.count(t) > 0; }

  /// Parameters: input 0 of each Adam op.
  Status FindParameters() {
    for (size_t i = 0; i < graph_.ops.size(); ++i) {
      const Op& op = graph_.ops[i];
      if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdam)
        adam_of_[TensorIndex(op.inputs[0])] = static_cast<int>(i);
    }
    if (adam_of_.empty()) return Fail("the program has no Adam ops, so no parameters to lay out");
    return Status::Ok();
  }

  /// `axis` of size `n` on dim `d` of tensor `t`'s annotation (created
  /// replicated), after the axes already there; an error when the local size
  /// (every segment's, for a segmented dim) is not divisible.
  Status Split(int t, size_t d, const std::string& axis, int n, const std::vector<int64_t>& segments = {}) {
    Dims& dims = Annotation(t);
    DimSharding& dim = dims[d];
    const int64_t blocks = n * Blocks(dim);
    const std::vector<int64_t> sizes = segments.empty() ? (dim.segments.empty() ? std::vector<int64_t>{T(t).shape[d]}
                                                                                  : dim.segments)
                                                         : segments;
    for (int64_t s : sizes)
      if (s % blocks != 0)
        return Fail("tensor '" + T(t).name + "' dim " + std::to_string(d) + ": size " + std::to_string(s) +
                    " is not divisible by " + std::to_string(blocks) + " (" + axis + "=" + std::to_string(n) + ")");
    dim.axes.push_back(axis);
    if (!segments.empty()) dim.segments = segments;
    return Status::Ok();
  }

  /// How many blocks `dim`'s axes cut it into.
  int64_t Blocks(const DimSharding& dim) const {
    int64_t blocks = 1;
    for (const std::string& a : dim.axes) blocks *= (a == "dp" ? plan_.dp : plan_.tp);
    return blocks;
  }

  /// `param`'s annotation with dp appended to dim 0, when dp divides its local
  /// rows (and dim 0 is not segmented); else nullopt.
  std::optional<Dims> DpShard(int param) const {
    Dims base = annotations_.count(param) ? annotations_.at(param) : Dims(T(param).shape.size());
    if (base.empty() || !base[0].segments.empty() || T(param).shape[0] % (plan_.dp * Blocks(base[0])) != 0)
      return std::nullopt;
    base[0].axes.push_back("dp");
    return base;
  }

  Dims& Annotation(int t) {
    auto it = annotations_.find(t);
    if (it == annotations_.end()) it = annotations_.emplace(t, Dims(T(t).shape.size())).first;
    return it->second;
  }

  /// dp: the data inputs split on dim 0.
  Status SplitData() {
    for (const std::string& name : data_) {
      auto it = index_.tensor.find(name);
      if (it == index_.tensor.end()) return Fail("data input '" + name + "' is not a tensor of the program");
      const int t = it->second;
      if (index_.producer[t] >= 0) return Fail("data input '" + name + "' is computed, not a graph input");
      if (T(t).shape.empty()) return Fail("data input '" + name + "' is a scalar (no batch dim to split)");
      batch_ = std::max<int64_t>(batch_, T(t).shape[0]);
      data_tensors_.insert(t);
      if (plan_.dp > 1) CONCERTO_RETURN_IF_ERROR(Split(t, 0, "dp", plan_.dp));
    }
    return Status::Ok();
  }

  /// The sizes of the equal slices op output `t`'s last dim is cut into
  /// (through views that keep the last dim and bias adds), or {} when it is
  /// not cut: a fused q/k/v projection.
  std::vector<int64_t> SliceSegments(int t) const {
    const int64_t width = T(t).shape.back();
    std::map<int64_t, int64_t> pieces;  // start -> len
    std::vector<int> stack = {t};
    std::set<int> seen;
    while (!stack.empty()) {
      const int x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second) continue;
      for (int c : index_.consumers[x]) {
        const Op& op = graph_.ops[c];
        if (op.kind != OpKind::kCompute || op.outputs.empty()) continue;
        const int y = TensorIndex(op.outputs[0]);
        const bool keeps_last = !T(y).shape.empty() && T(y).shape.back() == width;
        if (op.compute_type == ComputeType::kSlice &&
            static_cast<size_t>(op.Attr("axis", 0)) + 1 == T(x).shape.size()) {
          pieces[static_cast<int64_t>(op.Attr("start", 0))] = T(y).shape.back();
        } else if ((op.compute_type == ComputeType::kIdentity || op.compute_type == ComputeType::kAdd) && keeps_last) {
          stack.push_back(y);
        }
      }
    }
    std::vector<int64_t> segments;
    int64_t at = 0;
    for (const auto& [start, len] : pieces) {
      if (start != at || len != pieces.begin()->second) return {};
      segments.push_back(len);
      at += len;
    }
    if (at != width || segments.size() < 2) return {};
    return segments;
  }

  /// What the forward walk knows of a tensor under tp: split on its features
  /// (descends from a column-parallel output), with the last dim's split when
  /// it is the column-parallel output's own width.
  struct TpState {
    bool split = false;
    std::optional<DimSharding> last;
  };

  /// Megatron's column/row roles, found in program order over the forward.
  Status TensorParallel() {
    std::vector<TpState> state(graph_.tensors.size());
    for (size_t i = 0; i < graph_.ops.size(); ++i) {
      const Op& op = graph_.ops[i];
      if (op.tags.phase != Phase::kForward || op.kind != OpKind::kCompute) continue;
      const int out = op.outputs.empty() ? -1 : TensorIndex(op.outputs[0]);
      if (op.compute_type == ComputeType::kMatmul && IsParam(TensorIndex(op.inputs[1])) &&
          T(TensorIndex(op.inputs[1])).shape.size() == 2 && !IsParam(TensorIndex(op.inputs[0]))) {
        const int w = TensorIndex(op.inputs[1]), x = TensorIndex(op.inputs[0]);
        const size_t out_dim = op.Attr("transpose_b", 0) != 0 ? 0 : 1;
        if (!state[x].split) {  // column-parallel
          const std::vector<int64_t> segments = SliceSegments(out);
          CONCERTO_RETURN_IF_ERROR(Role(w, out_dim, segments));
          DimSharding last{{"tp"}, segments};
          state[out] = {true, last};
          column_outputs_.push_back(out);
        } else {  // row-parallel
          CONCERTO_RETURN_IF_ERROR(Role(w, 1 - out_dim, {}));
          row_outputs_.push_back(out);
          row_inputs_.push_back({x, w});
        }
        continue;
      }
      if (op.compute_type == ComputeType::kEmbedding && IsParam(TensorIndex(op.inputs[0])) &&
          IsData(TensorIndex(op.inputs[1]))) {
        const int table = TensorIndex(op.inputs[0]);
        if (T(table).shape[0] % plan_.tp == 0) CONCERTO_RETURN_IF_ERROR(Role(table, 0, {}));
        continue;
      }
      if (op.compute_type == ComputeType::kAttention) {  // the heads split over tp, as Megatron requires
        for (const char* key : {"heads", "kv_heads"})
          if (op.attrs.count(key) && static_cast<int64_t>(op.Attr(key, 1)) % plan_.tp != 0)
            return Fail(OpLabel(op) + ": tp (" + std::to_string(plan_.tp) + ") must divide " + key + " (" +
                        std::to_string(static_cast<int64_t>(op.Attr(key, 1))) + ")");
      }
      // A bias: a 1-D parameter added to a split output takes its last dim's split.
      if (op.compute_type == ComputeType::kAdd && op.inputs.size() == 2) {
        const int a = TensorIndex(op.inputs[0]), b = TensorIndex(op.inputs[1]);
        if (IsParam(b) && T(b).shape.size() == 1 && state[a].last) {
          CONCERTO_RETURN_IF_ERROR(Role(b, 0, state[a].last->segments));
          state[out] = state[a];
          continue;
        }
      }
      TpState s;
      for (const std::string& in : op.inputs) {
        const TpState& from = state[TensorIndex(in)];
        if (!from.split) continue;
        s.split = true;
        if (from.last && out >= 0 && !T(out).shape.empty() && !T(TensorIndex(in)).shape.empty() &&
            T(out).shape.back() == T(TensorIndex(in)).shape.back())
          s.last = from.last;
        break;
      }
      for (const std::string& o : op.outputs) state[TensorIndex(o)] = s;
    }
    return Status::Ok();
  }

  /// Whether `t` is a data input, or a view or cast of one.
  bool IsData(int t) const {
    while (!data_tensors_.count(t)) {
      const int p = index_.producer[t];
      if (p < 0) return false;
      const Op& op = graph_.ops[p];
      if (op.compute_type != ComputeType::kIdentity && op.compute_type != ComputeType::kCast) return false;
      t = TensorIndex(op.inputs[0]);
    }
    return true;
  }

  /// Parameter `w` split over tp on `dim`; a parameter seen in a second role
  /// (tied embeddings) keeps its first.
  Status Role(int w, size_t dim, const std::vector<int64_t>& segments) {
    if (!roles_.insert(w).second) return Status::Ok();
    return Split(w, dim, "tp", plan_.tp, segments);
  }

  /// sp: norms' inputs and outputs and the bias adds after row-parallel
  /// matmuls split on the token dim (rank - 2); column-parallel outputs and
  /// the input gradients of row-parallel matmuls whole on it.
  Status SequenceParallel() {
    // A row-parallel output itself stays unannotated: its partial sum is reduce-scattered onto the
    // token dim where the residual stream (a norm's input) or a bias add needs it so.
    std::vector<int> token_split;
    for (int r : row_outputs_)
      for (int c : index_.consumers[r]) {
        const Op& op = graph_.ops[c];
        if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAdd && op.inputs.size() == 2 &&
            op.inputs[0] == T(r).name && IsParam(TensorIndex(op.inputs[1])) &&
            T(TensorIndex(op.inputs[1])).shape.size() == 1)
          token_split.push_back(TensorIndex(op.outputs[0]));
      }
    for (const Op& op : graph_.ops)
      if (op.tags.phase == Phase::kForward && op.kind == OpKind::kCompute &&
          (op.compute_type == ComputeType::kLayerNorm || op.compute_type == ComputeType::kRmsNorm)) {
        token_split.push_back(TensorIndex(op.inputs[0]));
        token_split.push_back(TensorIndex(op.outputs[0]));
      }
    // A norm's output is a column-parallel input: gathered again in the backward for the weight
    // gradient, as Megatron does, instead of keeping the forward's gathered copy.
    for (const Op& op : graph_.ops)
      if (op.tags.phase == Phase::kForward && op.kind == OpKind::kCompute &&
          (op.compute_type == ComputeType::kLayerNorm || op.compute_type == ComputeType::kRmsNorm))
        regather_.insert(TensorIndex(op.outputs[0]));
    for (int t : token_split) {
      if (T(t).shape.size() < 2) return Fail("sp: tensor '" + T(t).name + "' has no token dim");
      CONCERTO_RETURN_IF_ERROR(Batch(t));
      CONCERTO_RETURN_IF_ERROR(Split(t, T(t).shape.size() - 2, "tp", plan_.tp));
    }
    // The backward of a row-parallel matmul (a backward op reading its weight and giving its
    // activation's shape: dx = dy w) gives dx split on features and whole on tokens as x is, so
    // dy is gathered (Megatron's backward all-gather), not the weight.
    for (const auto& [x, w] : row_inputs_)
      for (int c : index_.consumers[w]) {
        const Op& op = graph_.ops[c];
        if (op.tags.phase != Phase::kBackward || op.outputs.size() != 1) continue;
        const int dx = TensorIndex(op.outputs[0]);
        if (T(dx).shape != T(x).shape || annotations_.count(dx)) continue;
        CONCERTO_RETURN_IF_ERROR(Batch(dx));
        CONCERTO_RETURN_IF_ERROR(Split(dx, T(dx).shape.size() - 1, "tp", plan_.tp));
      }
    for (int t : column_outputs_) {
      CONCERTO_RETURN_IF_ERROR(Batch(t));
      Dims& dims = Annotation(t);
      if (dims.back().axes.empty()) {
        DimSharding last = {{"tp"}, {}};
        last.segments = SliceSegments(t);
        dims.back() = last;
      }
    }
    return Status::Ok();
  }

  /// An activation's annotation keeps the data-parallel split of dim 0.
  Status Batch(int t) {
    Dims& dims = Annotation(t);
    if (plan_.dp < 2 || !dims[0].axes.empty()) return Status::Ok();
    if (batch_ == 0 || T(t).shape[0] % batch_ != 0)
      return Fail("tensor '" + T(t).name + "': dim 0 (" + std::to_string(T(t).shape[0]) +
                  ") is not a multiple of the batch (" + std::to_string(batch_) + ")");
    return Split(t, 0, "dp", plan_.dp);
  }

  /// zero=3: each parameter split on dim 0 over dp where dp divides its local
  /// rows, gathered before each phase that reads it (forward, then again in
  /// the backward); its gradient, Adam state and update follow the shard.
  void ShardParameters() {
    for (const auto& [param, op] : adam_of_)
      if (std::optional<Dims> shard = DpShard(param)) {
        annotations_[param] = *shard;
        regather_.insert(param);
      }
  }

  /// zero=1|2: each Adam op's gradient, moments and master copy split on dim 0
  /// over dp where dp divides its local rows (DeepSpeed pads the others; they
  /// are updated whole here, as concerto.torch's dp builder does).
  void ShardOptimizerState() {
    for (const auto& [param, i] : adam_of_) {
      const Op& op = graph_.ops[i];
      const std::optional<Dims> shard = DpShard(param);
      if (!shard) continue;
      std::vector<std::string> operands(op.inputs.begin() + 1, op.inputs.end());
      operands.insert(operands.end(), op.outputs.begin() + 1, op.outputs.end());
      for (const std::string& name : operands) {
        const int t = TensorIndex(name);
        if (T(t).shape == T(param).shape) annotations_[t] = *shard;
      }
      // The updated parameter follows the parameter (the partitioner gathers it after the update).
    }
  }

  const Program& program_;
  const Graph& graph_;
  const ParallelPlan& plan_;
  const std::vector<std::string>& data_;
  GraphIndex index_;
  std::map<int, int> adam_of_;  // parameter tensor -> its Adam op
  std::set<int> data_tensors_;
  int64_t batch_ = 0;
  std::map<int, Dims> annotations_;
  std::set<int> roles_;
  std::set<int> regather_;  // tensors gathered again in the backward
  std::vector<int> column_outputs_, row_outputs_;
  std::vector<std::pair<int, int>> row_inputs_;  // (activation, weight) of each row-parallel matmul
};

}  // namespace

Result<ShardingPlan> ShardingFromPlan(const Program& unsharded, const ParallelPlan& plan,
                                      const std::vector<std::string>& data_inputs) {
  return PlanAnnotator(unsharded, plan, data_inputs).Run();
}

}  // namespace concerto
