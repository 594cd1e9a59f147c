// Decoder transformers (GPT and LLaMA style, dense or LLaMA blocks with a
// mixture of experts) lowered to the IR under a ParallelPlan: data
// parallelism (plain or ZeRO 1/2/3), Megatron tensor parallelism, sequence
// parallelism, gradient accumulation over micro-batches, pipeline
// parallelism (1F1B, plain or interleaved) and expert parallelism. One SPMD graph, or one graph per pipeline
// stage, with real local shapes, sharding specs, flops, bytes, collectives
// and sends/recvs. The op list, the collective placement and the conventions
// are in docs/workloads.md and docs/frontends.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/lower/plan.h"
#include "concerto/util/status.h"

namespace concerto {

/// gpt: pre-LayerNorm, learned positions, GELU MLP, fused QKV, LM head tied
/// to the word embedding. llama: pre-RMSNorm, no position table (RoPE is not
/// modelled), SwiGLU MLP, separate Q/K/V (grouped-query when kv_heads <
/// heads), untied LM head. Neither has linear biases.
enum class ModelFamily { kGpt, kLlama };

std::string_view ToString(ModelFamily family);
std::optional<ModelFamily> ParseModelFamily(std::string_view text);

/// A decoder model. Sizes are global (unsharded).
struct ModelConfig {
  std::string name;
  ModelFamily family = ModelFamily::kGpt;
  int layers = 0;
  int hidden = 0;      // h
  int heads = 0;       // query heads a; head dim d = h / a
  int kv_heads = 0;    // key/value heads (== heads: multi-head attention)
  int ffn_hidden = 0;  // MLP inner width (gpt: 4h; llama-7b: 11008)
  int seq = 0;         // s
  int vocab = 0;       // V
  int batch = 0;       // B: sequences per data-parallel rank per micro-batch
                       // (a step runs plan.microbatches of them)
  DType dtype = DType::kBF16;
  /// The attention kernels: fused (FlashAttention: the s x s scores never
  /// reach memory) or unfused (two batched GEMMs around a softmax and dropout
  /// over the materialised scores, as Megatron-LM before FlashAttention).
  /// Model files: `attention: flash | unfused` (default flash).
  bool fused_attention = true;
  // Mixture of experts (llama family only; docs/frontends.md "MoE / ep"):
  // every block's MLP is replaced by `experts` SwiGLU experts of width
  // ffn_hidden behind a top-`top_k` router. 0 experts: a dense model.
  int experts = 0;             // E
  int top_k = 0;               // experts per token (1..E)
  double capacity_factor = 0;  // slots per expert and sequence: MoeCapacity
};

/// Whether `model` is a mixture-of-experts decoder (experts > 0).
bool IsMoe(const ModelConfig& model);

/// Expert capacity C, the slots each expert has per sequence (GShard's
/// group = one sequence): ceil(capacity_factor * seq * top_k / experts).
/// Routing choices beyond C are dropped in token order (docs/ir.md,
/// moe_dispatch). 0 for a dense model.
int64_t MoeCapacity(const ModelConfig& model);

/// Names accepted by ModelPreset, GPT family first, smallest first in each
/// family ("gpt-tiny" and "llama-tiny" are for tests).
std::vector<std::string> ModelPresetNames();
/// A preset by name; an error listing the known names otherwise.
Result<ModelConfig> ModelPreset(const std::string& name);

/// Parses a model spec (YAML, or JSON, which YAML reads too): a map with
/// family, layers, hidden, heads, seq, vocab (required), kv_heads (default
/// heads), ffn_hidden (default 4*hidden for gpt; required for llama), batch
/// (default 1), dtype (default bf16), name (default `default_name`), and for
/// a mixture of experts experts (>= 1), top_k (default 2, or 1 with one
/// expert) and capacity_factor (> 0, default 1.0).
/// `source` names the file in errors, which also name the field.
Result<ModelConfig> ParseModelSpec(const std::string& text, const std::string& source,
                                   const std::string& default_name);
/// Reads and parses a model spec file; the default name is the file's stem.
Result<ModelConfig> LoadModelFile(const std::string& path);
/// A preset when `name_or_path` is one, else a model spec file; the error
/// lists the presets when it is neither.
Result<ModelConfig> LoadModel(const std::string& name_or_path);

/// Ok when every size is positive, heads divides hidden and kv_heads divides
/// heads, and for a mixture of experts: family llama, 1 <= top_k <= experts
/// and a finite capacity_factor > 0; otherwise the first broken constraint,
/// named.
Status ValidateModel(const ModelConfig& model);

/// Trainable parameters of the whole model (docs/workloads.md has the formula
/// per family): per layer attention 2h^2 + 2h*kv_heads*d, MLP 2h*f (gpt) or
/// 3h*f (llama), norms 4h (gpt) or 2h (llama); plus V*h word embedding, and
/// for gpt s*h positions + 2h final LayerNorm, for llama h final RMSNorm +
/// V*h untied head. A mixture of experts has E*3h*f expert weights and an
/// h*E router per layer instead of the 3h*f MLP.
int64_t ModelParameterCount(const ModelConfig& model);

/// One training step (forward and backward of plan.microbatches micro-batches
/// of model.batch sequences each, gradient accumulation, Adam) of `model`
/// under `plan` as a Program. Without pp: mesh {dp, tp}, one graph "main"
/// that every rank runs (role "spmd"). With pp > 1: mesh {pp, dp, tp}, one
/// graph and one role "stage<i>" per stage, holding the ranks with pp
/// coordinate i (contiguous) and layers [i*L/pp, (i+1)*L/pp); its forwards
/// and backwards follow the 1F1B order and exchange activations and their
/// gradients with the neighbouring stages by send/recv (docs/frontends.md).
/// With vstages = v > 1 each stage graph holds v model chunks (virtual
/// stages chunk*pp + i) in Megatron's interleaved 1F1B order, with sends and
/// recvs between virtual stages (the last stage sends to the first for the
/// next chunk). plan.order reorders the mesh axes (PlanMeshAxes); a stage's
/// role then holds the ranks whose pp coordinate is i.
/// With ep > 1 (a mixture of experts) the mesh splits the data-parallel
/// ranks into {dp: dp/ep, ep: ep} ({pp,} dp, ep, tp): activations are
/// sharded over both, experts over ep, and the MoE layer's dispatch and
/// combine are all-to-alls over ep (docs/frontends.md, "MoE / ep").
/// ValidateModel and ValidatePlan errors are returned as they are; dap is a
/// "not implemented yet in this frontend" error.
Result<Program> LowerTransformer(const ModelConfig& model, const ParallelPlan& plan);

}  // namespace concerto
