// A list schedule with critical-path priorities over the joined graph of
// every role (the graphs of all roles' representatives, the lowest rank of
// each role, joined where a send meets its recv: PairSendRecv in
// sim/lower_bound.h): a starting point for the Concerto scheduler that defers
// short tails, e.g. a pipeline's weight-gradient ops, into idle time.
#pragma once

#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/util/status.h"

namespace concerto {


/// The critical-path list schedule of `program`. Priority of an op: the
/// longest chain of nominal durations from its end to the end of the program
/// through the joined graph (a send and its recv start together). Event
/// driven: whenever a stream of a representative is free, the ready op of
/// that stream with the highest priority starts (ties: lower op index). A
/// send or recv goes only when the op it meets is ready too, and both start
/// together: at once when the partner's stream is free, else the stream
/// waits for the partner's stream to finish its running op (as the machine
/// waits once a send or recv is issued; one waiter per stream, and only for
/// a running stream, so the waits never form a cycle). Sends and recvs of
/// one key are issued in program order. Every rank of a role gets its representative's
/// orders. An error when the joined graph has a cycle.
///
/// Options: with `in_order`, the ops another role waits for and every send
/// and recv additionally start in program order per role (a chain through
/// them): a pipeline keeps the lowered 1F1B order of forwards, activation
/// gradients and transfers, and with it 1F1B's bound on micro-batches in
/// flight (its memory), while weight gradients and the optimizer still fill
/// idle time by their chains. Without it, a first stage runs its forwards
/// ahead of its backward (nothing waits for the backward there), which is
/// faster where bubbles dominate and holds more activations.
///
/// With `max_ahead_ops` > 0, an op starts only while it is fewer than that
/// many ops (in its graph's program order) past its role's first unfinished
/// op: a sliding window over the lowered order. The order as lowered keeps
/// memory low (a micro-batch's backward follows its forward); the window
/// lets the list schedule overlap within it and bounds how far forwards run
/// ahead, and with them the activations held (what a memory budget needs).
/// The role's first unfinished op is always inside, so the window never
/// deadlocks a program whose program order runs.
struct ListScheduleOptions {
  bool in_order = false;
  int max_ahead_ops = 0;  // <= 0: no window
};
Result<Schedule> CriticalPathListSchedule(const Program& program, const CostModel& cost,
                                          const ListScheduleOptions& options = {});

}  // namespace concerto
