// Per-op sharding plans: the file syntax and its errors, the partitioner's
// inserted collectives against the hand-written dp and tp lowerings, and
// the partitioned programs of dp, tp (Megatron) and a plan that mixes
// strategies across layers, run for real against the unsharded model.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "concerto/ir/verifier.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/schedule.h"

namespace concerto {
namespace {

// ---------------------------------------------------------------------------
// Sharding files used below (gpt-tiny: h = 256, 4 heads, ffn 1024, V = 512,
// s = 64, batch 2 per data-parallel rank; llama-tiny: 8 heads, 2 kv heads,
// kv width 2 * 32 = 64, ffn 512).

/// Batch over dp: tokens, labels and positions split on dim 0; every
/// parameter replicated (the default).
const char* kGptDp2 = R"({
  "mesh": {"dp": 2},
  "default": "replicated",
  "tensors": {"tokens": [["dp"], []], "labels": [["dp"], []], "positions": [["dp"], []]}
})";

/// Megatron tp=2 on gpt: vocab-parallel table, segmented column-parallel
/// fused QKV ([q | k | v], each split on tp), row-parallel proj and fc2,
/// column-parallel fc1.
const char* kGptTp2 = R"({
  "mesh": {"tp": 2},
  "tensors": {
    "embed.word.table": [["tp"], []],
    "L*.attn.qkv.w": [[], {"axes": ["tp"], "segments": [256, 256, 256]}],
    "L*.attn.proj.w": [["tp"], []],
    "L*.mlp.fc1.w": [[], ["tp"]],
    "L*.mlp.fc2.w": [["tp"], []]
  }
})";

/// Mixed on dp=2 x tp=2: batch over dp everywhere; layer 0 Megatron over tp;
/// layer 1 data parallel over both axes (its input, L0's output, is split
/// on the batch over dp and tp; its input gradient goes back to dp only).
const char* kGptMixed = R"({
  "mesh": {"dp": 2, "tp": 2},
  "tensors": {
    "tokens": [["dp"], []], "labels": [["dp"], []], "positions": [["dp"], []],
    "L0.attn.qkv.w": [[], {"axes": ["tp"], "segments": [256, 256, 256]}],
    "L0.attn.proj.w": [["tp"], []],
    "L0.mlp.fc1.w": [[], ["tp"]],
    "L0.mlp.fc2.w": [["tp"], []],
    "L0.mlp.res.out": [["dp", "tp"], [], []],
    "L1.attn.res.grad.out": [["dp"], [], []]
  }
})";

const char* kLlamaTp2 = R"({
  "mesh": {"tp": 2},
  "tensors": {
    "embed.word.table": [["tp"], []], "head.w": [["tp"], []],
    "L*.attn.q.w": [[], ["tp"]], "L*.attn.k.w": [[], ["tp"]], "L*.attn.v.w": [[], ["tp"]],
    "L*.attn.o.w": [["tp"], []],
    "L*.mlp.gate.w": [[], ["tp"]], "L*.mlp.up.w": [[], ["tp"]], "L*.mlp.down.w": [["tp"], []]
  }
})";

const char* kLlamaMixed = R"({
  "mesh": {"dp": 2, "tp": 2},
  "tensors": {
    "tokens": [["dp"], []], "labels": [["dp"], []],
    "L0.attn.q.w": [[], ["tp"]], "L0.attn.k.w": [[], ["tp"]], "L0.attn.v.w": [[], ["tp"]],
    "L0.attn.o.w": [["tp"], []],
    "L0.mlp.gate.w": [[], ["tp"]], "L0.mlp.up.w": [[], ["tp"]], "L0.mlp.down.w": [["tp"], []],
    "L0.mlp.res.out": [["dp", "tp"], [], []],
    "L1.attn.res.grad.out": [["dp"], [], []]
  }
})";

ShardingPlan ParseSharding(const std::string& text) {
  Result<ShardingPlan> plan = ParseShardingPlan(text, "plan.json");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : ShardingPlan{};
}

