// The Chrome trace's structure (docs/cli.md, "Traces"): metadata per rank and
// stream, one X event per record with exposed communication and the critical
// path marked, flow arrows from each send to its recv and through each
// collective's members, a memory counter track per rank.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/frontend.h"
#include "concerto/report/report.h"
#include "concerto/schedule/scheduler.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

using nlohmann::json;

struct Traced {
  ScheduledProgram sp;
  Timeline timeline;
  json trace;
};

Traced Trace(const std::string& model, const std::string& plan, bool all_ranks) {
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Program p = LowerModelPlan(model, plan).value();
  ScheduledProgram sp = RunBaseline("fifo", p, cost).value();
  SimOptions options;
  options.all_ranks = all_ranks;
  Timeline t = Simulate(sp, cost, options).value();
  json trace = json::parse(ChromeTrace(sp, t));
  return {std::move(sp), std::move(t), std::move(trace)};
}

/// The events of phase `ph`.
std::vector<json> Events(const json& trace, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == ph) out.push_back(e);
  return out;
}

TEST(Trace, OpsAreMarkedExposedAndCritical) {
  Traced t = Trace("gpt-tiny", "dp=2,tp=2", false);
  const std::vector<json> ops = Events(t.trace, "X");
  ASSERT_EQ(ops.size(), t.timeline.records.size());
  int critical = 0;
  for (const json& e : ops) {
    const json& args = e["args"];
    if (args.contains("critical_path")) ++critical;
    if (args.contains("exposed_us")) {
      // Only communication carries exposed_us; red exactly when above zero.
      EXPECT_NE(e["cat"], "compute");
      const double exposed = args["exposed_us"];
      EXPECT_GE(exposed, 0);
      EXPECT_LE(exposed, e["dur"].get<double>() + 1e-9);
      EXPECT_EQ(exposed > 1e-9, e.value("cname", "") == "terrible") << e.dump();
    } else {
      EXPECT_EQ(e["cat"], "compute") << e.dump();
    }
    if (e.value("cname", "") == "yellow") {
      EXPECT_TRUE(args.contains("critical_path"));
    }
  }
  EXPECT_EQ(critical, static_cast<int>(t.timeline.critical_path.size()));
  EXPECT_GT(critical, 0);
  // Metadata: a process per simulated rank, a thread per stream; a memory
  // counter per simulated rank.
  std::set<int> pids, counters;
  for (const json& e : Events(t.trace, "M"))
    if (e["name"] == "process_name") pids.insert(e["pid"].get<int>());
  for (const json& e : Events(t.trace, "C")) counters.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, std::set<int>(t.timeline.ranks.begin(), t.timeline.ranks.end()));
  EXPECT_EQ(counters, pids);
}

/// Flow arrows grouped by id: the phases in order and the X events' ranks.
std::map<int, std::vector<json>> Flows(const json& trace) {
  std::map<int, std::vector<json>> flows;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "s" || e["ph"] == "t" || e["ph"] == "f") flows[e["id"].get<int>()].push_back(e);
  return flows;
}

TEST(Trace, EverySendHasAnArrowToItsRecv) {
  // gpt-tiny pp=2 with 2 micro-batches, one rank per stage: stage 0 sends 2
  // activations forward, stage 1 sends 2 gradients back, and the two stages
  // swap the tied word embedding's gradient (one send each way): 6 arrows,
  // each from the sending rank's send to the other rank's recv.
  Traced t = Trace("gpt-tiny", "pp=2,microbatches=2", false);
  int p2p = 0;
  for (const auto& [id, events] : Flows(t.trace)) {
    ASSERT_GE(events.size(), 2u) << "flow " << id;
    EXPECT_EQ(events.front()["ph"], "s");
    EXPECT_EQ(events.back()["ph"], "f");
    EXPECT_EQ(events.back()["bp"], "e");
    if (events.front()["cat"] != "p2p") continue;
    ++p2p;
    ASSERT_EQ(events.size(), 2u);
    EXPECT_NE(events[0]["pid"], events[1]["pid"]);
  }
  int sends = 0;
  const Program& p = t.sp.program;
  for (const OpRecord& r : t.timeline.records)
    sends += p.GraphOf(p.roles[p.RoleOfRank(r.rank)]).ops[r.op_index].kind == OpKind::kSend;
  EXPECT_EQ(p2p, sends);
  EXPECT_EQ(p2p, 6);
}

TEST(Trace, CollectiveArrowsRunThroughEveryMember) {
  // dp=2 with every rank simulated: each gradient all-reduce of rank 0 meets
  // rank 1's, one arrow each (s on rank 0, f on rank 1).
  Traced t = Trace("gpt-tiny", "dp=2", true);
  int collectives = 0, arrows = 0;
  for (const OpRecord& r : t.timeline.records)
    if (r.rank == 0 && t.sp.program.graphs[0].ops[r.op_index].kind == OpKind::kCollective) ++collectives;
  for (const auto& [id, events] : Flows(t.trace)) {
    if (events.front()["cat"] != "collective") continue;
    ++arrows;
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(events[0]["pid"], 0);
    EXPECT_EQ(events[1]["pid"], 1);
  }
  EXPECT_GT(collectives, 0);
  EXPECT_EQ(arrows, collectives);
}

}  // namespace
}  // namespace concerto
