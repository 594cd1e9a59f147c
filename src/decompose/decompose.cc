#include "concerto/decompose/decompose.h"

#include <algorithm>
#include <cassert>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

enum class Side { kProducer, kConsumer };

/// An eligible collective and the matmuls next to it.
struct Candidate {
  int collective = -1;        // op index
  Side side = Side::kProducer;
  std::vector<int> matmuls;   // producer: the one matmul; consumer: every matmul reading the gather
  std::vector<int> others;    // consumer side: other consumers of the gathered tensor
  std::vector<int> dims;      // dimensions the chunks may cut, lowest first
};

/// The new ops and tensors that replace a candidate's ops, in a topological
/// order that is also each stream's order in a chunked pipeline.
struct Rewrite {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  /// Per op: the original op index it takes the place of in program order
  /// (chunks where their op was, joins just before the first reader of
  /// their output), and whether it goes before that op rather than in its
  /// place. Program order is each stream's order under the in-order
  /// baselines, so a join must not hold up independent work.
  std::vector<int> anchor;
  std::vector<bool> before;
  std::vector<int> removed;  // op indices replaced

  void Add(Op op, int at, bool goes_before) {
    ops.push_back(std::move(op));
    anchor.push_back(at);
    before.push_back(goes_before);
  }
};

/// A matmul the chunking can cut along a leading dimension of its left
/// operand: a not transposed and b two-dimensional (so every leading dim of a
/// is a dim of the output at the same position).
bool IsChunkableMatmul(const Op& op, const Graph& g, const GraphIndex& index) {
  if (op.kind != OpKind::kCompute || op.compute_type != ComputeType::kMatmul) return false;
  if (op.inputs.size() != 2 || op.outputs.size() != 1) return false;
  if (op.Attr("transpose_a", 0) != 0) return false;
  if (!op.control_deps.empty()) return false;
  const Tensor& b = g.tensors[index.tensor.at(op.inputs[1])];
  return b.shape.size() == 2;
}

/// The dimension where a gather's or scatter's input and output differ, or
/// -1 when they have the same shape (all_reduce).
int CollectiveDim(const Tensor& in, const Tensor& out) {
  if (in.shape.size() != out.shape.size()) return -2;
  for (size_t d = 0; d < in.shape.size(); ++d)
    if (in.shape[d] != out.shape[d]) return static_cast<int>(d);
  return -1;
}

const Tensor& TensorOf(const Graph& g, const GraphIndex& index, const std::string& name) {
  return g.tensors[index.tensor.at(name)];
}

/// Leading dims (all but the last) of `t` other than `skip`, with size >= 2.
std::vector<int> LeadingDims(const Tensor& t, int skip) {
  std::vector<int> dims;
  for (int d = 0; d + 1 < static_cast<int>(t.shape.size()); ++d)
    if (d != skip && t.shape[d] >= 2) dims.push_back(d);
  return dims;
}

/// The candidate around collective op `i`, if its neighbourhood has an
/// eligible shape.
std::optional<Candidate> FindCandidate(const Graph& g, const GraphIndex& index, int i, bool gather_scatter_only) {
  const Op& c = g.ops[i];
  if (c.kind != OpKind::kCollective || c.tags.purpose != "activation") return std::nullopt;
  if (gather_scatter_only && c.collective != CollectiveType::kAllGather &&
      c.collective != CollectiveType::kReduceScatter)
    return std::nullopt;
  if (c.inputs.size() != 1 || c.outputs.size() != 1 || !c.control_deps.empty()) return std::nullopt;
  const int in_t = index.tensor.at(c.inputs[0]);
  const int out_t = index.tensor.at(c.outputs[0]);
  const int cdim = CollectiveDim(g.tensors[in_t], g.tensors[out_t]);
  if (cdim == -2) return std::nullopt;
  Candidate cand;
  cand.collective = i;
  if (c.collective == CollectiveType::kAllReduce || c.collective == CollectiveType::kReduceScatter) {
    const int p = index.producer[in_t];
    if (p < 0 || index.consumers[in_t].size() != 1) return std::nullopt;
    if (!IsChunkableMatmul(g.ops[p], g, index)) return std::nullopt;
    cand.side = Side::kProducer;
    cand.matmuls = {p};
    // The matmul's output keeps a's leading dims, so a's dim d is the
    // collective input's dim d.
    cand.dims = LeadingDims(TensorOf(g, index, g.ops[p].inputs[0]), cdim);
  } else if (c.collective == CollectiveType::kAllGather) {
    cand.side = Side::kConsumer;
    for (int q : index.consumers[out_t]) {
      const Op& op = g.ops[q];
      if (IsChunkableMatmul(op, g, index) && op.inputs[0] == c.outputs[0] && op.inputs[1] != c.outputs[0])
        cand.matmuls.push_back(q);
      else
        cand.others.push_back(q);
    }
    if (cand.matmuls.empty()) return std::nullopt;
    cand.dims = LeadingDims(g.tensors[out_t], cdim);
  } else {
    return std::nullopt;
  }
  if (cand.dims.empty()) return std::nullopt;
  return cand;
}

