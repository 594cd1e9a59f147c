// The pipeline orders of the decoder frontend (pipeline_order.h).
#include "pipeline_order.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

namespace concerto::lower {

/// The 1F1B (PipeDream-Flush, Megatron non-interleaved) order of stage
/// `stage` of `stages` over `microbatches`: min(stages - stage - 1, m)
/// warm-up forwards, then one forward and one backward alternating, then
/// the remaining backwards. Backwards run in micro-batch order.
std::vector<PipeStep> OneFOneB(int stage, int stages, int microbatches) {
  const int warmup = std::min(stages - stage - 1, microbatches);
  std::vector<PipeStep> order;
  order.reserve(2 * static_cast<size_t>(microbatches));
  for (int k = 0; k < warmup; ++k) order.push_back({true, k});
  for (int k = warmup; k < microbatches; ++k) {
    order.push_back({true, k});
    order.push_back({false, k - warmup});
  }
  for (int k = microbatches - warmup; k < microbatches; ++k) order.push_back({false, k});
  return order;
}

/// Megatron's interleaved 1F1B order of pp rank `stage` with `chunks` model
/// chunks over `microbatches` (a multiple of `stages`): forward step k runs
/// micro-batch (k / (stages*chunks)) * stages + k % stages in chunk
/// (k / stages) % chunks; backward step k the same micro-batch in chunk
/// chunks - 1 - (k / stages) % chunks. Warm-up: (stages - stage - 1) * 2 +
/// (chunks - 1) * stages forwards (all of them when microbatches == stages),
/// then one forward and one backward alternating, then the remaining
/// backwards. Within a chunk, micro-batches run in order.
std::vector<PipeStep> InterleavedOneFOneB(int stage, int stages, int chunks, int microbatches) {
  assert(microbatches % stages == 0);
  const int total = microbatches * chunks;
  const int warmup = microbatches == stages
                         ? total
                         : std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  auto step = [&](int k, bool forward) {
    const int group = k / (stages * chunks), in_group = k % (stages * chunks);
    const int chunk = in_group / stages;
    return PipeStep{forward, group * stages + in_group % stages,
                    forward ? chunk : chunks - 1 - chunk};
  };
  std::vector<PipeStep> order;
  order.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) order.push_back(step(k, true));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(step(warmup + k, true));
    order.push_back(step(k, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(step(k, false));
  return order;
}


namespace {

/// A pipeline message of interleaved 1F1B: (forward, micro-batch, source
/// virtual stage).
using PipeMsg = std::tuple<bool, int, int>;

/// The message pass `p` of rank `rank` reads, if any: a forward reads the
/// previous virtual stage's activation, a backward the next one's gradient.
std::optional<PipeMsg> PassInput(const PipeStep& p, int rank, int stages, int virtual_stages) {
  const int vs = p.chunk * stages + rank;
  if (p.forward) return vs > 0 ? std::optional<PipeMsg>(PipeMsg{true, p.microbatch, vs - 1}) : std::nullopt;
  if (vs + 1 < virtual_stages) return PipeMsg{false, p.microbatch, vs + 1};
  return std::nullopt;
}

/// Whether pass `p` of rank `rank` sends its output to another virtual stage.
bool PassSends(const PipeStep& p, int rank, int stages, int virtual_stages) {
  const int vs = p.chunk * stages + rank;
  return p.forward ? vs + 1 < virtual_stages : vs > 0;
}

/// Every rank's passes timed with forward 1 and backward 2 units, sends
/// buffered: `start[r][i]` is when pass i of rank r starts, `sent` when each
/// message is sent (its producer's end).
struct InterleavedTiming {
  std::vector<std::vector<PipeStep>> orders;
  std::vector<std::vector<int>> start;
  std::map<PipeMsg, int> sent;
};

/// Times InterleavedOneFOneB on every rank (asserts that it completes).
InterleavedTiming TimeInterleaved(int stages, int chunks, int microbatches) {
  const int virtual_stages = stages * chunks;
  InterleavedTiming t;
  t.orders.resize(stages);
  t.start.resize(stages);
  for (int r = 0; r < stages; ++r) t.orders[r] = InterleavedOneFOneB(r, stages, chunks, microbatches);
  std::vector<size_t> next(stages, 0);
  std::vector<int> free_at(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < stages; ++r) {
      for (; next[r] < t.orders[r].size(); ++next[r], progress = true) {
        const PipeStep& p = t.orders[r][next[r]];
        const std::optional<PipeMsg> in = PassInput(p, r, stages, virtual_stages);
        if (in && !t.sent.count(*in)) break;
        const int begin = std::max(free_at[r], in ? t.sent[*in] : 0);
        free_at[r] = begin + (p.forward ? 1 : 2);
        t.start[r].push_back(begin);
        if (PassSends(p, r, stages, virtual_stages))
          t.sent[PipeMsg{p.forward, p.microbatch, p.chunk * stages + r}] = free_at[r];
      }
    }
  }
  for (int r = 0; r < stages; ++r) assert(next[r] == t.orders[r].size() && "interleaved 1F1B stuck");
  return t;
}

}  // namespace

/// Places the sends and recvs of interleaved 1F1B so that they cannot
/// deadlock as rendezvous on one comm stream per rank. With every rank's
/// passes timed (TimeInterleaved), each message gets the key (send time,
/// direction, source virtual stage, micro-batch), a total order both of its
/// ends agree on. Each rank lists its sends and recvs in key order: a send
/// right after its pass, a recv after the last pass that starts before the
/// message is sent (so before the pass that reads it). Processing messages
/// in key order then never waits on a later one: a pass before a send or
/// recv only reads messages with smaller keys. Virtual stage s = chunk * pp
/// + rank sends forward to s + 1 (rank + 1, or from the last rank to rank 0
/// for the next chunk: offset -(pp-1)) and backward to s - 1.
InterleavedSchedule ScheduleInterleaved(int rank, int stages, int chunks, int microbatches) {
  const int virtual_stages = stages * chunks;
  InterleavedTiming t = TimeInterleaved(stages, chunks, microbatches);
  using Key = std::tuple<int, int, int, int>;  // time, direction, source virtual stage, micro-batch
  std::vector<std::pair<Key, CommEvent>> events;
  const std::vector<PipeStep>& mine = t.orders[rank];
  for (const PipeStep& p : mine) {
    if (std::optional<PipeMsg> in = PassInput(p, rank, stages, virtual_stages)) {
      const int src = std::get<2>(*in);
      events.push_back({{t.sent[*in], p.forward ? 0 : 1, src, p.microbatch},
                        {false, p.forward, p.microbatch, p.chunk, src % stages - rank}});
    }
    if (PassSends(p, rank, stages, virtual_stages)) {
      const int vs = p.chunk * stages + rank, dst = p.forward ? vs + 1 : vs - 1;
      events.push_back({{t.sent[PipeMsg{p.forward, p.microbatch, vs}], p.forward ? 0 : 1, vs,
                         p.microbatch},
                        {true, p.forward, p.microbatch, p.chunk, dst % stages - rank}});
    }
  }
  std::sort(events.begin(), events.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  InterleavedSchedule schedule;
  schedule.steps = mine;
  schedule.before.resize(mine.size() + 1);
  size_t e = 0;
  for (size_t i = 0; i <= mine.size(); ++i) {
    const int limit = i < mine.size() ? t.start[rank][i] : INT_MAX;
    for (; e < events.size() && std::get<0>(events[e].first) <= limit; ++e)
      schedule.before[i].push_back(events[e].second);
  }
  return schedule;
}

}  // namespace concerto::lower
