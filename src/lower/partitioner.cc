// The SPMD partitioner: an unsharded program plus a sharding plan to the
// per-rank program, with every resharding collective derived and inserted
// (GSPMD-style). Each compute type's rule is its op registry entry's
// sharding signature (ir/sharding_signature.h, src/ir/sharding_rules.cc):
// dimension labels, as in an einsum; this pass turns a signature and the
// inputs' current shardings into an assignment and the resharding
// collectives. docs/frontends.md
// ("Per-op sharding plans") states the rules and the resharding table.
#include <algorithm>
#include <cassert>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "concerto/ir/graph_index.h"
#include "concerto/ir/comm_streams.h"
#include "concerto/ir/op_registry.h"
#include "concerto/ir/sharding_signature.h"
#include "concerto/ir/verifier.h"
#include "concerto/lower/sharding_plan.h"

namespace concerto {

bool ShardingGlobMatch(const std::string& pattern, const std::string& name);  // sharding_plan.cc

namespace {

/// A tensor's distribution: per dimension its axes (and segments), plus a
/// pending partial reduction over `partial` (a max when `max`).
struct Spec {
  std::vector<DimSharding> dims;
  std::vector<std::string> partial;
  bool max = false;
  bool operator==(const Spec&) const = default;
};

/// "[[dp], [], [tp segments 256,256,256]] partial [tp]".
std::string ToText(const Spec& s) {
  std::string out = "[";
  for (size_t d = 0; d < s.dims.size(); ++d) {
    out += (d ? ", [" : "[");
    for (size_t i = 0; i < s.dims[d].axes.size(); ++i) out += (i ? ", " : "") + s.dims[d].axes[i];
    if (!s.dims[d].segments.empty()) {
      out += " segments ";
      for (size_t i = 0; i < s.dims[d].segments.size(); ++i) {
        if (i) out += ",";
        out += std::to_string(s.dims[d].segments[i]);
      }
    }
    out += "]";
  }
  out += "]";
  if (!s.partial.empty()) {
    out += std::string(" partial ") + (s.max ? "max " : "") + "[";
    for (size_t i = 0; i < s.partial.size(); ++i) out += (i ? ", " : "") + s.partial[i];
    out += "]";
  }
  return out;
}

/// A replicated spec of rank `rank`.
Spec Replicated(size_t rank) {
  Spec s;
  s.dims.resize(rank);
  return s;
}

using Signature = ShardingSignature;

/// The chosen shardings of one op: what each input must be, what each output is.
struct Assignment {
  std::vector<Spec> in, out;
  std::vector<DimSharding> label;
  double cost = 0;
};

/// What the pass knows about one tensor of the unsharded graph.
struct TensorState {
  const Tensor* global = nullptr;
  std::optional<Spec> annotation;
  std::string annotated_by;  // pattern (or "default", "adam of <param>")
  bool is_input = false;
  bool is_grad = false;  // an Adam op's gradient input
  bool follows = false;  // annotated only by following its Adam op's parameter
  /// Gathered again for each phase that reads it (ShardingRule::regather):
  /// a reshard made for a forward consumer is not reused by a backward one.
  bool regather = false;
  /// Per version: the phase of the consumer a reshard made it for (kNone:
  /// the tensor's own versions, reused everywhere).
  std::vector<Phase> made_for;
  int producer = -1;     // original op index
  /// Versions in the new graph: (spec, tensor name). `current` is the one
  /// consumers start from (the annotated one when there is an annotation).
  std::vector<std::pair<Spec, std::string>> versions;
  int current = -1;
};

class Partitioner {
 public:
  Partitioner(const Program& in, const ShardingPlan& plan, PartitionReport* report)
      : in_(in), plan_(plan), report_(report), graph_(in.graphs.front()),
        index_(GraphIndex::Build(graph_)) {}

  Result<Program> Run() {
    CONCERTO_RETURN_IF_ERROR(CheckInput());
    CONCERTO_RETURN_IF_ERROR(ResolveAnnotations());
    out_graph_.name = graph_.name;
    out_graph_.streams = graph_.streams;
    if (std::find(out_graph_.streams.begin(), out_graph_.streams.end(), "comm") == out_graph_.streams.end())
      out_graph_.streams.push_back("comm");
    for (const Op& op : graph_.ops) next_id_ = std::max(next_id_, op.id + 1);
    before_.resize(graph_.ops.size());
    after_.resize(graph_.ops.size());
    main_.resize(graph_.ops.size());
    DeclareInputs();
    for (size_t i = 0; i < graph_.ops.size(); ++i) CONCERTO_RETURN_IF_ERROR(PartitionOp(static_cast<int>(i)));
    for (size_t i = 0; i < graph_.ops.size(); ++i) {
      for (Op& op : before_[i]) out_graph_.ops.push_back(std::move(op));
      out_graph_.ops.push_back(std::move(main_[i]));
      for (Op& op : after_[i]) out_graph_.ops.push_back(std::move(op));
    }
    DropUnreadInputs();
    Program out;
    out.name = in_.name + " sharded by " + plan_.source;
    out.mesh = plan_.mesh;
    out.graphs.push_back(std::move(out_graph_));
    Role role{"spmd", out.graphs.front().name, {}};
    for (int r = 0; r < out.mesh.NumRanks(); ++r) role.ranks.push_back(r);
    out.roles.push_back(std::move(role));
    CONCERTO_RETURN_IF_ERROR(CheckProgram(out, plan_.source + " (partitioned program)"));
    if (report_) {
      report_->inserted.assign(inserted_.begin(), inserted_.end());
      report_->segmented = segmented_;
    }
    return out;
  }