/// Builds the chunked ops of `cand` with `k` chunks along `dim`; new op ids
/// count up from `*next_id`.
Rewrite BuildRewrite(const Graph& g, const GraphIndex& index, const Candidate& cand, int k, int dim,
                     int* next_id) {
  Rewrite rw;
  // Chunks along a dimension with only size-1 dimensions before it are
  // contiguous blocks: on a device runtime a slice or concat of them is a
  // pointer offset (kernels read and write the chunk in place), so they move
  // no bytes and cost one launch. Otherwise the copy is priced.
  const Tensor& c_first = TensorOf(g, index, g.ops[cand.collective].outputs[0]);
  bool contiguous = true;
  for (int d = 0; d < dim; ++d) contiguous &= c_first.shape[d] == 1;
  const double copy_factor = contiguous ? 0.0 : 2.0;
  auto add_tensor = [&](const Tensor& like, const std::string& name, int64_t size_on_dim) {
    Tensor t = like;
    t.name = name;
    t.shape[dim] = size_on_dim;
    rw.tensors.push_back(t);
    return name;
  };
  auto new_op = [&](const Op& like, const std::string& name) {
    Op op = like;
    op.id = (*next_id)++;
    op.name = name;
    op.control_deps.clear();
    op.fused_from.clear();
    op.duration_us.reset();
    if (op.kind == OpKind::kCompute) op.tags.purpose.clear();
    return op;
  };
  auto slices = [&](const Op& tags_from, const Tensor& src, int at) {
    std::vector<std::string> parts;
    const int64_t len = src.shape[dim] / k;
    for (int j = 0; j < k; ++j) {
      std::string name = add_tensor(src, src.name + ".chunk" + std::to_string(j), len);
      Op s = new_op(tags_from, src.name + ".split" + std::to_string(j));
      s.kind = OpKind::kCompute;
      s.tags.purpose.clear();
      s.stream = "compute";
      s.compute_type = ComputeType::kSlice;
      s.attrs = {{"axis", dim}, {"start", static_cast<double>(j * len)}, {"len", static_cast<double>(len)}};
      s.inputs = {src.name};
      s.outputs = {name};
      s.flops = 0;
      s.bytes = copy_factor * static_cast<double>(rw.tensors.back().Bytes());
      rw.Add(std::move(s), at, false);
      parts.push_back(name);
    }
    return parts;
  };
  // The join goes just before the first op (not replaced) that reads `dst`,
  // or in place of `fallback` when none does.
  auto concat = [&](const Op& tags_from, const std::vector<std::string>& parts, const Tensor& dst, int fallback,
                    const std::vector<int>& replaced) {
    Op j = new_op(tags_from, dst.name + ".join");
    j.kind = OpKind::kCompute;
    j.tags.purpose.clear();
    j.stream = "compute";
    j.compute_type = ComputeType::kConcat;
    j.attrs = {{"axis", dim}};
    j.inputs = parts;
    j.outputs = {dst.name};
    j.flops = 0;
    j.bytes = copy_factor * static_cast<double>(dst.Bytes());
    int first_reader = -1;
    for (int q : index.consumers[index.tensor.at(dst.name)])
      if (std::find(replaced.begin(), replaced.end(), q) == replaced.end() && (first_reader < 0 || q < first_reader))
        first_reader = q;
    if (first_reader >= 0)
      rw.Add(std::move(j), first_reader, true);
    else
      rw.Add(std::move(j), fallback, false);
  };
  // One chunk of matmul `m` reading `a_part`, writing a new chunk tensor. It
  // moves 1/k of a and of the output and all of b.
  auto matmul_chunk = [&](const Op& m, const std::string& a_part, int j) {
    const Tensor& out = TensorOf(g, index, m.outputs[0]);
    const double b_bytes = static_cast<double>(TensorOf(g, index, m.inputs[1]).Bytes());
    std::string y = add_tensor(out, out.name + ".chunk" + std::to_string(j), out.shape[dim] / k);
    Op op = new_op(m, m.name + ".c" + std::to_string(j));
    op.inputs = {a_part, m.inputs[1]};
    op.outputs = {y};
    op.flops = m.flops / k;
    op.bytes = std::max(0.0, m.bytes - b_bytes) / k + b_bytes;
    return std::make_pair(std::move(op), y);
  };
  const Op& c = g.ops[cand.collective];
  const Tensor& c_in = TensorOf(g, index, c.inputs[0]);
  const Tensor& c_out = TensorOf(g, index, c.outputs[0]);
  if (cand.side == Side::kProducer) {
    const Op& m = g.ops[cand.matmuls[0]];
    const Tensor& a = TensorOf(g, index, m.inputs[0]);
    rw.removed = {cand.matmuls[0], cand.collective};
    std::vector<std::string> a_parts = slices(m, a, cand.matmuls[0]);
    std::vector<std::string> z_parts;
    for (int j = 0; j < k; ++j) {
      auto [mm, y] = matmul_chunk(m, a_parts[j], j);
      rw.Add(std::move(mm), cand.matmuls[0], false);
      std::string z = add_tensor(c_out, c_out.name + ".chunk" + std::to_string(j), c_out.shape[dim] / k);
      Op cc = new_op(c, c.name + ".c" + std::to_string(j));
      cc.inputs = {y};
      cc.outputs = {z};
      cc.message_bytes = c.message_bytes / k;
      rw.Add(std::move(cc), cand.collective, false);
      z_parts.push_back(z);
    }
    concat(c, z_parts, c_out, cand.collective, rw.removed);
  } else {
    rw.removed = cand.matmuls;
    rw.removed.push_back(cand.collective);
    std::vector<std::string> x_parts = slices(c, c_in, cand.collective);
    std::map<int, std::vector<std::string>> y_parts;  // matmul op index -> chunk outputs
    std::vector<std::string> g_parts;
    for (int j = 0; j < k; ++j) {
      std::string xg = add_tensor(c_out, c_out.name + ".chunk" + std::to_string(j), c_out.shape[dim] / k);
      Op cc = new_op(c, c.name + ".c" + std::to_string(j));
      cc.inputs = {x_parts[j]};
      cc.outputs = {xg};
      cc.message_bytes = c.message_bytes / k;
      rw.Add(std::move(cc), cand.collective, false);
      g_parts.push_back(xg);
      for (int q : cand.matmuls) {
        const Op& m = g.ops[q];
        auto [mm, y] = matmul_chunk(m, xg, j);
        rw.Add(std::move(mm), q, false);
        y_parts[q].push_back(y);
      }
    }
    for (int q : cand.matmuls)
      concat(g.ops[q], y_parts[q], TensorOf(g, index, g.ops[q].outputs[0]), q, rw.removed);
    if (!cand.others.empty()) concat(c, g_parts, c_out, cand.collective, rw.removed);
  }
  return rw;
}

