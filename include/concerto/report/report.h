// Turning a simulated or measured Timeline into figures: lower bound,
// exposed communication, overlap, critical path, and a Chrome trace.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/lower_bound.h"
#include "concerto/sim/memory.h"
#include "concerto/sim/simulator.h"

namespace concerto {



struct CollectiveExposure {
  int rank = 0;
  int op_id = 0;
  std::string name;
  double duration_us = 0;
  double exposed_us = 0;  // part of its run with no compute on that rank
};

struct Summary {
  std::string scheduler;
  double makespan_us = 0;
  LowerBound bound;  // of the scheduled program, data edges only
  int report_rank = 0;         // the simulated rank with the most exposed comm
  double compute_busy_us = 0;  // on report_rank: time some compute op runs
  double comm_busy_us = 0;     // on report_rank: time some comm op runs
  double exposed_comm_us = 0;  // on report_rank: comm running, compute idle
  double overlap_ratio = 0;    // 1 - exposed / comm busy
  /// Summed over simulated ranks' comm ops: time they ran past their price
  /// because transfers in flight together shared links (docs/cost-model.md).
  double link_sharing_delay_us = 0;
  int64_t peak_memory_bytes = 0;  // largest over simulated ranks (sim/memory.h)
  int64_t memory_budget_bytes = 0;  // the budget it was checked against (0: none; the driver sets it)
  bool fits_memory = true;          // peak_memory_bytes <= memory_budget_bytes (or no budget)
  int peak_memory_rank = 0;
  double peak_memory_time_us = 0;
  std::string peak_memory_op;            // the op whose output reached the peak
  std::vector<LiveTensor> peak_live;     // the largest tensors live at the peak (<= 5)
  int num_ops = 0;             // ops per simulated rank, summed over roles
  int ranks_simulated = 0;
  bool representative = false;
  CostReport costs;
  std::vector<CollectiveExposure> top_exposed;  // on report_rank, most exposed first (<= 10)
  std::vector<RankStreamStats> busy;
  std::vector<std::string> critical_path;  // "rank R: op name", first to last (<= 50 shown)
  int critical_path_ops = 0;
};

/// Figures of one simulated (or measured) run. With `interference` > 0 (the
/// compute slowdown the timeline was simulated with) the bound also carries
/// the interference term, from the same joined graph as the plain terms.
Summary Summarize(const ScheduledProgram& sp, const Timeline& timeline, const CostModel& cost,
                  double interference = 0);
/// Exposed time (running while its rank computes nothing) of every
/// communication op, per graph name and op id, the largest over the
/// simulated ranks that run the graph.
std::map<std::string, std::map<int, double>> ExposedCommByOp(const ScheduledProgram& sp, const Timeline& timeline);
/// One JSON object (fields with units) for --json.
nlohmann::json SummaryJson(const Summary& summary);
/// Chrome trace event JSON: one process per rank, one thread per stream.
std::string ChromeTrace(const ScheduledProgram& sp, const Timeline& timeline);

}  // namespace concerto
