// The AlphaFold Evoformer stack lowered to the IR, alone or under FastFold's
// dynamic axial parallelism (DAP) and data parallelism. One SPMD graph per
// program: forward, the distogram and masked-MSA heads with their
// cross-entropy losses, backward (activation and weight gradients as
// separate ops), gradient all-reduce and Adam. The block's op list, the approximations
// forced by the fixed compute vocabulary and the placement of the DAP
// collectives are in docs/evoformer.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/ir/ir.h"
#include "concerto/util/status.h"

namespace concerto {

/// An Evoformer stack. Sizes are global (unsharded); the defaults are the
/// AlphaFold 2 training sizes (REFERENCES.md).
struct EvoformerConfig {
  std::string name = "evoformer";
  int blocks = 48;
  int n_seq = 128;          // MSA sequences (s)
  int n_res = 256;          // residues (r)
  int c_m = 256;            // MSA channels
  int c_z = 128;            // pair channels
  int msa_heads = 8;        // MSA row/column attention heads
  int msa_head_dim = 32;
  int tri_heads = 4;        // triangle attention heads
  int tri_head_dim = 32;
  int opm_hidden = 32;      // outer-product-mean projection width
  int tri_mul_hidden = 128; // triangle multiplication projection width
  int transition_mult = 4;  // MSA and pair transition widening
  int batch = 1;            // samples per data-parallel rank (must be 1)
  int distogram_bins = 64;  // distogram head: distance bins of each residue pair
  int msa_classes = 23;     // masked-MSA head: 20 amino acids, unknown, gap, mask
  double distogram_weight = 0.3;   // AlphaFold's loss weights (supplement 1.9)
  double masked_msa_weight = 2.0;
  DType dtype = DType::kBF16;
};

/// "evoformer" (AlphaFold training sizes, 48 blocks) and "evoformer-tiny"
/// (1 block, small channels, for tests).
std::vector<std::string> EvoformerPresetNames();
/// A preset by name; an error listing the known names otherwise.
Result<EvoformerConfig> EvoformerPreset(const std::string& name);

/// Ok when every size and loss weight is positive, batch is 1 and dtype is a
/// float type; otherwise the first broken constraint, named.
Status ValidateEvoformer(const EvoformerConfig& config);
/// Ok when `dp` and `dap` are >= 1 and `dap` divides n_res and n_seq (DAP
/// shards both axes of the MSA and of the pair representation); otherwise the
/// broken constraint, named.
Status ValidateEvoformerPlan(const EvoformerConfig& config, int dp, int dap);

/// Trainable parameters of one block (no linear biases; docs/evoformer.md has
/// the per-module formula).
int64_t EvoformerBlockParameterCount(const EvoformerConfig& config);

/// Trainable parameters of the two heads: c_z x distogram_bins +
/// c_m x msa_classes (no biases).
int64_t EvoformerHeadParameterCount(const EvoformerConfig& config);

/// One training step of the stack and its two heads under `dp` x `dap`: mesh
/// {dp, dap} (dap last), one graph "main" that every rank runs (role
/// "spmd"). The loss is distogram_weight x the distogram cross entropy plus
/// masked_msa_weight x the masked-MSA cross entropy, each a mean over its
/// labels, averaged over dp. Validation errors are returned as they are.
Result<Program> LowerEvoformer(const EvoformerConfig& config, int dp, int dap);

}  // namespace concerto
