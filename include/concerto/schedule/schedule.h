// A Schedule: per rank role, per stream, the order ops run in. Every op is
// listed under its own stream; a scheduler that wants more than an order
// (buckets, a synchronous collective, full serialization) rewrites the
// program (fused ops, control edges), so the decision shows in the IR.
#pragma once

#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

struct GraphIndex;

struct StreamOrder {
  std::string stream;
  std::vector<int> op_ids;
};

struct RoleSchedule {
  std::string role;
  std::vector<StreamOrder> streams;
};

/// A group of ops that a fusion rewrite merged into one (informational; the
/// fused op itself is in the program).
struct FusionGroup {
  std::string role;
  int fused_op = 0;
  std::vector<int> members;
};

struct Schedule {
  std::string scheduler;
  std::vector<RoleSchedule> roles;
  std::vector<FusionGroup> fusion_groups;

  const RoleSchedule* ForRole(const std::string& role) const;
};

/// A program together with the schedule made for it (a scheduler may rewrite
/// the program, e.g. to fuse collectives into buckets).
struct ScheduledProgram {
  Program program;
  Schedule schedule;
};

/// Every op on its own stream, in program order: the "fifo" order.
Schedule ProgramOrderSchedule(const Program& program, const std::string& scheduler_name);

std::string WriteSchedule(const Schedule& schedule);
Result<Schedule> ParseSchedule(const std::string& text, const std::string& source);
Result<Schedule> ReadScheduleFile(const std::string& path);

/// Lists every violation of `schedule` on `program`: a role or stream that
/// does not exist, an op missing or listed twice, a dependency that runs
/// later on the same stream than the op needing it (a deadlock), and
/// collectives on one group issued in different orders by different ranks,
/// or sends and recvs whose orders do not pair (a real run would hang).
std::vector<std::string> VerifySchedule(const Program& program, const Schedule& schedule);
/// The same with each graph's index given (indexes[g] of program.graphs[g],
/// as Simulate takes them), for callers that build them anyway.
std::vector<std::string> VerifySchedule(const Program& program, const Schedule& schedule,
                                        const std::vector<GraphIndex>& indexes);

}  // namespace concerto
