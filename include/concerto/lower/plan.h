// Parallel plans: which parallelism degrees and schemes a training step uses,
// given as strings ("dp=4,tp=8", "pp=4,tp=8,dp=1,sp,microbatches=8",
// "zero=3,dp=32"). docs/frontends.md describes every key and what the
// frontend lowers for it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

struct ModelConfig;  // concerto/lower/transformer.h

/// Size limits every frontend checks before it builds anything (docs/ir.md
/// "Limits"): the lowered program grows with layers x micro-batches (about 60
/// ops each for a decoder layer, forward and backward), so a small file
/// cannot ask for a program that exhausts memory. The most layers a model
/// may have (decoder blocks, ViT layers, ResNet bottleneck blocks; the
/// largest published models have under 200) ...
inline constexpr int kMaxModelLayers = 4096;
/// ... and the most layers x micro-batches of a plan (GPT-1T's 128 layers at
/// its published 512 micro-batches, 3.8M ops, is 65,536).
inline constexpr int64_t kMaxLayerMicrobatches = int64_t{1} << 16;

/// Activation recomputation (Korthikanti et al. 2022, "Reducing Activation
/// Recomputation in Large Transformer Models"): what the backward recomputes
/// instead of keeping from the forward. docs/frontends.md "recompute".
enum class Recompute {
  kNone,       // every activation the backward reads is kept
  kSelective,  // the attention core is recomputed in the backward (Megatron's
               // "selective" granularity, core attention checkpointed)
  kFull,       // only each layer's input is kept; the backward re-runs the
               // layer's forward (Megatron's "full" granularity, uniform, 1 layer)
};
/// "none", "selective", "full".
std::string_view ToString(Recompute recompute);

/// A parallel plan. Degrees are group sizes (1: not used). The mesh is
/// {pp, dp, tp} by default (tp last, so a tp group sits inside a node; pp only
/// when > 1); `order` places the axes otherwise (PlanMeshAxes). With ep > 1
/// the dp ranks are split into {dp: dp/ep, ep} (ep divides dp, and sits right
/// inside dp). Dynamic axial parallelism is parsed and validated; the decoder
/// frontend rejects it (docs/frontends.md).
struct ParallelPlan {
  int dp = 1;            // data parallel
  int tp = 1;            // Megatron tensor parallel
  int pp = 1;            // pipeline stages (1F1B)
  int ep = 1;            // expert parallel (mixture-of-experts models), carved out of dp
  bool sp = false;       // Megatron sequence parallelism over the tp group (needs tp > 1)
  int zero = 0;          // ZeRO stage over dp: 0 (off), 1, 2 or 3
  int microbatches = 1;  // micro-batches per step (>= pp for 1F1B)
  int dap = 1;           // FastFold dynamic axial parallelism degree (Evoformer only)
  int vstages = 1;       // model chunks (virtual pipeline stages) per pp rank: > 1 is
                         // Megatron's interleaved 1F1B
  Recompute recompute = Recompute::kNone;  // activation recomputation
  /// Mesh axes innermost (fastest, inside a node) first, as Megatron's rank
  /// order "tp-dp-pp": a permutation of tp, dp and (optional when pp = 1) pp.
  /// Empty: the default tp, dp, pp. Written "order=dp-tp-pp" in plan text.
  std::vector<std::string> order;
};

/// The older two-degree plan (dp and tp only), kept for existing callers.
struct DpTpPlan {
  int dp = 1;
  int tp = 1;
};

/// Parses a comma-separated plan: integer keys dp, tp, pp, ep, microbatches,
/// vstages (>= 1), dap (>= 1) and zero (0..3); flag sp (bare, or =1 / =0);
/// order (axes joined by '-', innermost first, e.g. order=dp-tp-pp);
/// recompute (none, selective or full). Spaces
/// around items are ignored; omitted keys keep their defaults. Errors name the
/// item: unknown key, key given twice, a value that is not an integer in
/// range, a flag or key without its value, sp without tp > 1, a bad order
/// (CheckAxisOrder). An order equal to the default is dropped.
Result<ParallelPlan> ParsePlan(const std::string& text);

/// The canonical text of `plan`: "dp=N,tp=M" followed by every other key that
/// differs from its default, in the order pp, ep, sp, zero, microbatches, dap,
/// vstages, order, recompute. ParsePlan(PlanToString(p)) gives p back.
std::string PlanToString(const ParallelPlan& plan);

/// Ok when `plan.order` (if not empty) names each of tp and dp once, pp at
/// most once (and must name it when pp > 1), and nothing else (ep always
/// sits right inside dp). The message names the key: "order: ...".
Status CheckAxisOrder(const ParallelPlan& plan);

/// The mesh of `plan`, outermost axis first (the IR's order, last axis
/// fastest): the reverse of the effective order, with dp split into
/// {dp: dp/ep, ep} when ep > 1, pp only when > 1. Default: {pp, dp, tp}.
/// `plan.order` must pass CheckAxisOrder (asserted).
std::vector<MeshAxis> PlanMeshAxes(const ParallelPlan& plan);

/// Ok when `plan` can run `model`; otherwise the first constraint that fails,
/// named in the message: degrees >= 1 and zero in 0..3; sp needs tp > 1; when
/// `world_size` > 0, tp*pp must divide it and dp*tp*pp must equal it; tp must
/// divide heads, kv_heads, vocab and ffn_hidden (and seq under sp); pp must
/// divide layers; pp > 1 needs microbatches >= pp (1F1B); vstages > 1 needs
/// pp > 1, pp*vstages dividing layers and microbatches a multiple of pp;
/// order passes CheckAxisOrder; a mixture-of-experts
/// model rejects sp; ep > 1 needs a mixture-of-experts model whose expert
/// count and whose dp it divides, and zero = 0; zero > 0 needs dp > 1 and dp
/// dividing the first dimension of every parameter shard (and the expert
/// count); dap needs an Evoformer model (no family here is one).
/// Does not check the model itself (ValidateModel does).
Status ValidatePlan(const ModelConfig& model, const ParallelPlan& plan, int world_size = 0);

/// Parses "dp=N,tp=M" through ParsePlan; any other key (sp, zero, pp, ...) is
/// an error saying this entry point takes dp and tp only.
Result<DpTpPlan> ParseDpTpPlan(const std::string& text);

/// The ParallelPlan equal to a DpTpPlan.
ParallelPlan ToParallelPlan(const DpTpPlan& plan);

/// Parses a plan file (YAML, or JSON, which YAML reads too): a map with the
/// keys of the plan string (dp, tp, pp, ep, microbatches, dap, vstages:
/// integers; zero: 0..3; sp: true/false or 1/0; order: "dp-tp-pp" or a list
/// [dp, tp, pp], innermost first; recompute: none, selective or full). `source` names the file in errors,
/// which also name the key: unknown key, a value of the wrong type, a YAML
/// syntax error (with its line), and ParsePlan's checks (sp without tp > 1).
Result<ParallelPlan> ParsePlanFile(const std::string& text, const std::string& source);
/// Reads and parses a plan file.
Result<ParallelPlan> LoadPlanFile(const std::string& path);
/// A plan given on a command line: the file at `arg` when it names an
/// existing file, otherwise a plan string (ParsePlan).
Result<ParallelPlan> LoadPlan(const std::string& arg);

}  // namespace concerto
