// The IR verifier: structure, references, DAG, groups, peers, sizes and shapes
// of a Program, listing every violation as one line.
#include "concerto/ir/verifier.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "concerto/ir/graph_index.h"

namespace concerto {
namespace {

/// The most violations CheckProgram puts in its message.
constexpr size_t kMaxReportedViolations = 20;
/// The most send/recv pairing lines VerifyProgram lists.
constexpr size_t kMaxPairingViolations = 20;
/// The send/recv pairing check holds one entry per (send or recv op, rank
/// that runs it); past this many it would take gigabytes, so the program is
/// rejected up front (docs/ir.md, "Limits").
constexpr int64_t kMaxPointToPointInstances = int64_t{1} << 22;
/// The most ops a cycle message spells out.
constexpr int kMaxCycleOps = 12;
/// Largest element count of a tensor (keeps byte counts far from overflow).
constexpr int64_t kMaxElements = int64_t{1} << 56;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

/// "[0, 1, 2]".
std::string IntListText(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// A double printed briefly ("12.5", "inf").
std::string NumberText(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// Checks one graph; `mesh_ok` false skips the checks that need a usable mesh.
class GraphVerifier {
 public:
  GraphVerifier(const Graph& graph, const Mesh& mesh, bool mesh_ok, std::vector<std::string>* out)
      : g_(graph), mesh_(mesh), mesh_ok_(mesh_ok), out_(out) {}

  void Run() {
    CheckStreams();
    CheckTensors();
    IndexOps();
    for (size_t i = 0; i < g_.ops.size(); ++i) CheckOp(static_cast<int>(i));
    CheckAcyclic();
  }

 private:
  void Report(const std::string& what) { out_->push_back("graph " + Quote(g_.name) + ": " + what); }
  void ReportOp(const Op& op, const std::string& what) { Report(OpLabel(op) + ": " + what); }

  /// Stream names: non-empty and unique.
  void CheckStreams() {
    if (g_.streams.empty()) Report("no streams");
    if (g_.streams.size() > static_cast<size_t>(kMaxStreamsPerGraph))
      Report("field 'streams': " + std::to_string(g_.streams.size()) + " streams, more than the limit of " +
             std::to_string(kMaxStreamsPerGraph) + " (docs/ir.md \"Limits\")");
    for (const auto& s : g_.streams) {
      if (s.empty()) Report("a stream has an empty name");
      if (!stream_names_.insert(s).second) Report("stream " + Quote(s) + " is listed twice");
    }
  }

  /// Tensor names, shapes, sharding and partial axes.
  void CheckTensors() {
    tensor_index_.reserve(g_.tensors.size());
    for (size_t t = 0; t < g_.tensors.size(); ++t) {
      const Tensor& tensor = g_.tensors[t];
      if (tensor.name.empty()) Report("tensor " + std::to_string(t) + " has an empty name");
      if (!tensor_index_.emplace(tensor.name, static_cast<int>(t)).second)
        Report("duplicate tensor name " + Quote(tensor.name));
      CheckTensor(tensor);
    }
  }

  void CheckTensor(const Tensor& t) {
    const std::string where = "tensor " + Quote(t.name) + ": ";
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        Report(where + "field 'shape': negative dimension " + std::to_string(d));
        return;
      }
      if (d > 0 && elements > kMaxElements / d) {
        Report(where + "field 'shape': too many elements");
        return;
      }
      elements *= d;
    }
    if (!t.sharding.empty() && t.sharding.size() != t.shape.size())
      Report(where + "field 'sharding': has " + std::to_string(t.sharding.size()) +
             " entries for a shape of rank " + std::to_string(t.shape.size()));
    std::unordered_set<std::string> used;
    for (const auto& dim : t.sharding)
      for (const auto& axis : dim) CheckTensorAxis(where + "field 'sharding': ", axis, &used);
    std::unordered_set<std::string> partial;
    for (const auto& axis : t.partial) CheckTensorAxis(where + "field 'partial': ", axis, &partial);
    CheckSegments(t, where);
  }

  /// A segmented dim is sharded, and its segments add up to the global size
  /// with each divisible by the dim's blocks.
  void CheckSegments(const Tensor& t, const std::string& where) {
    if (t.segments.empty()) return;
    if (t.segments.size() != t.shape.size()) {
      Report(where + "field 'segments': has " + std::to_string(t.segments.size()) + " entries for a shape of rank " +
             std::to_string(t.shape.size()));
      return;
    }
    for (size_t d = 0; d < t.segments.size(); ++d) {
      if (t.segments[d].empty()) continue;
      const std::string field = where + "field 'segments[" + std::to_string(d) + "]': ";
      int64_t blocks = 1;
      if (d < t.sharding.size())
        for (const std::string& axis : t.sharding[d])
          if (const int a = mesh_.AxisIndex(axis); a >= 0) blocks *= mesh_.axes[a].size;
      if (blocks == 1) {
        Report(field + "a segmented dim must be sharded");
        continue;
      }
      int64_t sum = 0;
      for (int64_t s : t.segments[d]) {
        if (s < 1 || s % blocks != 0) {
          Report(field + "segment " + std::to_string(s) + " is not a positive multiple of the dim's " +
                 std::to_string(blocks) + " blocks");
          break;
        }
        sum += s;
      }
      if (sum != t.shape[d] * blocks)
        Report(field + "segments add up to " + std::to_string(sum) + ", not the global size " +
               std::to_string(t.shape[d] * blocks));
    }
  }

  void CheckTensorAxis(const std::string& where, const std::string& axis,
                       std::unordered_set<std::string>* used) {
    if (mesh_.AxisIndex(axis) < 0) Report(where + "unknown mesh axis " + Quote(axis));
    if (!used->insert(axis).second) Report(where + "mesh axis " + Quote(axis) + " used twice");
  }

  /// Op ids: unique and non-negative.
  void IndexOps() {
    op_index_.reserve(g_.ops.size());
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      const Op& op = g_.ops[i];
      if (op.id < 0) ReportOp(op, "field 'id': negative");
      auto [it, fresh] = op_index_.emplace(op.id, static_cast<int>(i));
      if (!fresh)
        ReportOp(op, "duplicate op id " + std::to_string(op.id) + " (also " +
                         OpLabel(g_.ops[it->second]) + ")");
    }
  }

