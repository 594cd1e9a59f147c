// The vision frontend (lower/vision.h): the presets' parameter counts are
// torchvision's, every plan verifies, data parallelism keeps batch norm and the
// activations local, tensor parallelism splits the heads, and a small ViT under
// dp=2,tp=2 computes the unsharded step's loss, gradients and updates on the
// runtime. (Its flops against the torchvision models captured through
// concerto.torch: tests/python/test_torch.py.)
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "concerto/ir/verifier.h"
#include "concerto/lower/frontend.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/vision.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/reference.h"
#include "concerto/schedule/schedule.h"

namespace concerto {
namespace {

TEST(Vision, ParameterCountsAreTorchvisions) {
  // sum(p.numel() for p in torchvision.models.<f>().parameters()), torchvision 0.14
  // (vit_h_14 built with image_size=224).
  const std::map<std::string, int64_t> torchvision = {{"vit-b16", 86567656},        {"vit-l16", 304326632},
                                                      {"vit-h14", 632045800},       {"wide-resnet50-2", 68883240},
                                                      {"wide-resnet101-2", 126886696}};
  for (const auto& [name, count] : torchvision) {
    Result<VisionConfig> c = VisionPreset(name);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(VisionParameterCount(*c).value(), count) << name;
  }
  EXPECT_EQ(VisionPreset("vit-b-16").status().message(), "unknown vision model 'vit-b-16' (did you mean 'vit-b16'?)");
}

int Count(const Program& p, CollectiveType type, const std::string& purpose = "") {
  int n = 0;
  for (const Op& op : p.graphs[0].ops)
    n += op.kind == OpKind::kCollective && op.collective == type && (purpose.empty() || op.tags.purpose == purpose);
  return n;
}

TEST(Vision, PlansVerify) {
  for (const auto& [model, plan] : std::vector<std::pair<std::string, std::string>>{
           {"vit-b16", "dp=4"}, {"vit-b16", "dp=4,zero=3"}, {"vit-b16", "dp=2,tp=2"}, {"wide-resnet50-2", "dp=4"},
           {"wide-resnet50-2", "dp=4,zero=3"}}) {
    Result<Program> p = LowerModelPlan(model, plan);
    ASSERT_TRUE(p.ok()) << model << " " << plan << ": " << p.status().message();
    EXPECT_TRUE(VerifyProgram(*p).empty()) << model << " " << plan;
    EXPECT_EQ(p->mesh.NumRanks(), 4);
  }
}

TEST(Vision, DataParallelKeepsActivationsAndBatchNormLocal) {
  Result<Program> p = LowerModelPlan("wide-resnet50-2", "dp=4");
  ASSERT_TRUE(p.ok()) << p.status().message();
  // Only gradient all-reduces: no activation is gathered (batch norm's statistics are per rank).
  const int grads = Count(*p, CollectiveType::kAllReduce, "grad_sync");
  EXPECT_GT(grads, 150);
  int collectives = 0;
  for (const Op& op : p->graphs[0].ops) collectives += op.kind == OpKind::kCollective;
  EXPECT_EQ(collectives, grads);
  // 32 images per rank.
  for (const Tensor& t : p->graphs[0].tensors) {
    if (t.name == "images") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{32, 3, 224, 224}));
    }
  }
}

TEST(Vision, ZeroThreeGathersParametersAndReduceScattersGradients) {
  Result<Program> p = LowerModelPlan("vit-b16", "dp=4,zero=3");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_GT(Count(*p, CollectiveType::kReduceScatter), 100);
  // Every matrix is gathered twice, as DeepSpeed does: before its forward and before its backward use.
  int fwd = 0, bwd = 0;
  for (const Op& op : p->graphs[0].ops) {
    if (op.kind != OpKind::kCollective || op.tags.purpose != "param_gather") continue;
    (op.tags.phase == Phase::kForward ? fwd : bwd) += 1;
  }
  EXPECT_GT(fwd, 100);
  EXPECT_GT(bwd, 70);  // the weights a backward GEMM reads (q, k, v, o, fc1, fc2 of 12 layers, the head, ...)
  EXPECT_TRUE(VerifyProgram(*p).empty());
}

TEST(Vision, TensorParallelSplitsTheHeads) {
  Result<Program> p = LowerModelPlan("vit-b16", "dp=2,tp=2");
  ASSERT_TRUE(p.ok()) << p.status().message();
  for (const Op& op : p->graphs[0].ops) {
    if (op.kind == OpKind::kCompute && op.compute_type == ComputeType::kAttention) {
      EXPECT_EQ(op.Attr("heads", 0), 6);
    }
  }
  // The out-projection and fc2 outputs are partial over tp: one all-reduce each per layer, forward.
  int fwd_tp = 0;
  for (const Op& op : p->graphs[0].ops)
    fwd_tp += op.kind == OpKind::kCollective && op.collective == CollectiveType::kAllReduce &&
              op.tags.phase == Phase::kForward && op.group.axes == std::vector<std::string>{"tp"};
  EXPECT_EQ(fwd_tp, 2 * 12);
}

TEST(Vision, PlansItDoesNotTakeAreNamed) {
  EXPECT_EQ(LowerModelPlan("wide-resnet50-2", "dp=2,tp=2").status().message(),
            "plan 'dp=2,tp=2' for model 'wide-resnet50-2': tp applies to the ViTs only (a ResNet is data parallel)");
  EXPECT_NE(LowerModelPlan("vit-b16", "dp=2,zero=2").status().message().find("zero=1 and zero=2 are not built"),
            std::string::npos);
  EXPECT_EQ(LowerModelPlan("vit-b16", "tp=5").status().message(),
            "plan 'dp=1,tp=5' for model 'vit-b16': tp (5) must divide heads (12)");
  EXPECT_EQ(LowerModelPlan("vit-b16", "pp=2,microbatches=2").status().message(),
            "plan 'dp=1,tp=1,pp=2,microbatches=2' for model 'vit-b16': the vision frontend takes dp, tp (ViT) and "
            "zero only");
}

