// The pipeline orders of the decoder frontend (internal to lower/): the 1F1B
// order of one stage (PipeDream-Flush, Megatron non-interleaved), Megatron's
// interleaved 1F1B, and where each rank places its sends and recvs under
// interleaving so that they cannot deadlock (docs/frontends.md, "Pipeline").
#pragma once

#include <vector>

namespace concerto::lower {

/// One forward or backward pass of one micro-batch on one stage (in one of
/// its model chunks).
struct PipeStep {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;
};

/// The 1F1B (PipeDream-Flush, Megatron non-interleaved) order of stage
/// `stage` of `stages` over `microbatches`: min(stages - stage - 1, m)
/// warm-up forwards, then one forward and one backward alternating, then
/// the remaining backwards. Backwards run in micro-batch order.
std::vector<PipeStep> OneFOneB(int stage, int stages, int microbatches);

/// Megatron's interleaved 1F1B order of pp rank `stage` with `chunks` model
/// chunks over `microbatches` (a multiple of `stages`); see pipeline_order.cc.
std::vector<PipeStep> InterleavedOneFOneB(int stage, int stages, int chunks, int microbatches);

/// One pipeline message as a rank sees it under interleaving: a send of the
/// output of (or a recv of the input to) this rank's pass of `microbatch`
/// in `chunk` (forward: activations, tag 0; backward: their grads, tag 1),
/// to or from the pp rank `offset` away.
struct CommEvent {
  bool send = false;
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;  // this rank's chunk that produced (send) or consumes (recv) it
  int offset = 0;
};

/// The interleaved schedule of one pp rank: its passes, and the sends and
/// recvs to emit before each pass (`before[i]`; `before[steps.size()]`
/// after the last pass).
struct InterleavedSchedule {
  std::vector<PipeStep> steps;
  std::vector<std::vector<CommEvent>> before;
};

/// Places the sends and recvs of interleaved 1F1B for pp rank `rank` so
/// that they cannot deadlock as rendezvous on one comm stream per rank.
InterleavedSchedule ScheduleInterleaved(int rank, int stages, int chunks, int microbatches);

}  // namespace concerto::lower
