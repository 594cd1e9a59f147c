// Deterministic graph-input initialisation keyed on global identity: a
// value is a hash of (seed, InitKey(tensor name), logical global index), so
// a shard holds exactly the slice of the global tensor its sharding spec
// (and any SegmentedLayout) names.
#include "concerto/runtime/init.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <optional>

#include "concerto/runtime/kernels.h"

namespace concerto {

namespace {

/// SplitMix64 finaliser: a well-mixed 64-bit hash of `x`.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// FNV-1a of `s` (stable across platforms, unlike std::hash).
uint64_t HashString(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

/// Uniform in [0, 1) from a tensor's base hash and an element index.
double Uniform01(uint64_t base, int64_t index) {
  return static_cast<double>(Mix(base ^ Mix(static_cast<uint64_t>(index))) >> 11) * 0x1.0p-53;
}

/// Whether `s` ends with `suffix`.
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// `key` without a trailing micro-batch suffix ".mbK".
std::string WithoutMicrobatch(const std::string& key) {
  const size_t dot = key.rfind(".mb");
  if (dot == std::string::npos || dot + 3 == key.size()) return key;
  for (size_t i = dot + 3; i < key.size(); ++i)
    if (key[i] < '0' || key[i] > '9') return key;
  return key.substr(0, dot);
}

/// The layout that applies to `tensor`: its own segmented dim (Tensor::segments),
/// else the first of `layouts` its key ends with, else none.
std::optional<SegmentedLayout> FindLayout(const Tensor& tensor, const std::vector<SegmentedLayout>& layouts) {
  for (size_t d = 0; d < tensor.segments.size(); ++d)
    if (!tensor.segments[d].empty()) return SegmentedLayout{tensor.name, static_cast<int>(d), tensor.segments[d]};
  const std::string key = InitKey(tensor.name);
  for (const SegmentedLayout& l : layouts)
    if (EndsWith(key, l.name_suffix)) return l;
  return std::nullopt;
}

/// Per local coordinate of dimension `dim`, the logical global coordinate
/// under `layout` (rank block `block` of `blocks`).
Result<std::vector<int64_t>> SegmentedMap(const Tensor& tensor, const SegmentedLayout& layout,
                                          int64_t global, int64_t block, int64_t blocks) {
  const int64_t local = tensor.shape[layout.dim];
  int64_t total = 0, local_total = 0;
  for (int64_t s : layout.segments) {
    total += s;
    if (s % blocks != 0) break;
    local_total += s / blocks;
  }
  if (total != global || local_total != local)
    return Status::Error("tensor '" + tensor.name + "': segmented layout '" + layout.name_suffix +
                         "' does not fit dim " + std::to_string(layout.dim) + " (global " +
                         std::to_string(global) + ", " + std::to_string(blocks) + " blocks)");
  std::vector<int64_t> map;
  int64_t global_start = 0;
  for (int64_t s : layout.segments) {
    const int64_t part = s / blocks;
    for (int64_t o = 0; o < part; ++o) map.push_back(global_start + block * part + o);
    global_start += s;
  }
  return map;
}

/// The smallest id range the consumers of integer tensor `ti` imply, or 0.
int64_t IdRange(const Graph& graph, const GraphIndex& index, int ti, const Mesh& mesh) {
  const std::string& name = graph.tensors[ti].name;
  int64_t range = 0;
  auto consider = [&](int64_t r) { range = range == 0 ? r : std::min(range, r); };
  auto global_of = [&](const std::string& t) {
    return GlobalShape(graph.tensors[index.tensor.at(t)], mesh);
  };
  for (int c : index.consumers[ti]) {
    const Op& op = graph.ops[c];
    if (op.kind != OpKind::kCompute) continue;
    for (size_t p = 0; p < op.inputs.size(); ++p) {
      if (op.inputs[p] != name) continue;
      switch (op.compute_type) {
        case ComputeType::kEmbedding:
          if (p == 1) consider(global_of(op.inputs[0]).at(0));
          break;
        case ComputeType::kEmbeddingGrad:
          if (p == 1) consider(global_of(op.outputs[0]).at(0));
          break;
        case ComputeType::kGatherTarget:
          if (p == 1) consider(global_of(op.inputs[0]).back());
          break;
        case ComputeType::kCrossEntropyGrad:
          if (p == 3) consider(global_of(op.inputs[0]).back());
          break;
        default:
          break;
      }
    }
  }
  return range;
}

/// The value of a float input at logical global index `g`.
float FloatValue(const std::string& key, uint64_t base, int64_t g) {
  if (EndsWith(key, ".adam_m") || EndsWith(key, ".adam_v")) return 0.0f;
  const double u = 2 * Uniform01(base, g) - 1;
  if (EndsWith(key, ".gamma")) return static_cast<float>(1 + 0.1 * u);
  if (EndsWith(key, ".beta")) return static_cast<float>(0.1 * u);
  return static_cast<float>(0.05 * u);
}

// ---- constant inputs (the Evoformer frontend, docs/evoformer.md) -------------

/// Whether `s` starts with `prefix`.
bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// "16x256x8" -> {16, 256, 8}; empty when `s` is not such a list.
std::vector<int64_t> ParseDims(const std::string& s) {
  std::vector<int64_t> dims;
  int64_t d = -1;
  for (char c : s + "x") {
    if (c >= '0' && c <= '9') {
      d = (d < 0 ? 0 : d * 10) + (c - '0');
      if (d > (int64_t{1} << 40)) return {};
    } else if (c == 'x' && d > 0) {
      dims.push_back(d);
      d = -1;
    } else {
      return {};
    }
  }
  return dims;
}

/// The local row ids of a permutation gather's constant index input
/// `const.perm.<in>.p<perm>.i<ids>[.s<d>]`: arange(rows).reshape(rows_shape)
/// .transpose(perm') flattened, where rows_shape is <in> without its last
/// dim when that dim stays last (perm' = perm without its last entry), else
/// <in> (perm' = perm). An error naming the tensor when the name does not
/// parse or its sizes do not fit the tensor.
Result<std::vector<int64_t>> PermutationRows(const Tensor& t) {
  auto bad = [&](const std::string& why) {
    return Status::Error("tensor '" + t.name + "': constant permutation input: " + why +
                         " (expected const.perm.<in dims>.p<perm digits>.i<ids dims>[.s<dim>], "
                         "docs/evoformer.md)");
  };
  std::vector<std::string> parts;
  size_t start = std::string("const.perm.").size();
  for (size_t dot; (dot = t.name.find('.', start)) != std::string::npos; start = dot + 1)
    parts.push_back(t.name.substr(start, dot - start));
  parts.push_back(t.name.substr(start));
  if (parts.size() < 3 || parts[1].size() < 2 || parts[1][0] != 'p' || parts[2].size() < 2 ||
      parts[2][0] != 'i')
    return bad("malformed name");
  const std::vector<int64_t> in = ParseDims(parts[0]);
  const std::vector<int64_t> ids = ParseDims(parts[2].substr(1));
  if (in.empty() || ids.empty()) return bad("malformed dims");
  std::vector<int> perm;
  for (char c : parts[1].substr(1)) perm.push_back(c - '0');
  std::vector<int> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size(); ++k)
    if (sorted[k] != static_cast<int>(k)) return bad(parts[1] + " is not a permutation");
  if (perm.size() != in.size()) return bad("the permutation and <in> differ in rank");
  std::vector<int64_t> rows_shape = in;
  if (perm.back() == static_cast<int>(in.size()) - 1) {
    rows_shape.pop_back();
    perm.pop_back();
  }
  int64_t rows = 1, id_count = 1;
  for (int64_t d : rows_shape) rows *= d;
  for (int64_t d : ids) id_count *= d;
  if (id_count != rows || ids != t.shape)
    return bad("<ids> must be the tensor's local shape and hold one id per row of <in>");
  std::vector<int64_t> stride(rows_shape.size(), 1);
  for (size_t d = rows_shape.size(); d-- > 1;) stride[d - 1] = stride[d] * rows_shape[d];
  std::vector<int64_t> out(rows), coord(perm.size(), 0);  // coord over the transposed shape
  for (int64_t i = 0; i < rows; ++i) {
    int64_t row = 0;
    for (size_t k = 0; k < perm.size(); ++k) row += coord[k] * stride[perm[k]];
    out[i] = row;
    for (size_t k = perm.size(); k-- > 0;) {
      if (++coord[k] < rows_shape[perm[k]]) break;
      coord[k] = 0;
    }
  }
  return out;
}

/// The first global table row (`row0`) of the embedding gathers that read
/// constant ids `ti` on `rank`; they must all agree.
Result<int64_t> GatherRow0(const Graph& graph, const GraphIndex& index, int ti, const Mesh& mesh,
                           int rank) {
  const std::string& name = graph.tensors[ti].name;
  int64_t row0 = -1;
  for (int c : index.consumers[ti]) {
    const Op& op = graph.ops[c];
    if (op.kind != OpKind::kCompute || op.compute_type != ComputeType::kEmbedding ||
        op.inputs.size() < 2 || op.inputs[1] != name)
      continue;
    const int64_t r = ShardOffset(graph.tensors[index.tensor.at(op.inputs[0])], 0, mesh, rank);
    if (row0 >= 0 && r != row0)
      return Status::Error("tensor '" + name + "': its embedding gathers read tables that start "
                           "at different global rows (" + std::to_string(row0) + " and " +
                           std::to_string(r) + ")");
    row0 = r;
  }
  if (row0 < 0)
    return Status::Error("tensor '" + name + "': constant permutation input without an embedding "
                         "consumer");
  return row0;
}

}  // namespace

std::string InitKey(const std::string& tensor_name) {
  std::string key = tensor_name;
  for (const std::string suffix : {".master", ".shard"})  // a master copy starts equal to its parameter
    if (EndsWith(key, suffix)) key.resize(key.size() - suffix.size());
  return key;
}

Result<std::vector<int64_t>> LogicalGlobalIndices(const Tensor& tensor, const Mesh& mesh, int rank,
                                                  const std::vector<SegmentedLayout>& layouts) {
  const std::vector<int64_t> global = GlobalShape(tensor, mesh);
  const size_t rank_dims = tensor.shape.size();
  const int64_t n = tensor.NumElements();
  if (n == 0) return std::vector<int64_t>();
  // Per dimension, local coordinate -> logical global coordinate.
  std::vector<std::vector<int64_t>> maps(rank_dims);
  const std::optional<SegmentedLayout> layout = FindLayout(tensor, layouts);
  if (layout && (layout->dim < 0 || layout->dim >= static_cast<int>(rank_dims)))
    return Status::Error("tensor '" + tensor.name + "': segmented layout dim out of range");
  for (size_t d = 0; d < rank_dims; ++d) {
    const int64_t offset = ShardOffset(tensor, static_cast<int>(d), mesh, rank);
    if (layout && layout->dim == static_cast<int>(d)) {
      const int64_t blocks = global[d] / tensor.shape[d];
      Result<std::vector<int64_t>> m =
          SegmentedMap(tensor, *layout, global[d], offset / tensor.shape[d], blocks);
      if (!m.ok()) return m.status();
      maps[d] = std::move(m).value();
      continue;
    }
    for (int64_t l = 0; l < tensor.shape[d]; ++l) maps[d].push_back(offset + l);
  }
  std::vector<int64_t> stride(rank_dims, 1);
  for (size_t d = rank_dims; d-- > 1;) stride[d - 1] = stride[d] * global[d];
  std::vector<int64_t> out(n);
  std::vector<int64_t> coord(rank_dims, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t g = 0;
    for (size_t d = 0; d < rank_dims; ++d) g += maps[d][coord[d]] * stride[d];
    out[i] = g;
    for (size_t d = rank_dims; d-- > 0;) {  // odometer, last dim fastest
      if (++coord[d] < tensor.shape[d]) break;
      coord[d] = 0;
    }
  }
  return out;
}

Status FillGraphInput(const Graph& graph, const GraphIndex& index, int tensor_index,
                      const Mesh& mesh, int rank, const InitOptions& options, float* out) {
  const Tensor& t = graph.tensors[tensor_index];
  const std::string key = InitKey(t.name);
  Result<std::vector<int64_t>> indices = LogicalGlobalIndices(t, mesh, rank, options.layouts);
  if (!indices.ok()) return indices.status();
  const std::vector<int64_t>& g = indices.value();
  if (auto given = options.values.find(key); given != options.values.end()) {
    int64_t global_elements = 1;
    for (int64_t d : GlobalShape(t, mesh)) global_elements *= d;
    if (static_cast<int64_t>(given->second.size()) != global_elements)
      return Status::Error("graph '" + graph.name + "': tensor '" + t.name + "': " +
                           std::to_string(given->second.size()) + " values given for '" + key + "', its global shape has " +
                           std::to_string(global_elements) + " elements");
    for (size_t i = 0; i < g.size(); ++i) out[i] = given->second[static_cast<size_t>(g[i])];
    return Status::Ok();
  }
  const uint64_t base = Mix(options.seed) ^ HashString(key);
  // Constants of the Evoformer frontend (docs/evoformer.md, "Constant inputs").
  if (StartsWith(key, "const.ones.")) {
    std::fill(out, out + g.size(), 1.0f);
    return Status::Ok();
  }
  if (StartsWith(key, "const.zeros.")) {
    std::fill(out, out + g.size(), 0.0f);
    return Status::Ok();
  }
  if (StartsWith(key, "const.perm.")) {
    Result<std::vector<int64_t>> rows = PermutationRows(t);
    if (!rows.ok()) return Status::Error("graph '" + graph.name + "': " + rows.status().message());
    Result<int64_t> row0 = GatherRow0(graph, index, tensor_index, mesh, rank);
    if (!row0.ok()) return Status::Error("graph '" + graph.name + "': " + row0.status().message());
    for (size_t i = 0; i < rows->size(); ++i) out[i] = static_cast<float>(*row0 + (*rows)[i]);
    return Status::Ok();
  }
  if (t.dtype != DType::kI32 && t.dtype != DType::kI64) {
    for (size_t i = 0; i < g.size(); ++i) out[i] = FloatValue(key, base, g[i]);
    return Status::Ok();
  }
  if (WithoutMicrobatch(key) == "positions") {
    const int64_t last = t.shape.empty() ? 1 : GlobalShape(t, mesh).back();
    for (size_t i = 0; i < g.size(); ++i) out[i] = static_cast<float>(g[i] % last);
    return Status::Ok();
  }
  const int64_t range = IdRange(graph, index, tensor_index, mesh);
  if (range <= 0 || range >= (int64_t{1} << 24))
    return Status::Error("graph '" + graph.name + "': tensor '" + t.name +
                         "': cannot initialise integer input: no embedding, embedding_grad, "
                         "gather_target or cross_entropy_grad consumer gives an id range below 2^24");
  for (size_t i = 0; i < g.size(); ++i)
    out[i] = static_cast<float>(std::min<int64_t>(
        range - 1, static_cast<int64_t>(Uniform01(base, g[i]) * static_cast<double>(range))));
  return Status::Ok();
}

}  // namespace concerto