/// The finish time of `ops` run alone on a rank: each stream runs its ops in
/// list order, an op starts when its stream is free and the ops of the list
/// producing its inputs have finished (the list is topological). A compute
/// op that starts while communication is in flight progresses at 1/(1+f)
/// until that communication ends (the machine model's interference; comm
/// that starts later during the op is not seen, so this is an estimate).
double PipelineUs(const std::vector<const Op*>& ops, const std::vector<double>& durations_us,
                  double interference) {
  std::unordered_map<std::string, double> ready_at;  // tensor -> time
  std::unordered_map<std::string, double> stream_free;
  double comm_busy_until = 0;
  double end_all = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = *ops[i];
    double start = stream_free[op.stream];
    for (const auto& t : op.inputs) {
      auto it = ready_at.find(t);
      if (it != ready_at.end()) start = std::max(start, it->second);
    }
    double end = start + durations_us[i];
    if (op.IsComm()) {
      comm_busy_until = std::max(comm_busy_until, end);
    } else if (comm_busy_until > start && interference > 0) {
      const double slow_end = start + durations_us[i] * (1 + interference);
      end = slow_end <= comm_busy_until
                ? slow_end
                : comm_busy_until + durations_us[i] - (comm_busy_until - start) / (1 + interference);
    }
    stream_free[op.stream] = end;
    for (const auto& t : op.outputs) ready_at[t] = end;
    end_all = std::max(end_all, end);
  }
  return end_all;
}