 private:
  // ---- setup ---------------------------------------------------------------

  Status Fail(const std::string& what) const { return Status::Error(plan_.source + ": " + what); }

  Status CheckInput() const {
    if (in_.graphs.size() != 1)
      return Fail("the partitioner takes a program with one graph; '" + in_.name + "' has " +
                  std::to_string(in_.graphs.size()));
    if (in_.mesh.NumRanks() != 1)
      return Fail("the partitioner takes an unsharded program (one rank); '" + in_.name + "' has " +
                  std::to_string(in_.mesh.NumRanks()));
    for (const Op& op : graph_.ops)
      if (op.IsComm())
        return Fail(OpLabel(op) + ": the unsharded program must not communicate (" +
                    std::string(ToString(op.kind)) + ")");
    return Status::Ok();
  }

  int AxisSize(const std::string& axis) const { return plan_.mesh.axes[plan_.mesh.AxisIndex(axis)].size; }
  int64_t AxesSize(const std::vector<std::string>& axes) const {
    int64_t n = 1;
    for (const std::string& a : axes) n *= AxisSize(a);
    return n;
  }
  /// Axes sorted in mesh order.
  std::vector<std::string> MeshOrder(std::vector<std::string> axes) const {
    std::sort(axes.begin(), axes.end(), [&](const std::string& a, const std::string& b) {
      return plan_.mesh.AxisIndex(a) < plan_.mesh.AxisIndex(b);
    });
    return axes;
  }

  /// Whether `dim` can split a global dimension of `size`: its axes divide
  /// the size (every segment, for a segmented dim, whose segments must add up).
  std::string DimProblem(const DimSharding& dim, int64_t size) const {
    const int64_t n = AxesSize(dim.axes);
    if (!dim.segments.empty()) {
      const int64_t sum = std::accumulate(dim.segments.begin(), dim.segments.end(), int64_t{0});
      if (sum != size)
        return "segments add up to " + std::to_string(sum) + ", not the dimension's size " + std::to_string(size);
      for (int64_t s : dim.segments)
        if (s % n != 0)
          return "segment of size " + std::to_string(s) + " is not divisible by its axes (" + std::to_string(n) + " blocks)";
      return "";
    }
    if (size % n != 0)
      return "size " + std::to_string(size) + " is not divisible by its axes (" + std::to_string(n) + " blocks)";
    return "";
  }

  /// Checks `spec` against tensor `t` (rank, divisibility); "" when it fits.
  std::string SpecProblem(const Spec& spec, const Tensor& t) const {
    if (spec.dims.size() != t.shape.size())
      return "has " + std::to_string(spec.dims.size()) + " entries for a tensor of rank " +
             std::to_string(t.shape.size()) + " " + ShapeText(t.shape);
    for (size_t d = 0; d < spec.dims.size(); ++d) {
      std::string p = DimProblem(spec.dims[d], t.shape[d]);
      if (!p.empty()) return "dim " + std::to_string(d) + ": " + p;
    }
    return "";
  }

