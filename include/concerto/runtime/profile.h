// Profiling this machine for the cost model (`concerto profile`,
// docs/runtime.md "Profiling"): the runtime's own kernels timed by op
// signature, collectives timed through any Communicator (MPI processes or
// FakeWorld threads), least-squares fits of achieved compute rate, memory
// bandwidth, launch overhead and collective alpha/beta, and from them a
// profile database (ProfileDb) and a `cpu-local` cluster spec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/ir/ir.h"
#include "concerto/runtime/communicator.h"
#include "concerto/util/status.h"

namespace concerto {

/// One compute kernel's measured time.
struct KernelSample {
  std::string signature;  // ProfileDb::Signature of the op
  ComputeType type = ComputeType::kIdentity;
  double flops = 0;  // as the IR counts them (op.flops)
  double bytes = 0;  // as the IR counts them (op.bytes, in the IR's dtype)
  double time_us = 0;  // median of the timed repetitions
  int reps = 0;
};

struct KernelProfileOptions {
  /// Each kernel is repeated until this much time is spent (at least
  /// min_reps, at most max_reps times), after one untimed warm-up run.
  double min_time_s = 0.02;
  int min_reps = 3;
  int max_reps = 20;
};

/// Times every distinct compute op (by signature) of every role's graph of
/// `program`, on the role's first rank's shard, with the runtime's kernels
/// (RunKernel) on synthetic inputs (floats in [0.01, 0.5), integer tensors
/// 0). `cluster` gives the signature's device context. Errors: an op the
/// runtime cannot run.
Result<std::vector<KernelSample>> ProfileKernels(const Program& program, const ClusterSpec& cluster,
                                                 const KernelProfileOptions& options = {});

/// The shapes profiled when no program is given: square and skinny matmuls
/// (64 to 1024) and two small f32 GPT decoders (hidden 256 / sequence 64
/// and hidden 512 / sequence 128), which bring every other kernel type
/// (norms, softmax, attention, GELU, embedding, loss, Adam) at two sizes.
Result<std::vector<Program>> DefaultProfilePrograms();

/// One collective to time: type, group = ranks 0..group_size-1, bytes per
/// rank of input (a multiple of 4: fp32).
struct CollectiveSpec {
  CollectiveType type = CollectiveType::kAllReduce;
  int group_size = 2;
  int64_t bytes = 0;
};

/// A collective's measured time: the median over repetitions of the
/// slowest member's time.
struct CollectiveSample {
  CollectiveSpec spec;
  double time_us = 0;
  int reps = 0;
};

/// The default sweep: all_reduce, all_gather, reduce_scatter, broadcast and
/// all_to_all on the whole world, 4 KiB to `max_bytes` by factors of 4.
std::vector<CollectiveSpec> DefaultCollectiveSpecs(int world, int64_t max_bytes);
/// The collectives of `program` (type, group size, bytes), deduplicated.
std::vector<CollectiveSpec> ProgramCollectiveSpecs(const Program& program);
/// "all_reduce:2:4096,..." and back (concerto_mpi_run --profile-specs).
std::string FormatCollectiveSpecs(const std::vector<CollectiveSpec>& specs);
Result<std::vector<CollectiveSpec>> ParseCollectiveSpecs(const std::string& text);
/// The groups ProfileCollectives uses (for MpiCommunicator::CreateGroups).
std::vector<std::vector<int>> CollectiveSpecGroups(const std::vector<CollectiveSpec>& specs, int world);

/// Times each spec on `comm` (every rank of the world calls this with the
/// same specs; ranks outside a spec's group skip it). Each timing starts
/// after a barrier of the group; the time is the slowest member's (an
/// all-reduce max). Every rank returns the same samples. Errors: a group
/// larger than the world, a size that is not a positive multiple of 4
/// bytes, or any communicator error.
Result<std::vector<CollectiveSample>> ProfileCollectives(Communicator& comm,
                                                         const std::vector<CollectiveSpec>& specs,
                                                         int reps);

/// ProfileCollectives over a FakeWorld of `ranks` threads (measures this
/// process's memory copies, not a network).
Result<std::vector<CollectiveSample>> ProfileCollectivesInProcess(int ranks, const std::vector<CollectiveSpec>& specs,
                                                                  int reps);

/// The samples as JSON ({"format": "concerto-collective-samples", "ranks",
/// "samples": [{collective, group_size, bytes, time_us, reps}]}) and back;
/// errors name the file, the sample index and the field.
std::string WriteCollectiveSamples(const std::vector<CollectiveSample>& samples, int ranks);
Result<std::vector<CollectiveSample>> ReadCollectiveSamples(const std::string& path);

/// y ~ slope x + intercept by least squares.
struct LinearFit {
  double slope = 0;
  double intercept = 0;
  double r2 = 0;  // coefficient of determination
  int points = 0;
};
/// Least squares with an intercept; needs two distinct x values.
Result<LinearFit> FitLine(const std::vector<double>& x, const std::vector<double>& y);

/// Alpha-beta of collectives: time = alpha * steps + bytes / bandwidth *
/// factor, with the ring steps and bandwidth factors of docs/cost-model.md.
/// The bandwidth is a least-squares fit on the samples of at least 1 MiB
/// (or of the largest size measured, when smaller; all_reduce only when it
/// has two or more: the collective data parallelism runs on, and the one
/// the fitted link matters most for); alpha is the median per-step
/// remainder of the samples of at most 64 KiB (or of the smallest size);
/// the two are refined alternately.
struct CollectiveFit {
  double latency_us = 0;       // alpha per step
  double bandwidth_gbps = 0;   // B, GB/s per rank
  double max_rel_error = 0;    // worst |fit - measured| / measured over all samples
  int points = 0;
};
/// Errors: no sample on two or more ranks, or a non-positive time per byte.
Result<CollectiveFit> FitCollectives(const std::vector<CollectiveSample>& samples);

/// The fitted compute figures.
struct ComputeFit {
  double matmul_tflops = 0;       // achieved fp32 matmul rate (slope of time vs flops)
  double memory_gbps = 0;         // achieved bandwidth of streaming kernels (add, mul, scale, slice,
                                  // concat, identity, cast, adam: time vs op.bytes)
  double launch_overhead_us = 0;  // intercept of the memory fit, >= 0
  double vector_efficiency = 1;   // median achieved flop rate of the other non-matmul kernels
                                  // (norms, softmax, GELU, loss, ...) / matmul_tflops, in (0, 1]
  LinearFit matmul, memory;
};
/// Errors: fewer than two distinct matmul or streaming samples.
Result<ComputeFit> FitCompute(const std::vector<KernelSample>& samples);

/// The `cpu-local` cluster: one node of `ranks` devices (one per process)
/// with the fitted device and the fitted link on both intra and inter
/// links; ring collectives; no interference (not measured).
ClusterSpec MakeCpuLocalCluster(const ComputeFit& compute, const CollectiveFit& comm, int ranks,
                                const std::string& device_name);

/// A profile database for `device`: every kernel sample, and for every
/// collective op of `program` (if any) whose (type, group size, bytes) was
/// measured, its signature on `cluster`.
ProfileDb MakeProfileDb(const std::string& device, const std::vector<KernelSample>& kernels,
                        const std::vector<CollectiveSample>& collectives, const Program* program,
                        const ClusterSpec& cluster);

}  // namespace concerto
