// The list schedule's window over the program order
// (ListScheduleOptions::max_ahead_ops): how far forwards may run ahead of
// the backwards that free their activations, and so the peak memory.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/json_io.h"
#include "concerto/schedule/list_schedule.h"
#include "concerto/schedule/schedule.h"
#include "concerto/sim/memory.h"
#include "concerto/sim/simulator.h"

namespace concerto {
namespace {

/// Gradient accumulation over three micro-batches on one stream, program
/// order F1 B1 F2 B2 F3 B3 (as a frontend lowers it), every op 1 us.
/// F_i = x_i [1,1] @ w [1,100] -> a_i [1,100] (400 B, the activation);
/// B_i = a_i[:, :1] -> g_i [1,1] (4 B, a graph output: held to the end).
/// The x_i (4 B each) and w (400 B) are graph inputs, held until their last
/// consumer ends. Critical-path priorities: F_i has a tail of 1 us (B_i),
/// B_i none, so a free list schedule runs every forward first.
const char* kAccumulation = R"({"format": "concerto-ir", "version": 1, "name": "accumulation",
 "mesh": {"axes": [{"name": "dp", "size": 1}]},
 "graphs": [{"name": "main", "streams": ["compute"],
  "tensors": [{"name": "w", "shape": [1, 100], "dtype": "f32"},
   {"name": "x1", "shape": [1, 1], "dtype": "f32"}, {"name": "x2", "shape": [1, 1], "dtype": "f32"},
   {"name": "x3", "shape": [1, 1], "dtype": "f32"},
   {"name": "a1", "shape": [1, 100], "dtype": "f32"}, {"name": "a2", "shape": [1, 100], "dtype": "f32"},
   {"name": "a3", "shape": [1, 100], "dtype": "f32"},
   {"name": "g1", "shape": [1, 1], "dtype": "f32"}, {"name": "g2", "shape": [1, 1], "dtype": "f32"},
   {"name": "g3", "shape": [1, 1], "dtype": "f32"}],
  "ops": [
   {"id": 0, "name": "F1", "kind": "compute", "type": "matmul", "inputs": ["x1", "w"], "outputs": ["a1"], "duration_us": 1},
   {"id": 1, "name": "B1", "kind": "compute", "type": "slice", "attrs": {"axis": 1, "start": 0}, "inputs": ["a1"], "outputs": ["g1"], "duration_us": 1},
   {"id": 2, "name": "F2", "kind": "compute", "type": "matmul", "inputs": ["x2", "w"], "outputs": ["a2"], "duration_us": 1},
   {"id": 3, "name": "B2", "kind": "compute", "type": "slice", "attrs": {"axis": 1, "start": 0}, "inputs": ["a2"], "outputs": ["g2"], "duration_us": 1},
   {"id": 4, "name": "F3", "kind": "compute", "type": "matmul", "inputs": ["x3", "w"], "outputs": ["a3"], "duration_us": 1},
   {"id": 5, "name": "B3", "kind": "compute", "type": "slice", "attrs": {"axis": 1, "start": 0}, "inputs": ["a3"], "outputs": ["g3"], "duration_us": 1}]}],
 "roles": [{"name": "all", "graph": "main", "ranks": [0]}]})";

struct ListRun {
  std::vector<std::string> order;
  double makespan_us = 0;
  int64_t peak_bytes = 0;
};

ListRun ListWithWindow(int max_ahead_ops) {
  const Program p = ParseProgram(kAccumulation, "accumulation").value();
  AnalyticCostModel cost(LoadCluster("a800-4x8").value());
  Result<Schedule> s = CriticalPathListSchedule(p, cost, ListScheduleOptions{false, max_ahead_ops});
  EXPECT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(VerifySchedule(p, *s).empty());
  SimOptions nominal;
  nominal.interference = 0;
  Result<Timeline> t = Simulate({p, *s}, cost, nominal);
  EXPECT_TRUE(t.ok()) << t.status().message();
  ListRun r;
  for (int id : s->ForRole("all")->streams[0].op_ids) r.order.push_back(p.graphs[0].ops[id].name);
  r.makespan_us = t->makespan_us;
  r.peak_bytes = PeakMemory(p, *t).peak_bytes;
  return r;
}

using Names = std::vector<std::string>;

// No window: every forward first.
//   t  0    1    2    3    4    5    6
//      | F1 | F2 | F3 | B1 | B2 | B3 |
// Live during F3 [2, 3): x3 4 + w 400 + a1, a2, a3 3 x 400 = 1604 B.
TEST(ListScheduleWindow, WithoutAWindowEveryForwardRunsFirst) {
  const ListRun r = ListWithWindow(0);
  EXPECT_EQ(r.order, (Names{"F1", "F2", "F3", "B1", "B2", "B3"}));
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_EQ(r.peak_bytes, 1604);
}

// Two ops ahead of the first unfinished one: at t=1 the first unfinished op
// is B1 (index 1), so F2 (index 2) may start and goes first (its tail is
// longer); F3 (index 4) waits until B1 and F2 are done (first unfinished:
// B2, index 3).
//   t  0    1    2    3    4    5    6
//      | F1 | F2 | B1 | F3 | B2 | B3 |
// Live during F2 [1, 2): x2, x3 8 + w 400 + a1, a2 800 = 1208 B; during B1
// [2, 3): x3 4 + w 400 + a1, a2 800 + g1 4 = 1208 B; during F3 [3, 4) (a1
// freed at 3): x3 4 + w 400 + a2, a3 800 + g1 4 = 1208 B. Three ops ahead
// gives the same order (at t=0 F1 and F2 tie; the lower index goes).
TEST(ListScheduleWindow, AWindowBoundsTheForwardsInFlight) {
  for (int ahead : {2, 3}) {
    SCOPED_TRACE(ahead);
    const ListRun r = ListWithWindow(ahead);
    EXPECT_EQ(r.order, (Names{"F1", "F2", "B1", "F3", "B2", "B3"}));
    EXPECT_DOUBLE_EQ(r.makespan_us, 6);
    EXPECT_EQ(r.peak_bytes, 1208);
  }
}

// One op ahead: the program order itself.
//   t  0    1    2    3    4    5    6
//      | F1 | B1 | F2 | B2 | F3 | B3 |
// Live during F1 [0, 1): x1..x3 12 + w 400 + a1 400 = 812 B; during B1:
// x2, x3 8 + w + a1 + g1 4 = 812 B; during F2 (a1 freed at 2): x2, x3 8 +
// w + a2 + g1 = 812 B; later fewer inputs and more 4-byte gradients: at
// most 812 B.
TEST(ListScheduleWindow, OneOpAheadIsTheProgramOrder) {
  const ListRun r = ListWithWindow(1);
  EXPECT_EQ(r.order, (Names{"F1", "B1", "F2", "B2", "F3", "B3"}));
  EXPECT_DOUBLE_EQ(r.makespan_us, 6);
  EXPECT_EQ(r.peak_bytes, 812);
}

}  // namespace
}  // namespace concerto
