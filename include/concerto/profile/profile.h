// Profiling this machine for the cost model (`concerto profile`,
// docs/runtime.md "Profiling"): the runtime's own kernels timed by op
// signature, collectives timed through any Communicator (MPI processes or
// FakeWorld threads), least-squares fits of achieved compute rate, memory
// bandwidth, launch overhead and collective alpha/beta, and from them a
// profile database (ProfileDb) and a `cpu-local` cluster spec.
#pragma once

#include <cstdint>
#include <set>
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

/// Whether input `slot` of `op` must hold non-negative values (cross
/// entropy's sum of exponentials, Adam's second moment).
bool NonNegativeInput(const Op& op, size_t slot);

/// Fills `data` (sized to `t`) with the values a run gives a kernel, for
/// timing it: floats signed with mean 0 and standard deviation 1 (1 + |x|
/// where `non_negative`), integer tensors 0; deterministic, a different
/// sequence per input `slot`. CPU kernels' speed depends on the values
/// (libm branches on sign and size).
void FillSynthetic(const Tensor& t, size_t slot, bool non_negative, std::vector<float>* data);

/// Times every distinct compute op (by signature) of every role's graph of
/// `program`, on the role's first rank's shard, with the runtime's kernels
/// (RunKernel) on synthetic inputs (FillSynthetic). `cluster` gives the
/// signature's device context. Sets OpenBLAS to one thread (process-wide),
/// as a run uses. `seen` (optional): signatures
/// already timed, skipped; the ones timed here are added. Errors: an op the
/// runtime cannot run.
Result<std::vector<KernelSample>> ProfileKernels(const Program& program, const ClusterSpec& cluster,
                                                 const KernelProfileOptions& options = {},
                                                 std::set<std::string>* seen = nullptr);

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