  static std::string ShapeText(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  /// The explicit annotation of every tensor (first matching pattern), then
  /// Adam operands following their parameter, then the default for graph
  /// inputs. Every pattern must match some tensor.
  Status ResolveAnnotations() {
    state_.resize(graph_.tensors.size());
    std::vector<int> matches(plan_.rules.size(), 0);
    for (size_t t = 0; t < graph_.tensors.size(); ++t) {
      const Tensor& tensor = graph_.tensors[t];
      TensorState& s = state_[t];
      s.global = &tensor;
      s.producer = index_.producer[t];
      s.is_input = s.producer < 0;
      tensor_index_[tensor.name] = static_cast<int>(t);
      for (size_t r = 0; r < plan_.rules.size(); ++r) {
        const ShardingRule& rule = plan_.rules[r];
        if (rule.exact ? rule.pattern != tensor.name : !ShardingGlobMatch(rule.pattern, tensor.name)) continue;
        ++matches[r];
        Spec spec = Replicated(tensor.shape.size());
        if (!rule.replicated) spec.dims = rule.dims;
        std::string problem = SpecProblem(spec, tensor);
        if (!problem.empty())
          return Fail("tensors: pattern '" + rule.pattern + "': tensor '" + tensor.name + "' " +
                      ShapeText(tensor.shape) + ": " + problem);
        s.annotation = spec;
        s.annotated_by = "pattern '" + rule.pattern + "'";
        s.regather = rule.regather;
        break;
      }
    }
    for (size_t r = 0; r < plan_.rules.size(); ++r)
      if (matches[r] == 0)
        return Fail("tensors: pattern '" + plan_.rules[r].pattern + "' matches no tensor of program '" +
                    in_.name + "'");
    // Adam operands without their own pattern follow the parameter (input 0).
    for (const Op& op : graph_.ops) {
      if (op.kind != OpKind::kCompute || op.compute_type != ComputeType::kAdam) continue;
      const TensorState& param = state_[tensor_index_.at(op.inputs[0])];
      state_[tensor_index_.at(op.inputs[1])].is_grad = true;
      const Spec follow = param.annotation ? *param.annotation : Replicated(param.global->shape.size());
      std::vector<std::string> operands = op.inputs;
      operands.insert(operands.end(), op.outputs.begin(), op.outputs.end());
      for (const std::string& name : operands) {
        TensorState& s = state_[tensor_index_.at(name)];
        if (s.annotation || s.global->shape != param.global->shape) continue;
        s.annotation = follow;
        s.annotated_by = "adam of '" + op.inputs[0] + "'";
        s.follows = true;
      }
    }
    for (TensorState& s : state_)
      if (s.is_input && !s.annotation) {
        s.annotation = Replicated(s.global->shape.size());
        s.annotated_by = "default";
      }
    return Status::Ok();
  }

  // ---- the new graph -------------------------------------------------------

  /// Local shape of `t` under `spec`.
  std::vector<int64_t> LocalShape(const Tensor& t, const Spec& spec) const {
    std::vector<int64_t> shape = t.shape;
    for (size_t d = 0; d < shape.size(); ++d) shape[d] /= AxesSize(spec.dims[d].axes);
    return shape;
  }

  /// A fresh tensor name: `base`, or `base`.2, `base`.3, ...
  std::string UniqueName(const std::string& base) {
    std::string name = base;
    for (int k = 2; used_names_.count(name); ++k) name = base + "." + std::to_string(k);
    used_names_.insert(name);
    return name;
  }

  /// Declares a tensor of the new graph holding `global` under `spec`.
  std::string Declare(const std::string& base, const Tensor& global, const Spec& spec) {
    Tensor t;
    t.name = UniqueName(base);
    t.shape = LocalShape(global, spec);
    t.dtype = global.dtype;
    for (const DimSharding& d : spec.dims) t.sharding.push_back(d.axes);
    t.partial = spec.partial;
    for (size_t d = 0; d < spec.dims.size(); ++d)
      if (!spec.dims[d].segments.empty() && !spec.dims[d].axes.empty()) {
        segmented_.push_back({t.name, static_cast<int>(d), spec.dims[d].segments});
        t.segments.resize(spec.dims.size());
        t.segments[d] = spec.dims[d].segments;
      }
    local_bytes_[t.name] = t.Bytes();
    out_graph_.tensors.push_back(t);
    return t.name;
  }

  /// Graph inputs are declared directly in their annotated sharding (the
  /// runtime initialises each rank's shard from the global identity).
  void DeclareInputs() {
    for (size_t t = 0; t < state_.size(); ++t) {
      TensorState& s = state_[t];
      if (!s.is_input) continue;
      s.versions.push_back({*s.annotation, Declare(s.global->name, *s.global, *s.annotation)});
      s.current = 0;
    }
  }

  /// Removes graph inputs no op reads (an input all of whose consumers read
  /// its "<name>.shard" instead).
  void DropUnreadInputs() {
    std::set<std::string> touched;
    for (const Op& op : out_graph_.ops) {
      touched.insert(op.inputs.begin(), op.inputs.end());
      touched.insert(op.outputs.begin(), op.outputs.end());
    }
    auto& ts = out_graph_.tensors;
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const Tensor& t) { return !touched.count(t.name); }),
             ts.end());
  }

  // ---- resharding ----------------------------------------------------------

  /// Where inserted ops go and how they are tagged.
  struct Anchor {
    int op = 0;       // original op index
    bool after = true;  // after that op (a producer), or before it (a consumer)
    Tags tags;
  };

  std::vector<Op>& Slot(const Anchor& a) { return a.after ? after_[a.op] : before_[a.op]; }

  /// Appends a collective over `axes` from `in` to a new tensor of `spec`.
  std::string Collective(const Anchor& anchor, TensorState& s, CollectiveType type, ReduceOp reduce,
                         const std::vector<std::string>& axes, const std::string& in, const Spec& spec,
                         const std::string& purpose) {
    static const std::map<CollectiveType, std::string> kSuffix = {
        {CollectiveType::kAllReduce, "ar"}, {CollectiveType::kAllGather, "ag"},
        {CollectiveType::kReduceScatter, "rs"}, {CollectiveType::kAllToAll, "a2a"},
        {CollectiveType::kBroadcast, "bc"}};
    const std::string out = Declare(s.global->name + "." + kSuffix.at(type), *s.global, spec);
    Op op;
    op.id = next_id_++;
    op.name = out;
    op.kind = OpKind::kCollective;
    op.stream = "comm";
    op.collective = type;
    op.reduce = reduce;
    op.group.axes = axes;
    op.inputs = {in};
    op.outputs = {out};
    op.message_bytes = local_bytes_.at(in);
    op.tags = anchor.tags;
    op.tags.purpose = purpose;
    Slot(anchor).push_back(std::move(op));
    ++inserted_[std::string(ToString(type))];
    return out;
  }

  /// Appends a local compute op (slice or scale) from `in` to a new tensor.
  std::string LocalOp(const Anchor& anchor, TensorState& s, ComputeType type, const std::string& suffix,
                      const std::string& in, const Spec& spec, std::map<std::string, double> attrs) {
    const std::string out = Declare(s.global->name + "." + suffix, *s.global, spec);
    Op op;
    op.id = next_id_++;
    op.name = out;
    op.kind = OpKind::kCompute;
    op.stream = "compute";
    op.compute_type = type;
    op.inputs = {in};
    op.outputs = {out};
    op.attrs = std::move(attrs);
    op.bytes = static_cast<double>(local_bytes_.at(in) + local_bytes_.at(out));
    op.tags = anchor.tags;
    Slot(anchor).push_back(std::move(op));
    ++inserted_[suffix];
    return out;
  }

