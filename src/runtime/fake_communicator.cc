// FakeWorld: an in-process world of N ranks whose endpoints are used by
// threads. A collective rendezvous is a slot keyed by (group, k-th call of
// that group): every member posts its input pointer, waits for the others,
// computes its own result from all inputs in ascending rank order into a
// private buffer, waits until every member is done reading, then writes its
// output (so in-place calls are safe). A send posts a message and waits
// until the matching recv has copied it.
#include "concerto/runtime/communicator.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>

namespace concerto {

namespace {

using Clock = std::chrono::steady_clock;

enum class CollKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };

/// Name of a collective kind in messages.
const char* KindName(CollKind kind) {
  switch (kind) {
    case CollKind::kAllReduce: return "all_reduce";
    case CollKind::kAllGather: return "all_gather";
    case CollKind::kReduceScatter: return "reduce_scatter";
    case CollKind::kAllToAll: return "all_to_all";
    case CollKind::kBroadcast: return "broadcast";
  }
  return "?";
}

/// What one member brought to a collective.
struct Post {
  bool present = false;
  CollKind kind = CollKind::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  int64_t count = 0;
  const float* in = nullptr;
};

/// One rendezvous: the k-th collective on a group.
struct Slot {
  std::vector<Post> posts;
  int arrived = 0;
  int departed = 0;
  std::string failure;  // set when a member gave up (timeout): late arrivals fail too
};

/// One message in flight from a send to its recv.
struct Message {
  const float* data = nullptr;
  int64_t count = 0;
  bool taken = false;
  std::string failure;
};

/// "all_reduce (sum) of 128 floats".
std::string Describe(CollKind kind, ReduceOp op, int64_t count) {
  std::string s = KindName(kind);
  if (kind == CollKind::kAllReduce || kind == CollKind::kReduceScatter)
    s += std::string(" (") + std::string(ToString(op)) + ")";
  return s + " of " + std::to_string(count) + " floats";
}

/// Elementwise reduction of `n` inputs at `offset`, ascending member order.
void Reduce(const std::vector<Post>& posts, ReduceOp op, int64_t offset, int64_t count, float* out) {
  std::memcpy(out, posts[0].in + offset, sizeof(float) * count);
  for (size_t m = 1; m < posts.size(); ++m) {
    const float* in = posts[m].in + offset;
    if (op == ReduceOp::kSum) {
      for (int64_t j = 0; j < count; ++j) out[j] += in[j];
    } else {
      for (int64_t j = 0; j < count; ++j) out[j] = std::max(out[j], in[j]);
    }
  }
}

/// The result member `me` computes from every member's post.
std::vector<float> Compute(const std::vector<Post>& posts, int me) {
  const Post& p = posts[me];
  const int64_t n = static_cast<int64_t>(posts.size());
  std::vector<float> out;
  switch (p.kind) {
    case CollKind::kAllReduce:
      out.resize(p.count);
      Reduce(posts, p.op, 0, p.count, out.data());
      break;
    case CollKind::kAllGather:
      out.resize(n * p.count);
      for (int64_t m = 0; m < n; ++m)
        std::memcpy(out.data() + m * p.count, posts[m].in, sizeof(float) * p.count);
      break;
    case CollKind::kReduceScatter:
      out.resize(p.count);
      Reduce(posts, p.op, me * p.count, p.count, out.data());
      break;
    case CollKind::kAllToAll:
      out.resize(n * p.count);
      for (int64_t m = 0; m < n; ++m)
        std::memcpy(out.data() + m * p.count, posts[m].in + me * p.count, sizeof(float) * p.count);
      break;
    case CollKind::kBroadcast:
      out.assign(posts[0].in, posts[0].in + p.count);
      break;
  }
  return out;
}

}  // namespace

std::string GroupString(const std::vector<int>& group) {
  std::string s = "[";
  for (size_t i = 0; i < group.size(); ++i) s += (i ? ", " : "") + std::to_string(group[i]);
  return s + "]";
}

struct FakeWorld::State {
  int size = 0;
  double timeout_s = 30;
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string abort_reason;
  std::map<std::pair<std::vector<int>, int>, int64_t> calls;  // (group, rank) -> calls made
  std::map<std::pair<std::vector<int>, int64_t>, std::shared_ptr<Slot>> slots;
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<Message>>> mail;  // (src, dst, tag)

  /// The deadline of a wait that starts now.
  Clock::time_point Deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(timeout_s));
  }
  /// "timed out after 30 s".
  std::string TimedOut() const {
    std::ostringstream s;
    s << "timed out after " << timeout_s << " s";
    return s.str();
  }
  /// The error returned by calls after an abort.
  Status AbortedError(int rank, const std::string& what) const {
    return Status::Error("rank " + std::to_string(rank) + ": " + what + ": aborted (" +
                         abort_reason + ")");
  }
};

