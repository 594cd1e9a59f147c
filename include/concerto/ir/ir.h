// The Concerto IR: a Program is a device mesh, one Graph per distinct rank
// role, and the map from ranks to roles. See docs/ir.md for the text form.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace concerto {

enum class DType { kF32, kF16, kBF16, kI32, kI64 };
enum class OpKind { kCompute, kCollective, kSend, kRecv, kCopy };
enum class CollectiveType { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast };
enum class ReduceOp { kSum, kMax };
enum class Phase { kNone, kForward, kBackward, kOptimizer };

/// The fixed vocabulary of compute types. Each has real semantics (docs/ir.md)
/// that the runtime executes and that CheckComputeShapes enforces.
enum class ComputeType {
  kMatmul,          // (a, b) -> c; attrs transpose_a, transpose_b; leading dims batch
  kAdd,             // (x, y) -> x + y; y may broadcast over leading dims
  kMul,             // (x, y) -> x * y, same shapes
  kScale,           // (x) -> x * attrs.scale
  kGelu,            // (x) -> gelu(x) (tanh approximation)
  kGeluGrad,        // (dy, x) -> dx
  kSilu,            // (x) -> x * sigmoid(x)
  kSiluGrad,        // (dy, x) -> dx
  kSwiglu,          // (gate, up) -> silu(gate) * up
  kSwigluGrad,      // (dy, gate, up) -> (dgate, dup)
  kLayerNorm,       // (x, gamma, beta) -> y over the last dim; attrs eps
  kLayerNormGrad,   // (dy, x, gamma) -> (dx, dgamma, dbeta)
  kRmsNorm,         // (x, gamma) -> y over the last dim; attrs eps
  kRmsNormGrad,     // (dy, x, gamma) -> (dx, dgamma)
  kSoftmax,         // (x) -> softmax over the last dim
  kSoftmaxGrad,     // (dy, y) -> dx
  kAttention,       // (q, k, v) [b, s, heads*d] -> o; attrs heads, kv_heads, causal
  kAttentionGrad,   // (do, q, k, v) -> (dq, dk, dv)
  kEmbedding,       // (table [V, h], ids [b, s]) -> [b, s, h]; rows outside a sharded table's slice give 0
  kEmbeddingGrad,   // (dy [b, s, h], ids) -> dtable [V, h]
  kReduceMax,       // (x) -> max over the last dim
  kSumExp,          // (x, m) -> sum(exp(x - m)) over the last dim
  kGatherTarget,    // (logits [b, s, V], labels [b, s]) -> logits[label] (0 outside a vocab shard)
  kCrossEntropy,    // (m, z, target) -> mean(log z + m - target), a scalar
  kCrossEntropyGrad,// (logits, m, z, labels) -> dlogits = (softmax - onehot) / (b*s)
  kAdam,            // (param, grad, m, v) -> (param', m', v'); attrs lr, beta1, beta2, eps, step
  kSlice,           // (x) -> x[start:start+len] on attrs.axis
  kConcat,          // (x...) -> concat on attrs.axis
  kCast,            // (x) -> x in the output's dtype
  kIdentity,        // (x) -> x (e.g. a fused collective's split, a marker)
  // Mixture of experts (docs/ir.md 1.6): routing, dispatch and combine.
  kTopK,            // (probs [..., E]) -> (gates [..., k], ids [..., k]); attrs k, normalize
  kTopKGrad,        // (dgates, ids, probs) -> dprobs [..., E]; attrs normalize
  kMoeDispatch,     // (x [G, n, h], ids [G, n, k]) -> buffers [E, G*C, h] (capacity C per group)
  kMoeDispatchGrad, // (dbuffers [E, G*C, h], ids) -> dx [G, n, h]
  kMoeCombine,      // (y [E, G*C, h], ids, gates [G, n, k]) -> out [G, n, h]
  kMoeCombineGrad,  // (dout, y, ids, gates) -> (dy [E, G*C, h], dgates)
  kTranspose,       // (x) -> x with dims attrs.axis0 and attrs.axis1 swapped
  // Convolutional networks (NCHW; docs/ir.md 1.6).
  kRelu,            // (x) -> max(x, 0)
  kReluGrad,        // (dy, x) -> dy * (x > 0)
  kConv2d,          // (x [N, C, H, W], w [K, C, R, S]) -> y [N, K, P, Q]; attrs stride, padding
  kConv2dGrad,      // (dy, x, w) -> (dx, dw)
  kMaxPool2d,       // (x [N, C, H, W]) -> y [N, C, P, Q]; attrs kernel, stride, padding
  kMaxPool2dGrad,   // (dy, x) -> dx (to the first maximum of each window)
  kBatchNorm,       // (x [N, C, ...], gamma [C], beta [C][, sum [1, C], sqdev [1, C]]) -> (y, mean [C], invstd [C]); attrs eps, count
  kBatchNormGrad,   // (dy, x, gamma, mean, invstd[, gstats]) -> (dx, dgamma, dbeta)
  // Synchronised batch norm: the statistics summed over every rank by an all-reduce.
  kBatchNormStats,      // (x [N, C, ...][, sum [1, C]]) -> [1, C]: sum x, or sum (x - sum/count)^2, per channel over this rank's part
  kBatchNormGradStats,  // (dy, x, mean, invstd) -> gstats [2, C]: sum dy, sum dy xhat per channel
};

