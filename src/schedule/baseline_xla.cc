// The "xla-lhs" baseline: a bottom-up list scheduler in the spirit of XLA's
// latency-hiding scheduler with its approximate latency estimator. Every comm
// op is an async start/done pair: the done is placed (bottom-up) once all its
// users are placed, the start once enough compute has been placed since the
// done to cover the collective's latency, or when nothing else can go.
#include <algorithm>
#include <array>
#include <cassert>
#include <queue>
#include <tuple>

#include "baseline_internal.h"

namespace concerto::baseline {
namespace {

constexpr int64_t kComputeCost = 1;         // approximate estimator: low cost
constexpr int64_t kCollectiveLatency = 5000;  // approximate estimator: high latency
constexpr int kNumResources = 6;            // one per collective type, one for send/recv

/// The async resource of a comm op: its collective type, or send/recv.
int ResourceOf(const Op& op) {
  if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) return kNumResources - 1;
  return static_cast<int>(op.collective);
}

class XlaLhs {
 public:
  /// `keep_comm_order`: comm ops start in program order (see PlanXlaLhs).
  XlaLhs(const Graph& graph, const GraphIndex& index, const std::vector<int>& pos,
         bool keep_comm_order)
      : graph_(graph), index_(index), pos_(pos), n_(static_cast<int>(graph.ops.size())),
        keep_comm_order_(keep_comm_order) {}

  /// The bottom-up order (sinks first).
  std::vector<int> Run();

 private:
  enum Class { kConsumesComm = 0, kFreesPreds = 1, kOther = 2 };
  using Entry = std::tuple<int, int, int>;  // (class, -program position, op index)

  bool IsComm(int i) const { return graph_.ops[i].IsComm(); }
  int ClassOf(int i) const;
  void MakeReady(int i);
  void DoneReady(int i);
  void Admit(int i);
  void ScheduleDone(int i);
  void Place(int i);
  void Release(int i);
  void NoteOneSuccessorLeft(int p);
  int OldestInFlight(bool covered_only) const;
  int PopCompute();