namespace {

/// One rank's endpoint of a FakeWorld.
class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(FakeWorld::State* state, int rank) : s_(state), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  Status AllReduce(const std::vector<int>& group, ReduceOp op, const float* in, float* out,
                   int64_t count) override {
    return Collective(group, CollKind::kAllReduce, op, in, out, count);
  }
  Status AllGather(const std::vector<int>& group, const float* in, float* out,
                   int64_t count) override {
    return Collective(group, CollKind::kAllGather, ReduceOp::kSum, in, out, count);
  }
  Status ReduceScatter(const std::vector<int>& group, ReduceOp op, const float* in, float* out,
                       int64_t count) override {
    return Collective(group, CollKind::kReduceScatter, op, in, out, count);
  }
  Status AllToAll(const std::vector<int>& group, const float* in, float* out,
                  int64_t chunk) override {
    return Collective(group, CollKind::kAllToAll, ReduceOp::kSum, in, out, chunk);
  }
  Status Broadcast(const std::vector<int>& group, const float* in, float* out,
                   int64_t count) override {
    return Collective(group, CollKind::kBroadcast, ReduceOp::kSum, in, out, count);
  }

  Status Send(const float* data, int64_t count, int peer, int tag) override;
  Status Recv(float* data, int64_t count, int peer, int tag) override;

  void Abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->aborted) {
      s_->aborted = true;
      s_->abort_reason = reason;
    }
    s_->cv.notify_all();
  }
  bool aborted() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->aborted;
  }

 private:
  Status Collective(const std::vector<int>& group, CollKind kind, ReduceOp op, const float* in,
                    float* out, int64_t count);
  Status CheckGroup(const std::vector<int>& group, int* me) const;
  std::string Mismatch(const std::vector<int>& group, const Slot& slot) const;
  Status GiveUp(const std::vector<int>& group, const std::string& what, bool timed_out, Slot* slot);

  /// "rank R: <what> on group [..] (call k on this group): <msg>".
  Status Error(const std::string& what, const std::string& msg) const {
    return Status::Error("rank " + std::to_string(rank_) + ": " + what + ": " + msg);
  }

  FakeWorld::State* s_;
  int rank_;
};

/// Ok when `group` is ascending, duplicate-free, in range and holds this
/// rank; sets *me to this rank's position.
Status FakeCommunicator::CheckGroup(const std::vector<int>& group, int* me) const {
  const bool sorted = std::adjacent_find(group.begin(), group.end(),
                                         [](int a, int b) { return a >= b; }) == group.end();
  auto it = std::find(group.begin(), group.end(), rank_);
  if (group.empty() || !sorted || group.front() < 0 || group.back() >= s_->size ||
      it == group.end())
    return Status::Error("rank " + std::to_string(rank_) + ": invalid group " +
                         GroupString(group) + " (must be ascending, in [0, " +
                         std::to_string(s_->size) + ") and hold the calling rank)");
  *me = static_cast<int>(it - group.begin());
  return Status::Ok();
}

/// Leaves an incomplete rendezvous (timeout, abort, or another member gave
/// up) and marks it failed so that members arriving later do not read this
/// rank's buffer. Called with the world's mutex held.
Status FakeCommunicator::GiveUp(const std::vector<int>& group, const std::string& what,
                                bool timed_out, Slot* slot) {
  std::string missing;
  for (size_t m = 0; m < group.size(); ++m)
    if (!slot->posts[m].present) missing += (missing.empty() ? "" : ", ") + std::to_string(group[m]);
  if (slot->failure.empty())
    slot->failure = "rank " + std::to_string(rank_) + " gave up waiting for rank(s) [" + missing + "]";
  s_->cv.notify_all();
  if (timed_out) return Error(what, s_->TimedOut() + " waiting for rank(s) [" + missing + "]");
  if (s_->aborted) return s_->AbortedError(rank_, what);
  return Error(what, slot->failure);
}

/// Describes how the members of a complete slot disagree, or "" when they agree.
std::string FakeCommunicator::Mismatch(const std::vector<int>& group, const Slot& slot) const {
  const Post& first = slot.posts[0];
  for (const Post& p : slot.posts)
    if (p.kind != first.kind || p.op != first.op || p.count != first.count) {
      std::string s = "members disagree:";
      for (size_t m = 0; m < slot.posts.size(); ++m)
        s.append(m ? ", rank " : " rank ")
            .append(std::to_string(group[m]))
            .append(" issued ")
            .append(Describe(slot.posts[m].kind, slot.posts[m].op, slot.posts[m].count));
      return s;
    }
  return "";
}

