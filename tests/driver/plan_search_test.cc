// The parallel-plan search (issue "Choose the plan, not only the order"):
// on tiny models and a 4-device node, every plan is lowered and simulated by
// brute force, and the search's bounds and pruning are checked against it.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "concerto/cost/cluster.h"
#include "concerto/driver/driver.h"
#include "concerto/driver/plan_search.h"
#include "concerto/ir/graph_index.h"
#include "concerto/lower/transformer.h"

namespace concerto {
namespace {

/// One node of 4 A800s (the a800-4x8 preset cut down).
ClusterSpec FourDevices() {
  ClusterSpec c = LoadCluster("a800-4x8").value();
  c.nodes = 1;
  c.devices_per_node = 4;
  c.name = "a800-1x4";
  return c;
}

PlanSearchOptions Small(int64_t global_batch) {
  PlanSearchOptions o;
  o.global_batch = global_batch;
  o.max_micro_batch = 4;
  o.max_vstages = 2;
  o.search_top = 0;
  return o;
}

int64_t GraphInputs(const Program& p) {
  int64_t most = 0;
  for (const Graph& g : p.graphs) {
    const GraphIndex index = GraphIndex::Build(g);
    int64_t bytes = 0;
    for (size_t t = 0; t < g.tensors.size(); ++t)
      if (index.producer[t] < 0) bytes += g.tensors[t].Bytes();
    most = std::max(most, bytes);
  }
  return most;
}

// Every plan of three tiny models: the memory bounds never exceed any
// schedule's simulated peak, and the compute bound never exceeds any
// schedule's step. The graph-input figure extrapolated from the one- and
// two-layer lowerings equals the full program's with one stage (with more,
// the embedding and head are left out, so it is below).
TEST(PlanSearch, BoundsHoldForEverySchedulerOnEveryPlan) {
  const AnalyticCostModel cost(FourDevices());
  Options options;
  int plans_checked = 0;
  for (const std::string name : {"gpt-tiny", "llama-tiny", "mixtral-tiny"}) {
    const ModelConfig model = ModelPreset(name).value();
    std::vector<PlanCandidate> plans = EnumeratePlans(model, 4, 4, Small(8));
    ASSERT_FALSE(plans.empty()) << name;
    ASSERT_TRUE(BoundPlans(model, cost, &plans).ok());
    for (const PlanCandidate& c : plans) {
      ModelConfig mb = model;
      mb.batch = c.micro_batch;
      const Program program = LowerTransformer(mb, c.plan).value();
      const std::string label = name + " " + PlanToString(c.plan) + " mbs=" + std::to_string(c.micro_batch);
      const int64_t inputs = GraphInputs(program);
      // Equal but for the data of micro-batches beyond the first (tokens,
      // labels, positions: a few KiB) with one stage.
      if (c.plan.pp == 1) {
        EXPECT_GE(c.static_bytes, 0.99 * static_cast<double>(inputs)) << label;
      }
      EXPECT_LE(c.static_bytes, inputs) << label;
      EXPECT_GT(c.live_bytes, 0) << label;
      for (const std::string sched : {"sequential", "fifo", "ddp", "megatron", "zero"}) {
        const RunResult run = RunScheduler(program, sched, cost, options).value();
        EXPECT_LE(c.compute_bound_us, run.summary.makespan_us * (1 + 1e-9)) << label << " " << sched;
        EXPECT_LE(c.static_bytes, run.summary.peak_memory_bytes) << label << " " << sched;
        EXPECT_LE(c.live_bytes, run.summary.peak_memory_bytes) << label << " " << sched;
      }
      ++plans_checked;
    }
  }
  EXPECT_GT(plans_checked, 100);
}

// The search keeps the best plan: every plan simulated with its own system's
// baseline by brute force, under a budget that some plans' peaks overflow; the
// search (which prunes) ranks the same plan first with the same step.
TEST(PlanSearch, PruningKeepsTheBestPlan) {
  const AnalyticCostModel cost(FourDevices());
  for (const std::string name : {"gpt-tiny", "llama-tiny"}) {
    const ModelConfig model = ModelPreset(name).value();
    PlanSearchOptions o = Small(8);
    // A budget between the peaks: the median of the plans' fifo peaks.
    std::vector<PlanCandidate> plans = EnumeratePlans(model, 4, 4, o);
    std::vector<int64_t> peaks;
    for (const PlanCandidate& c : plans) {
      ModelConfig mb = model;
      mb.batch = c.micro_batch;
      peaks.push_back(
          RunScheduler(LowerTransformer(mb, c.plan).value(), "fifo", cost, Options{}).value().summary.peak_memory_bytes);
    }
    std::nth_element(peaks.begin(), peaks.begin() + peaks.size() / 2, peaks.end());
    o.options.memory_budget = static_cast<double>(peaks[peaks.size() / 2]);

    double best = std::numeric_limits<double>::infinity();
    std::string best_label;
    for (const PlanCandidate& c : plans) {
      ModelConfig mb = model;
      mb.batch = c.micro_batch;
      const Program program = LowerTransformer(mb, c.plan).value();
      const std::string sched = c.plan.zero > 0 ? "zero" : (c.plan.tp > 1 || c.plan.pp > 1) ? "megatron" : "ddp";
      const Summary s = RunScheduler(program, sched, cost, o.options).value().summary;
      if (s.fits_memory && s.makespan_us < best) {
        best = s.makespan_us;
        best_label = PlanToString(c.plan) + " mbs=" + std::to_string(c.micro_batch);
      }
    }
    ASSERT_LT(best, std::numeric_limits<double>::infinity()) << name;
    const PlanSearchResult r = SearchPlans(model, cost, o).value();
    ASSERT_GT(r.ranked, 0) << name;
    EXPECT_DOUBLE_EQ(r.plans[0].step_us, best) << name << ": brute force's best is " << best_label
                                               << ", the search's " << PlanToString(r.plans[0].plan);
    // Something was pruned, and nothing evaluated is over the budget.
    EXPECT_LT(r.simulated, static_cast<int>(plans.size())) << name;
    for (int i = 0; i < r.ranked; ++i) EXPECT_LE(r.plans[i].peak_bytes, o.options.memory_budget) << name;
  }
}

// The pruning rule's arithmetic on one plan (gpt-tiny: 2 layers, hidden 256,
// seq 64; pp=2 with 4 micro-batches of 2 sequences, one layer per stage):
//
//   compute bound = k (m w + o) + (pp - 1) (k / v) f
//                 = 1 x (4 x w + o) + 1 x 1 x f
//
// with w a layer's forward and backward compute for one micro-batch, o its
// optimizer step and f its forward, priced on a800 (us):
//   stage 0 ....[f0 f1 f2 f3 ...b...]            stage 1 waits f before its
//   stage 1 ........[f0 b0 f1 b1 ...]            first op: f + 4w + o at least
TEST(PlanSearch, ComputeBoundArithmetic) {
  const AnalyticCostModel cost(FourDevices());
  const ModelConfig model = ModelPreset("gpt-tiny").value();
  ParallelPlan proxy;  // one layer, one micro-batch, one stage
  ModelConfig one = model;
  one.layers = 1;
  one.batch = 2;
  const Program p1 = LowerTransformer(one, proxy).value();
  const Graph& g = p1.graphs[0];
  const GraphIndex index = GraphIndex::Build(g);
  double w = 0, o = 0, f = 0;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCompute || op.tags.layer != 0) continue;
    const double us = cost.Price(op, PriceContext{g, index, p1.mesh, 0}).duration_us;
    if (op.tags.phase == Phase::kOptimizer) o += us;
    else w += us, f += op.tags.phase == Phase::kForward ? us : 0;
  }
  std::vector<PlanCandidate> plans(1);
  plans[0].plan = ParsePlan("dp=2,pp=2,microbatches=4").value();
  plans[0].micro_batch = 2;
  ASSERT_TRUE(BoundPlans(model, cost, &plans).ok());
  EXPECT_NEAR(plans[0].compute_bound_us, 4 * w + o + f, 1e-9);
  // On a800: a layer's 13 forward and 20 backward kernels, 4 us of launch
  // each (132 us) plus their work: w = 141.42, f = 63.46 (13 x 4 = 52 of
  // it), o = 45.63; bound = 4 x 141.42 + 45.63 + 63.46 = 674.78 us.
  EXPECT_NEAR(w, 141.42, 0.01);
  EXPECT_NEAR(f, 63.46, 0.01);
  EXPECT_NEAR(o, 45.63, 0.01);
  EXPECT_NEAR(plans[0].compute_bound_us, 674.78, 0.01);
}

TEST(PlanSearch, ErrorsNameWhatIsWrong) {
  const AnalyticCostModel cost(FourDevices());
  PlanSearchOptions o = Small(7);
  // 7 sequences cannot split over 2 or 4 data-parallel ranks; dp = 1 needs
  // tp * pp = 4 and micro-batches of 1 (7 of them): that exists.
  EXPECT_TRUE(SearchPlans(ModelPreset("gpt-tiny").value(), cost, o).ok());
  o.max_micro_batch = 1;
  o.global_batch = 0;
  Result<PlanSearchResult> r = SearchPlans(ModelPreset("gpt-tiny").value(), cost, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--global-batch"), std::string::npos) << r.status().message();
  ModelConfig vit = ModelPreset("gpt-tiny").value();
  vit.family = ModelFamily::kGpt;
  vit.heads = 3;  // 256 is not a multiple of 3
  r = SearchPlans(vit, cost, Small(8));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("heads"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace concerto