  void CheckOp(int index) {
    const Op& op = g_.ops[index];
    if (!stream_names_.count(op.stream))
      ReportOp(op, "field 'stream': unknown stream " + Quote(op.stream) +
                       " (not in the graph's streams)");
    CheckSizes(op);
    CheckTags(op);
    for (int dep : op.control_deps)
      if (!op_index_.count(dep))
        ReportOp(op, "field 'control_deps': dangling control dep " + std::to_string(dep) +
                         " (no op has this id)");
    std::vector<const Tensor*> in, out;
    bool resolved = ResolveTensors(op, index, &in, &out);
    bool endpoints_ok = true;
    if (op.kind == OpKind::kCollective) endpoints_ok = CheckGroup(op);
    if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) CheckPeerAndCounts(op);
    if (resolved && endpoints_ok) CheckShapes(op, in, out);
  }

  /// flops, bytes, duration_us: finite and non-negative.
  void CheckSizes(const Op& op) {
    CheckAmount(op, "flops", op.flops);
    CheckAmount(op, "bytes", op.bytes);
    if (op.duration_us) CheckAmount(op, "duration_us", *op.duration_us);
    if (op.message_bytes < 0)
      ReportOp(op, "field 'bytes': negative message size " + std::to_string(op.message_bytes));
  }

  void CheckAmount(const Op& op, const char* field, double v) {
    if (!std::isfinite(v))
      ReportOp(op, std::string("field '") + field + "': non-finite value " + NumberText(v));
    else if (v < 0)
      ReportOp(op, std::string("field '") + field + "': negative value " + NumberText(v));
  }

  void CheckTags(const Op& op) {
    if (op.tags.layer < -1) ReportOp(op, "field 'tags.layer': must be >= -1");
    if (op.tags.microbatch < -1) ReportOp(op, "field 'tags.microbatch': must be >= -1");
    if (op.tag < 0) ReportOp(op, "field 'tag': negative");
  }