/// The error message of parsing `text` ("" when it parses).
std::string ShardingParseError(const std::string& text) {
  Result<ShardingPlan> plan = ParseShardingPlan(text, "plan.json");
  return plan.ok() ? "" : plan.status().message();
}

/// The error message of partitioning gpt-tiny under `text`.
std::string PartitionError(const std::string& text) {
  Result<ShardingPlan> plan = ParseShardingPlan(text, "plan.json");
  if (!plan.ok()) return "parse: " + plan.status().message();
  Result<Program> p = LowerModelSharding("gpt-tiny", *plan);
  return p.ok() ? "" : p.status().message();
}

// ---------------------------------------------------------------------------
// The file and its errors.

TEST(ShardingPlanFile, ParsesMeshInFileOrderAndRulesInOrder) {
  ShardingPlan p = ParseSharding(kGptMixed);
  ASSERT_EQ(p.mesh.axes.size(), 2u);
  EXPECT_EQ(p.mesh.axes[0].name, "dp");
  EXPECT_EQ(p.mesh.axes[1].name, "tp");
  EXPECT_EQ(p.mesh.NumRanks(), 4);
  ASSERT_EQ(p.rules.size(), 9u);
  EXPECT_EQ(p.rules[3].pattern, "L0.attn.qkv.w");
  EXPECT_EQ(p.rules[3].dims[1].axes, std::vector<std::string>{"tp"});
  EXPECT_EQ(p.rules[3].dims[1].segments, (std::vector<int64_t>{256, 256, 256}));
  EXPECT_EQ(p.rules[7].dims[0].axes, (std::vector<std::string>{"dp", "tp"}));
  // A single axis may be written as a string.
  ShardingPlan q = ParseSharding(R"({"mesh": {"tp": 2}, "tensors": {"x*": [[], "tp"], "y": "replicated"}})");
  EXPECT_EQ(q.rules[0].dims[1].axes, std::vector<std::string>{"tp"});
  EXPECT_TRUE(q.rules[1].replicated);
}

TEST(ShardingPlanFile, RejectsBadFilesNamingWhatIsWrong) {
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 2}, "tensors": {"tokens": [["tq"], []]}})"),
            "plan.json: tensors: pattern 'tokens': dim 0: unknown mesh axis 'tq' (mesh axes: dp)");
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 2, "tp": 2}, "tensors": {"w": [["tp"], ["dp", "tp"]]}})"),
            "plan.json: tensors: pattern 'w': mesh axis 'tp' is used twice in one tensor (an axis "
            "shards at most one dimension, once)");
  // Malformed JSON: the parser fails at line 3, column 11 (after the missing comma's line).
  EXPECT_EQ(ShardingParseError("{\n  \"mesh\": {\"dp\": 2}\n  \"tensors\": {}\n}").substr(0, 33),
            "plan.json:3:11: malformed JSON: s");
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 2}, "tensor": {}})"),
            "plan.json: field 'tensor': unknown field (known: mesh, default, tensors, regather, global_batch, "
            "description)");
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 2}, "tensors": {"w*": [["dp"]]}, "regather": ["x*"]})"),
            "plan.json: field 'regather': pattern 'x*' is not a key of 'tensors'");
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 0}})"),
            "plan.json: mesh: axis 'dp': size must be an integer >= 1, got 0");
  EXPECT_EQ(ShardingParseError(R"({"tensors": {}})"), "plan.json: field 'mesh': missing required field");
  EXPECT_EQ(ShardingParseError(R"({"mesh": {"dp": 2}, "default": "sharded"})"),
            "plan.json: field 'default': only \"replicated\" is supported, got \"sharded\"");
}

TEST(ShardingPlanFile, MeshMustCoverTheWorld) {
  ShardingPlan p = ParseSharding(kGptMixed);
  EXPECT_TRUE(CheckShardingWorld(p, 4).ok());
  Status bad = CheckShardingWorld(p, 32);
  EXPECT_EQ(bad.message(),
            "plan.json: field 'mesh': the axes multiply to 4 ranks (dp=2 x tp=2) but the world has 32");
}