/// A one-way transfer's measured time (rank 0 sends, rank 1 receives; the
/// slower of the two, median over repetitions).
struct OneWaySample {
  int64_t bytes = 0;
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
/// process's memory copies, not a network); with `one_way` also
/// ProfileOneWay of DefaultOneWaySizes(`max_bytes`).
Result<std::vector<CollectiveSample>> ProfileCollectivesInProcess(int ranks, const std::vector<CollectiveSpec>& specs,
                                                                  int reps,
                                                                  std::vector<OneWaySample>* one_way = nullptr,
                                                                  int64_t max_bytes = 0);

/// Sizes of the one-way sweep: max_bytes / 16, / 4 and max_bytes (multiples
/// of 4, at least 64 KiB: the bandwidth, not the latency).
std::vector<int64_t> DefaultOneWaySizes(int64_t max_bytes);
/// Times rank 0 sending each size to rank 1 (the others wait), after a
/// barrier of the world; every rank returns the same samples. Needs a world
/// of at least 2 ranks (1: no samples).
Result<std::vector<OneWaySample>> ProfileOneWay(Communicator& comm, const std::vector<int64_t>& sizes, int reps);

/// The samples as JSON ({"format": "concerto-collective-samples", "ranks",
/// "samples": [{collective, group_size, bytes, time_us, reps}]}) and back;
/// errors name the file, the sample index and the field.
/// One-way samples, when there are any, go in an optional "one_way" list
/// ([{bytes, time_us, reps}]); reading fills `one_way` when given.
std::string WriteCollectiveSamples(const std::vector<CollectiveSample>& samples, int ranks,
                                   const std::vector<OneWaySample>& one_way = {});
Result<std::vector<CollectiveSample>> ReadCollectiveSamples(const std::string& path,
                                                            std::vector<OneWaySample>* one_way = nullptr);

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
/// remainder (time minus the bandwidth term, at least 0) of the samples of
/// at most 4 KiB (or of the smallest size measured): mid-size messages on a
/// tbf-shaped link measure its token bucket, not the latency. The two are
/// refined alternately. When that leaves no positive time per byte (noise:
/// the large messages no slower than alpha predicts), alpha is 0 and the
/// bandwidth comes from the large samples alone.
///
/// With one-way samples (ProfileOneWay) it also decides what the node's link
/// is: per-device ports (each rank of a ring gets B whatever the others do)
/// or one medium all of the node's traffic crosses (a bus of B: each of a
/// ring's k senders gets B / k, a lone transfer all of it; the testbed's
/// tbf-shaped loopback is one queue for both directions). Both are fitted
/// on the collectives, and the one whose price of the one-way transfers is
/// closer to their measured times (median |log(predicted / measured)|) wins.
/// Without one-way samples: ports.
struct CollectiveFit {
  double latency_us = 0;       // alpha per step
  double bandwidth_gbps = 0;   // B, GB/s per rank (ports) or of the node's medium (bus)
  double max_rel_error = 0;    // worst |fit - measured| / measured over all collective samples
  int points = 0;
  std::string intra_link = "nvswitch";  // "nvswitch" (ports) or "bus": TopologySpec::intra_link
  double ports_gbps = 0;                // B of the ports fit
  double bus_gbps = 0;                  // B of the bus fit (0: not fitted)
  double one_way_gbps = 0;              // bytes / time of the largest one-way sample (0: none)
  double ports_one_way_error = 0;       // median |log(predicted / measured)| of the one-way samples
  double bus_one_way_error = 0;
  int one_way_points = 0;
};
/// Errors: no sample on two or more ranks, or a non-positive time per byte.
Result<CollectiveFit> FitCollectives(const std::vector<CollectiveSample>& samples,
                                     const std::vector<OneWaySample>& one_way = {});

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
/// Kernels timed in several passes, merged: each signature's time the
/// median over the passes that timed it (reps summed), in the first
/// pass's order; each pass's total time; their max / min (1: one pass).
struct KernelPasses {
  std::vector<KernelSample> kernels;
  std::vector<double> pass_totals_us;
  double spread = 1;
};
KernelPasses MedianKernelPasses(const std::vector<std::vector<KernelSample>>& passes);

/// Errors: fewer than two distinct matmul or streaming samples.
Result<ComputeFit> FitCompute(const std::vector<KernelSample>& samples);

/// Interference: how much slower compute runs while a collective is in
/// flight on another thread of the same process (the machine model's
/// `interference` f: compute progresses at 1/(1+f) while communication is
/// in flight; docs/architecture.md).
struct InterferenceOptions {
  /// The collective kept in flight: an all_reduce (sum) of this many bytes
  /// over the whole world, issued back to back by a second thread.
  int64_t comm_bytes = 16 << 20;
  /// The small all_reduce that measures the per-message co-run latency
  /// (comm_corun_latency_us): small enough that its transfer is nothing.
  int64_t small_comm_bytes = 2048;
  /// The mid-size all_reduce that measures the link's burst (link_burst_us:
  /// right after another against after idle_us of idle) and the first part
  /// of the co-run wait, in which a transfer moves nothing
  /// (comm_corun_hold_us: run by the executor beside a chain of matmuls
  /// about the round's wait long, its end less its time after idle).
  int64_t mid_comm_bytes = 1 << 20;
  int64_t idle_us = 5000;
  /// The segment of kernels every rank runs at once to measure the jitter
  /// (compute_jitter): about this long, as many kernels on every rank.
  double jitter_segment_us = 15000;
  /// The compute kernels, run with the runtime's own kernels (RunKernel):
  /// a matmul [m, m] x [m, m] and an elementwise add of this many floats.
  int64_t matmul_size = 512;
  int64_t add_elements = int64_t{1} << 22;
  /// Rounds of (alone phase, overlapped phase), so that a drift in the
  /// machine's load affects both alike. Per round, kernel and phase at
  /// least min_samples timed runs; an overlapped phase lasts at least
  /// min_time_s; once max_time_s has passed a rank stops asking for more.
  int rounds = 5;
  int min_samples = 3;
  double min_time_s = 0.3;
  double max_time_s = 20;
};

/// One kernel's medians, averaged over the ranks.
struct InterferenceKernel {
  std::string kernel;      // "matmul 512x512x512", "add 4194304 floats"
  double alone_us = 0;     // every rank computing, no communication
  double overlapped_us = 0;  // the same while the all_reduce is in flight
  int alone_reps = 0, overlapped_reps = 0;  // rank 0's counts
  double solo_us = 0;      // rank 0 computing while the other ranks wait (0: not measured)
};

struct InterferenceMeasurement {
  std::vector<InterferenceKernel> kernels;
  int ranks = 0;
  int64_t comm_bytes = 0;
  int collectives = 0;        // all_reduces issued during the overlapped phases
  std::vector<double> round_factors;  // InterferenceFactor of each round's medians
  double interference = 0;    // MedianFactor(round_factors)
  std::vector<double> corun_round_factors;  // CorunSlowdown of each round's solo and alone medians,
                                            // compute-bound kernels (the matmul)
  double corun = 0;           // MedianFactor(corun_round_factors): the co-run slowdown of compute-bound kernels
  std::vector<double> corun_memory_round_factors;  // the same for streaming kernels (the add)
  double corun_memory = 0;    // their median: the co-run slowdown of streaming kernels
  std::vector<double> comm_alone_us;       // per round: the all_reduce of comm_bytes, nothing computing
  std::vector<double> comm_computing_us;   // per round: its median while every rank computes
  std::vector<double> comm_corun_round_factors;  // computing / alone - 1, clamped to [0, 10]
  double comm_corun = 0;      // their median: the communication's co-run slowdown
  int64_t small_comm_bytes = 0;
  std::vector<double> small_comm_alone_us;      // per round: the small all_reduce's median, nothing computing
  std::vector<double> small_comm_computing_us;  // per round: its median while every rank computes
  double comm_corun_latency_us = 0;  // median over the rounds of max(0, computing - alone)
  int64_t mid_comm_bytes = 0;
  std::vector<double> mid_back_to_back_us;  // per round: the mid-size all_reduce right after another
  std::vector<double> mid_idle_us;          // per round: the same after idle_us of idle
  double link_burst_us = 0;                 // median over the rounds of max(0, back_to_back - idle)
  std::vector<double> mid_wait_compute_us;  // per round: the compute beside it in the wait probe
  std::vector<double> mid_wait_after_us;    // per round: its end after that compute stopped
  std::vector<double> hold_round_us;        // per round: the mean of its repetitions' holds
  std::vector<double> hold_samples_us;      // every repetition's hold (clamped to [0, compute]), round after round
  double comm_corun_hold_us = 0;            // their median
  std::vector<double> jitter_segment_us;    // per round: the jitter segment's mean time over the ranks
  std::vector<double> jitter_round;         // per round: mean of (slowest - mean) / mean, over e_n
  double compute_jitter = 0;                // their median (at most 1)
};

/// f = (sum of the kernels' overlapped times) / (sum of their alone times)
/// - 1, clamped to [0, 10] (the cluster file's range): the slowdown of a
/// compute mix of one matmul and one elementwise op. 0 for no kernels.
double InterferenceFactor(const std::vector<InterferenceKernel>& kernels);
/// The lower median of per-round factors (robust to a round hit by a load
/// spike on a shared machine); 0 when empty.
double MedianFactor(const std::vector<double>& factors);

/// Every rank of the world calls this together, `rounds` times three phases.
/// Every phase runs the kernels in turn (matmul, add, matmul, ...), so that
/// the ranks' kernels meet in the same mix in each.
/// Solo: after a world barrier rank 0 times each kernel while the others
/// wait in the next barrier (solo_us; per round CorunSlowdown of the solo
/// and alone medians of the compute-bound kernels goes to
/// corun_round_factors, their median to corun; of the streaming kernels to
/// corun_memory_round_factors and corun_memory). After the every-rank
/// phase one all_reduce of comm_bytes runs with nothing computing
/// (comm_alone_us); the overlapped phase's all_reduces, which run while every
/// rank computes, give comm_computing_us. Then a small
/// all_reduce (small_comm_bytes) is timed alone (small_comm_alone_us) and
/// issued back to back while every rank runs the kernels (min_time_s;
/// small_comm_computing_us): the per-message wait for a core,
/// comm_corun_latency_us, is the median over the rounds of the difference.
/// Then an all_reduce of mid_comm_bytes, timed on its slowest rank: right
/// after another and after idle_us of idle (mid_back_to_back_us,
/// mid_idle_us: the link's burst, link_burst_us, is the median over the
/// rounds of the difference), and run by the runtime's executor on a comm
/// stream beside a chain of matmuls about the round's wait long on the
/// compute stream, issued once the first is done (mid_wait_compute_us: the
/// matmuls after its start; its end after them mid_wait_after_us): its time
/// less its time after idle, slowed by the round's comm_corun while the
/// matmuls went on, is how long it moved nothing (hold_samples_us,
/// hold_round_us the mean over repetitions; their median
/// comm_corun_hold_us). Per round computing / alone - 1 of the
/// all_reduce of comm_bytes goes to comm_corun_round_factors, their median
/// to comm_corun (its messages follow each other on a busy thread: no hold).
/// Alone: after a world barrier every rank times each kernel. Overlapped:
/// a second thread issues all_reduces of comm_bytes on the world back to
/// back while this thread times the kernels, keeping a run only when the
/// collective was in flight from its start to its end. The ranks agree on
/// when to stop through the all_reduce itself (each contributes 1 in
/// element 0 once it has enough samples; they stop when the sum reaches the
/// world size). Per kernel the median of each phase's runs over all rounds,
/// averaged over the ranks; per round the same from that round's runs,
/// whose factor (InterferenceFactor) goes to round_factors; the result is
/// their median. Every rank returns the same measurement.
/// OpenBLAS runs one thread (set process-wide), as in a run. Errors: a world of fewer than 2 ranks, comm_bytes not a positive
/// multiple of 4, any communicator error.
Result<InterferenceMeasurement> MeasureInterference(Communicator& comm, const InterferenceOptions& options);
/// MeasureInterference over a FakeWorld of `ranks` threads (measures this
/// process's memory copies competing with compute, not a network).
Result<InterferenceMeasurement> MeasureInterferenceInProcess(int ranks, const InterferenceOptions& options);

/// Co-running: how much slower a kernel runs while every rank computes (as
/// in a step) than while only one does (as ProfileKernels times it, one
/// process): the processes share cores, caches and memory bandwidth.
/// sum(corun) / sum(solo) - 1 over the kernels, clamped to [0, 10] (a co-run
/// faster than solo is noise, not a speed-up); 0 when either is empty, their
/// sizes differ or a sum is not positive.
double CorunSlowdown(const std::vector<double>& solo_us, const std::vector<double>& corun_us);

/// As JSON ({"format": "concerto-interference", ...}) and back; errors name
/// the file and the field.
std::string WriteInterference(const InterferenceMeasurement& m);
Result<InterferenceMeasurement> ReadInterference(const std::string& path);

/// The `cpu-local` cluster: one node of `ranks` devices (one per process)
/// with the fitted device and the fitted link on both intra and inter
/// links; ring collectives; `interference`, `corun_slowdown` and
/// `corun_slowdown_memory` as measured (MeasureInterference's interference,
/// corun and corun_memory; 0 when not measured; memory -1: as corun_slowdown).
ClusterSpec MakeCpuLocalCluster(const ComputeFit& compute, const CollectiveFit& comm, int ranks,
                                const std::string& device_name, double interference = 0, double corun_slowdown = 0,
                                double corun_slowdown_memory = -1, double comm_corun_slowdown = 0,
                                double comm_corun_latency_us = 0, double link_burst_us = 0,
                                double comm_corun_hold_us = 0, double compute_jitter = 0);

/// A profile database for `device`: every kernel sample, and for every
/// collective op of `program` (if any) whose (type, group size, bytes) was
/// measured, its signature on `cluster`.
ProfileDb MakeProfileDb(const std::string& device, const std::vector<KernelSample>& kernels,
                        const std::vector<CollectiveSample>& collectives, const Program* program,
                        const ClusterSpec& cluster);

/// What a run measured for one compute signature (DurationsFromTrace).
struct TraceSample {
  std::string signature;  // ProfileDb::Signature on the run's cluster
  double median_us = 0;   // over every occurrence in the trace (ranks, layers, micro-batches)
  int count = 0;
};

/// The compute ops' durations measured inside a real schedule (the Chrome
/// trace `concerto run --trace` writes: one "X" event per op, pid = rank,
/// args.id = the op's id in `program`, the scheduled program the run
/// executed), keyed by each op's ProfileDb signature on `cluster`.
/// Communication ops are left out unless `collectives`: their spans include
/// waiting for the peers, so a collective's instance (its n-th occurrence)
/// counts with the shortest span over the ranks that ran it (the last to
/// arrive waited for nobody); best from a run that issues one op at a time
/// (the `sequential` schedule). Errors name `source` and the event: not a
/// trace, a field of the wrong type, a rank or op id `program` does not have
/// (read wide: no wrap-around), an event whose name differs from its op's, a
/// duration over kMaxProfiledUs.
Result<std::vector<TraceSample>> DurationsFromTrace(const std::string& trace_text, const std::string& source,
                                                    const Program& program, const ClusterSpec& cluster,
                                                    bool collectives = false);

/// Several profile databases of one machine taken at different times
/// (`concerto profile --merge`; the testbed's rounds) made one.
struct MergedProfile {
  ProfileDb db;               // per (device, signature): the median over the databases that hold it
  int entries_in_all = 0;     // entries every database holds
  double median_spread = 1;   // over those entries: max / min of their durations, the median ...
  double max_spread = 1;      // ... and the largest (1 when fewer than two databases hold an entry)
  std::string max_spread_signature;  // the entry with the largest spread
};

/// The per-entry median of `dbs` (the mean of the two middle durations for
/// an even count): a kernel timed once per round between the runs of a
/// long measurement is priced at its typical speed over the whole window,
/// not at the speed of one moment. Entries held by only some databases get
/// the median of those. A zero duration makes no spread. Needs at least
/// one database.
MergedProfile MergeProfiles(const std::vector<ProfileDb>& dbs);

}  // namespace concerto