  /// Looks up the op's tensors; records producers. False when one is dangling.
  bool ResolveTensors(const Op& op, int index, std::vector<const Tensor*>* in,
                      std::vector<const Tensor*>* out) {
    bool ok = true;
    for (const auto& name : op.inputs) {
      auto it = tensor_index_.find(name);
      if (it == tensor_index_.end()) {
        ReportOp(op, "field 'inputs': dangling tensor reference " + Quote(name) +
                         " (no tensor has this name)");
        ok = false;
      } else {
        in->push_back(&g_.tensors[it->second]);
      }
    }
    for (const auto& name : op.outputs) {
      auto it = tensor_index_.find(name);
      if (it == tensor_index_.end()) {
        ReportOp(op, "field 'outputs': dangling tensor reference " + Quote(name) +
                         " (no tensor has this name)");
        ok = false;
        continue;
      }
      out->push_back(&g_.tensors[it->second]);
      auto [prod, fresh] = producer_.emplace(it->second, index);
      if (fresh) continue;
      if (prod->second == index)
        ReportOp(op, "field 'outputs': tensor " + Quote(name) + " is listed twice");
      else
        ReportOp(op, "tensor " + Quote(name) + " is produced by two ops (also " +
                         OpLabel(g_.ops[prod->second]) + ")");
    }
    return ok;
  }

  /// The group of a collective; false when unusable for shape checks.
  bool CheckGroup(const Op& op) {
    const Group& group = op.group;
    if (!group.axes.empty() && !group.ranks.empty()) {
      ReportOp(op, "field 'group': has both axes and ranks");
      return false;
    }
    bool ok = true;
    std::unordered_set<std::string> axes;
    for (const auto& axis : group.axes) {
      if (mesh_.AxisIndex(axis) < 0) {
        ReportOp(op, "field 'group': unknown mesh axis " + Quote(axis));
        ok = false;
      } else if (!axes.insert(axis).second) {
        ReportOp(op, "field 'group': mesh axis " + Quote(axis) + " listed twice");
        ok = false;
      }
    }
    std::unordered_set<int> ranks;
    for (int r : group.ranks) {
      if (mesh_ok_ && (r < 0 || r >= mesh_.NumRanks())) {
        ReportOp(op, "field 'group': rank " + std::to_string(r) + " is out of range (mesh has " +
                         std::to_string(mesh_.NumRanks()) + " ranks)");
        ok = false;
      } else if (!ranks.insert(r).second) {
        ReportOp(op, "field 'group': rank " + std::to_string(r) + " listed twice");
        ok = false;
      }
    }
    return ok && mesh_ok_;
  }

  /// Send/recv: a usable peer, inputs (send) or outputs (recv) only.
  void CheckPeerAndCounts(const Op& op) {
    bool send = op.kind == OpKind::kSend;
    if (send && (op.inputs.empty() || !op.outputs.empty()))
      ReportOp(op, "a send takes >= 1 input and no outputs");
    if (!send && (!op.inputs.empty() || op.outputs.empty()))
      ReportOp(op, "a recv takes no inputs and >= 1 output");
    const Peer& peer = op.peer;
    if (peer.rank >= 0) {
      if (mesh_ok_ && peer.rank >= mesh_.NumRanks())
        ReportOp(op, "field 'peer': rank " + std::to_string(peer.rank) +
                         " is off the mesh (mesh has " + std::to_string(mesh_.NumRanks()) +
                         " ranks)");
      return;
    }
    int axis = mesh_.AxisIndex(peer.axis);
    if (axis < 0) {
      ReportOp(op, "field 'peer': unknown mesh axis " + Quote(peer.axis));
      return;
    }
    int size = mesh_.axes[axis].size;
    if (peer.offset == 0 || std::abs(static_cast<int64_t>(peer.offset)) >= size)
      ReportOp(op, "field 'peer': offset " + std::to_string(peer.offset) + " along " +
                       Quote(peer.axis) + " (size " + std::to_string(size) +
                       ") is off the mesh or the rank itself for every rank");
  }

  void CheckShapes(const Op& op, const std::vector<const Tensor*>& in,
                   const std::vector<const Tensor*>& out) {
    std::string e;
    if (op.kind == OpKind::kCollective)
      e = CheckCollectiveShapes(op, in, out, GroupRankCount(mesh_, op.group));
    else
      e = CheckComputeShapes(op, in, out);
    if (!e.empty()) ReportOp(op, "shape mismatch: " + e);
  }

