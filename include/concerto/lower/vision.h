// Vision models lowered to the IR: the Vision Transformer (ViT-B/16, L/16,
// H/14) and the wide ResNets (Wide ResNet-50-2, -101-2), the paper's other
// model families. The forward is built op by op as torchvision's
// `vit_b_16()` and `wide_resnet50_2()` compute it (their GEMM and conv flops
// are pinned against the models captured through concerto.torch in
// tests/python/test_torch.py); the backward comes from the autodiff pass
// (ir/autodiff.h) and the optimizer is Adam with fp32 master copies. A plan
// (dp, zero, and tp for the ViTs) is applied by the SPMD partitioner
// (lower/sharding_plan.h) on the unsharded step. docs/frontends.md
// ("Vision models").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/lower/plan.h"
#include "concerto/util/status.h"

namespace concerto {

struct VisionConfig {
  enum class Kind { kVit, kWideResnet };
  std::string name;
  Kind kind = Kind::kVit;
  int image = 224;    // square input images, 3 channels
  int classes = 1000;
  int batch = 32;     // images per data-parallel rank
  // ViT
  int patch = 16;
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int mlp = 3072;
  // Wide ResNet: bottleneck blocks per stage (4 stages), 3x3 width factor
  std::vector<int> blocks;
  int width_factor = 2;
  DType dtype = DType::kBF16;
};

/// vit-b16, vit-l16, vit-h14, wide-resnet50-2, wide-resnet101-2.
std::vector<std::string> VisionPresetNames();
/// A preset by name; an error listing the known names otherwise.
Result<VisionConfig> VisionPreset(const std::string& name);

/// A vision model spec file (YAML or JSON, docs/frontends.md "Vision model
/// spec files"): nullopt when `path` is not a file or its `family` is not
/// `vit` or `wide-resnet` (the transformer spec reader takes it then), else
/// the config or an error naming the file and field. Fields: name, family,
/// image, classes, batch, dtype; vit: patch, layers, hidden, heads, mlp;
/// wide-resnet: blocks (four counts), width_factor.
Result<std::optional<VisionConfig>> LoadVisionSpec(const std::string& path);
/// LoadVisionSpec of a file's text (`source` names it in messages).
Result<std::optional<VisionConfig>> ParseVisionSpec(const std::string& text, const std::string& source);

/// The size limits of docs/ir.md "Limits" for `config` at a batch of
/// `images`: at most kMaxModelLayers layers (ViT) or bottleneck blocks (all
/// four stages), every tensor and the parameter count at most 2^40 elements.
/// The spec reader and the lowerings check it before building anything.
Status ValidateVisionSize(const VisionConfig& config, int64_t images);

/// Trainable parameters (weights, biases, norms' scales and shifts, class
/// token and positions).
Result<int64_t> VisionParameterCount(const VisionConfig& config);

/// The unsharded training step of `config` on one rank at a global batch of
/// `images`: forward, mean cross-entropy loss, the autodiff backward, Adam.
Result<Program> LowerVisionUnsharded(const VisionConfig& config, int64_t images);

/// `config` under `plan` (dp, zero 0 or 3, and tp for a ViT: Megatron's split
/// of the q/k/v and fc1 columns and the out-projection and fc2 rows): the
/// unsharded step at a global batch of batch x dp, partitioned. ZeRO-3 shards
/// dim 0 of the parameters, their fp32 masters and Adam moments over dp where
/// it divides (the gradients are reduce-scattered to them), each gathered
/// again for its backward use as DeepSpeed does; zero=1 and 2 are refused
/// (see the message). Batch norm keeps per-rank
/// statistics (`local_stats`, DDP's default). Errors name the plan key a
/// vision model does not take (pp, ep, sp, microbatches, dap, vstages,
/// recompute, order; tp for a ResNet) and a tp that does not divide the heads.
Result<Program> LowerVision(const VisionConfig& config, const ParallelPlan& plan);

}  // namespace concerto