Status FakeCommunicator::Collective(const std::vector<int>& group, CollKind kind, ReduceOp op,
                                    const float* in, float* out, int64_t count) {
  int me = 0;
  CONCERTO_RETURN_IF_ERROR(CheckGroup(group, &me));
  const int n = static_cast<int>(group.size());
  std::unique_lock<std::mutex> lock(s_->mu);
  const int64_t k = s_->calls[{group, rank_}]++;
  const std::string what = Describe(kind, op, count) + " on group " + GroupString(group) +
                           " (call " + std::to_string(k) + " on this group)";
  if (s_->aborted) return s_->AbortedError(rank_, what);
  std::shared_ptr<Slot>& entry = s_->slots[{group, k}];
  if (!entry) {
    entry = std::make_shared<Slot>();
    entry->posts.resize(n);
  }
  std::shared_ptr<Slot> slot = entry;
  if (!slot->failure.empty()) return Error(what, slot->failure);
  slot->posts[me] = Post{true, kind, op, count, in};
  ++slot->arrived;
  s_->cv.notify_all();
  const bool complete = s_->cv.wait_until(lock, s_->Deadline(), [&] {
    return slot->arrived == n || s_->aborted || !slot->failure.empty();
  });
  if (slot->arrived < n) return GiveUp(group, what, !complete, slot.get());
  const std::string mismatch = Mismatch(group, *slot);
  std::vector<float> result;
  if (mismatch.empty()) {
    lock.unlock();
    result = Compute(slot->posts, me);
    lock.lock();
  }
  // Every member must finish reading the inputs before any of them returns.
  ++slot->departed;
  s_->cv.notify_all();
  s_->cv.wait(lock, [&] { return slot->departed == n; });
  auto it = s_->slots.find({group, k});
  if (it != s_->slots.end() && it->second == slot) s_->slots.erase(it);
  lock.unlock();
  if (!mismatch.empty()) return Error(what, mismatch);
  std::memcpy(out, result.data(), sizeof(float) * result.size());
  return Status::Ok();
}

Status FakeCommunicator::Send(const float* data, int64_t count, int peer, int tag) {
  const std::string what = "send of " + std::to_string(count) + " floats to rank " +
                           std::to_string(peer) + " tag " + std::to_string(tag);
  if (peer < 0 || peer >= s_->size || peer == rank_) return Error(what, "invalid peer");
  auto msg = std::make_shared<Message>();
  msg->data = data;
  msg->count = count;
  std::unique_lock<std::mutex> lock(s_->mu);
  if (s_->aborted) return s_->AbortedError(rank_, what);
  auto& queue = s_->mail[{rank_, peer, tag}];
  queue.push_back(msg);
  s_->cv.notify_all();
  const bool done =
      s_->cv.wait_until(lock, s_->Deadline(), [&] { return msg->taken || s_->aborted; });
  if (!done || (!msg->taken && s_->aborted)) {
    auto it = std::find(queue.begin(), queue.end(), msg);
    if (it != queue.end()) {  // not picked up: withdraw it
      queue.erase(it);
      if (!done) return Error(what, s_->TimedOut() + " waiting for the matching recv");
      return s_->AbortedError(rank_, what);
    }
    s_->cv.wait(lock, [&] { return msg->taken; });  // the receiver is copying it
  }
  if (!msg->failure.empty()) return Error(what, msg->failure);
  return Status::Ok();
}

Status FakeCommunicator::Recv(float* data, int64_t count, int peer, int tag) {
  const std::string what = "recv of " + std::to_string(count) + " floats from rank " +
                           std::to_string(peer) + " tag " + std::to_string(tag);
  if (peer < 0 || peer >= s_->size || peer == rank_) return Error(what, "invalid peer");
  std::unique_lock<std::mutex> lock(s_->mu);
  auto& queue = s_->mail[{peer, rank_, tag}];
  const bool ready =
      s_->cv.wait_until(lock, s_->Deadline(), [&] { return !queue.empty() || s_->aborted; });
  if (s_->aborted) return s_->AbortedError(rank_, what);
  if (!ready) return Error(what, s_->TimedOut() + " waiting for the matching send");
  std::shared_ptr<Message> msg = queue.front();
  queue.pop_front();
  std::string failure;
  if (msg->count != count) {
    failure = "size mismatch: the send has " + std::to_string(msg->count) +
              " floats, the recv expects " + std::to_string(count);
  } else {
    lock.unlock();
    std::memcpy(data, msg->data, sizeof(float) * count);
    lock.lock();
  }
  msg->failure = failure;
  msg->taken = true;
  s_->cv.notify_all();
  if (!failure.empty()) return Error(what, failure);
  return Status::Ok();
}

}  // namespace

FakeWorld::FakeWorld(int size, FakeWorldOptions options) : state_(std::make_unique<State>()) {
  assert(size >= 1);
  state_->size = size;
  state_->timeout_s = options.timeout_s;
  for (int r = 0; r < size; ++r)
    endpoints_.push_back(std::make_unique<FakeCommunicator>(state_.get(), r));
}

FakeWorld::~FakeWorld() = default;

int FakeWorld::size() const { return state_->size; }

Communicator& FakeWorld::endpoint(int rank) {
  assert(rank >= 0 && rank < size());
  return *endpoints_[rank];
}

std::string FakeWorld::abort_reason() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->abort_reason;
}

}  // namespace concerto
