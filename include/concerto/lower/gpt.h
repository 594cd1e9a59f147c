// GPT-style decoder lowered to the IR for data parallelism and Megatron
// tensor parallelism: one SPMD graph with real local shapes, sharding specs,
// flops, bytes and collectives. Conventions are in docs/workloads.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
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

/// Data parallelism over mesh axis "dp", Megatron tensor parallelism over "tp".
struct DpTpPlan {
  int dp = 1;
  int tp = 1;
};

/// Ok when `plan` can shard `config`: positive sizes, tp dividing heads,
/// vocab, hidden and ffn_mult * hidden, heads dividing hidden.
Status ValidateGpt(const GptConfig& config, const DpTpPlan& plan);

/// Number of trainable parameters of the whole (unsharded) model:
/// layers * (4 + 2 * ffn_mult) h^2 + 4h per layer (two LayerNorms),
/// plus V*h (tied word embedding), s*h (positions) and 2h (final LayerNorm).
int64_t GptParameterCount(const GptConfig& config);

/// One training step (forward, backward, Adam) of `config` under `plan` as a
/// Program: mesh {dp, tp}, one graph "main" run by every rank (role "spmd").
Result<Program> LowerGpt(const GptConfig& config, const DpTpPlan& plan);

}  // namespace concerto
