// Fuzz target: the schedule reader (ParseSchedule) and the schedule verifier
// against two example programs (one role with two comm streams, a two-stage
// pipeline); a schedule the verifier accepts is simulated.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/cost/cluster.h"
#include "concerto/ir/json_io.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/simulator.h"

namespace {

struct Fixture {
  std::vector<concerto::Program> programs;
  concerto::ClusterSpec cluster;
};

const Fixture& Get() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture;
    for (const char* name : {"two_comm_streams.json", "pipeline_2stage.json"}) {
      auto p = concerto::ReadProgramFile(std::string(CONCERTO_SOURCE_DIR) + "/examples/ir/" + name);
      if (!p.ok()) {
        std::fprintf(stderr, "fuzz_schedule: %s\n", p.status().message().c_str());
        std::abort();
      }
      f->programs.push_back(std::move(p).value());
    }
    f->cluster = concerto::LoadCluster("a800-4x8").value();
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  concerto::Result<concerto::Schedule> schedule = concerto::ParseSchedule(text, "fuzz.json");
  if (!schedule.ok()) return 0;
  const Fixture& f = Get();
  concerto::AnalyticCostModel cost(f.cluster);
  for (const concerto::Program& program : f.programs) {
    if (!concerto::VerifySchedule(program, *schedule).empty()) continue;
    concerto::Result<concerto::Timeline> t = concerto::Simulate(concerto::ScheduledProgram{program, *schedule}, cost);
    (void)t;  // a verified schedule simulates or says why; either way no crash
  }
  return 0;
}