int DTypeBytes(DType dtype);
std::string_view ToString(DType v);
std::string_view ToString(OpKind v);
std::string_view ToString(CollectiveType v);
std::string_view ToString(ReduceOp v);
std::string_view ToString(Phase v);
std::string_view ToString(ComputeType v);
std::optional<DType> ParseDType(std::string_view s);
std::optional<OpKind> ParseOpKind(std::string_view s);
std::optional<CollectiveType> ParseCollectiveType(std::string_view s);
std::optional<ReduceOp> ParseReduceOp(std::string_view s);
std::optional<Phase> ParsePhase(std::string_view s);
std::optional<ComputeType> ParseComputeType(std::string_view s);
/// Every compute type name, in enum order (for help text and docs).
std::vector<std::string_view> AllComputeTypeNames();

struct MeshAxis {
  std::string name;
  int size = 1;
};

/// Named axes; rank = row-major index over the axes (last axis fastest).
struct Mesh {
  std::vector<MeshAxis> axes;

  int NumRanks() const;
  /// Index of the axis called `name`, or -1.
  int AxisIndex(std::string_view name) const;
  std::vector<int> Coords(int rank) const;
  int RankOf(const std::vector<int>& coords) const;
};

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;  // this rank's local shape
  DType dtype = DType::kBF16;
  /// Per dimension: the mesh axes it is sharded over (empty: replicated).
  std::vector<std::vector<std::string>> sharding;
  /// Mesh axes over which this tensor holds a pending partial sum.
  std::vector<std::string> partial;
  /// Per dimension (or empty: no dimension is segmented): the global sizes of
  /// segments laid side by side, each split over the dim's axes on its own, so
  /// rank block c holds block c of every segment (a fused q/k/v weight
  /// [q | k | v] holds [q_c | k_c | v_c]); empty for a plain dimension.
  std::vector<std::vector<int64_t>> segments;

  int64_t NumElements() const;
  int64_t Bytes() const { return NumElements() * DTypeBytes(dtype); }
};

/// A communication group: mesh axes (the ranks that differ only along them)
/// or an explicit list of global ranks.
struct Group {
  std::vector<std::string> axes;
  std::vector<int> ranks;
};

/// The other end of a send/recv: an offset along a mesh axis, or a rank.
struct Peer {
  std::string axis;
  int offset = 0;
  int rank = -1;
};

struct Tags {
  Phase phase = Phase::kNone;
  int layer = -1;
  int microbatch = -1;
  /// What a collective is for, as frontends mark it: "grad_sync" (data-parallel
  /// gradient reduction), "param_gather" (ZeRO parameter all-gather),
  /// "activation" (tensor/sequence/expert parallel), "pipeline"; "" unknown.
  std::string purpose;
};

struct Op {
  int id = 0;
  std::string name;
  OpKind kind = OpKind::kCompute;
  std::string stream;
  std::vector<std::string> inputs;   // tensor names
  std::vector<std::string> outputs;  // tensor names
  std::vector<int> control_deps;     // op ids that must finish first

  // kCompute (and kCopy uses bytes).
  ComputeType compute_type = ComputeType::kIdentity;
  std::map<std::string, double> attrs;
  double flops = 0;
  double bytes = 0;  // compute/copy: bytes moved to and from memory

  // kCollective / kSend / kRecv.
  CollectiveType collective = CollectiveType::kAllReduce;
  ReduceOp reduce = ReduceOp::kSum;
  Group group;
  Peer peer;
  int tag = 0;
  int64_t message_bytes = 0;  // per-rank payload (the input buffer)

  std::optional<double> duration_us;  // measured; overrides the cost model
  Tags tags;
  std::vector<int> fused_from;  // ids of the ops a fusion rewrite replaced

  bool IsComm() const {
    return kind == OpKind::kCollective || kind == OpKind::kSend || kind == OpKind::kRecv;
  }
  double Attr(const std::string& key, double fallback) const {
    auto it = attrs.find(key);
    return it == attrs.end() ? fallback : it->second;
  }
};

struct Graph {
  std::string name;
  std::vector<std::string> streams = {"compute", "comm"};
  std::vector<Tensor> tensors;
  std::vector<Op> ops;  // program order
};

struct Role {
  std::string name;
  std::string graph;
  std::vector<int> ranks;
};

struct Program {
  std::string name;
  Mesh mesh;
  std::vector<Graph> graphs;
  std::vector<Role> roles;

  /// Index into roles of the role that `rank` runs, or -1.
  int RoleOfRank(int rank) const;
  /// The graph a role runs (asserts that it exists).
  const Graph& GraphOf(const Role& role) const;
  Graph& GraphOf(const Role& role);
  int GraphIndex(std::string_view name) const;
};

/// Global ranks in `group` as seen from `rank`, ascending. Empty when the
/// group names an unknown axis.
std::vector<int> GroupRanks(const Mesh& mesh, const Group& group, int rank);
/// The smallest rank of `group` as seen from `rank`, found without listing
/// the members (an axis group: the rank's coordinates on its axes set to 0):
/// equal for every member, so per-group work can be keyed by it instead of
/// being repeated per rank. -1 when the group names an unknown axis or lists
/// no ranks.
int GroupLeader(const Mesh& mesh, const Group& group, int rank);
/// Text that is equal for equal group specs ("axes|ranks"), for map keys.
std::string GroupSpecKey(const Group& group);
/// The peer rank of a send/recv on `rank`, or -1 when it falls off the mesh.
int PeerRank(const Mesh& mesh, const Peer& peer, int rank);
/// Readable label "op 12 'layer3.fc1'" used in every message about an op.
std::string OpLabel(const Op& op);

}  // namespace concerto
