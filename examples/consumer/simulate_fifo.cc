// Reads a program (Concerto's IR), schedules every stream in program order,
// simulates it on a cluster preset and prints the iteration time and the
// lower bound: what a user of Concerto::core alone can do.
// Usage: simulate_fifo PROGRAM.json [CLUSTER]
#include <cstdio>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/json_io.h"
#include "concerto/report/report.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"
#include "concerto/version.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: simulate_fifo PROGRAM.json [CLUSTER]\n");
    return 2;
  }
  concerto::Result<concerto::Program> program = concerto::ReadProgramFile(argv[1]);
  if (!program.ok()) {
    std::fprintf(stderr, "simulate_fifo: %s\n", program.status().message().c_str());
    return 1;
  }
  concerto::Result<concerto::ClusterSpec> cluster = concerto::LoadCluster(argc > 2 ? argv[2] : "a800-4x8");
  if (!cluster.ok()) {
    std::fprintf(stderr, "simulate_fifo: %s\n", cluster.status().message().c_str());
    return 1;
  }
  const concerto::AnalyticCostModel cost(*cluster);
  const concerto::ScheduledProgram sp{*program, concerto::ProgramOrderSchedule(*program, "program-order")};
  concerto::Result<concerto::Timeline> timeline = concerto::Simulate(sp, cost);
  if (!timeline.ok()) {
    std::fprintf(stderr, "simulate_fifo: %s\n", timeline.status().message().c_str());
    return 1;
  }
  const concerto::Summary s = concerto::Summarize(sp, *timeline, cost);
  std::printf("concerto %s: %s on %s: iteration %.3f us, lower bound %.3f us\n", concerto::kVersion,
              program->name.c_str(), cluster->name.c_str(), s.makespan_us, s.bound.lower_bound_us);
  return 0;
}
