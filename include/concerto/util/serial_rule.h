// The serial rule shared by the lower bounds (sim/lower_bound.cc over the
// joined graph, in microseconds, and the window solver's bound in ticks): the
// near relatives of a node that share a stream run one at a time, so a node
// waits for all of them, not just the longest. docs/architecture.md, "Lower
// bound".
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

namespace concerto {

/// Relatives of one node on one stream, with the known path length between
/// each and the node (the time that must pass between the relative's end and
/// the node's start, or the node's end and the relative's start).
template <typename Time>
struct SerialGroup {
  std::vector<int> nodes;
  std::vector<Time> dist;
};

/// Groups of relatives larger than this use the direct neighbours only
/// (keeps a node with a huge fan-in from costing quadratic time).
inline constexpr size_t kMaxSerialRelatives = 256;

/// Per node: its neighbours in `next` (distance 0) and their neighbours
/// (distance = the middle node's duration), by stream, keeping only streams
/// with two or more of them and nodes of positive duration (a zero-duration
/// op occupies no stream). A relative reached on two paths keeps the longer
/// distance. `next` is the predecessor lists (relatives before a node) or
/// the successor lists (after it).
template <typename Time>
std::vector<std::vector<SerialGroup<Time>>> GroupSerialRelatives(const std::vector<Time>& dur,
                                                                 const std::vector<int>& stream,
                                                                 const std::vector<std::vector<int>>& next) {
  const size_t n = dur.size();
  std::vector<std::vector<SerialGroup<Time>>> out(n);
  std::vector<int> slot(n, -1);             // node -> index in `found` (reset after each node)
  std::vector<std::pair<int, Time>> found;  // (node, longest known distance)
  auto add = [&](int node, Time dist) {
    if (slot[node] < 0) {
      slot[node] = static_cast<int>(found.size());
      found.emplace_back(node, dist);
    } else {
      found[slot[node]].second = std::max(found[slot[node]].second, dist);
    }
  };
  auto clear = [&] {
    for (const auto& f : found) slot[f.first] = -1;
    found.clear();
  };
  for (size_t i = 0; i < n; ++i) {
    for (int p : next[i]) add(p, Time{0});
    if (found.size() <= kMaxSerialRelatives)
      for (int p : next[i])
        for (int q : next[p]) add(q, dur[p]);
    if (found.size() > kMaxSerialRelatives) {
      clear();
      for (int p : next[i]) add(p, Time{0});
    }
    for (const auto& f : found) slot[f.first] = -1;
    std::erase_if(found, [&](const auto& f) { return !(dur[f.first] > 0); });
    std::sort(found.begin(), found.end(), [&](const auto& a, const auto& b) {
      return std::tie(stream[a.first], a.first) < std::tie(stream[b.first], b.first);
    });
    for (size_t k = 0; k < found.size();) {
      size_t e = k;
      while (e < found.size() && stream[found[e].first] == stream[found[k].first]) ++e;
      if (e - k >= 2) {
        SerialGroup<Time> g;
        for (size_t m = k; m < e; ++m) {
          g.nodes.push_back(found[m].first);
          g.dist.push_back(found[m].second);
        }
        out[i].push_back(std::move(g));
      }
      k = e;
    }
    found.clear();
  }
  return out;
}

/// The serial bound of one group, with `key` the relatives' heads (for a
/// group before the node: the node's head is at least this) or tails (after
/// it: the node's tail is at least this): the relatives run one at a time, so
/// for those with key >= k (high to low), k + their work + the smallest
/// distance among them. The largest such value. `order` is scratch space.
template <typename Time>
Time SerialBound(const SerialGroup<Time>& g, const std::vector<Time>& key, const std::vector<Time>& dur,
                 std::vector<int>* order) {
  order->resize(g.nodes.size());
  for (size_t k = 0; k < order->size(); ++k) (*order)[k] = static_cast<int>(k);
  std::sort(order->begin(), order->end(), [&](int a, int b) { return key[g.nodes[a]] > key[g.nodes[b]]; });
  Time best{0}, work{0}, min_dist = std::numeric_limits<Time>::max();
  for (int k : *order) {
    work += dur[g.nodes[k]];
    min_dist = std::min(min_dist, g.dist[k]);
    best = std::max(best, key[g.nodes[k]] + work + min_dist);
  }
  return best;
}

}  // namespace concerto
