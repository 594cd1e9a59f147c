#include "concerto/ir/comm_streams.h"

#include <algorithm>
#include <set>

namespace concerto {

std::string CommunicatorStream(const Op& op) {
  auto join = [](const auto& items, const std::string& sep) {
    std::string out;
    for (const auto& x : items) {
      if (!out.empty()) out += sep;
      if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) out += x;
      else out += std::to_string(x);
    }
    return out;
  };
  switch (op.kind) {
    case OpKind::kCollective:
      if (!op.group.axes.empty()) return "comm." + join(op.group.axes, ".");
      return "comm.r" + join(op.group.ranks, "_");
    case OpKind::kSend:
    case OpKind::kRecv:
      if (!op.peer.axis.empty())
        return "p2p." + op.peer.axis + (op.peer.offset >= 0 ? "+" : "") + std::to_string(op.peer.offset);
      return "p2p.r" + std::to_string(op.peer.rank);
    case OpKind::kCompute:
    case OpKind::kCopy:
      return "";
  }
  return "";
}

namespace {

/// Puts every communication op on `stream_of(op)` and redeclares the graph's
/// streams: the used ones it had (and "compute"), then new ones in order of
/// first use. Returns the number of ops moved.
template <typename StreamOf>
int Reassign(Program& program, const StreamOf& stream_of) {
  int changed = 0;
  for (Graph& g : program.graphs) {
    for (Op& op : g.ops) {
      if (!op.IsComm()) continue;
      std::string s = stream_of(op);
      if (s == op.stream) continue;
      op.stream = std::move(s);
      ++changed;
    }
    std::set<std::string> used;
    bool any_comm = false;
    for (const Op& op : g.ops) used.insert(op.stream), any_comm = any_comm || op.IsComm();
    std::vector<std::string> streams;  // a graph without comm ops keeps what it declared
    for (const std::string& s : g.streams)
      if (used.count(s) || !any_comm || s == "compute") streams.push_back(s);
    for (const Op& op : g.ops)
      if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
    g.streams = std::move(streams);
  }
  return changed;
}

}  // namespace

int AssignCommunicatorStreams(Program& program) { return Reassign(program, CommunicatorStream); }

int AssignOneCommStream(Program& program) {
  return Reassign(program, [](const Op&) { return std::string("comm"); });
}

}  // namespace concerto
