// Cluster specs: devices, links and collective algorithm of a training cluster.
// Built-in presets and files (YAML or JSON). Values and sources: docs/cost-model.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concerto/util/status.h"

namespace concerto {

struct DeviceSpec {
  std::string name;
  double peak_tflops_bf16 = 0;  // dense, per device
  double peak_tflops_fp16 = 0;
  double peak_tflops_fp32 = 0;
  double memory_bandwidth_gbps = 0;  // GB/s (1e9 bytes/s)
  double memory_gb = 0;
  /// Device memory no schedule gets: CUDA context, NCCL buffers, the
  /// framework's allocator slack (docs/cost-model.md, "Memory budget").
  double memory_reserve_gb = 0;
  double matmul_efficiency = 0.8;   // achieved fraction of peak on large GEMMs
  /// Achieved fraction of peak of a fused (FlashAttention-style) attention
  /// kernel, forward and backward; 0 takes matmul_efficiency (docs/cost-model.md,
  /// "Attention").
  double attention_efficiency = 0;
  double vector_efficiency = 0.5;   // achieved fraction of peak on non-matmul flops
  double memory_efficiency = 0.85;  // achieved fraction of memory bandwidth
  double launch_overhead_us = 5;    // per kernel
  /// Size-aware GEMM efficiency (docs/cost-model.md, "GEMM shapes"): streaming
  /// multiprocessors the output tiles are spread over in waves; 0 turns the
  /// shape model off (every matmul at matmul_efficiency, the size-blind roofline).
  int sm_count = 0;
  /// Reduction depth K at which a GEMM reaches half of its large-K efficiency
  /// (the minimum-size ramp K / (K + gemm_ramp_k), normalised to 1 at K = 8192).
  double gemm_ramp_k = 64;

  bool operator==(const DeviceSpec&) const = default;
};

struct LinkSpec {
  double bandwidth_gbps = 0;  // GB/s per device, one direction
  double latency_us = 0;      // per algorithm step (alpha)

  bool operator==(const LinkSpec&) const = default;
};

/// The links a device's traffic crosses (docs/cost-model.md, "Shared links").
/// Each device has an intra-node port (NVLink/NVSwitch or PCIe) and a share
/// of its node's NICs (rail-optimised: GPU i uses NIC i * nics / devices),
/// each direction a separate resource whose capacity is the bandwidth the
/// link's alpha-beta price assumes. Collectives in flight together divide a
/// link fairly (max-min); compute interference grows with their number.
struct TopologySpec {
  /// What the intra-node link is: "nvswitch" or "pcie" (a port per device,
  /// each direction its own capacity of intra_node.bandwidth_gbps), or "bus"
  /// (one medium per node that all of the node's transfers cross, both
  /// directions, of capacity intra_node.bandwidth_gbps: a ring of k ranks on
  /// it gives each B / k; the CPU testbed's shaped loopback, one queue for
  /// every packet; docs/cost-model.md, "Shared links").
  std::string intra_link = "nvswitch";
  /// NICs per node (0: one per device), for reports and docs.
  int nics_per_node = 0;
  /// True when inter-node traffic also crosses the intra-node port (a NIC behind
  /// the same PCIe link as the GPU's peer traffic): it then loads that port by
  /// inter_node.bandwidth / intra_node.bandwidth of its capacity.
  bool network_crosses_intra_link = false;
  /// 0 turns link sharing off (every transfer at its alpha-beta price, whatever
  /// else is in flight); 1 (default) shares links.
  bool share_links = true;
  /// Each collective in flight beyond the first adds this fraction of
  /// `interference` to the compute slowdown (NCCL kernels of several
  /// communicators take SMs each): slowdown f * (1 + growth * (n - 1)).
  double interference_growth = 1.0;
  /// Algorithm bandwidth (bytes / time) of an all-reduce inside one node over
  /// NVLink SHARP (NVSwitch in-network reduction, NCCL's NVLS); 0: none (A100
  /// and older). An all-reduce within a node takes the faster of the ring and
  /// NVLS (docs/cost-model.md, "NVLS").
  double nvls_algbw_gbps = 0;

  bool IsBus() const { return intra_link == "bus"; }