TEST(Vision, SmallVitUnderDpTpMatchesTheUnshardedStep) {
  VisionConfig c;
  c.name = "vit-small";
  c.image = 32, c.patch = 8, c.layers = 2, c.hidden = 16, c.heads = 4, c.mlp = 32, c.classes = 10, c.batch = 2;
  c.dtype = DType::kF32;
  ParallelPlan plan;
  plan.dp = 2, plan.tp = 2;
  Result<Program> sharded = LowerVision(c, plan);
  ASSERT_TRUE(sharded.ok()) << sharded.status().message();
  Result<Program> ref = LowerVisionUnsharded(c, 4);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  RunOptions options;
  ScheduledProgram ref_sp{*ref, ProgramOrderSchedule(*ref, "fifo")};
  ScheduledProgram sp{*sharded, ProgramOrderSchedule(*sharded, "fifo")};
  Result<ExecutionResult> ref_run = RunInProcess(ref_sp, options);
  ASSERT_TRUE(ref_run.ok()) << ref_run.status().message();
  Result<ExecutionResult> run = RunInProcess(sp, options);
  ASSERT_TRUE(run.ok()) << run.status().message();
  // The key bias's gradient is 0 in exact arithmetic (it adds q.b to every score of a softmax
  // row), so both runs hold rounding noise of ~1e-11 there: an absolute floor for it.
  Tolerance tolerance;
  tolerance.grad_abs = 1e-8;
  Result<ReferenceReport> cmp = CompareToReference(ref_sp, *ref_run, sp, *run, tolerance, {});
  ASSERT_TRUE(cmp.ok()) << cmp.status().message();
  EXPECT_GT(cmp->checks.size(), 60u);  // the loss, 36 gradients, 36 updates
}

}  // namespace
}  // namespace concerto

namespace concerto {
namespace {

/// Writes `text` to a spec file under the test's temporary directory; returns its path.
std::string SpecFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// A spec file of family vit or wide-resnet lowers like a preset of its sizes.
TEST(VisionSpec, FilesLowerLikeTheirSizes) {
  const std::string vit = std::string(CONCERTO_SOURCE_DIR) + "/examples/models/vit-tiny.yaml";
  Result<std::optional<VisionConfig>> c = LoadVisionSpec(vit);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->name, "vit-tiny");
  EXPECT_EQ((*c)->hidden, 16);
  EXPECT_EQ((*c)->dtype, DType::kF32);
  // torchvision's VisionTransformer(32, 8, 2 layers, 2 heads, 16, 32, 10 classes): patch conv 3*8*8*16
  // + 16, class token 16, positions 17*16, per layer 2 norms 4*16, qkv 3*(16*16+16), out 16*16+16,
  // MLP 16*32+32 + 32*16+16; final norm 32, head 16*10+10.
  const int64_t layer = 4 * 16 + 3 * (16 * 16 + 16) + (16 * 16 + 16) + (16 * 32 + 32) + (32 * 16 + 16);
  EXPECT_EQ(VisionParameterCount(**c).value(), 3 * 8 * 8 * 16 + 16 + 16 + 17 * 16 + 2 * layer + 32 + 16 * 10 + 10);
  Result<Program> p = LowerModelPlan(vit, "dp=2,tp=2");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(VerifyProgram(*p).empty());
  const std::string wrn = SpecFile("wrn.yaml", "family: wide-resnet\nblocks: [1, 1, 1, 1]\nimage: 64\nclasses: 10\n");
  Result<std::optional<VisionConfig>> w = LoadVisionSpec(wrn);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ((*w)->blocks, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_TRUE(LowerModelPlan(wrn, "dp=2").ok());
  // Not a vision family: left to the transformer reader.
  Result<std::optional<VisionConfig>> gpt =
      LoadVisionSpec(std::string(CONCERTO_SOURCE_DIR) + "/examples/models/gpt-1.3b.yaml");
  ASSERT_TRUE(gpt.ok());
  EXPECT_FALSE(gpt->has_value());
}

TEST(VisionSpec, BadFieldsAreNamed) {
  auto error = [](const std::string& text) {
    Result<std::optional<VisionConfig>> c = LoadVisionSpec(SpecFile("bad.yaml", text));
    return c.ok() ? std::string("ok") : c.status().message();
  };
  EXPECT_NE(error("family: vit\nwidth_factor: 2\n").find("field 'width_factor': unknown field for family vit"),
            std::string::npos);
  EXPECT_NE(error("family: vit\nimage: 30\npatch: 8\n").find("patch (8) must divide image (30)"), std::string::npos);
  EXPECT_NE(error("family: vit\nhidden: 10\nheads: 4\n").find("heads (4) must divide hidden (10)"), std::string::npos);
  EXPECT_NE(error("family: wide-resnet\nblocks: [1, 2]\n").find("field 'blocks': must be a list of four"),
            std::string::npos);
  EXPECT_NE(error("family: vit\nlayers: two\n").find("field 'layers': must be a positive integer"), std::string::npos);
  EXPECT_NE(error("family: vit\ndtype: i32\n").find("field 'dtype': must be bf16, f16 or f32"), std::string::npos);
  EXPECT_NE(error("family: wide-resnet\nimage: 16\n").find("image (16) must be at least 32"), std::string::npos);
}

}  // namespace
}  // namespace concerto