  /// The purpose tag of a collective on `s`.
  static std::string Purpose(const TensorState& s, CollectiveType type) {
    if (s.is_grad) return "grad_sync";
    if ((s.is_input || s.follows) && type == CollectiveType::kAllGather) return "param_gather";
    return "activation";
  }

  /// Makes this rank hold `s` under `target` (no partial), starting from
  /// version `from`; returns the new tensor's name. Partial axes become a
  /// reduce_scatter onto a dimension the target shards next on that axis,
  /// else one all_reduce; then each dimension keeps its common prefix of
  /// axes, all-gathers the rest (innermost first) and takes its block of the
  /// target's remaining axes locally (outermost first). One axis moving from
  /// dim i to dim j is an all_to_all when that is exact in the IR.
  Result<std::string> Reshard(TensorState& s, int from, const Spec& target, const Anchor& anchor,
                              const std::string& who) {
    Spec cur = s.versions[from].first;
    std::string name = s.versions[from].second;
    const Tensor& g = *s.global;
    auto fail = [&](const std::string& why) {
      return Fail(who + ": tensor '" + g.name + "' sharded " + ToText(s.versions[from].first) +
                  " cannot be resharded to " + ToText(target) + ": " + why);
    };
    // Pending partial sums the target does not keep: reduce-scatter onto a
    // dim whose next target axis is that axis, else one all-reduce.
    std::vector<std::string> ar_axes;
    std::vector<std::pair<size_t, std::string>> rs;  // (dim, axis)
    {
      std::vector<DimSharding> scratch = cur.dims;
      for (const std::string& p : MeshOrder(cur.partial)) {
        if (std::find(target.partial.begin(), target.partial.end(), p) != target.partial.end()) continue;
        bool scattered = false;
        for (size_t d = 0; d < scratch.size() && !cur.max; ++d) {
          const auto& have = scratch[d].axes;
          const auto& want = target.dims[d].axes;
          if (!scratch[d].segments.empty() || !target.dims[d].segments.empty()) continue;
          if (want.size() > have.size() && std::equal(have.begin(), have.end(), want.begin()) &&
              want[have.size()] == p) {
            rs.push_back({d, p});
            scratch[d].axes.push_back(p);
            scattered = true;
            break;
          }
        }
        if (!scattered) ar_axes.push_back(p);
      }
    }
    if (!ar_axes.empty()) {
      Spec next = cur;
      for (const std::string& p : ar_axes) next.partial.erase(std::find(next.partial.begin(), next.partial.end(), p));
      next.max = cur.max && !next.partial.empty();
      name = Collective(anchor, s, CollectiveType::kAllReduce, cur.max ? ReduceOp::kMax : ReduceOp::kSum, ar_axes,
                        name, next, Purpose(s, CollectiveType::kAllReduce));
      cur = next;
    }
    for (const auto& [d, p] : rs) {
      Spec next = cur;
      next.dims[d].axes.push_back(p);
      next.partial.erase(std::find(next.partial.begin(), next.partial.end(), p));
      name = Collective(anchor, s, CollectiveType::kReduceScatter, ReduceOp::kSum, {p}, name, next,
                        Purpose(s, CollectiveType::kReduceScatter));
      cur = next;
    }
    if (cur.partial != target.partial || cur.max != target.max)
      return fail("its pending partial sum cannot become the target's");
    // Per dimension: gathers (pops) and local blocks (pushes).
    std::vector<std::pair<size_t, std::string>> pops, pushes;
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      DimSharding& have = cur.dims[d];
      const DimSharding& want = target.dims[d];
      if (have.segments != want.segments) {
        if (!have.axes.empty() || !want.axes.empty())
          return fail("dim " + std::to_string(d) + ": resharding a segmented dimension is not supported");
        have.segments = want.segments;
      }
      size_t k = 0;
      while (k < have.axes.size() && k < want.axes.size() && have.axes[k] == want.axes[k]) ++k;
      if ((k < have.axes.size() || k < want.axes.size()) && !have.segments.empty())
        return fail("dim " + std::to_string(d) + ": resharding a segmented dimension is not supported");
      for (size_t i = have.axes.size(); i > k; --i) pops.push_back({d, have.axes[i - 1]});
      for (size_t i = k; i < want.axes.size(); ++i) pushes.push_back({d, want.axes[i]});
    }
    if (pops.size() == 1 && pushes.size() == 1 && pops[0].second == pushes[0].second &&
        AllToAllIsExact(g, cur, pops[0].first, pushes[0].first, pops[0].second)) {
      Spec next = cur;
      next.dims[pops[0].first].axes.pop_back();
      next.dims[pushes[0].first].axes.push_back(pushes[0].second);
      name = Collective(anchor, s, CollectiveType::kAllToAll, ReduceOp::kSum, {pops[0].second}, name, next,
                        Purpose(s, CollectiveType::kAllToAll));
      cur = next;
      pops.clear();
      pushes.clear();
    }
    for (const auto& [d, axis] : pops) {
      Spec next = cur;
      next.dims[d].axes.pop_back();
      name = Collective(anchor, s, CollectiveType::kAllGather, ReduceOp::kSum, {axis}, name, next,
                        Purpose(s, CollectiveType::kAllGather));
      cur = next;
    }
    for (const auto& [d, axis] : pushes) {
      Result<std::string> sliced = TakeBlock(anchor, s, cur, d, axis, name);
      if (!sliced.ok()) return sliced.status();
      name = *sliced;
      cur.dims[d].axes.push_back(axis);
    }
    assert(cur == target);
    return name;
  }

  /// An all_to_all over `axis` moves its sharding from dim `i` to dim `j`
  /// exactly when the chunks it cuts and concatenates (row-major) are those
  /// blocks: every local dimension before `j` of the input and before `i`
  /// of the output has size 1.
  bool AllToAllIsExact(const Tensor& g, const Spec& cur, size_t i, size_t j, const std::string& axis) const {
    Spec next = cur;
    next.dims[i].axes.pop_back();
    next.dims[j].axes.push_back(axis);
    const std::vector<int64_t> in = LocalShape(g, cur), out = LocalShape(g, next);
    for (size_t d = 0; d < j; ++d)
      if (in[d] != 1) return false;
    for (size_t d = 0; d < i; ++d)
      if (out[d] != 1) return false;
    return true;
  }

  /// This rank's block along dim `d` over `axis` of a tensor replicated on
  /// that axis. The IR's slice has a static start, the same on every rank of
  /// an SPMD graph, so a rank-dependent block is taken with communication:
  /// an all_to_all (member j gets chunk j; each member receives n copies of
  /// its own block) then a slice of the first copy, which is exact when
  /// every local dim before `d` is 1 (always for dim 0); otherwise a scale
  /// by 1/n and a reduce_scatter.
  Result<std::string> TakeBlock(const Anchor& anchor, TensorState& s, const Spec& cur, size_t d,
                                const std::string& axis, const std::string& name) {
    const Tensor& g = *s.global;
    const std::vector<int64_t> local = LocalShape(g, cur);
    const int n = AxisSize(axis);
    Spec next = cur;
    next.dims[d].axes.push_back(axis);
    bool leading_ones = true;
    for (size_t k = 0; k < d; ++k) leading_ones = leading_ones && local[k] == 1;
    if (leading_ones) {
      std::string copies = Collective(anchor, s, CollectiveType::kAllToAll, ReduceOp::kSum, {axis}, name, cur,
                                      "activation");
      return LocalOp(anchor, s, ComputeType::kSlice, "slice", copies, next,
                     {{"axis", static_cast<double>(d)}, {"start", 0}, {"len", static_cast<double>(local[d] / n)}});
    }
    std::string scaled = LocalOp(anchor, s, ComputeType::kScale, "scale", name, cur, {{"scale", 1.0 / n}});
    return Collective(anchor, s, CollectiveType::kReduceScatter, ReduceOp::kSum, {axis}, scaled, next, "activation");
  }

  /// Whether `target` only adds axes to `cur`'s dims (no partial sums; the
  /// same segments, or a whole dim becoming segmented).
  static bool IsPureRefinement(const Spec& cur, const Spec& target) {
    if (!cur.partial.empty() || !target.partial.empty()) return false;
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      const auto& have = cur.dims[d].axes;
      const auto& want = target.dims[d].axes;
      const bool whole = have.empty() && cur.dims[d].segments.empty();
      if ((!whole && cur.dims[d].segments != target.dims[d].segments) || want.size() < have.size() ||
          !std::equal(have.begin(), have.end(), want.begin()))
        return false;
    }
    return true;
  }

  /// The name of `s` under `target`: an existing version, or a new reshard.
  Result<std::string> Get(TensorState& s, const Spec& target, const Anchor& consumer, const std::string& who) {
    const Phase phase = consumer.tags.phase;
    s.made_for.resize(s.versions.size(), Phase::kNone);
    for (size_t v = 0; v < s.versions.size(); ++v)
      if (s.versions[v].first == target && Reusable(s, v, phase)) return s.versions[v].second;
    if (s.is_input && IsPureRefinement(s.versions[s.current].first, target) &&
        !used_names_.count(s.global->name + ".shard")) {
      // A graph input is initialised from its global identity, so a finer
      // split of it is one more graph input, "<name>.shard" (the runtime's
      // ZeRO convention): each rank's block, no communication.
      const std::string name = Declare(s.global->name + ".shard", *s.global, target);
      ++inserted_["input_shard"];
      s.versions.push_back({target, name});
      return name;
    }
    Anchor anchor = consumer;
    const bool again = s.regather && s.producer >= 0 && graph_.ops[s.producer].tags.phase != phase;
    if (s.producer >= 0 && !again) {
      anchor.op = s.producer;
      anchor.after = true;
      anchor.tags = graph_.ops[s.producer].tags;
    }  // else right before the consumer: a graph input, or a re-gather in a later phase
    Result<std::string> name = Reshard(s, s.current, target, anchor, who);
    if (!name.ok()) return name.status();
    s.versions.push_back({target, *name});
    s.made_for.resize(s.versions.size(), Phase::kNone);
    s.made_for.back() = s.regather ? phase : Phase::kNone;
    return name;
  }

  /// Whether version `v` of `s` may serve a consumer in `phase`.
  static bool Reusable(const TensorState& s, size_t v, Phase phase) {
    return !s.regather || v >= s.made_for.size() || s.made_for[v] == Phase::kNone || s.made_for[v] == phase;
  }

  // ---- rules ---------------------------------------------------------------

  /// Current spec of input tensor `name`.
  const Spec& CurrentSpec(const std::string& name) const {
    const TensorState& s = state_[tensor_index_.at(name)];
    return s.versions[s.current].first;
  }
  const Tensor& Global(const std::string& name) const { return *state_[tensor_index_.at(name)].global; }

  /// The partitioner as the registry's sharding rules see it.
  class RuleContext : public ShardingRuleContext {
   public:
    explicit RuleContext(const Partitioner& p) : p_(p) {}
    const Graph& graph() const override { return p_.graph_; }
    const Tensor& Global(const std::string& name) const override { return p_.Global(name); }
    const DimSharding& CurrentDim(const std::string& name, size_t dim) const override {
      return p_.CurrentSpec(name).dims[dim];
    }

   private:
    const Partitioner& p_;
  };

  /// The signature of op `op` (given its inputs' current specs): its
  /// compute type's rule from the op registry (a copy's: pairwise), or an error.
  Result<Signature> BuildSignature(const Op& op) const {
    const RuleContext ctx(*this);
    if (op.kind == OpKind::kCopy) return CopyShardingSignature(op, ctx);
    const ShardingSignatureRule rule = OpInfo(op.compute_type).sharding;
    if (rule == nullptr)
      return Status::Error("no sharding rule for compute type '" + std::string(ToString(op.compute_type)) + "'");
    return rule(op, ctx);
  }

  /// Global sizes of every operand dimension carrying label `l`.
  std::vector<int64_t> LabelSizes(const Op& op, const Signature& sig, int l) const {
    std::vector<int64_t> sizes;
    auto scan = [&](const std::vector<std::string>& names, const std::vector<std::vector<int>>& dims) {
      for (size_t i = 0; i < names.size(); ++i)
        for (size_t d = 0; d < dims[i].size(); ++d)
          if (dims[i][d] == l) sizes.push_back(Global(names[i]).shape[d]);
    };
    scan(op.inputs, sig.in);
    scan(op.outputs, sig.out);
    return sizes;
  }

  /// Whether label `l` of `op` may take `dim`.
  bool Fits(const Op& op, const Signature& sig, int l, const DimSharding& dim) const {
    if (sig.whole[l] && !dim.axes.empty()) return false;
    for (int64_t size : LabelSizes(op, sig, l))
      if (!DimProblem(dim, size).empty()) return false;
    if (l == sig.head_label && !dim.axes.empty()) {
      const int64_t n = AxesSize(dim.axes);
      if (!dim.segments.empty()) return false;
      if (static_cast<int64_t>(op.Attr("heads", 1)) % n != 0) return false;
      if (static_cast<int64_t>(op.Attr("kv_heads", op.Attr("heads", 1))) % n != 0) return false;
    }
    return true;
  }

  /// Assigns label shardings with the inputs claiming in `order`, then
  /// derives each input's required spec and each output's spec.
  Assignment Assign(const Op& op, const Signature& sig, const std::vector<size_t>& order) const {
    std::vector<std::optional<DimSharding>> label(sig.labels);
    std::map<int, std::set<std::string>> used_by_group;
    // A label takes an operand's axes, or the longest prefix of them no other label of its
    // group holds (a table split over tp then dp under ZeRO-3 keeps tp where the batch holds dp).
    auto claim = [&](int l, DimSharding dim) {
      if (l < 0 || label[l]) return;
      std::set<std::string>& used = used_by_group[sig.group[l]];
      for (size_t k = 0; k < dim.axes.size(); ++k)
        if (used.count(dim.axes[k])) {
          if (k == 0 || !dim.segments.empty()) return;
          dim.axes.resize(k);
          break;
        }
      if (!Fits(op, sig, l, dim)) return;
      label[l] = dim;
      used.insert(dim.axes.begin(), dim.axes.end());
    };
    for (const auto& [l, dim] : sig.forced) {  // consistent by construction: no axis check
      label[l] = dim;
      used_by_group[sig.group[l]].insert(dim.axes.begin(), dim.axes.end());
    }
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const TensorState& s = state_[tensor_index_.at(op.outputs[o])];
      // A gradient's annotation (usually Adam's, following its parameter) does not steer the op
      // that computes it: that op runs as its inputs are split (data parallel: a partial sum over
      // the batch) and the result is resharded after it (a ZeRO shard: reduce-scattered). Fixing
      // its labels first would deny the contracted batch its axis and gather the activations.
      // Nor does an Adam output that only follows its parameter: an Adam op whose moments are
      // annotated as shards (ZeRO) runs on the shard, and its updated parameter is gathered after.
      if (!s.annotation || s.is_grad || s.follows) continue;
      for (size_t d = 0; d < sig.out[o].size(); ++d) {
        const int l = sig.out[o][d];
        if (l < 0 || label[l]) continue;
        if (s.annotation->dims[d].axes.empty()) {
          if (!sig.forced.count(l)) label[l] = DimSharding{};
        } else {
          claim(l, s.annotation->dims[d]);
        }
      }
    }
    for (size_t i : order) {
      const Spec& cur = CurrentSpec(op.inputs[i]);
      for (size_t d = 0; d < sig.in[i].size(); ++d)
        if (!cur.dims[d].axes.empty()) claim(sig.in[i][d], cur.dims[d]);
    }
    for (const auto& [l, dim] : sig.hints) claim(l, dim);
    Assignment a;
    for (int l = 0; l < sig.labels; ++l) a.label.push_back(label[l] ? *label[l] : DimSharding{});
    auto dims_of = [&](const std::vector<int>& labels) {
      std::vector<DimSharding> dims;
      for (int l : labels) dims.push_back(l < 0 ? DimSharding{} : a.label[l]);
      return dims;
    };
    // Which partial inputs pass through.
    const size_t nin = op.inputs.size();
    std::vector<bool> pass(nin, false);
    std::set<std::string> used;
    for (const auto& [g, axes] : used_by_group) used.insert(axes.begin(), axes.end());
    auto passable = [&](const Spec& s, int group) {
      if (s.partial.empty() || s.max) return false;
      for (const std::string& p : s.partial)
        if (group < 0 ? used.count(p) : used_by_group[group].count(p)) return false;
      return true;
    };
    if (sig.linear == Signature::Linear::kPairwise) {
      for (size_t i = 0; i < nin; ++i)
        pass[i] = passable(CurrentSpec(op.inputs[i]), sig.in[i].empty() ? -1 : sig.group[sig.in[i][0]]);
    } else if (sig.linear == Signature::Linear::kSame) {
      bool all = true;
      for (size_t i = 0; i < nin; ++i)
        all = all && passable(CurrentSpec(op.inputs[i]), -1) &&
              CurrentSpec(op.inputs[i]).partial == CurrentSpec(op.inputs[0]).partial;
      if (all) pass.assign(nin, true);
    } else if (sig.linear == Signature::Linear::kOne) {
      for (size_t i = 0; i < nin; ++i)
        if (passable(CurrentSpec(op.inputs[i]), -1)) {
          pass[i] = true;
          break;
        }
    }
    std::vector<std::string> passed;
    for (size_t i = 0; i < nin; ++i) {
      Spec need;
      need.dims = dims_of(sig.in[i]);
      if (pass[i]) {
        need.partial = CurrentSpec(op.inputs[i]).partial;
        if (sig.linear != Signature::Linear::kPairwise) passed = need.partial;
      }
      // A tensor marked regather is meant to be gathered where each phase reads it (ZeRO-3's
      // parameters over dp): gathering its innermost axes costs the choice nothing, so the
      // activations keep their split.
      const TensorState& in = state_[tensor_index_.at(op.inputs[i])];
      const bool intended = in.regather && InnermostGather(CurrentSpec(op.inputs[i]), need);
      if (!intended && !HasVersion(op.inputs[i], need, op.tags.phase)) a.cost += static_cast<double>(local_bytes_.at(Name(op.inputs[i])));
      a.in.push_back(std::move(need));
    }
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      Spec out;
      out.dims = dims_of(sig.out[o]);
      std::set<int> has(sig.out[o].begin(), sig.out[o].end());
      std::vector<std::string> partial = sig.linear == Signature::Linear::kPairwise && pass[o]
                                             ? CurrentSpec(op.inputs[o]).partial
                                             : passed;
      bool contracted = false;
      if (!sig.no_output_partial) {
        std::set<int> seen;
        for (size_t i = 0; i < sig.in.size(); ++i)
          if (sig.linear != Signature::Linear::kPairwise || i == o)  // a pairwise op's output sees its own input only
          for (int l : sig.in[i])
            if (l >= 0 && !has.count(l) && !sig.renamed.count(l) && seen.insert(l).second)
              for (const std::string& ax : a.label[l].axes) {
                partial.push_back(ax);
                contracted = true;
              }
      }
      out.partial = MeshOrder(partial);
      out.max = contracted && sig.contract_max;
      a.out.push_back(std::move(out));
    }
    return a;
  }

  /// Whether `need` is `cur` with at most the innermost axis of each dim
  /// dropped (and no partial sums): what re-gathering a regather tensor does.
  static bool InnermostGather(const Spec& cur, const Spec& need) {
    if (!cur.partial.empty() || !need.partial.empty()) return false;
    for (size_t d = 0; d < cur.dims.size(); ++d) {
      const auto& have = cur.dims[d].axes;
      const auto& want = need.dims[d].axes;
      if (cur.dims[d].segments != need.dims[d].segments) return false;
      if (want != have && (have.empty() || want != std::vector<std::string>(have.begin(), have.end() - 1)))
        return false;
    }
    return true;
  }

  /// Whether `name` is already held as `spec` (its current version or one a
  /// reshard made before): using it costs no communication.
  bool HasVersion(const std::string& name, const Spec& spec, Phase phase) const {
    const TensorState& s = state_[tensor_index_.at(name)];
    for (size_t v = 0; v < s.versions.size(); ++v)
      if (s.versions[v].first == spec && Reusable(s, v, phase)) return true;
    return false;
  }

  /// The new-graph name of the current version of `name`.
  const std::string& Name(const std::string& name) const {
    const TensorState& s = state_[tensor_index_.at(name)];
    return s.versions[s.current].second;
  }

  /// The cheapest assignment over every claim order of the inputs (by the
  /// bytes of inputs that must be resharded and are not held so already, a
  /// regather tensor's innermost gather counting nothing; ties: program order
  /// first).
  Assignment Choose(const Op& op, const Signature& sig) const {
    std::vector<size_t> order(op.inputs.size());
    std::iota(order.begin(), order.end(), 0);
    Assignment best = Assign(op, sig, order);
    if (order.size() > 4) return best;
    while (std::next_permutation(order.begin(), order.end())) {
      Assignment a = Assign(op, sig, order);
      if (a.cost < best.cost) best = std::move(a);
    }
    return best;
  }

  /// The local flops fraction: 1 / (axes product) of every sharded label of
  /// the iteration space.
  double WorkFraction(const Signature& sig, const Assignment& a) const {
    double f = 1;
    for (int l = 0; l < sig.labels; ++l)
      if (!sig.lookup[l]) f /= static_cast<double>(AxesSize(a.label[l].axes));
    return f;
  }

  /// Partitions original op `i`: chooses shardings, reshards its inputs,
  /// emits the local op with rewritten shapes and attributes, and reshards
  /// annotated outputs.
  Status PartitionOp(int i) {
    const Op& op = graph_.ops[i];
    Result<Signature> sig = BuildSignature(op);
    if (!sig.ok()) return Fail(OpLabel(op) + ": " + sig.status().message());
    const Assignment a = Choose(op, *sig);
    Op local = op;
    Anchor consumer{i, false, op.tags};
    double global_bytes = 0, local_bytes = 0;
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      TensorState& s = state_[tensor_index_.at(op.inputs[k])];
      const std::string who = OpLabel(op) + " input " + std::to_string(k);
      Result<std::string> name = Get(s, a.in[k], consumer, who);
      if (!name.ok()) return name.status();
      local.inputs[k] = *name;
      global_bytes += static_cast<double>(s.global->Bytes());
      local_bytes += static_cast<double>(local_bytes_.at(*name));
    }
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      TensorState& s = state_[tensor_index_.at(op.outputs[k])];
      std::string problem = SpecProblem(a.out[k], *s.global);
      if (!problem.empty())
        return Fail(OpLabel(op) + ": output '" + s.global->name + "' would be sharded " + ToText(a.out[k]) +
                    ": " + problem);
      local.outputs[k] = Declare(s.global->name, *s.global, a.out[k]);
      s.versions.push_back({a.out[k], local.outputs[k]});
      s.current = 0;
      global_bytes += static_cast<double>(s.global->Bytes());
      local_bytes += static_cast<double>(local_bytes_.at(local.outputs[k]));
    }
    if (op.kind == OpKind::kCompute) {
      RewriteAttrs(op, *sig, a, &local);
      local.flops = op.flops * WorkFraction(*sig, a);
      if (global_bytes > 0) local.bytes = op.bytes * local_bytes / global_bytes;
    } else if (global_bytes > 0) {
      local.bytes = op.bytes * local_bytes / global_bytes;
    }
    main_[i] = std::move(local);
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      TensorState& s = state_[tensor_index_.at(op.outputs[k])];
      if (!s.annotation || *s.annotation == a.out[k]) continue;
      Anchor after{i, true, op.tags};
      Result<std::string> name =
          Reshard(s, 0, *s.annotation, after, OpLabel(op) + " output '" + s.global->name + "' (" + s.annotated_by + ")");
      if (!name.ok()) return name.status();
      s.versions.push_back({*s.annotation, *name});
      s.current = static_cast<int>(s.versions.size()) - 1;
    }
    return Status::Ok();
  }

  /// Size-carrying attributes: attention head counts, slice start/len,
  /// the cross-entropy gradient's denominator (the global token count).
  void RewriteAttrs(const Op& op, const Signature& sig, const Assignment& a, Op* local) const {
    if (sig.head_label >= 0) {
      const double n = static_cast<double>(AxesSize(a.label[sig.head_label].axes));
      local->attrs["heads"] = op.Attr("heads", 1) / n;
      if (op.attrs.count("kv_heads")) local->attrs["kv_heads"] = op.Attr("kv_heads", 1) / n;
    }
    if (op.compute_type == ComputeType::kSlice) {
      const size_t axis = static_cast<size_t>(op.Attr("axis", 0));
      const double n = static_cast<double>(AxesSize(a.in[0].dims[axis].axes));
      local->attrs["start"] = op.Attr("start", 0) / n;
      if (op.attrs.count("len")) local->attrs["len"] = op.Attr("len", 0) / n;
    }
    if (op.compute_type == ComputeType::kCrossEntropyGrad && !op.attrs.count("denominator"))
      local->attrs["denominator"] = static_cast<double>(Global(op.inputs[3]).NumElements());
  }

  const Program& in_;
  const ShardingPlan& plan_;
  PartitionReport* report_;
  const Graph& graph_;
  GraphIndex index_;
  std::vector<TensorState> state_;
  std::unordered_map<std::string, int> tensor_index_;
  std::unordered_map<std::string, int64_t> local_bytes_;
  std::set<std::string> used_names_;
  Graph out_graph_;
  std::vector<std::vector<Op>> before_, after_;
  std::vector<Op> main_;
  int next_id_ = 0;
  std::map<std::string, int> inserted_;
  std::vector<SegmentedTensor> segmented_;
};

}  // namespace

Result<Program> PartitionProgram(const Program& unsharded, const ShardingPlan& plan, PartitionReport* report) {
  Result<Program> p = Partitioner(unsharded, plan, report).Run();
  if (p.ok()) AssignCommunicatorStreams(*p);
  return p;
}

}  // namespace concerto