TEST(ShardingPlanFile, PartitionRejectsAnnotationsThatDoNotFit) {
  EXPECT_EQ(PartitionError(R"({"mesh": {"dp": 2}, "tensors": {"L9.*": "replicated"}})"),
            "plan.json: tensors: pattern 'L9.*' matches no tensor of program 'gpt-tiny.dp1.tp1'");
  // gpt-tiny's fc1 weight is [256, 1024]; 1024 is not divisible by 3.
  EXPECT_EQ(PartitionError(R"({"mesh": {"tp": 3}, "tensors": {"L0.mlp.fc1.w": [[], ["tp"]]}})"),
            "plan.json: tensors: pattern 'L0.mlp.fc1.w': tensor 'L0.mlp.fc1.w' [256, 1024]: dim 1: size "
            "1024 is not divisible by its axes (3 blocks)");
  EXPECT_EQ(PartitionError(R"({"mesh": {"tp": 2}, "tensors": {"L0.mlp.fc1.w": [["tp"]]}})"),
            "plan.json: tensors: pattern 'L0.mlp.fc1.w': tensor 'L0.mlp.fc1.w' [256, 1024]: has 1 "
            "entries for a tensor of rank 2 [256, 1024]");
  EXPECT_EQ(PartitionError(R"({"mesh": {"tp": 2}, "tensors": {"L0.attn.qkv.w": [[], {"axes": ["tp"],
            "segments": [256, 256]}]}})"),
            "plan.json: tensors: pattern 'L0.attn.qkv.w': tensor 'L0.attn.qkv.w' [256, 768]: dim 1: "
            "segments add up to 512, not the dimension's size 768");
}

// ---------------------------------------------------------------------------
// Plan files (the keys of the plan string, in YAML or JSON).

TEST(PlanFile, ReadsTheKeysOfThePlanString) {
  Result<ParallelPlan> p = ParsePlanFile("pp: 4\ntp: 8\nsp: true\nmicrobatches: 8\n", "p.yaml");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(PlanToString(*p), "dp=1,tp=8,pp=4,sp,microbatches=8");
  Result<ParallelPlan> j = ParsePlanFile(R"({"zero": 3, "dp": 32})", "p.json");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(PlanToString(*j), "dp=32,tp=1,zero=3");
  // A plan string that names no file is parsed as a string.
  EXPECT_EQ(PlanToString(LoadPlan("dp=4,tp=8").value()), "dp=4,tp=8");
}

TEST(PlanFile, ErrorsNameTheFileAndKey) {
  EXPECT_EQ(ParsePlanFile("dp: 2\ntq: 4\n", "p.yaml").status().message(),
            "p.yaml: key 'tq': unknown key (known: dp, tp, pp, ep, sp, zero, microbatches, dap, vstages, order, recompute)");
  EXPECT_EQ(ParsePlanFile("dp: two\n", "p.yaml").status().message(),
            "p.yaml: key 'dp': expected a non-negative integer, got 'two'");
  EXPECT_EQ(ParsePlanFile("sp: maybe\n", "p.yaml").status().message(),
            "p.yaml: key 'sp': expected true or false, got 'maybe'");
  EXPECT_EQ(ParsePlanFile("dp: [1, 2]\n", "p.yaml").status().message(), "p.yaml: key 'dp': expected a scalar value");
  // ParsePlan's own checks, prefixed with the file.
  const std::string sp = ParsePlanFile("dp: 2\nsp: true\n", "p.yaml").status().message();
  EXPECT_EQ(sp.substr(0, 8), "p.yaml: ");
  EXPECT_NE(sp.find("sp"), std::string::npos);
  EXPECT_EQ(ParsePlanFile("dp: 2\n  tp: [\n", "p.yaml").status().message().substr(0, 14), "p.yaml: line 2");
}

// ---------------------------------------------------------------------------
// Inserted collectives against the hand-written lowerings.