/// Prices `ops` (with the tensors of `g` and `extra`) on `rank`. `g_index`
/// is g's index: the tensors the ops name are looked up, not searched for
/// (a scan of every tensor per candidate made the pass quadratic).
std::vector<double> PriceOps(const Graph& g, const GraphIndex& g_index, const std::vector<Tensor>& extra,
                             const std::vector<const Op*>& ops, const Mesh& mesh, int rank, const CostModel& cost) {
  Graph scratch;
  scratch.name = g.name;
  scratch.streams = g.streams;
  std::unordered_set<std::string> needed;
  for (const Op* op : ops) {
    for (const auto& t : op->inputs) needed.insert(t);
    for (const auto& t : op->outputs) needed.insert(t);
  }
  std::vector<int> from_g;  // in g's order, as a scan of g.tensors would find them
  for (const auto& name : needed)
    if (auto it = g_index.tensor.find(name); it != g_index.tensor.end()) from_g.push_back(it->second);
  std::sort(from_g.begin(), from_g.end());
  for (int t : from_g) scratch.tensors.push_back(g.tensors[t]);
  for (const auto& t : extra)
    if (needed.count(t.name)) scratch.tensors.push_back(t);
  for (const Op* op : ops) scratch.ops.push_back(*op);
  const GraphIndex index = GraphIndex::Build(scratch);
  const PriceContext ctx{scratch, index, mesh, rank};
  std::vector<double> us;
  for (const auto& op : scratch.ops) us.push_back(cost.Price(op, ctx).duration_us);
  return us;
}

/// The ops a candidate replaces, in program order, as pointers.
std::vector<const Op*> OriginalOps(const Graph& g, const Candidate& cand) {
  std::vector<int> idx = cand.matmuls;
  idx.push_back(cand.collective);
  std::sort(idx.begin(), idx.end());
  std::vector<const Op*> ops;
  for (int i : idx) ops.push_back(&g.ops[i]);
  return ops;
}