  /// Reports one cycle (ops on it, in dependence order) if there is any.
  void CheckAcyclic() {
    const int n = static_cast<int>(g_.ops.size());
    for (int i = 0; i < n; ++i) {
      if (DependsOnItself(i)) {
        Report("cycle through " + OpLabel(g_.ops[i]) + " -> " + OpLabel(g_.ops[i]));
        return;
      }
    }
    GraphIndex index = GraphIndex::Build(g_);
    std::vector<int> order = TopologicalOrder(g_, index);
    if (static_cast<int>(order.size()) == n) return;
    std::vector<char> done(n, 0);
    for (int i : order) done[i] = 1;
    int start = 0;
    while (done[start]) ++start;
    Report("cycle through " + DescribeCycle(index, done, start));
  }

  /// An op that reads its own output or waits on its own id.
  bool DependsOnItself(int i) const {
    const Op& op = g_.ops[i];
    for (const auto& name : op.inputs)
      if (std::find(op.outputs.begin(), op.outputs.end(), name) != op.outputs.end()) return true;
    for (int dep : op.control_deps) {
      auto it = op_index_.find(dep);
      if (it != op_index_.end() && it->second == i) return true;
    }
    return false;
  }

  /// Walks predecessors among unfinished ops from `start` until one repeats.
  std::string DescribeCycle(const GraphIndex& index, const std::vector<char>& done, int start) {
    std::vector<int> pos(g_.ops.size(), -1);
    std::vector<int> path;
    int cur = start;
    while (pos[cur] < 0) {
      pos[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      int next = -1;
      for (int p : index.preds[cur])
        if (!done[p]) {
          next = p;
          break;
        }
      assert(next >= 0 && "an op left by Kahn's algorithm has an unfinished predecessor");
      cur = next;
    }
    // path[k + 1] is a predecessor of path[k]: print it backwards.
    std::string text = OpLabel(g_.ops[cur]);
    const int last = static_cast<int>(path.size()) - 1;
    for (int k = last; k > pos[cur]; --k) {
      if (last - k == kMaxCycleOps) {
        text += " -> ... (" + std::to_string(k - pos[cur]) + " more)";
        break;
      }
      text += " -> " + OpLabel(g_.ops[path[k]]);
    }
    return text + " -> " + OpLabel(g_.ops[cur]);
  }

  const Graph& g_;
  const Mesh& mesh_;
  bool mesh_ok_;
  std::vector<std::string>* out_;
  std::unordered_map<std::string, int> tensor_index_;
  std::unordered_set<std::string> stream_names_;
  std::unordered_map<int, int> op_index_;
  std::unordered_map<int, int> producer_;  // tensor index -> op index
};

/// Graph names unique and non-empty.
void CheckGraphNames(const Program& program, std::vector<std::string>* out) {
  if (program.graphs.empty()) out->push_back("program has no graphs");
  std::unordered_set<std::string> seen;
  for (const auto& g : program.graphs) {
    if (g.name.empty()) out->push_back("a graph has an empty name");
    if (!seen.insert(g.name).second) out->push_back("duplicate graph name " + Quote(g.name));
  }
}

/// Roles: known graphs, ranks in range, every rank in exactly one role.
void CheckRoles(const Program& program, std::vector<std::string>* out) {
  const int n = program.mesh.NumRanks();
  std::vector<int> role_of(n, -1);
  std::unordered_set<std::string> names;
  for (size_t r = 0; r < program.roles.size(); ++r) {
    const Role& role = program.roles[r];
    const std::string where = "role " + Quote(role.name) + ": ";
    if (role.name.empty()) out->push_back("a role has an empty name");
    if (!names.insert(role.name).second) out->push_back("duplicate role name " + Quote(role.name));
    if (program.GraphIndex(role.graph) < 0)
      out->push_back(where + "field 'graph': unknown graph " + Quote(role.graph));
    if (role.ranks.empty()) out->push_back(where + "field 'ranks': empty");
    for (int rank : role.ranks) {
      if (rank < 0 || rank >= n) {
        out->push_back(where + "field 'ranks': rank " + std::to_string(rank) +
                       " is out of range (mesh has " + std::to_string(n) + " ranks)");
      } else if (role_of[rank] >= 0) {
        out->push_back(where + "rank " + std::to_string(rank) + " is in two roles (also role " +
                       Quote(program.roles[role_of[rank]].name) + ")");
      } else {
        role_of[rank] = static_cast<int>(r);
      }
    }
  }
  std::vector<int> missing;
  for (int rank = 0; rank < n; ++rank)
    if (role_of[rank] < 0) missing.push_back(rank);
  if (missing.empty()) return;
  std::string text = std::to_string(missing.size()) + " rank(s) in no role: ";
  for (size_t i = 0; i < missing.size() && i < 10; ++i)
    text += (i ? ", " : "") + std::to_string(missing[i]);
  out->push_back(text + (missing.size() > 10 ? ", ..." : ""));
}

/// Every rank that runs a collective over explicit ranks is in that group.
void CheckGroupMembership(const Program& program, std::vector<std::string>* out) {
  for (const Role& role : program.roles) {
    const Graph& graph = program.GraphOf(role);
    std::set<std::vector<int>> seen;
    for (const Op& op : graph.ops) {
      if (op.kind != OpKind::kCollective || op.group.ranks.empty()) continue;
      std::vector<int> ranks = GroupRanks(program.mesh, op.group, 0);
      if (!seen.insert(ranks).second) continue;
      for (int rank : role.ranks) {
        if (std::binary_search(ranks.begin(), ranks.end(), rank)) continue;
        out->push_back("role " + Quote(role.name) + " rank " + std::to_string(rank) + ": graph " +
                       Quote(graph.name) + ": " + OpLabel(op) + ": group " + IntListText(ranks) +
                       " does not contain the rank that runs it");
        break;
      }
    }
  }
}

/// One send or recv as issued by one rank.
struct P2pIssue {
  const Graph* graph;
  const Op* op;
};

/// "graph 'g' op 3 's'".
std::string IssueText(const P2pIssue& issue) {
  return "graph " + Quote(issue.graph->name) + " " + OpLabel(*issue.op);
}

using P2pKey = std::tuple<int, int, int>;  // (src, dst, tag)

/// Compares the sends and recvs of one (src, dst, tag) in issue order.
void ComparePairs(const P2pKey& key, const std::vector<P2pIssue>& sends,
                  const std::vector<P2pIssue>& recvs, std::vector<std::string>* lines) {
  auto [src, dst, tag] = key;
  const std::string where = "send/recv mismatch from rank " + std::to_string(src) + " to rank " +
                            std::to_string(dst) + " tag " + std::to_string(tag) + ": ";
  if (sends.size() != recvs.size()) {
    const P2pIssue& first = sends.empty() ? recvs[0] : sends[0];
    lines->push_back(where + std::to_string(sends.size()) + " send(s) but " +
                     std::to_string(recvs.size()) + " recv(s) (e.g. " + IssueText(first) + ")");
    return;
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].op->message_bytes == recvs[i].op->message_bytes) continue;
    lines->push_back(where + "message " + std::to_string(i) + ": " + IssueText(sends[i]) +
                     " sends " + std::to_string(sends[i].op->message_bytes) + " bytes, " +
                     IssueText(recvs[i]) + " receives " +
                     std::to_string(recvs[i].op->message_bytes));
    return;
  }
}

