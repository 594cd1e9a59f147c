// Streams per communicator: NCCL (and so PyTorch, Megatron-LM and DeepSpeed)
// runs every collective of one process group on that group's own stream, and
// point-to-point transfers on a stream per peer pair, so transfers of
// different groups are in flight together (docs/schedulers.md, "Streams").
#pragma once

#include <string>

#include "concerto/ir/ir.h"

namespace concerto {

/// The stream of the communicator `op` runs on: "comm.<axes joined by '.'>"
/// for a collective over mesh axes ("comm.tp", "comm.dp", "comm.dp.tp"),
/// "comm.r<ranks joined by '_'>" over explicit ranks, "p2p.<axis><+/-offset>"
/// for a send or recv ("p2p.pp+1": the transfers with the next stage, both
/// ways), "p2p.r<rank>" with an explicit peer. Empty for a compute or copy op.
std::string CommunicatorStream(const Op& op);

/// The default a frontend lowers to: every communication op of every graph on
/// its communicator's stream (CommunicatorStream), each such stream declared
/// after the graph's existing ones in order of first use; streams no op uses
/// any more are dropped. Returns the number of ops whose stream changed.
int AssignCommunicatorStreams(Program& program);

/// The paper's two-stream mapping: every communication op of every graph on
/// one stream "comm" (declared after the graph's compute streams); streams no
/// op uses any more are dropped. Returns the number of ops whose stream changed.
int AssignOneCommStream(Program& program);

}  // namespace concerto