/// (type, reduce, group axes, message bytes) of every collective, sorted.
using CollectiveKey = std::tuple<std::string, std::string, std::vector<std::string>, int64_t>;
std::vector<CollectiveKey> Collectives(const Program& p) {
  std::vector<CollectiveKey> keys;
  for (const Op& op : p.graphs.front().ops)
    if (op.kind == OpKind::kCollective)
      keys.emplace_back(std::string(ToString(op.collective)), std::string(ToString(op.reduce)), op.group.axes,
                        op.message_bytes);
  std::sort(keys.begin(), keys.end());
  return keys;
}

Program Partitioned(const std::string& model, const std::string& text, PartitionReport* report = nullptr) {
  Result<Program> p = LowerModelSharding(model, ParseSharding(text), report);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Program{};
}

Program HandWritten(const std::string& model, const std::string& plan) {
  Result<Program> p = LowerTransformer(ModelPreset(model).value(), ParsePlan(plan).value());
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Program{};
}

TEST(Partitioner, DataParallelGivesTheHandWrittenGradientAllReduces) {
  // gpt-tiny has 2 x 8 + 4 = 20 parameters (per layer: ln1 gamma/beta,
  // qkv, proj, ln2 gamma/beta, fc1, fc2; plus the word and position tables
  // and the final norm's gamma and beta). Each gradient is partial over dp
  // after its producer, and Adam needs it whole: 20 all-reduces over [dp],
  // each of the whole bf16 gradient, e.g. fc1: 256 x 1024 x 2 = 524288 bytes.
  // The word table's two gradients (head and lookup) are summed first: one.
  Program sharded = Partitioned("gpt-tiny", kGptDp2);
  Program hand = HandWritten("gpt-tiny", "dp=2");
  EXPECT_EQ(Collectives(sharded), Collectives(hand));
  EXPECT_EQ(Collectives(sharded).size(), 20u);
  int fc1 = 0;
  for (const Op& op : sharded.graphs.front().ops)
    if (op.name == "L0.mlp.fc1.w.grad.ar") {
      ++fc1;
      EXPECT_EQ(op.message_bytes, 256 * 1024 * 2);
      EXPECT_EQ(op.tags.purpose, "grad_sync");
    }
  EXPECT_EQ(fc1, 1);
}

TEST(Partitioner, MegatronAnnotationGivesTheHandWrittenTensorParallelCollectives) {
  // Per block 2 forward all-reduces (proj, fc2) and 2 backward (qkv.dX,
  // fc1.dX) over [tp], each [B, s, h] = 2 x 64 x 256 x 2 = 65536 bytes; outside
  // the blocks the vocab-parallel embedding's (65536 bytes), the head's input
  // grad (65536), and the loss max / sum-exp / target ([B, s] f32 = 512 bytes):
  // 2 x 4 + 5 = 13.
  Program sharded = Partitioned("gpt-tiny", kGptTp2);
  Program hand = HandWritten("gpt-tiny", "tp=2");
  EXPECT_EQ(Collectives(sharded), Collectives(hand));
  EXPECT_EQ(Collectives(sharded).size(), 13u);
  Program llama = Partitioned("llama-tiny", kLlamaTp2);
  EXPECT_EQ(Collectives(llama), Collectives(HandWritten("llama-tiny", "tp=2")));
}