/// Resolves every send/recv on every rank and pairs them by (src, dst, tag).
void CheckPointToPoint(const Program& program, std::vector<std::string>* out) {
  int64_t instances = 0;
  for (const Role& role : program.roles) {
    int64_t ops = 0;
    for (const Op& op : program.GraphOf(role).ops) ops += op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
    instances += ops * static_cast<int64_t>(role.ranks.size());
  }
  if (instances > kMaxPointToPointInstances) {
    out->push_back("the program's sends and recvs run " + std::to_string(instances) +
                   " times over all ranks (send/recv ops x ranks of their role): more than the " +
                   std::to_string(kMaxPointToPointInstances) + " the verifier pairs (docs/ir.md, \"Limits\")");
    return;
  }
  std::map<P2pKey, std::vector<P2pIssue>> sends, recvs;
  int peer_errors = 0;
  for (const Role& role : program.roles) {
    const Graph& graph = program.GraphOf(role);
    for (const Op& op : graph.ops) {
      if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) continue;
      bool reported = false;
      for (int rank : role.ranks) {
        int peer = PeerRank(program.mesh, op.peer, rank);
        if (peer < 0 || peer == rank) {
          if (!reported) {
            ++peer_errors;
            out->push_back("role " + Quote(role.name) + " rank " + std::to_string(rank) +
                           ": graph " + Quote(graph.name) + ": " + OpLabel(op) +
                           ": field 'peer': " +
                           (peer < 0 ? "peer is off the mesh" : "peer is the rank itself"));
          }
          reported = true;
          continue;
        }
        bool send = op.kind == OpKind::kSend;
        P2pKey key = send ? P2pKey{rank, peer, op.tag} : P2pKey{peer, rank, op.tag};
        (send ? sends : recvs)[key].push_back({&graph, &op});
      }
    }
  }
  // Pairing is only meaningful once every peer resolves.
  if (peer_errors > 0) return;
  std::vector<std::string> lines;
  static const std::vector<P2pIssue> kNone;
  for (const auto& [key, list] : sends) {
    auto it = recvs.find(key);
    ComparePairs(key, list, it == recvs.end() ? kNone : it->second, &lines);
  }
  for (const auto& [key, list] : recvs)
    if (!sends.count(key)) ComparePairs(key, kNone, list, &lines);
  for (size_t i = 0; i < lines.size() && i < kMaxPairingViolations; ++i) out->push_back(lines[i]);
  if (lines.size() > kMaxPairingViolations)
    out->push_back(std::to_string(lines.size() - kMaxPairingViolations) +
                   " more send/recv mismatches");
}

}  // namespace

