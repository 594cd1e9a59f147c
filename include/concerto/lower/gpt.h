// GPT entry points kept for existing callers (the CLI, the benchmarks): a
// thin layer over concerto/lower/transformer.h, which lowers GPT and LLaMA
// models under any ParallelPlan. Conventions are in docs/workloads.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/lower/plan.h"
#include "concerto/lower/transformer.h"
#include "concerto/util/status.h"

namespace concerto {

/// A GPT decoder: pre-LayerNorm blocks, learned position embeddings, no
/// linear biases, LM head tied to the word embedding.
struct GptConfig {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int seq = 0;
  int vocab = 0;
  int batch = 0;  // micro-batch per data-parallel rank (sequences)
  int ffn_mult = 4;
  DType dtype = DType::kBF16;
};

/// Names accepted by GptPreset, smallest first ("gpt-tiny" is for tests).
std::vector<std::string> GptPresetNames();
/// A preset configuration by name; an error listing the known names otherwise.
Result<GptConfig> GptPreset(const std::string& name);

/// The ModelConfig (family gpt, kv_heads = heads, ffn_hidden = ffn_mult * h)
/// of a GptConfig.
ModelConfig ToModelConfig(const GptConfig& config);

/// Ok when `plan` can shard `config`: positive sizes, tp dividing heads,
/// vocab, hidden and ffn_mult * hidden, heads dividing hidden.
Status ValidateGpt(const GptConfig& config, const DpTpPlan& plan);

/// Number of trainable parameters of the whole (unsharded) model:
/// layers * (4 + 2 * ffn_mult) h^2 + 4h per layer (two LayerNorms),
/// plus V*h (tied word embedding), s*h (positions) and 2h (final LayerNorm).
int64_t GptParameterCount(const GptConfig& config);

/// One training step (forward, backward, Adam) of `config` under `plan` as a
/// Program: mesh {dp, tp}, one graph "main" run by every rank (role "spmd").
/// Same as LowerTransformer(ToModelConfig(config), ToParallelPlan(plan)).
Result<Program> LowerGpt(const GptConfig& config, const DpTpPlan& plan);

}  // namespace concerto