/// Replaces the ops of every rewrite in `g`, each new op at its anchor, and
/// restores a topological program order that keeps that order where it can.
/// A tensor only the replaced ops read or wrote (a collective's whole output
/// that no op reads any more, a matmul's whole output now made in chunks)
/// leaves the graph with them: an unreferenced tensor is held for the whole
/// step by the memory model, like an unused parameter (docs/decompose.md).
void ApplyRewrites(Graph& g, std::vector<Rewrite>& rewrites) {
  std::unordered_set<std::string> was_referenced;
  for (const Op& op : g.ops) {
    was_referenced.insert(op.inputs.begin(), op.inputs.end());
    was_referenced.insert(op.outputs.begin(), op.outputs.end());
  }
  std::unordered_set<int> removed;
  std::unordered_map<int, std::vector<int>> redirect;  // removed op id -> new op ids that stand for it
  std::unordered_map<int, std::vector<Op*>> before_op, in_place_of;
  for (auto& rw : rewrites) {
    std::vector<int> new_ids;
    for (const auto& op : rw.ops) new_ids.push_back(op.id);
    for (int i : rw.removed) {
      removed.insert(i);
      redirect[g.ops[i].id] = new_ids;
    }
    for (size_t k = 0; k < rw.ops.size(); ++k)
      (rw.before[k] ? before_op : in_place_of)[rw.anchor[k]].push_back(&rw.ops[k]);
  }
  std::vector<Op> ops;
  ops.reserve(g.ops.size());
  for (int i = 0; i < static_cast<int>(g.ops.size()); ++i) {
    if (auto it = before_op.find(i); it != before_op.end())
      for (Op* op : it->second) ops.push_back(std::move(*op));
    if (auto it = in_place_of.find(i); it != in_place_of.end())
      for (Op* op : it->second) ops.push_back(std::move(*op));
    if (!removed.count(i)) ops.push_back(std::move(g.ops[i]));
  }
  for (auto& op : ops) {
    std::vector<int> deps;
    for (int d : op.control_deps) {
      auto it = redirect.find(d);
      if (it == redirect.end()) deps.push_back(d);
      else deps.insert(deps.end(), it->second.begin(), it->second.end());
    }
    op.control_deps = std::move(deps);
  }
  std::unordered_set<std::string> referenced;
  for (const Op& op : ops) {
    referenced.insert(op.inputs.begin(), op.inputs.end());
    referenced.insert(op.outputs.begin(), op.outputs.end());
  }
  std::erase_if(g.tensors, [&](const Tensor& t) { return was_referenced.count(t.name) && !referenced.count(t.name); });
  for (auto& rw : rewrites)
    for (auto& t : rw.tensors) g.tensors.push_back(std::move(t));
  g.ops = std::move(ops);
  const GraphIndex index = GraphIndex::Build(g);
  const std::vector<int> order = TopologicalOrder(g, index);
  assert(order.size() == g.ops.size() && "decomposition made the graph cyclic");
  std::vector<Op> sorted;
  sorted.reserve(g.ops.size());
  for (int i : order) sorted.push_back(std::move(g.ops[i]));
  g.ops = std::move(sorted);
}

