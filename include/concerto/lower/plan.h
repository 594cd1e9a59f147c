// Parallel plans: which parallelism degrees and schemes a training step uses,
// given as strings ("dp=4,tp=8", "pp=4,tp=8,dp=1,sp,microbatches=8",
// "zero=3,dp=32"). docs/frontends.md describes every key and what the
// frontend lowers for it.
#pragma once

#include <string>

#include "concerto/util/status.h"

namespace concerto {

struct ModelConfig;  // concerto/lower/transformer.h

/// A parallel plan. Degrees are group sizes (1: not used). The mesh is
/// {pp, dp, tp} (tp last, so a tp group sits inside a node; pp only when > 1).
/// With ep > 1 the dp ranks are split into {dp: dp/ep, ep} (ep divides dp).
/// Dynamic axial parallelism is parsed and validated; the decoder frontend
/// rejects it (docs/frontends.md).
struct ParallelPlan {
  int dp = 1;            // data parallel
  int tp = 1;            // Megatron tensor parallel
  int pp = 1;            // pipeline stages (1F1B)
  int ep = 1;            // expert parallel (mixture-of-experts models), carved out of dp
  bool sp = false;       // Megatron sequence parallelism over the tp group (needs tp > 1)
  int zero = 0;          // ZeRO stage over dp: 0 (off), 1, 2 or 3
  int microbatches = 1;  // micro-batches per step (>= pp for 1F1B)
  int dap = 1;           // FastFold dynamic axial parallelism degree (Evoformer only)
};

/// The older two-degree plan (dp and tp only), kept for existing callers.
struct DpTpPlan {
  int dp = 1;
  int tp = 1;
};

/// Parses a comma-separated plan: integer keys dp, tp, pp, ep, microbatches
/// (>= 1), dap (>= 1) and zero (0..3); flag sp (bare, or =1 / =0). Spaces around
/// items are ignored; omitted keys keep their defaults. Errors name the item:
/// unknown key, key given twice, a value that is not an integer in range, a
/// flag or key without its value, sp without tp > 1.
Result<ParallelPlan> ParsePlan(const std::string& text);

/// The canonical text of `plan`: "dp=N,tp=M" followed by every other key that
/// differs from its default, in the order pp, ep, sp, zero, microbatches, dap.
/// ParsePlan(PlanToString(p)) gives p back.
std::string PlanToString(const ParallelPlan& plan);

/// Ok when `plan` can run `model`; otherwise the first constraint that fails,
/// named in the message: degrees >= 1 and zero in 0..3; sp needs tp > 1; when
/// `world_size` > 0, tp*pp must divide it and dp*tp*pp must equal it; tp must
/// divide heads, kv_heads, vocab and ffn_hidden (and seq under sp); pp must
/// divide layers; pp > 1 needs microbatches >= pp (1F1B); a mixture-of-experts
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
/// keys of the plan string (dp, tp, pp, ep, microbatches, dap: integers;
/// zero: 0..3; sp: true/false or 1/0). `source` names the file in errors,
/// which also name the key: unknown key, a value of the wrong type, a YAML
/// syntax error (with its line), and ParsePlan's checks (sp without tp > 1).
Result<ParallelPlan> ParsePlanFile(const std::string& text, const std::string& source);
/// Reads and parses a plan file.
Result<ParallelPlan> LoadPlanFile(const std::string& path);
/// A plan given on a command line: the file at `arg` when it names an
/// existing file, otherwise a plan string (ParsePlan).
Result<ParallelPlan> LoadPlan(const std::string& arg);

}  // namespace concerto