  const Graph& graph_;
  const GraphIndex& index_;
  const std::vector<int>& pos_;
  const int n_;
  const bool keep_comm_order_;
  int64_t time_ = 0;
  std::vector<int> chain_;  // comm ops, latest program position first
  size_t chain_next_ = 0;   // first comm op of chain_ not yet admitted
  std::vector<char> done_ready_;
  std::vector<int> remaining_succ_, blocked_preds_, cls_;
  std::vector<int64_t> done_time_;
  std::vector<char> placed_, ready_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  std::array<int, kNumResources> in_flight_{};
  std::array<std::queue<int>, kNumResources> waiting_;
  std::vector<int> bottom_up_;
};

/// Preference among ready compute ops (smaller first): users of a comm op
/// (so its done is placed early), then ops whose placement makes all their
/// predecessors ready, then the rest.
int XlaLhs::ClassOf(int i) const {
  for (int p : index_.preds[i])
    if (IsComm(p)) return kConsumesComm;
  if (!index_.preds[i].empty() && blocked_preds_[i] == 0) return kFreesPreds;
  return kOther;
}

/// Op `i` has every successor placed.
void XlaLhs::MakeReady(int i) {
  if (IsComm(i)) return DoneReady(i);
  ready_[i] = 1;
  cls_[i] = ClassOf(i);
  heap_.push({cls_[i], -pos_[i], i});
}

/// Comm op `i` has all its users placed. With keep_comm_order_ it is
/// admitted only once every comm op later in program order was admitted.
void XlaLhs::DoneReady(int i) {
  done_ready_[i] = 1;
  if (!keep_comm_order_) return Admit(i);
  while (chain_next_ < chain_.size() && done_ready_[chain_[chain_next_]])
    Admit(chain_[chain_next_++]);
}

/// Places the done of comm op `i` now if its resource is free, else after
/// the resource's in-flight op starts (in admission order).
void XlaLhs::Admit(int i) {
  int r = ResourceOf(graph_.ops[i]);
  if (in_flight_[r] < 0) ScheduleDone(i);
  else waiting_[r].push(i);
}

/// Places the done of comm op `i` at the current time: its resource is busy
/// until its start is placed.
void XlaLhs::ScheduleDone(int i) {
  in_flight_[ResourceOf(graph_.ops[i])] = i;
  done_time_[i] = time_;
}

/// Appends op `i` (a compute op, or the start of a comm op) to the order.
void XlaLhs::Place(int i) {
  placed_[i] = 1;
  bottom_up_.push_back(i);
  if (IsComm(i)) {
    int r = ResourceOf(graph_.ops[i]);
    assert(in_flight_[r] == i);
    in_flight_[r] = -1;
    if (!waiting_[r].empty()) {
      ScheduleDone(waiting_[r].front());
      waiting_[r].pop();
    }
  } else {
    time_ += kComputeCost;
  }
  Release(i);
}

/// Counts `i` as placed for each predecessor.
void XlaLhs::Release(int i) {
  for (int p : index_.preds[i]) {
    int left = --remaining_succ_[p];
    if (left == 0) MakeReady(p);
    else if (left == 1) NoteOneSuccessorLeft(p);
  }
}

/// Predecessor `p` now waits on one successor only: that successor no longer
/// counts `p` as blocked, and may move up a class.
void XlaLhs::NoteOneSuccessorLeft(int p) {
  for (int s : index_.succs[p]) {
    if (placed_[s]) continue;
    if (--blocked_preds_[s] == 0 && ready_[s] && !placed_[s]) {
      int c = ClassOf(s);
      if (c < cls_[s]) {
        cls_[s] = c;
        heap_.push({c, -pos_[s], s});
      }
    }
    return;
  }
}

/// The in-flight comm op with the oldest done (ties: later in program
/// order), optionally only among those whose latency is covered; or -1.
int XlaLhs::OldestInFlight(bool covered_only) const {
  int best = -1;
  for (int i : in_flight_) {
    if (i < 0) continue;
    if (covered_only && time_ - done_time_[i] < kCollectiveLatency) continue;
    if (best < 0 || done_time_[i] < done_time_[best] ||
        (done_time_[i] == done_time_[best] && pos_[i] > pos_[best]))
      best = i;
  }
  return best;
}

/// The best ready compute op (dropping stale heap entries), or -1.
int XlaLhs::PopCompute() {
  while (!heap_.empty()) {
    auto [c, neg_pos, i] = heap_.top();
    heap_.pop();
    if (!placed_[i] && c == cls_[i]) return i;
  }
  return -1;
}

std::vector<int> XlaLhs::Run() {
  remaining_succ_.assign(n_, 0);
  blocked_preds_.assign(n_, 0);
  cls_.assign(n_, kOther);
  done_time_.assign(n_, 0);
  placed_.assign(n_, 0);
  ready_.assign(n_, 0);
  done_ready_.assign(n_, 0);
  in_flight_.fill(-1);
  for (int i = 0; i < n_; ++i)
    if (IsComm(i)) chain_.push_back(i);
  std::sort(chain_.begin(), chain_.end(), [&](int a, int b) { return pos_[a] > pos_[b]; });
  for (int i = 0; i < n_; ++i) {
    remaining_succ_[i] = static_cast<int>(index_.succs[i].size());
    for (int p : index_.preds[i])
      if (index_.succs[p].size() > 1) ++blocked_preds_[i];
  }
  for (int i = n_ - 1; i >= 0; --i)
    if (remaining_succ_[i] == 0) MakeReady(i);
  while (static_cast<int>(bottom_up_.size()) < n_) {
    int i = OldestInFlight(/*covered_only=*/true);
    if (i < 0) i = PopCompute();
    if (i < 0) {
      i = OldestInFlight(/*covered_only=*/false);
      assert(i >= 0 && "xla-lhs: nothing placeable (cyclic graph?)");
      time_ = std::max(time_, done_time_[i] + kCollectiveLatency);
    }
    Place(i);
  }
  return bottom_up_;
}

}  // namespace

/// Each op on its own stream, in the reverse of the bottom-up order.
Result<GraphPlan> PlanXlaLhs(const Graph& graph, bool keep_comm_order) {
  GraphPlan plan{graph, {}, {}, {}};
  const GraphIndex index = GraphIndex::Build(graph);
  Result<std::vector<int>> pos = ProgramPositions(graph, index);
  if (!pos.ok()) return pos.status();
  plan.sequence = XlaLhs(graph, index, *pos, keep_comm_order).Run();
  std::reverse(plan.sequence.begin(), plan.sequence.end());
  plan.stream = OwnStreams(graph);
  assert(IsLaunchOrder(plan, index) && "xla-lhs produced a non-topological order");
  return plan;
}

}  // namespace concerto::baseline