int GroupRankCount(const Mesh& mesh, const Group& group) {
  if (!group.ranks.empty()) {
    std::set<int> distinct(group.ranks.begin(), group.ranks.end());
    return static_cast<int>(distinct.size());
  }
  int64_t size = 1;
  for (const auto& axis : group.axes) {
    int i = mesh.AxisIndex(axis);
    if (i < 0) return 0;
    size = std::min<int64_t>(size * std::max(mesh.axes[i].size, 0), kMaxMeshRanks + 1);
  }
  return static_cast<int>(size);
}

std::vector<std::string> VerifyMesh(const Mesh& mesh) {
  std::vector<std::string> out;
  std::unordered_set<std::string> names;
  int64_t ranks = 1;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    const MeshAxis& axis = mesh.axes[i];
    const std::string where = "mesh: axis " + std::to_string(i) + " " + Quote(axis.name) + ": ";
    if (axis.name.empty()) out.push_back(where + "field 'name': empty");
    if (!names.insert(axis.name).second) out.push_back(where + "duplicate axis name");
    if (axis.size < 1) {
      out.push_back(where + "field 'size': must be >= 1, got " + std::to_string(axis.size));
      continue;
    }
    ranks = std::min<int64_t>(ranks * axis.size, int64_t{kMaxMeshRanks} + 1);
  }
  if (ranks > kMaxMeshRanks)
    out.push_back("mesh: more than " + std::to_string(kMaxMeshRanks) + " ranks");
  return out;
}

std::vector<std::string> VerifyGraph(const Graph& graph, const Mesh& mesh) {
  std::vector<std::string> out = VerifyMesh(mesh);
  GraphVerifier(graph, mesh, out.empty(), &out).Run();
  return out;
}

std::vector<std::string> VerifyProgram(const Program& program) {
  std::vector<std::string> out = VerifyMesh(program.mesh);
  const bool mesh_ok = out.empty();
  CheckGraphNames(program, &out);
  for (const Graph& g : program.graphs) GraphVerifier(g, program.mesh, mesh_ok, &out).Run();
  if (!mesh_ok) return out;
  CheckRoles(program, &out);
  // Rank-by-rank checks need a program whose graphs and roles are sound.
  if (!out.empty()) return out;
  CheckGroupMembership(program, &out);
  CheckPointToPoint(program, &out);
  return out;
}

Status CheckProgram(const Program& program, const std::string& source) {
  std::vector<std::string> violations = VerifyProgram(program);
  if (violations.empty()) return Status::Ok();
  const std::string prefix = source.empty() ? "" : source + ": ";
  std::string message;
  for (size_t i = 0; i < violations.size() && i < kMaxReportedViolations; ++i)
    message += (i ? "\n" : "") + prefix + violations[i];
  if (violations.size() > kMaxReportedViolations)
    message += "\n" + prefix + "(" + std::to_string(violations.size() - kMaxReportedViolations) +
               " more violations)";
  return Status::Error(message);
}

}  // namespace concerto