  bool operator==(const TopologySpec&) const = default;
};

struct ClusterSpec {
  std::string name;
  std::string description;
  int nodes = 1;
  int devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node;  // per device inside a node (NVLink, PCIe)
  LinkSpec inter_node;  // per device between nodes (node NIC bandwidth / devices per node)
  /// "auto" (ring inside a node, hierarchical across nodes), "ring", "tree", "hierarchical".
  std::string collective_algorithm = "auto";
  /// Compute slows by this fraction while a collective is in flight (0.2 = 20% slower).
  double interference = 0;
  /// Compute slows by this fraction while every other device of its node
  /// computes too, in proportion to the share of them computing: processes
  /// sharing cores and memory bandwidth (the CPU testbed; `concerto profile`
  /// measures it). 0 for GPUs, whose kernels share nothing across devices.
  /// Applies to compute-bound kernels (matmuls, attention, the vector
  /// kernels: KernelClass kTensorCore and kVector).
  double corun_slowdown = 0;
  /// The same for memory-bound (streaming) kernels, which share the memory
  /// bus: on the testbed an add ran 4-73% slower beside the other rank's
  /// where a matmul ran 0-13% slower (docs/results.md, fourteenth session).
  /// -1 (a file without the field): as corun_slowdown.
  double corun_slowdown_memory = -1;
  /// A transfer slows by this fraction while one of its ranks computes: on a
  /// CPU the communication's progress (copies, the network stack, MPI's
  /// polling) needs the cores the kernels take (`concerto profile` measures
  /// it: an all_reduce while every rank computes against one alone). 0 for
  /// GPUs, whose copy engines and NCCL kernels do not wait for the compute
  /// stream. Applies to transfers over shared links (topology.share_links).
  double comm_corun_slowdown = 0;
  /// A collective or send/recv that starts while one of its ranks computes
  /// ends no earlier than this much later, or than its ranks' compute
  /// stopping, whichever comes first (its bytes move meanwhile): on a CPU
  /// whose cores the compute threads fill, each message waits for the
  /// scheduler to give MPI's thread a core, whatever its size (`concerto profile`
  /// measures it: a small all_reduce while every rank computes against one
  /// alone; on the 2-vCPU testbed 2 KiB all_reduces took 5-30 ms beside
  /// backward kernels where alone they take 0.05 ms). 0 for GPUs.
  double comm_corun_latency_us = 0;
  /// A link that idled gives the next transfer on it a head start: idle time
  /// t takes min(t, this) off its transfer time (a token bucket refilled at
  /// the link's rate: a shaped or policed link, tbf on the testbed). The
  /// collective prices are timed back to back, with the bucket empty.
  /// `concerto profile` measures it: a 1 MiB all_reduce right after another
  /// against one after 5 ms idle (1.1-1.3 ms on the testbed). 0 for GPUs.
  double link_burst_us = 0;
  /// The first part of the co-run wait (at most comm_corun_latency_us):
  /// a transfer that starts while its ranks compute, on a stream whose
  /// thread idled before it (not one that goes straight on from the previous
  /// op), moves nothing for this long, or until they stop computing, then
  /// its bytes move (at 1 / (1 + comm_corun_slowdown) while they still
  /// compute). `concerto profile` measures it through the runtime's
  /// executor: a 1 MiB all_reduce issued after a matmul, beside more, its
  /// end less its time alone (7-8 ms on the testbed, where a 2 KiB message's
  /// wait is 15-16 ms). 0: its bytes move from the start.
  double comm_corun_hold_us = 0;
  /// How much a rank's compute time between two synchronisations varies
  /// (its standard deviation over its mean, a coefficient of variation):
  /// the ranks of a collective or a send/recv pair reach it at different
  /// times and it starts with the last of them, so each rendezvous starts
  /// the expected maximum of its members' arrivals past the last simulated
  /// arrival (docs/cost-model.md, "Jitter"). `concerto profile` measures it:
  /// every rank runs the same ~15 ms of kernels at once, the slowest rank's
  /// time past their mean (0.03-0.15 on the testbed's traces). 0 for GPUs,
  /// whose kernels of one shape take the same time to a few percent.
  double compute_jitter = 0;
  /// The co-run slowdown of streaming kernels (corun_slowdown_memory, or
  /// corun_slowdown when that is -1).
  double CorunSlowdownMemory() const { return corun_slowdown_memory >= 0 ? corun_slowdown_memory : corun_slowdown; }
  TopologySpec topology;

  int NumDevices() const { return nodes * devices_per_node; }
  /// The memory a schedule may use per rank by default: memory_gb minus
  /// memory_reserve_gb, in bytes (1 GB = 1e9 bytes).
  int64_t DeviceBudgetBytes() const {
    return static_cast<int64_t>((device.memory_gb - device.memory_reserve_gb) * 1e9);
  }
  int NodeOf(int rank) const { return rank / devices_per_node; }

  bool operator==(const ClusterSpec&) const = default;
};

/// Names of the built-in presets (a800-4x8, h100-8x8, commodity-4x8, ...).
std::vector<std::string> ClusterPresetNames();
/// A preset by name, or a spec file (.yaml, .yml, .json) by path.
Result<ClusterSpec> LoadCluster(const std::string& name_or_path);
/// A cluster file's text (YAML, or JSON when `json`), read and validated;
/// errors start with `source`. LoadCluster reads files through it.
Result<ClusterSpec> ParseCluster(const std::string& text, const std::string& source, bool json);
/// Checks a spec's values (positive sizes, finite bandwidths); names the field.
Status ValidateCluster(const ClusterSpec& spec, const std::string& source);
/// The spec as JSON in the cluster-file format (LoadCluster reads it back unchanged).
std::string ClusterToJson(const ClusterSpec& spec);

/// The interference a run uses: `requested` when >= 0 (an option's value),
/// else the cluster's (-1, the options' default). The one place the sentinel
/// is resolved: the simulator, the decomposition pass, the concerto search
/// and the reports call it.
double EffectiveInterference(double requested, const ClusterSpec& cluster);

}  // namespace concerto
