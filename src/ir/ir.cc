#include "concerto/ir/ir.h"
#include "concerto/ir/op_registry.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <utility>

namespace concerto {
namespace {

template <typename E, size_t N>
std::optional<E> Lookup(const std::array<std::pair<E, std::string_view>, N>& table,
                        std::string_view s) {
  for (const auto& [e, name] : table)
    if (name == s) return e;
  return std::nullopt;
}
template <typename E, size_t N>
std::string_view Name(const std::array<std::pair<E, std::string_view>, N>& table, E e) {
  for (const auto& [v, name] : table)
    if (v == e) return name;
  assert(false && "enum value missing from its name table");
  return "?";
}

constexpr std::array<std::pair<DType, std::string_view>, 5> kDTypes = {{
    {DType::kF32, "f32"}, {DType::kF16, "f16"}, {DType::kBF16, "bf16"},
    {DType::kI32, "i32"}, {DType::kI64, "i64"}}};
constexpr std::array<std::pair<OpKind, std::string_view>, 5> kKinds = {{
    {OpKind::kCompute, "compute"}, {OpKind::kCollective, "collective"},
    {OpKind::kSend, "send"}, {OpKind::kRecv, "recv"}, {OpKind::kCopy, "copy"}}};
constexpr std::array<std::pair<CollectiveType, std::string_view>, 5> kCollectives = {{
    {CollectiveType::kAllReduce, "all_reduce"}, {CollectiveType::kAllGather, "all_gather"},
    {CollectiveType::kReduceScatter, "reduce_scatter"}, {CollectiveType::kAllToAll, "all_to_all"},
    {CollectiveType::kBroadcast, "broadcast"}}};
constexpr std::array<std::pair<ReduceOp, std::string_view>, 2> kReduces = {{
    {ReduceOp::kSum, "sum"}, {ReduceOp::kMax, "max"}}};
constexpr std::array<std::pair<Phase, std::string_view>, 4> kPhases = {{
    {Phase::kNone, "none"}, {Phase::kForward, "fwd"}, {Phase::kBackward, "bwd"},
    {Phase::kOptimizer, "opt"}}};

}  // namespace

int DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

std::string_view ToString(DType v) { return Name(kDTypes, v); }
std::string_view ToString(OpKind v) { return Name(kKinds, v); }
std::string_view ToString(CollectiveType v) { return Name(kCollectives, v); }
std::string_view ToString(ReduceOp v) { return Name(kReduces, v); }
std::string_view ToString(Phase v) { return Name(kPhases, v); }
std::string_view ToString(ComputeType v) { return OpInfo(v).name; }
std::optional<DType> ParseDType(std::string_view s) { return Lookup(kDTypes, s); }
std::optional<OpKind> ParseOpKind(std::string_view s) { return Lookup(kKinds, s); }
std::optional<CollectiveType> ParseCollectiveType(std::string_view s) {
  return Lookup(kCollectives, s);
}
std::optional<ReduceOp> ParseReduceOp(std::string_view s) { return Lookup(kReduces, s); }
std::optional<Phase> ParsePhase(std::string_view s) { return Lookup(kPhases, s); }
std::optional<ComputeType> ParseComputeType(std::string_view s) {
  for (const OpTypeInfo& info : OpRegistry())
    if (info.name == s) return info.type;
  return std::nullopt;
}
std::vector<std::string_view> AllComputeTypeNames() {
  std::vector<std::string_view> names;
  for (const OpTypeInfo& info : OpRegistry()) names.push_back(info.name);
  return names;
}

int Mesh::NumRanks() const {
  int n = 1;
  for (const auto& a : axes) n *= a.size;
  return n;
}

int Mesh::AxisIndex(std::string_view name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name) return static_cast<int>(i);
  return -1;
}

std::vector<int> Mesh::Coords(int rank) const {
  std::vector<int> coords(axes.size());
  for (int i = static_cast<int>(axes.size()) - 1; i >= 0; --i) {
    coords[i] = rank % axes[i].size;
    rank /= axes[i].size;
  }
  return coords;
}

int Mesh::RankOf(const std::vector<int>& coords) const {
  int rank = 0;
  for (size_t i = 0; i < axes.size(); ++i) rank = rank * axes[i].size + coords[i];
  return rank;
}

int64_t Tensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int Program::RoleOfRank(int rank) const {
  for (size_t i = 0; i < roles.size(); ++i)
    if (std::find(roles[i].ranks.begin(), roles[i].ranks.end(), rank) != roles[i].ranks.end())
      return static_cast<int>(i);
  return -1;
}

int Program::GraphIndex(std::string_view name) const {
  for (size_t i = 0; i < graphs.size(); ++i)
    if (graphs[i].name == name) return static_cast<int>(i);
  return -1;
}

const Graph& Program::GraphOf(const Role& role) const {
  int i = GraphIndex(role.graph);
  assert(i >= 0 && "role names an unknown graph");
  return graphs[i];
}

Graph& Program::GraphOf(const Role& role) {
  int i = GraphIndex(role.graph);
  assert(i >= 0 && "role names an unknown graph");
  return graphs[i];
}

std::vector<int> GroupRanks(const Mesh& mesh, const Group& group, int rank) {
  if (!group.ranks.empty()) {
    std::vector<int> r = group.ranks;
    std::sort(r.begin(), r.end());
    return r;
  }
  std::vector<int> free_axes;
  for (const auto& name : group.axes) {
    int i = mesh.AxisIndex(name);
    if (i < 0) return {};
    free_axes.push_back(i);
  }
  std::vector<int> base = mesh.Coords(rank);
  std::vector<int> out;
  // Enumerate all coordinates along the free axes (odometer).
  std::vector<int> c = base;
  for (int i : free_axes) c[i] = 0;
  while (true) {
    out.push_back(mesh.RankOf(c));
    size_t k = 0;
    for (; k < free_axes.size(); ++k) {
      int ax = free_axes[k];
      if (++c[ax] < mesh.axes[ax].size) break;
      c[ax] = 0;
    }
    if (k == free_axes.size()) break;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int GroupLeader(const Mesh& mesh, const Group& group, int rank) {
  if (!group.ranks.empty()) return *std::min_element(group.ranks.begin(), group.ranks.end());
  std::vector<int> coords = mesh.Coords(rank);
  for (const auto& name : group.axes) {
    const int i = mesh.AxisIndex(name);
    if (i < 0) return -1;
    coords[static_cast<size_t>(i)] = 0;
  }
  return mesh.RankOf(coords);
}

std::string GroupSpecKey(const Group& group) {
  std::string key;
  for (const auto& a : group.axes) key += a + ",";
  key += "|";
  for (int r : group.ranks) key += std::to_string(r) + ",";
  return key;
}

int PeerRank(const Mesh& mesh, const Peer& peer, int rank) {
  if (peer.rank >= 0) return peer.rank < mesh.NumRanks() ? peer.rank : -1;
  int ax = mesh.AxisIndex(peer.axis);
  if (ax < 0) return -1;
  std::vector<int> c = mesh.Coords(rank);
  c[ax] += peer.offset;
  if (c[ax] < 0 || c[ax] >= mesh.axes[ax].size) return -1;
  return mesh.RankOf(c);
}

std::string OpLabel(const Op& op) {
  return "op " + std::to_string(op.id) + " '" + op.name + "'";
}

}  // namespace concerto
