// The reference check: a parallel run must reproduce the unsharded run of
// the same model and data: the step loss, every parameter's gradient (the
// one its Adam op reads) and every updated parameter, gathered from the
// ranks' shards into global tensors. docs/runtime.md states the tolerances.
#pragma once

#include <string>
#include <vector>

#include "concerto/runtime/executor.h"
#include "concerto/runtime/init.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/status.h"

namespace concerto {

struct Tolerance {
  /// |loss - ref| <= loss_rel * max(1, |ref|).
  double loss_rel = 1e-5;
  /// Per gradient tensor: max |g - ref| <= grad_rel * max |ref| + grad_abs.
  double grad_rel = 1e-4;
  /// Per updated parameter: max |p - ref| <= param_abs. (One Adam step moves
  /// each element by about lr = 1e-4; a flipped update differs by 2 lr.)
  double param_abs = 5e-5;
  /// An absolute floor for gradients that are zero in exact arithmetic (the
  /// Evoformer's pair-bias LayerNorm beta: a per-head constant added to every
  /// score of a softmax row), where the relative bound would compare
  /// rounding noise with rounding noise. 0: none.
  double grad_abs = 0;
};

/// One compared tensor.
struct TensorCheck {
  std::string what;       // e.g. "gradient of 'L0.attn.qkv.w'"
  double max_error = 0;   // largest |got - ref|
  double scale = 0;       // max |ref| (the gradient's normaliser)
  double tolerance = 0;   // the bound max_error was held to
  int64_t worst_index = 0;  // logical global row-major index of max_error
  double ref = 0, got = 0;  // values at worst_index
  bool ok = true;
};

struct ReferenceReport {
  double reference_loss = 0;
  double loss = 0;
  std::vector<TensorCheck> checks;  // loss first, then gradients, then parameters
  /// One line: losses, number of tensors, the largest normalised errors.
  std::string Summary() const;
};

/// A global tensor assembled from the ranks' shards.
struct GlobalTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;  // logical row-major
  double replica_error = 0;   // largest disagreement between ranks holding the same element
};

/// The step loss of a run: the mean of every cross_entropy output on every
/// rank (each is the mean over its rank's tokens of one micro-batch, the
/// convention of the decoder frontend; tensor-parallel replicas agree).
Result<double> StepLoss(const ScheduledProgram& sp, const ExecutionResult& run);

/// Gathers the tensor at position `position` of the inputs (or outputs) of
/// the op called `op_name` on every rank that has such an op into its
/// logical global tensor. Errors: no rank has the op, a partial-sum tensor,
/// ranks that disagree on the global shape, elements no rank holds.
Result<GlobalTensor> GatherOpTensor(const ScheduledProgram& sp, const ExecutionResult& run,
                                    const std::string& op_name, bool output, int position,
                                    const std::vector<SegmentedLayout>& layouts);

/// Gathers the tensor called `tensor_name` from every rank whose graph has
/// one (a graph input, an intermediate or an output) into its logical global
/// tensor. Errors as GatherOpTensor's; no rank has such a tensor.
Result<GlobalTensor> GatherTensor(const ScheduledProgram& sp, const ExecutionResult& run,
                                  const std::string& tensor_name, const std::vector<SegmentedLayout>& layouts);

/// Compares `run` of `sp` to `ref_run` of the unsharded `ref_sp` (same model
/// and global data): the loss, then for every Adam op of the reference (by
/// op name) its gradient input and its updated parameter. Ok with the
/// report, or an error naming the first diverging tensor, its max error,
/// where, and how many tensors diverged.
Result<ReferenceReport> CompareToReference(const ScheduledProgram& ref_sp, const ExecutionResult& ref_run,
                                           const ScheduledProgram& sp, const ExecutionResult& run,
                                           const Tolerance& tolerance,
                                           const std::vector<SegmentedLayout>& layouts);

/// The layout of the decoder frontend's fused QKV weight ("*.attn.qkv.w"):
/// global columns [q (q_width) | k (kv_width) | v (kv_width)].
SegmentedLayout FusedQkvLayout(int64_t q_width, int64_t kv_width);

}  // namespace concerto
