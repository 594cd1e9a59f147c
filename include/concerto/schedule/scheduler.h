// Schedulers: each turns a Program into a ScheduledProgram. Baselines model
// the policies of DDP, Megatron, DeepSpeed ZeRO and XLA (docs/schedulers.md).
#pragma once

#include <string>
#include <vector>

#include "concerto/cost/cost_model.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/option_record.h"
#include "concerto/util/status.h"

namespace concerto {

struct BaselineOptions {
  int64_t ddp_first_bucket_bytes = 1 << 20;          // PyTorch DDP: 1 MiB
  int64_t ddp_bucket_bytes = 25LL << 20;             // PyTorch DDP: 25 MiB
  int64_t megatron_bucket_min_params = 40000000;     // max(4e7, 1e6 x dp) parameters
  int64_t zero_reduce_bucket_elements = 500000000;   // DeepSpeed reduce_bucket_size 5e8
  int64_t zero_prefetch_bucket_elements = 50000000;  // DeepSpeed prefetch_bucket_size 5e7
  /// TransformerEngine's tensor-parallel overlap: chunks per all-gather /
  /// reduce-scatter and its GEMM (the pipeline method's default num_splits).
  int te_overlap_chunks = 4;
};
/// The option records of BaselineOptions (util/option_record.h).
const std::vector<OptionRecord<BaselineOptions>>& BaselineOptionRecords();

/// "sequential", "fifo", "ddp", "megatron", "megatron-tp-overlap", "zero",
/// "deepspeed-overlap", "xla-lhs".
std::vector<std::string> BaselineNames();
/// Runs baseline `name`. Unknown names are an error listing the known ones.
Result<ScheduledProgram> RunBaseline(const std::string& name, const Program& program,
                                     const CostModel& cost, const BaselineOptions& options = {});

}  // namespace concerto