/// Decomposes one graph; `rank` is a rank that runs it (for pricing).
void DecomposeGraph(Graph& g, const Mesh& mesh, int rank, const CostModel& cost, const DecomposeOptions& options,
                    const std::map<int, double>* exposed, DecomposeReport* report) {
  const GraphIndex index = GraphIndex::Build(g);
  const double f = EffectiveInterference(options.interference, cost.cluster());
  int next_id = 0;
  for (const auto& op : g.ops) next_id = std::max(next_id, op.id + 1);
  std::vector<Rewrite> rewrites;
  std::unordered_set<int> claimed;  // op indices already in a rewrite
  for (int i = 0; i < static_cast<int>(g.ops.size()); ++i) {
    std::optional<Candidate> cand = FindCandidate(g, index, i, options.gather_scatter_only);
    if (!cand) continue;
    bool overlaps = false;
    for (int m : cand->matmuls) overlaps |= claimed.count(m) > 0;
    if (overlaps || claimed.count(i)) continue;
    ++report->candidates;
    double exposed_us = -1;
    if (exposed) {
      auto it = exposed->find(g.ops[i].id);
      exposed_us = it == exposed->end() ? 0 : it->second;
      if (options.force_chunks == 0 && exposed_us < options.min_gain_us) continue;
    }
    const std::vector<const Op*> original = OriginalOps(g, *cand);
    const double before_us = PipelineUs(original, PriceOps(g, index, {}, original, mesh, rank, cost), f);
    std::optional<Rewrite> best;
    Decomposition best_info;
    for (int dim : cand->dims) {
      const int64_t size = g.tensors[index.tensor.at(g.ops[i].outputs[0])].shape[dim];
      int lo = options.force_chunks > 0 ? options.force_chunks : 2;
      const int hi = options.force_chunks > 0 ? options.force_chunks : options.max_chunks;
      if (options.force_chunks > 0 && options.force_at_most)
        while (lo > 2 && size % lo != 0) --lo;
      for (int k = lo; k <= hi; ++k) {
        if (size % k != 0) continue;
        int id = next_id;
        Rewrite rw = BuildRewrite(g, index, *cand, k, dim, &id);
        std::vector<const Op*> ops;
        for (const auto& op : rw.ops) ops.push_back(&op);
        const double after_us = PipelineUs(ops, PriceOps(g, index, rw.tensors, ops, mesh, rank, cost), f);
        const bool better = best ? after_us < best_info.estimated_after_us : true;
        if (!better) continue;
        best_info = {g.name, g.ops[i].name, cand->side == Side::kProducer ? "producer" : "consumer", k, dim,
                     before_us, after_us, exposed_us};
        best = std::move(rw);
      }
      if (best) break;  // the lowest dimension that divides wins
    }
    if (!best) continue;
    double gain_us = best_info.estimated_before_us - best_info.estimated_after_us;
    if (exposed_us >= 0) gain_us = std::min(gain_us, exposed_us);
    const bool pays = gain_us >= options.min_gain_us;
    if (options.force_chunks == 0 && !pays) continue;
    // Ids of the chosen rewrite were taken from next_id on.
    for (const auto& op : best->ops) next_id = std::max(next_id, op.id + 1);
    for (int r : best->removed) claimed.insert(r);
    rewrites.push_back(std::move(*best));
    report->rewrites.push_back(best_info);
  }
  if (!rewrites.empty()) ApplyRewrites(g, rewrites);
}

}  // namespace

Result<DecomposeReport> DecomposeCollectives(Program& program, const CostModel& cost,
                                             const DecomposeOptions& options, const ExposureMap* exposed) {
  if (options.max_chunks < 0 || options.force_chunks < 0)
    return Status::Error("decompose: chunk counts must be >= 0");
  DecomposeReport report;
  if (options.max_chunks < 2 && options.force_chunks == 0) return report;
  for (auto& g : program.graphs) {
    int rank = -1;
    for (const auto& role : program.roles)
      if (role.graph == g.name && !role.ranks.empty()) {
        rank = role.ranks.front();
        break;
      }
    if (rank < 0) continue;  // a graph no rank runs
    const std::map<int, double>* graph_exposed = nullptr;
    static const std::map<int, double> kNone;
    if (exposed) {
      auto it = exposed->find(g.name);
      graph_exposed = it == exposed->end() ? &kNone : &it->second;
    }
    DecomposeGraph(g, program.mesh, rank, cost, options, graph_exposed, &report);
  }
  return report;
}

const std::vector<OptionRecord<DecomposeOptions>>& DecomposeOptionRecords() {
  static const std::vector<OptionRecord<DecomposeOptions>> records = {
      {"decompose", "chunks", 0, 64,
       "concerto: most chunks the decomposition pass cuts a matmul and its exposed activation collective into "
       "(0 or 1: off)",
       &DecomposeOptions::max_chunks},
  };
  return records;
}

nlohmann::json DecomposeReportJson(const DecomposeReport& r) {
  nlohmann::json rewrites = nlohmann::json::array();
  for (const Decomposition& d : r.rewrites)
    rewrites.push_back({{"graph", d.graph},
                        {"collective", d.collective},
                        {"side", d.side},
                        {"chunks", d.chunks},
                        {"dim", d.dim},
                        {"estimated_before_us", d.estimated_before_us},
                        {"estimated_after_us", d.estimated_after_us},
                        {"exposed_us", d.exposed_us}});
  return {{"candidates", r.candidates},
          {"rewrites", rewrites},
          {"fifo_before_us", r.fifo_before_us},
          {"fifo_after_us", r.fifo_after_us},
          {"rejected", r.rejected},
          {"rejected_reason", r.rejected_reason},
          {"superseded", r.superseded}};
}

}  // namespace concerto
