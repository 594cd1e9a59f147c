// The concerto search's starting points beyond the baselines as they are:
// a baseline with its ordering edges stripped, and the stream rewrites a
// starting point may take (inter-node collectives on a stream of their own;
// every communicator on one stream). Internal to src/schedule/.
#pragma once

#include <optional>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"

namespace concerto::search {

/// Drops the control edges a baseline added (synchronous collectives,
/// serialization), keeping those of the input program and those pointing at
/// ops the baseline created (fused buckets). Returns whether any was dropped;
/// with `dry_run` only says so and changes nothing.
bool StripSchedulerEdges(const Program& input, Program& scheduled, bool dry_run = false);

/// Moves the collectives whose groups cross nodes off a communication stream
/// that also carries collectives inside a node, onto a new stream
/// "<stream>.inter" when each of their members sits on its own node (they use
/// only the network, which is separate from NVLink, so both kinds can be in
/// flight at once; a group with several members on one node crosses nodes
/// hierarchically and uses NVLink too, so then nothing moves). A graph rewrite: the new stream is
/// declared in the graph and each role's order keeps the moved ops'
/// relative order. Returns how many ops moved.
int SplitInterNodeStreams(ScheduledProgram& sp, const ClusterSpec& cluster);

/// The paper's two-stream mapping: every communication op of a graph with
/// several communication streams moves onto one stream "comm", each role's
/// order on it the order in which `t` started them on the role's lowest rank
/// (ties: the old streams' order). Fewer transfers in flight at once share no
/// link and slow compute less, at the price of queueing. A graph rewrite;
/// returns how many ops moved (0: nothing to merge). The result may deadlock
/// across roles (a caller simulates it before keeping it).
int MergeCommStreams(ScheduledProgram& sp, const Timeline& t);

}  // namespace concerto::search