TEST(Partitioner, MixedPlanReshardsAtTheLayerBoundary) {
  // Forward: L0's fc2 output is partial over tp and L0.mlp.res.out is
  // annotated [[dp, tp], [], []]: the partial sum becomes one reduce_scatter
  // over tp onto the batch (message: the whole local [2, 64, 256] bf16 =
  // 65536 bytes), and the residual (whole over tp) takes its block locally:
  // an all_to_all (65536 bytes) and a slice, since the IR's slice start is
  // the same on every rank. Backward: L1.attn.res.grad.out is annotated
  // [[dp], [], []]: its add's two inputs, batch-split over dp and tp, are
  // all-gathered over tp (each [1, 64, 256] bf16 = 32768 bytes).
  PartitionReport report;
  Program p = Partitioned("gpt-tiny", kGptMixed, &report);
  std::map<std::string, int> inserted(report.inserted.begin(), report.inserted.end());
  EXPECT_EQ(inserted["reduce_scatter"], 1);
  EXPECT_EQ(inserted["all_to_all"], 1);
  EXPECT_EQ(inserted["slice"], 1);
  EXPECT_EQ(inserted["all_gather"], 2);
  int rs = 0, ag = 0, l1_grad_sync = 0;
  for (const Op& op : p.graphs.front().ops) {
    if (op.kind != OpKind::kCollective) continue;
    if (op.collective == CollectiveType::kReduceScatter) {
      ++rs;
      EXPECT_EQ(op.name, "L0.mlp.fc2.out.rs");
      EXPECT_EQ(op.message_bytes, 65536);
    }
    if (op.collective == CollectiveType::kAllGather) {
      ++ag;
      EXPECT_EQ(op.message_bytes, 32768);
    }
    // Layer 1 is data parallel over both axes: its gradients are all-reduced over [dp, tp].
    if (op.tags.layer == 1 && op.tags.purpose == "grad_sync") {
      ++l1_grad_sync;
      EXPECT_EQ(op.group.axes, (std::vector<std::string>{"dp", "tp"}));
    }
  }
  EXPECT_EQ(rs, 1);
  EXPECT_EQ(ag, 2);
  EXPECT_EQ(l1_grad_sync, 8);  // ln1 gamma/beta, qkv, proj, ln2 gamma/beta, fc1, fc2
}

// ---------------------------------------------------------------------------
// Real runs against the unsharded model.

/// Runs the partitioned program of `model` under `text` and the unsharded
/// program of the same global batch, fifo order, and compares loss,
/// gradients and updated parameters.
void ExpectMatchesReference(const std::string& model, const std::string& text) {
  PartitionReport report;
  const ShardingPlan plan = ParseSharding(text);
  Result<Program> sharded = LowerModelSharding(model, plan, &report);
  ASSERT_TRUE(sharded.ok()) << sharded.status().message();
  ModelConfig unsharded = ModelPreset(model).value();
  unsharded.batch = static_cast<int>(plan.mesh.axes.front().name == "dp" ? 2 * unsharded.batch : unsharded.batch);
  Result<Program> ref = LowerTransformer(unsharded, ParallelPlan{});
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  RunOptions options;
  for (const SegmentedTensor& t : report.segmented) options.init.layouts.push_back({t.tensor, t.dim, t.segments});
  ScheduledProgram ref_sp{*ref, ProgramOrderSchedule(*ref, "fifo")};
  ScheduledProgram sp{*sharded, ProgramOrderSchedule(*sharded, "fifo")};
  Result<ExecutionResult> ref_run = RunInProcess(ref_sp, options);
  ASSERT_TRUE(ref_run.ok()) << ref_run.status().message();
  Result<ExecutionResult> run = RunInProcess(sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  Result<ReferenceReport> cmp =
      CompareToReference(ref_sp, *ref_run, sp, *run, Tolerance{}, options.init.layouts);
  ASSERT_TRUE(cmp.ok()) << cmp.status().message();
  EXPECT_GT(cmp->checks.size(), 20u);
  std::printf("%s %s: %s\n", model.c_str(), plan.mesh.axes.front().name.c_str(), cmp->Summary().c_str());
}

TEST(PartitionerRun, GptDataParallelMatchesUnsharded) { ExpectMatchesReference("gpt-tiny", kGptDp2); }
TEST(PartitionerRun, GptMegatronMatchesUnsharded) { ExpectMatchesReference("gpt-tiny", kGptTp2); }
TEST(PartitionerRun, GptMixedAcrossLayersMatchesUnsharded) { ExpectMatchesReference("gpt-tiny", kGptMixed); }
TEST(PartitionerRun, LlamaMegatronMatchesUnsharded) { ExpectMatchesReference("llama-tiny", kLlamaTp2); }
TEST(PartitionerRun, LlamaMixedAcrossLayersMatchesUnsharded) { ExpectMatchesReference("llama-tiny", kLlamaMixed); }

}  // namespace
}  // namespace concerto
