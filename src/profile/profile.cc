// Profiling: kernels by signature, collectives by (type, group, bytes), and
// the least-squares fits that turn them into a cpu-local cluster spec.
#include "concerto/profile/profile.h"

#include "concerto/sim/jitter.h"
#include "concerto/util/input_file.h"
#include "concerto/util/json_text.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cmath>
#include <map>
#include <set>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "concerto/cost/cost_model.h"
#include "concerto/ir/graph_index.h"
#include "concerto/ir/op_registry.h"
#include "concerto/lower/transformer.h"
#include "concerto/ir/json_io.h"
#include "concerto/runtime/executor.h"
#include "concerto/runtime/kernels.h"
#include "concerto/schedule/schedule.h"
#include "concerto/util/stopwatch.h"

namespace concerto {

/// Whether input `slot` of `op` must hold non-negative values: a
/// normaliser the kernel takes the log of or divides by (cross entropy's
/// sum of exponentials), or Adam's second moment (its square root).
bool NonNegativeInput(const Op& op, size_t slot) {
  switch (op.compute_type) {
    case ComputeType::kCrossEntropy:
      return slot == 1;
    case ComputeType::kCrossEntropyGrad:
      return slot == 2;
    case ComputeType::kAdam:
      return slot == 3;
    default:
      return false;
  }
}

/// A deterministic fill with the values a run gives a kernel: signed,
/// zero-mean, standard deviation 1 (an Irwin-Hall sum of four uniforms),
/// as activations and gradients of a normalised network are. The values
/// matter for speed on a CPU: libm's tanh and exp branch on sign and size,
/// and gelu over the positive [0.01, 0.5) the first version used ran 1.5x
/// faster than over a run's activations (docs/results.md). Non-negative
/// inputs (NonNegativeInput) get 1 + |x|; integer tensors get 0 (a valid id
/// and label). Each input slot draws its own values (a kernel's q and k are
/// not the same tensor in a run).
void FillSynthetic(const Tensor& t, size_t slot, bool non_negative, std::vector<float>* data) {
  const bool integer = t.dtype == DType::kI32 || t.dtype == DType::kI64;
  uint32_t state = 12345u + 7919u * static_cast<uint32_t>(slot);
  auto uniform = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
  };
  constexpr float kSqrt3 = 1.7320508f;  // the sum of four U(0,1) has variance 1/3
  for (float& x : *data) {
    if (integer) {
      x = 0.0f;
      continue;
    }
    const float normal = (uniform() + uniform() + uniform() + uniform() - 2.0f) * kSqrt3;
    x = non_negative ? 1.0f + std::fabs(normal) : normal;
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  assert(!v.empty());
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

/// The median with an even count's two middle values averaged (Median
/// takes the lower one): for merging timings, where two of them should
/// count alike.
double MidMedian(std::vector<double> v) {
  assert(!v.empty());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// Times one compute op with its own buffers.
Result<KernelSample> TimeKernel(const Op& op, const Graph& graph, const GraphIndex& index, const Mesh& mesh,
                                int rank, const KernelProfileOptions& options) {
  std::vector<std::vector<float>> in_data, out_data;
  std::vector<const Tensor*> in_meta, out_meta;
  for (const std::string& t : op.inputs) in_meta.push_back(&graph.tensors[index.tensor.at(t)]);
  for (const std::string& t : op.outputs) out_meta.push_back(&graph.tensors[index.tensor.at(t)]);
  CONCERTO_RETURN_IF_ERROR(CheckKernel(op, in_meta, out_meta));
  std::vector<KernelArg> in, out;
  in_data.reserve(in_meta.size());
  out_data.reserve(out_meta.size());
  for (const Tensor* t : in_meta) {
    in_data.emplace_back(t->NumElements());
    const size_t slot = in_data.size() - 1;
    FillSynthetic(*t, slot, NonNegativeInput(op, slot), &in_data.back());
    in.push_back({t, in_data.back().data()});
  }
  for (const Tensor* t : out_meta) {
    out_data.emplace_back(t->NumElements(), 0.0f);
    out.push_back({t, out_data.back().data()});
  }
  KernelScratch scratch;  // kept over the repetitions, as a run's stream keeps it
  const KernelContext ctx{&mesh, rank, &scratch};
  CONCERTO_RETURN_IF_ERROR(RunKernel(op, in, out, ctx));  // warm-up
  std::vector<double> times;
  const auto start = Clock::now();
  while (static_cast<int>(times.size()) < options.max_reps &&
         (static_cast<int>(times.size()) < options.min_reps || SecondsSince(start) < options.min_time_s)) {
    const auto t0 = Clock::now();
    CONCERTO_RETURN_IF_ERROR(RunKernel(op, in, out, ctx));
    times.push_back(SecondsSince(t0) * 1e6);
  }
  KernelSample s;
  s.type = op.compute_type;
  s.flops = op.flops;
  s.bytes = op.bytes;
  s.time_us = Median(times);
  s.reps = static_cast<int>(times.size());
  return s;
}

/// A one-rank program of matmuls [m,k] x [k,n] at the given sizes (f32).
Program MatmulSweepProgram() {
  Program p;
  p.name = "profile-matmul-sweep";
  p.mesh.axes = {{"dp", 1}};
  Graph g;
  g.name = "main";
  const std::vector<std::array<int64_t, 3>> sizes = {
      {64, 64, 64},     {128, 128, 128}, {256, 256, 256}, {512, 512, 512},  {768, 768, 768},
      {1024, 1024, 1024}, {1024, 256, 1024}, {256, 1024, 256}, {2048, 512, 512}, {512, 2048, 2048}};
  int id = 0;
  for (const auto& [m, k, n] : sizes) {
    const std::string tag = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    auto tensor = [&](const std::string& name, int64_t r, int64_t c) {
      Tensor t;
      t.name = name + "." + tag;
      t.shape = {r, c};
      t.dtype = DType::kF32;
      t.sharding = {{}, {}};
      g.tensors.push_back(t);
      return t.name;
    };
    Op op;
    op.id = id++;
    op.name = "matmul." + tag;
    op.kind = OpKind::kCompute;
    op.stream = "compute";
    op.compute_type = ComputeType::kMatmul;
    op.inputs = {tensor("a", m, k), tensor("b", k, n)};
    op.outputs = {tensor("c", m, n)};
    op.attrs = {{"transpose_a", 0}, {"transpose_b", 0}};
    op.flops = 2.0 * m * k * n;
    op.bytes = 4.0 * (m * k + k * n + m * n);
    g.ops.push_back(op);
  }
  p.graphs.push_back(g);
  p.roles.push_back(Role{"spmd", "main", {0}});
  return p;
}

/// Ring steps and bandwidth factor of a collective over n ranks
/// (docs/cost-model.md, "Ring").
std::pair<double, double> RingFactors(CollectiveType type, int n) {
  const double m = n - 1;
  switch (type) {
    case CollectiveType::kAllReduce: return {2 * m, 2 * m / n};
    case CollectiveType::kReduceScatter:
    case CollectiveType::kAllToAll: return {m, m / n};
    case CollectiveType::kAllGather: return {m, m};
    case CollectiveType::kBroadcast: return {m, 1};
  }
  return {m, 1};
}

/// Kernels whose time is set by the bytes they stream (a few flops per
/// element): they fit the memory bandwidth. Transcendental (GELU, softmax),
/// row-reduction and gather kernels are compute- or latency-bound on a CPU.
bool IsStreamingKernel(ComputeType t) { return OpInfo(t).kernel_class == KernelClass::kStreaming; }

}  // namespace

Result<std::vector<KernelSample>> ProfileKernels(const Program& program, const ClusterSpec& cluster,
                                                 const KernelProfileOptions& options, std::set<std::string>* seen) {
  SetBlasThreads(1);  // as in a run: one OpenBLAS thread per rank
  std::vector<KernelSample> out;
  std::set<std::string> own;
  if (seen == nullptr) seen = &own;
  for (const Role& role : program.roles) {
    const Graph& g = program.GraphOf(role);
    const GraphIndex index = GraphIndex::Build(g);
    const int rank = role.ranks.empty() ? 0 : role.ranks.front();
    const PriceContext ctx{g, index, program.mesh, rank};
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCompute) continue;
      const std::string sig = ProfileDb::Signature(op, ctx, cluster);
      if (!seen->insert(sig).second) continue;
      Result<KernelSample> s = TimeKernel(op, g, index, program.mesh, rank, options);
      if (!s.ok()) return Status::Error("program '" + program.name + "': " + s.status().message());
      s->signature = sig;
      out.push_back(*s);
    }
  }
  return out;
}

KernelPasses MedianKernelPasses(const std::vector<std::vector<KernelSample>>& passes) {
  KernelPasses out;
  std::map<std::string, std::vector<double>> times;
  std::map<std::string, int> reps;
  for (const std::vector<KernelSample>& pass : passes) {
    double total = 0;
    for (const KernelSample& k : pass) {
      times[k.signature].push_back(k.time_us);
      reps[k.signature] += k.reps;
      total += k.time_us;
    }
    out.pass_totals_us.push_back(total);
  }
  std::set<std::string> seen;
  for (const std::vector<KernelSample>& pass : passes)
    for (const KernelSample& k : pass) {
      if (!seen.insert(k.signature).second) continue;
      KernelSample m = k;
      m.time_us = MidMedian(times[k.signature]);  // two passes: their mean
      m.reps = reps[k.signature];
      out.kernels.push_back(m);
    }
  if (!out.pass_totals_us.empty()) {
    const auto [lo, hi] = std::minmax_element(out.pass_totals_us.begin(), out.pass_totals_us.end());
    out.spread = *lo > 0 ? *hi / *lo : 1;
  }
  return out;
}

Result<std::vector<Program>> DefaultProfilePrograms() {
  std::vector<Program> programs = {MatmulSweepProgram()};
  for (const auto& [hidden, seq] : std::vector<std::pair<int, int>>{{256, 64}, {512, 128}}) {
    ModelConfig m;
    m.name = "profile-gpt-h" + std::to_string(hidden);
    m.family = ModelFamily::kGpt;
    m.layers = 1;
    m.hidden = hidden;
    m.heads = hidden / 64;
    m.kv_heads = m.heads;
    m.ffn_hidden = 4 * hidden;
    m.seq = seq;
    m.vocab = 1024;
    m.batch = 2;
    m.dtype = DType::kF32;
    Result<Program> p = LowerTransformer(m, ParallelPlan{});
    if (!p.ok()) return p.status();
    programs.push_back(std::move(p).value());
  }
  return programs;
}

std::vector<CollectiveSpec> DefaultCollectiveSpecs(int world, int64_t max_bytes) {
  std::vector<CollectiveSpec> specs;
  if (world < 2) return specs;
  for (CollectiveType type : {CollectiveType::kAllReduce, CollectiveType::kAllGather,
                              CollectiveType::kReduceScatter, CollectiveType::kBroadcast,
                              CollectiveType::kAllToAll})
    for (int64_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
      // reduce_scatter and all_to_all split the input in `world` blocks.
      const int64_t unit = 4 * int64_t{world};
      specs.push_back({type, world, (bytes + unit - 1) / unit * unit});
    }
  return specs;
}

std::vector<CollectiveSpec> ProgramCollectiveSpecs(const Program& program) {
  std::set<std::tuple<int, int, int64_t>> seen;
  std::vector<CollectiveSpec> specs;
  for (const Role& role : program.roles) {
    const Graph& g = program.GraphOf(role);
    const GraphIndex index = GraphIndex::Build(g);
    const int rank = role.ranks.empty() ? 0 : role.ranks.front();
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCollective) continue;
      const int n = static_cast<int>(GroupRanks(program.mesh, op.group, rank).size());
      if (n < 2) continue;
      // The runtime moves fp32 whatever the IR dtype: bytes of its input buffers.
      int64_t bytes = 0;
      for (const std::string& t : op.inputs) bytes += 4 * g.tensors[index.tensor.at(t)].NumElements();
      if (seen.insert({static_cast<int>(op.collective), n, bytes}).second)
        specs.push_back({op.collective, n, bytes});
    }
  }
  return specs;
}

std::string FormatCollectiveSpecs(const std::vector<CollectiveSpec>& specs) {
  std::string out;
  for (const CollectiveSpec& s : specs) {
    if (!out.empty()) out += ',';
    out += std::string(ToString(s.type)) + ":" + std::to_string(s.group_size) + ":" + std::to_string(s.bytes);
  }
  return out;
}

Result<std::vector<CollectiveSpec>> ParseCollectiveSpecs(const std::string& text) {
  std::vector<CollectiveSpec> specs;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t a = item.find(':'), b = item.rfind(':');
    auto bad = [&](const std::string& why) {
      return Status::Error("collective spec '" + item + "': " + why + " (expected TYPE:GROUP_SIZE:BYTES)");
    };
    if (a == std::string::npos || a == b) return bad("missing fields");
    const std::optional<CollectiveType> type = ParseCollectiveType(item.substr(0, a));
    if (!type) return bad("unknown collective type");
    CollectiveSpec s;
    s.type = *type;
    try {
      s.group_size = std::stoi(item.substr(a + 1, b - a - 1));
      s.bytes = std::stoll(item.substr(b + 1));
    } catch (const std::exception&) {
      return bad("group size and bytes must be integers");
    }
    specs.push_back(s);
  }
  return specs;
}

std::vector<std::vector<int>> CollectiveSpecGroups(const std::vector<CollectiveSpec>& specs, int world) {
  std::set<std::vector<int>> groups;
  for (const CollectiveSpec& s : specs) {
    std::vector<int> g;
    for (int r = 0; r < s.group_size && r < world; ++r) g.push_back(r);
    groups.insert(g);
  }
  return {groups.begin(), groups.end()};
}

Result<std::vector<CollectiveSample>> ProfileCollectives(Communicator& comm,
                                                         const std::vector<CollectiveSpec>& specs,
                                                         int reps) {
  std::vector<CollectiveSample> out;
  for (const CollectiveSpec& s : specs) {
    const std::string what = std::string(ToString(s.type)) + " of " + std::to_string(s.bytes) +
                             " bytes on " + std::to_string(s.group_size) + " ranks";
    if (s.group_size < 1 || s.group_size > comm.size())
      return Status::Error(what + ": the world has " + std::to_string(comm.size()) + " ranks");
    const int64_t unit = (s.type == CollectiveType::kReduceScatter || s.type == CollectiveType::kAllToAll)
                             ? 4 * int64_t{s.group_size}
                             : 4;
    if (s.bytes <= 0 || s.bytes % unit != 0)
      return Status::Error(what + ": bytes must be a positive multiple of " + std::to_string(unit));
    if (comm.rank() >= s.group_size) continue;
    std::vector<int> group;
    for (int r = 0; r < s.group_size; ++r) group.push_back(r);
    const int64_t n = s.group_size, count = s.bytes / 4;
    std::vector<float> in(count, 1.0f), out_buf(s.type == CollectiveType::kAllGather ? n * count : count);
    auto once = [&]() -> Status {
      switch (s.type) {
        case CollectiveType::kAllReduce: return comm.AllReduce(group, ReduceOp::kSum, in.data(), out_buf.data(), count);
        case CollectiveType::kAllGather: return comm.AllGather(group, in.data(), out_buf.data(), count);
        case CollectiveType::kReduceScatter:
          return comm.ReduceScatter(group, ReduceOp::kSum, in.data(), out_buf.data(), count / n);
        case CollectiveType::kAllToAll: return comm.AllToAll(group, in.data(), out_buf.data(), count / n);
        case CollectiveType::kBroadcast: return comm.Broadcast(group, in.data(), out_buf.data(), count);
      }
      return Status::Error("unknown collective");
    };
    std::vector<double> times;
    for (int k = 0; k <= reps; ++k) {  // k == 0: warm-up
      float token = 0;
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(group, ReduceOp::kSum, &token, &token, 1));
      const auto t0 = Clock::now();
      CONCERTO_RETURN_IF_ERROR(once());
      float dt = static_cast<float>(SecondsSince(t0) * 1e6);
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(group, ReduceOp::kMax, &dt, &dt, 1));
      if (k > 0) times.push_back(dt);
    }
    out.push_back({s, Median(times), reps});
  }
  return out;
}

std::vector<int64_t> DefaultOneWaySizes(int64_t max_bytes) {
  std::vector<int64_t> sizes;
  for (int64_t div : {16, 4, 1}) {
    const int64_t b = max_bytes / div / 4 * 4;
    if (b >= (64 << 10) && (sizes.empty() || b > sizes.back())) sizes.push_back(b);
  }
  return sizes;
}

Result<std::vector<OneWaySample>> ProfileOneWay(Communicator& comm, const std::vector<int64_t>& sizes, int reps) {
  std::vector<OneWaySample> out;
  if (comm.size() < 2) return out;
  std::vector<int> world;
  for (int r = 0; r < comm.size(); ++r) world.push_back(r);
  for (const int64_t bytes : sizes) {
    if (bytes <= 0 || bytes % 4 != 0)
      return Status::Error("one-way transfer of " + std::to_string(bytes) + " bytes: not a positive multiple of 4");
    std::vector<float> buf(static_cast<size_t>(bytes / 4), 1.0f);
    std::vector<double> times;
    for (int k = 0; k <= reps; ++k) {  // k == 0: warm-up
      float token = 0;
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, &token, &token, 1));
      const auto t0 = Clock::now();
      if (comm.rank() == 0) CONCERTO_RETURN_IF_ERROR(comm.Send(buf.data(), bytes / 4, 1, 0));
      if (comm.rank() == 1) CONCERTO_RETURN_IF_ERROR(comm.Recv(buf.data(), bytes / 4, 0, 0));
      float dt = comm.rank() <= 1 ? static_cast<float>(SecondsSince(t0) * 1e6) : 0.0f;
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &dt, &dt, 1));
      if (k > 0) times.push_back(dt);
    }
    out.push_back({bytes, Median(times), reps});
  }
  return out;
}

Result<std::vector<CollectiveSample>> ProfileCollectivesInProcess(int ranks, const std::vector<CollectiveSpec>& specs,
                                                                  int reps, std::vector<OneWaySample>* one_way,
                                                                  int64_t max_bytes) {
  if (ranks < 1) return Status::Error("in-process collective profile: need at least 1 rank");
  FakeWorld world(ranks);
  std::vector<Result<std::vector<CollectiveSample>>> results(ranks, Status::Error("rank did not run"));
  std::vector<Result<std::vector<OneWaySample>>> one_way_results(ranks, std::vector<OneWaySample>{});
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      results[r] = ProfileCollectives(world.endpoint(r), specs, reps);
      if (one_way && results[r].ok())
        one_way_results[r] = ProfileOneWay(world.endpoint(r), DefaultOneWaySizes(max_bytes), reps);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!results[r].ok()) return results[r].status();
    if (!one_way_results[r].ok()) return one_way_results[r].status();
  }
  if (one_way) *one_way = *one_way_results[0];
  return results[0];
}

std::string WriteCollectiveSamples(const std::vector<CollectiveSample>& samples, int ranks,
                                   const std::vector<OneWaySample>& one_way) {
  nlohmann::json j = {{"format", "concerto-collective-samples"}, {"ranks", ranks}, {"samples", nlohmann::json::array()}};
  for (const CollectiveSample& s : samples)
    j["samples"].push_back({{"collective", ToString(s.spec.type)}, {"group_size", s.spec.group_size},
                            {"bytes", s.spec.bytes}, {"time_us", s.time_us}, {"reps", s.reps}});
  if (!one_way.empty()) {
    j["one_way"] = nlohmann::json::array();
    for (const OneWaySample& s : one_way)
      j["one_way"].push_back({{"bytes", s.bytes}, {"time_us", s.time_us}, {"reps", s.reps}});
  }
  return DumpJson(j, 1) + "\n";
}

namespace {

/// The JSON document in file `path`; errors name the file.
Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  Result<std::string> text = ReadInputFile(path, "samples file", kMaxLargeInputBytes);
  if (!text.ok()) return text.status();
  try {
    return nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(path + ": " + e.what());
  }
}

}  // namespace

Result<std::vector<CollectiveSample>> ReadCollectiveSamples(const std::string& path,
                                                            std::vector<OneWaySample>* one_way) {
  Result<nlohmann::json> parsed = ReadJsonFile(path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("format", "") != "concerto-collective-samples" || !j.contains("samples") ||
      !j["samples"].is_array())
    return Status::Error(path + ": not a collective sample file (format 'concerto-collective-samples' with a "
                                "'samples' list)");
  std::vector<CollectiveSample> out;
  for (size_t i = 0; i < j["samples"].size(); ++i) {
    const nlohmann::json& e = j["samples"][i];
    const std::string where = path + ": sample " + std::to_string(i) + ": ";
    if (!e.is_object()) return Status::Error(where + "not an object");
    for (const char* field : {"collective", "group_size", "bytes", "time_us"})
      if (!e.contains(field)) return Status::Error(where + "field '" + field + "' is missing");
    if (!e["collective"].is_string()) return Status::Error(where + "field 'collective' must be a string");
    const std::optional<CollectiveType> type = ParseCollectiveType(e["collective"].get<std::string>());
    if (!type) return Status::Error(where + "field 'collective': unknown type");
    if (!e["group_size"].is_number_integer() || !e["bytes"].is_number_integer())
      return Status::Error(where + "fields 'group_size' and 'bytes' must be integers");
    if (!e["time_us"].is_number() || !(e["time_us"].get<double>() >= 0))
      return Status::Error(where + "field 'time_us' must be a non-negative number");
    CollectiveSample s;
    s.spec = {*type, e["group_size"].get<int>(), e["bytes"].get<int64_t>()};
    s.time_us = e["time_us"].get<double>();
    s.reps = e.value("reps", 0);
    out.push_back(s);
  }
  if (one_way) one_way->clear();
  if (j.contains("one_way")) {
    if (!j["one_way"].is_array()) return Status::Error(path + ": field 'one_way' must be a list");
    for (size_t i = 0; i < j["one_way"].size(); ++i) {
      const nlohmann::json& e = j["one_way"][i];
      const std::string where = path + ": one_way " + std::to_string(i) + ": ";
      if (!e.is_object() || !e.contains("bytes") || !e.contains("time_us"))
        return Status::Error(where + "needs 'bytes' and 'time_us'");
      if (!e["bytes"].is_number_integer() || e["bytes"].get<int64_t>() <= 0)
        return Status::Error(where + "field 'bytes' must be a positive integer");
      if (!e["time_us"].is_number() || !(e["time_us"].get<double>() >= 0))
        return Status::Error(where + "field 'time_us' must be a non-negative number");
      if (one_way) one_way->push_back({e["bytes"].get<int64_t>(), e["time_us"].get<double>(), e.value("reps", 0)});
    }
  }
  return out;
}

Result<LinearFit> FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  assert(x.size() == y.size());
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0;
  for (size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i];
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (x.size() < 2 || sxx <= 0) return Status::Error("a line fit needs two distinct x values");
  LinearFit f;
  f.slope = sxy / sxx;
  f.intercept = my - f.slope * mx;
  f.r2 = syy > 0 ? (sxy * sxy) / (sxx * syy) : 1.0;
  f.points = static_cast<int>(x.size());
  return f;
}

namespace {

/// Ring steps and bytes factor of a sample; on a bus the factor also counts
/// the ring's senders, who share the medium (RingSenders).
std::pair<double, double> SampleFactors(const CollectiveSpec& spec, bool bus) {
  auto [steps, factor] = RingFactors(spec.type, spec.group_size);
  if (bus) factor *= RingSenders(spec.type, spec.group_size);
  return {steps, factor};
}

/// Alpha and B of the collectives on ports (`bus` false) or on a bus.
Result<CollectiveFit> FitAlphaBeta(const std::vector<CollectiveSample>& samples, bool bus) {
  // Large: >= 1 MiB, or the largest size measured when that is smaller;
  // small: <= 4 KiB, or the smallest size measured when that is larger.
  // Only the smallest messages fix alpha: on a tbf-shaped link a message
  // smaller than the token bucket passes at memory speed while two
  // simultaneous 64 KiB messages overflow it, so the mid sizes' remainder
  // measures the bucket (0.1-3.6 ms per step in one trial), not the
  // latency (docs/runtime.md, "Profiling").
  int64_t min_bytes = INT64_MAX, max_bytes = 0;
  for (const CollectiveSample& s : samples)
    if (s.time_us > 0 && s.spec.group_size >= 2)
      min_bytes = std::min(min_bytes, s.spec.bytes), max_bytes = std::max(max_bytes, s.spec.bytes);
  const int64_t kSmallBytes = std::max<int64_t>(4 << 10, min_bytes);
  const int64_t kLargeBytes = std::min<int64_t>(1 << 20, max_bytes);
  std::vector<const CollectiveSample*> small, large, large_all_reduce;
  for (const CollectiveSample& s : samples) {
    if (s.time_us <= 0 || s.spec.group_size < 2) continue;
    if (s.spec.bytes <= kSmallBytes) small.push_back(&s);
    if (s.spec.bytes >= kLargeBytes) {
      large.push_back(&s);
      if (s.spec.type == CollectiveType::kAllReduce) large_all_reduce.push_back(&s);
    }
  }
  if (large_all_reduce.size() >= 2) large = large_all_reduce;
  if (small.empty() || large.empty())
    return Status::Error("collective fit: no samples on two or more ranks");
  // Alternate: time per byte by least squares on the large samples given
  // alpha; alpha as the median per-step remainder of the small ones.
  double alpha = 0, per_byte = 0;
  for (int iteration = 0; iteration < 200; ++iteration) {
    double num = 0, den = 0;
    for (const CollectiveSample* s : large) {
      const auto [steps, factor] = SampleFactors(s->spec, bus);
      const double x = factor * static_cast<double>(s->spec.bytes);
      num += x * (s->time_us - alpha * steps);
      den += x * x;
    }
    per_byte = num / den;
    std::vector<double> rest;
    for (const CollectiveSample* s : small) {
      const auto [steps, factor] = SampleFactors(s->spec, bus);
      rest.push_back(std::max(0.0, (s->time_us - per_byte * factor * static_cast<double>(s->spec.bytes)) / steps));
    }
    alpha = Median(rest);
  }
  if (!(per_byte > 0)) {
    // Noise: the large messages were no slower than alpha alone predicts
    // (e.g. tiny in-process sweeps). Alpha 0, B from the large ones alone.
    alpha = 0;
    double num = 0, den = 0;
    for (const CollectiveSample* s : large) {
      const double x = SampleFactors(s->spec, bus).second * static_cast<double>(s->spec.bytes);
      num += x * s->time_us;
      den += x * x;
    }
    per_byte = num / den;
  }
  if (!(per_byte > 0)) return Status::Error("collective fit: non-positive time per byte");
  CollectiveFit fit;
  fit.latency_us = alpha;
  fit.bandwidth_gbps = 1e-3 / per_byte;
  for (const CollectiveSample& s : samples) {
    if (s.time_us <= 0 || s.spec.group_size < 2) continue;
    const auto [steps, factor] = SampleFactors(s.spec, bus);
    const double model = alpha * steps + per_byte * factor * static_cast<double>(s.spec.bytes);
    fit.max_rel_error = std::max(fit.max_rel_error, std::abs(model - s.time_us) / s.time_us);
    ++fit.points;
  }
  return fit;
}

}  // namespace

Result<CollectiveFit> FitCollectives(const std::vector<CollectiveSample>& samples,
                                     const std::vector<OneWaySample>& one_way) {
  Result<CollectiveFit> ports = FitAlphaBeta(samples, false);
  if (!ports.ok()) return ports.status();
  CollectiveFit fit = *ports;
  fit.ports_gbps = ports->bandwidth_gbps;
  if (one_way.empty()) return fit;
  Result<CollectiveFit> bus = FitAlphaBeta(samples, true);
  if (!bus.ok()) return fit;
  fit.bus_gbps = bus->bandwidth_gbps;
  // A lone transfer: alpha + bytes / B on either model (one step).
  auto error = [&](const CollectiveFit& f) {
    std::vector<double> e;
    for (const OneWaySample& s : one_way) {
      const double predicted = f.latency_us + static_cast<double>(s.bytes) / (f.bandwidth_gbps * 1e3);
      if (s.time_us > 0 && predicted > 0) e.push_back(std::abs(std::log(predicted / s.time_us)));
    }
    return e.empty() ? 0.0 : Median(e);
  };
  const OneWaySample* largest = &one_way.front();
  for (const OneWaySample& s : one_way)
    if (s.bytes > largest->bytes) largest = &s;
  if (largest->time_us > 0) fit.one_way_gbps = static_cast<double>(largest->bytes) / (largest->time_us * 1e3);
  fit.one_way_points = static_cast<int>(one_way.size());
  fit.ports_one_way_error = error(*ports);
  fit.bus_one_way_error = error(*bus);
  if (fit.bus_one_way_error < fit.ports_one_way_error) {
    fit.latency_us = bus->latency_us;
    fit.bandwidth_gbps = bus->bandwidth_gbps;
    fit.max_rel_error = bus->max_rel_error;
    fit.intra_link = "bus";
  }
  return fit;
}

Result<ComputeFit> FitCompute(const std::vector<KernelSample>& samples) {
  std::vector<double> mf, mt, bx, bt;
  for (const KernelSample& s : samples) {
    if (s.type == ComputeType::kMatmul) {
      mf.push_back(s.flops);
      mt.push_back(s.time_us);
    } else if (IsStreamingKernel(s.type) && s.bytes > 0) {
      bx.push_back(s.bytes);
      bt.push_back(s.time_us);
    }
  }
  Result<LinearFit> matmul = FitLine(mf, mt);
  if (!matmul.ok()) return Status::Error("matmul fit: " + matmul.status().message());
  Result<LinearFit> memory = FitLine(bx, bt);
  if (!memory.ok()) return Status::Error("memory fit: " + memory.status().message());
  if (matmul->slope <= 0 || memory->slope <= 0)
    return Status::Error("compute fit: time does not grow with flops or bytes (noisy measurements?)");
  ComputeFit fit;
  fit.matmul = *matmul;
  fit.memory = *memory;
  fit.matmul_tflops = 1e-6 / matmul->slope;
  fit.memory_gbps = 1e-3 / memory->slope;
  fit.launch_overhead_us = std::max(0.0, memory->intercept);
  std::vector<double> eff;
  for (const KernelSample& s : samples) {
    if (s.type == ComputeType::kMatmul || IsStreamingKernel(s.type) || s.flops <= 0) continue;
    const double t = std::max(s.time_us - fit.launch_overhead_us, 1e-3);
    eff.push_back(s.flops / (t * 1e6) / (fit.matmul_tflops * 1e6) * 1e6);
  }
  if (!eff.empty()) fit.vector_efficiency = std::clamp(Median(eff), 1e-4, 1.0);
  return fit;
}

namespace {

/// A compute kernel with its own tensors and buffers, run through RunKernel.
struct BenchKernel {
  std::string label;
  Op op;
  std::vector<Tensor> in_meta, out_meta;
  std::vector<std::vector<float>> in_data, out_data;
  Mesh mesh;

  /// Allocates and fills the buffers (FillSynthetic) and checks the kernel.
  Status Init() {
    mesh.axes = {{"dp", 1}};
    for (const Tensor& t : in_meta) {
      in_data.emplace_back(t.NumElements());
      const size_t slot = in_data.size() - 1;
      FillSynthetic(t, slot, NonNegativeInput(op, slot), &in_data.back());
    }
    for (const Tensor& t : out_meta) out_data.emplace_back(t.NumElements(), 0.0f);
    std::vector<const Tensor*> in, out;
    for (const Tensor& t : in_meta) in.push_back(&t);
    for (const Tensor& t : out_meta) out.push_back(&t);
    return CheckKernel(op, in, out);
  }
  /// One run; its time in microseconds.
  Result<double> Time() {
    std::vector<KernelArg> in, out;
    for (size_t i = 0; i < in_meta.size(); ++i) in.push_back({&in_meta[i], in_data[i].data()});
    for (size_t i = 0; i < out_meta.size(); ++i) out.push_back({&out_meta[i], out_data[i].data()});
    const auto t0 = Clock::now();
    CONCERTO_RETURN_IF_ERROR(RunKernel(op, in, out, KernelContext{&mesh, 0}));
    return SecondsSince(t0) * 1e6;
  }
};

Tensor F32Tensor(const std::string& name, std::vector<int64_t> shape) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = DType::kF32;
  t.sharding.assign(t.shape.size(), {});
  return t;
}

/// The interference kernels: a square matmul and an elementwise add.
std::vector<BenchKernel> InterferenceKernels(const InterferenceOptions& o) {
  std::vector<BenchKernel> k(2);
  const int64_t m = o.matmul_size, n = o.add_elements;
  k[0].label = "matmul " + std::to_string(m) + "x" + std::to_string(m) + "x" + std::to_string(m);
  k[0].op.name = "interference.matmul";
  k[0].op.kind = OpKind::kCompute;
  k[0].op.compute_type = ComputeType::kMatmul;
  k[0].op.attrs = {{"transpose_a", 0}, {"transpose_b", 0}};
  k[0].op.inputs = {"a", "b"};
  k[0].op.outputs = {"c"};
  k[0].in_meta = {F32Tensor("a", {m, m}), F32Tensor("b", {m, m})};
  k[0].out_meta = {F32Tensor("c", {m, m})};
  k[1].label = "add " + std::to_string(n) + " floats";
  k[1].op.name = "interference.add";
  k[1].op.kind = OpKind::kCompute;
  k[1].op.compute_type = ComputeType::kAdd;
  k[1].op.inputs = {"x", "y"};
  k[1].op.outputs = {"z"};
  k[1].in_meta = {F32Tensor("x", {n}), F32Tensor("y", {n})};
  k[1].out_meta = {F32Tensor("z", {n})};
  return k;
}

/// A probe program: on a mesh of `ranks`, a chain of `kernels` kernels on
/// the compute stream (square matmuls of `size`, each on the last one's
/// result; with add_elements > 0 every second one an add of that many
/// floats, likewise), then an all_reduce of `floats` over every rank on the
/// comm stream, issued once kernel `after` is done (a control dependency;
/// the all_reduce is op `kernels`).
std::string ProbeProgramJson(const std::string& name, int ranks, int kernels, int64_t size, int64_t add_elements,
                             int64_t floats, int after) {
  nlohmann::json tensors = nlohmann::json::array(), ops = nlohmann::json::array(), all = nlohmann::json::array();
  auto tensor = [&](const std::string& t, std::vector<int64_t> shape) {
    tensors.push_back({{"name", t}, {"shape", shape}, {"dtype", "f32"}});
  };
  tensor("a0", {size, size});
  tensor("b", {size, size});
  if (add_elements > 0) {
    tensor("x0", {add_elements});
    tensor("y", {add_elements});
  }
  int matmuls = 0, adds = 0;
  for (int k = 0; k < kernels; ++k) {
    const bool add = add_elements > 0 && k % 2 == 1;
    int& n = add ? adds : matmuls;
    const std::string in = (add ? "x" : "a") + std::to_string(n), out = (add ? "x" : "a") + std::to_string(n + 1);
    tensor(out, add ? std::vector<int64_t>{add_elements} : std::vector<int64_t>{size, size});
    ops.push_back({{"id", k}, {"name", (add ? "d" : "m") + std::to_string(n)}, {"kind", "compute"},
                   {"type", add ? "add" : "matmul"}, {"inputs", {in, add ? "y" : "b"}}, {"outputs", {out}}});
    ++n;
  }
  tensor("g", {floats});
  tensor("s", {floats});
  ops.push_back({{"id", kernels}, {"name", "ar"}, {"kind", "collective"}, {"stream", "comm"},
                 {"collective", "all_reduce"}, {"group", {{"axes", {"x"}}}}, {"inputs", {"g"}}, {"outputs", {"s"}},
                 {"control_deps", {after}}});
  for (int r = 0; r < ranks; ++r) all.push_back(r);
  nlohmann::json p = {{"format", "concerto-ir"},
                      {"version", 1},
                      {"name", name},
                      {"mesh", {{"axes", {{{"name", "x"}, {"size", ranks}}}}}},
                      {"graphs", {{{"name", "g0"}, {"streams", {"compute", "comm"}}, {"tensors", tensors}, {"ops", ops}}}},
                      {"roles", {{{"name", "r"}, {"graph", "g0"}, {"ranks", all}}}}};
  return p.dump();
}

}  // namespace

double InterferenceFactor(const std::vector<InterferenceKernel>& kernels) {
  double alone = 0, overlapped = 0;
  for (const InterferenceKernel& k : kernels) alone += k.alone_us, overlapped += k.overlapped_us;
  if (!(alone > 0)) return 0;
  return std::clamp(overlapped / alone - 1, 0.0, 10.0);
}

Result<InterferenceMeasurement> MeasureInterference(Communicator& comm, const InterferenceOptions& o) {
  const int n = comm.size();
  if (n < 2) return Status::Error("interference: needs a world of at least 2 ranks, got " + std::to_string(n));
  if (o.comm_bytes <= 0 || o.comm_bytes % 4 != 0)
    return Status::Error("interference: comm_bytes must be a positive multiple of 4, got " +
                         std::to_string(o.comm_bytes));
  if (o.small_comm_bytes <= 0 || o.small_comm_bytes % 4 != 0)
    return Status::Error("interference: small_comm_bytes must be a positive multiple of 4, got " +
                         std::to_string(o.small_comm_bytes));
  if (o.mid_comm_bytes <= 0 || o.mid_comm_bytes % 4 != 0)
    return Status::Error("interference: mid_comm_bytes must be a positive multiple of 4, got " +
                         std::to_string(o.mid_comm_bytes));
  if (o.idle_us < 0 || o.idle_us > 10000000)
    return Status::Error("interference: idle_us must be in [0, 1e7], got " + std::to_string(o.idle_us));
  std::vector<int> world(n);
  for (int r = 0; r < n; ++r) world[r] = r;
  auto barrier = [&]() -> Status {
    float token = 0;
    return comm.AllReduce(world, ReduceOp::kSum, &token, &token, 1);
  };
  SetBlasThreads(1);  // as in a run
  std::vector<BenchKernel> kernels = InterferenceKernels(o);
  for (BenchKernel& k : kernels) {
    CONCERTO_RETURN_IF_ERROR(k.Init());
    CONCERTO_RETURN_IF_ERROR(k.Time().status());  // warm-up
  }
  // Rounds of (alone, overlapped), so that a drift in the machine's load
  // affects both phases alike.
  std::vector<std::vector<double>> alone(kernels.size()), overlapped(kernels.size()), solo(kernels.size());
  std::vector<float> solo_round_medians;  // rank 0's, per round and kernel (0 on the other ranks)
  const int64_t count = o.comm_bytes / 4;
  std::vector<float> send(count, 0.0f), recv(count);
  int collectives = 0;
  std::vector<float> round_medians;  // per round, per kernel: alone, overlapped
  std::vector<float> comm_round_medians;  // per round: the all_reduce alone, then while every rank computes
  std::vector<float> small_round_medians;  // per round: the small all_reduce alone, then while every rank computes
  // Per round, per repetition of the hold probe: the all_reduce's time from
  // its start and the compute beside it, in us (the holds need the round's
  // comm_corun, known at the end).
  std::vector<std::vector<std::pair<double, double>>> hold_reps;
  std::vector<float> small_send(o.small_comm_bytes / 4, 0.0f), small_recv(o.small_comm_bytes / 4);
  std::vector<float> mid_send(o.mid_comm_bytes / 4, 0.0f), mid_recv(o.mid_comm_bytes / 4);
  InterferenceMeasurement m;
  // The mid-size all_reduce once, timed on its slowest rank (the rank that
  // only hands its bytes to the socket ends earlier).
  auto mid_all_reduce = [&]() -> Result<double> {
    const auto t0 = Clock::now();
    CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, mid_send.data(), mid_recv.data(),
                                            static_cast<int64_t>(mid_send.size())));
    float dt = static_cast<float>(SecondsSince(t0) * 1e6);
    CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &dt, &dt, 1));
    return static_cast<double>(dt);
  };
  bool missing = false;              // a round without an overlapped run of some kernel
  if (o.rounds < 1) return Status::Error("interference: rounds must be at least 1");
  // The kernels in turn (matmul, add, matmul, ...) as the overlapped phase
  // runs them, until each has min_samples runs and 0.1 s per kernel has
  // passed. Timing each kernel in a block instead ran every rank's add in
  // lockstep with the others' (memory co-run), against the mix of the
  // overlapped phase, and the interference came out 0.00 in some profiles.
  auto time_kernels = [&](std::vector<std::vector<double>>& into) -> Status {
    std::vector<size_t> had(kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i) had[i] = into[i].size();
    const auto start = Clock::now();
    for (size_t i = 0;; i = (i + 1) % kernels.size()) {
      Result<double> t = kernels[i].Time();
      if (!t.ok()) return t.status();
      into[i].push_back(*t);
      if (i + 1 < kernels.size()) continue;
      bool enough = SecondsSince(start) >= 0.1 * static_cast<double>(kernels.size());
      for (size_t k = 0; k < kernels.size(); ++k)
        enough = enough && static_cast<int>(into[k].size() - had[k]) >= o.min_samples;
      if (enough) return Status::Ok();
    }
  };
  // A second thread's loop: all_reduces of `s` back to back until every rank
  // has said enough (element 0 of `s`: 1 once this rank's `enough` is set;
  // every rank sees the same sum, so every rank stops after the same call).
  auto keep_in_flight = [&](std::vector<float>& s, std::vector<float>& r, std::atomic<bool>& enough,
                            std::atomic<bool>& in_flight, std::atomic<bool>& finished, std::vector<double>* times,
                            int* issued, Status* status) {
    in_flight = true;
    for (;;) {
      s[0] = enough ? 1.0f : 0.0f;
      const auto t0 = Clock::now();
      Status st = comm.AllReduce(world, ReduceOp::kSum, s.data(), r.data(), static_cast<int64_t>(s.size()));
      times->push_back(SecondsSince(t0) * 1e6);
      ++*issued;
      if (!st.ok()) {
        *status = st;
        break;
      }
      if (r[0] > n - 0.5f) break;
    }
    in_flight = false;
    finished = true;
  };
  for (int round = 0; round < o.rounds; ++round) {
    // Solo: rank 0 computes while the other ranks wait in the barrier (the
    // co-run slowdown's reference, as ProfileKernels times kernels).
    CONCERTO_RETURN_IF_ERROR(barrier());
    if (comm.rank() == 0) {
      std::vector<size_t> solo_had(kernels.size());
      for (size_t i = 0; i < kernels.size(); ++i) solo_had[i] = solo[i].size();
      CONCERTO_RETURN_IF_ERROR(time_kernels(solo));
      for (size_t i = 0; i < kernels.size(); ++i)
        solo_round_medians.push_back(static_cast<float>(
            Median(std::vector<double>(solo[i].begin() + static_cast<int64_t>(solo_had[i]), solo[i].end()))));
    } else {
      solo_round_medians.insert(solo_round_medians.end(), kernels.size(), 0.0f);
    }
    // Alone: every rank computes, nothing communicates.
    CONCERTO_RETURN_IF_ERROR(barrier());
    std::vector<size_t> alone_had(kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i) alone_had[i] = alone[i].size();
    CONCERTO_RETURN_IF_ERROR(time_kernels(alone));
    // Jitter: the runtime's executor runs the same chain of kernels (the
    // interference kernels in turn) on every rank's compute stream (about
    // jitter_segment_us), then a small all_reduce on its comm stream, as a
    // run computes between two synchronisations (its stream threads as in
    // a run); per repetition the
    // slowest rank's compute time past the ranks' mean, over the mean; the
    // round's mean over e_n (the expected largest of n standard normals):
    // the coefficient of variation of a rank's compute between two
    // synchronisations (ClusterSpec::compute_jitter).
    {
      double pair_us = 0;
      for (size_t i = 0; i < kernels.size(); ++i)
        pair_us += Median(std::vector<double>(alone[i].begin() + static_cast<int64_t>(alone_had[i]), alone[i].end()));
      float pairs =
          static_cast<float>(std::clamp(std::round(o.jitter_segment_us / std::max(1.0, pair_us)), 1.0, 256.0));
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &pairs, &pairs, 1));
      // The jitter probe: matmul + add pairs, the all_reduce once the last is
      // done (the synchronisation that ends a segment of a run).
      const int chain = 2 * static_cast<int>(pairs);
      Result<Program> probe =
          ParseProgram(ProbeProgramJson("jitter-probe", n, chain, o.matmul_size, o.add_elements,
                                        o.small_comm_bytes / 4, chain - 1),
                       "the interference's jitter probe");
      if (!probe.ok()) return probe.status();
      const ScheduledProgram sp{*probe, ProgramOrderSchedule(*probe, "fifo")};
      Result<std::unique_ptr<RankSession>> session = RankSession::Create(sp, comm, RunOptions{});
      if (!session.ok()) return session.status();
      const int probe_ar = chain;
      double sum = 0, segment_sum = 0;
      const int reps = std::max(o.min_samples, 12);
      for (int k = 0; k < reps; ++k) {
        Result<std::vector<OpRecord>> records = (*session)->Step();
        if (!records.ok()) return records.status();
        double first_us = -1, last_us = 0;
        for (const OpRecord& r : *records) {
          if (r.op_index == probe_ar) continue;
          first_us = first_us < 0 ? r.start_us : std::min(first_us, r.start_us);
          last_us = std::max(last_us, r.end_us);
        }
        float most = static_cast<float>(std::max(0.0, last_us - std::max(0.0, first_us))), total = most;
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &most, &most, 1));
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, &total, &total, 1));
        const double mean = total / n;
        if (mean > 0) sum += (most - mean) / mean;
        segment_sum += mean;
      }
      m.jitter_segment_us.push_back(segment_sum / reps);
      m.jitter_round.push_back(std::max(0.0, sum / reps / StandardNormalMaxMoments(n).mean));
    }
    // The all_reduce alone, nothing computing (the reference of the
    // communication's co-run slowdown).
    CONCERTO_RETURN_IF_ERROR(barrier());
    {
      const auto t0 = Clock::now();
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, send.data(), recv.data(), count));
      comm_round_medians.push_back(static_cast<float>(SecondsSince(t0) * 1e6));
    }
    // Overlapped: a second thread keeps an all_reduce in flight.
    CONCERTO_RETURN_IF_ERROR(barrier());
    std::atomic<bool> enough{false}, in_flight{false}, finished{false};
    Status comm_status = Status::Ok();
    int issued = 0;
    std::vector<size_t> had(kernels.size());
    for (size_t i = 0; i < kernels.size(); ++i) had[i] = overlapped[i].size();
    std::vector<double> comm_times;  // the all_reduces while this rank computes
    std::thread comm_thread(
        [&] { keep_in_flight(send, recv, enough, in_flight, finished, &comm_times, &issued, &comm_status); });
    while (!in_flight && !finished) std::this_thread::yield();
    const auto start = Clock::now();
    for (size_t i = 0; !finished; i = (i + 1) % kernels.size()) {
      const bool before = in_flight;
      Result<double> t = kernels[i].Time();
      if (!t.ok()) {
        enough = true;
        comm_thread.join();
        return t.status();
      }
      if (before && in_flight) overlapped[i].push_back(*t);
      const double elapsed = SecondsSince(start);
      bool all = elapsed >= o.min_time_s;
      for (size_t k = 0; k < kernels.size(); ++k)
        all = all && static_cast<int>(overlapped[k].size() - had[k]) >= o.min_samples;
      if (all || elapsed >= o.max_time_s) enough = true;
    }
    comm_thread.join();
    CONCERTO_RETURN_IF_ERROR(comm_status);
    collectives += issued;
    comm_round_medians.push_back(static_cast<float>(Median(comm_times)));
    // The small all_reduce alone, then back to back while every rank runs
    // the kernels (untimed): the per-message wait for a core.
    CONCERTO_RETURN_IF_ERROR(barrier());
    {
      std::vector<double> small_alone;
      for (int k = 0; k < std::max(o.min_samples, 5); ++k) {
        const auto t0 = Clock::now();
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, small_send.data(), small_recv.data(),
                                                static_cast<int64_t>(small_send.size())));
        small_alone.push_back(SecondsSince(t0) * 1e6);
      }
      small_round_medians.push_back(static_cast<float>(Median(small_alone)));
    }
    CONCERTO_RETURN_IF_ERROR(barrier());
    {
      std::atomic<bool> small_enough{false}, small_in_flight{false}, small_finished{false};
      Status small_status = Status::Ok();
      int small_issued = 0;
      std::vector<double> small_times;
      std::thread small_thread([&] {
        keep_in_flight(small_send, small_recv, small_enough, small_in_flight, small_finished, &small_times,
                       &small_issued, &small_status);
      });
      while (!small_in_flight && !small_finished) std::this_thread::yield();
      const auto small_start = Clock::now();
      for (size_t i = 0; !small_finished; i = (i + 1) % kernels.size()) {
        Result<double> t = kernels[i].Time();
        if (!t.ok()) {
          small_enough = true;
          small_thread.join();
          return t.status();
        }
        if (SecondsSince(small_start) >= o.min_time_s) small_enough = true;
      }
      small_thread.join();
      CONCERTO_RETURN_IF_ERROR(small_status);
      small_round_medians.push_back(static_cast<float>(Median(small_times)));
    }
    // The link's burst: the mid-size all_reduce right after another (its
    // bucket empty) and after idle_us of idle.
    std::vector<double> back_to_back, after_idle;
    for (int k = 0; k < std::max(o.min_samples, 5); ++k) {
      CONCERTO_RETURN_IF_ERROR(barrier());
      CONCERTO_RETURN_IF_ERROR(mid_all_reduce().status());
      Result<double> t = mid_all_reduce();
      if (!t.ok()) return t.status();
      back_to_back.push_back(*t);
      CONCERTO_RETURN_IF_ERROR(barrier());
      std::this_thread::sleep_for(std::chrono::microseconds(o.idle_us));
      t = mid_all_reduce();
      if (!t.ok()) return t.status();
      after_idle.push_back(*t);
    }
    m.mid_back_to_back_us.push_back(Median(back_to_back));
    m.mid_idle_us.push_back(Median(after_idle));
    // The first part of the co-run wait, in which its bytes do not move, as
    // a run sees it: the runtime's executor runs a chain of matmuls on its
    // compute stream and the all_reduce on its comm stream, issued once the
    // first matmul is done (the rest last about this round's wait, every
    // rank's smallest), after idle_us of idle. Per repetition its time from
    // its start (the last rank's) to its end on its slowest rank and the
    // matmuls' time after its start; the holds follow at the end, once the
    // round's comm_corun is known. (A second thread beside a tight kernel
    // loop, as the other phases run it, is not what a run's stream threads
    // do.)
    {
      float wait_us = std::max(0.0f, small_round_medians[small_round_medians.size() - 1] -
                                         small_round_medians[small_round_medians.size() - 2]);
      wait_us = -wait_us;  // every rank's smallest: the largest negation
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &wait_us, &wait_us, 1));
      wait_us = -wait_us;
      const double target_us = std::clamp(static_cast<double>(wait_us), 1000.0, 40000.0);
      float matmuls = static_cast<float>(std::clamp(
          std::round(target_us / std::max(1.0, Median(std::vector<double>(
                                                   alone[0].begin() + static_cast<int64_t>(alone_had[0]),
                                                   alone[0].end())))),
          1.0, 64.0)) + 1;  // the first runs before the all_reduce starts
      CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &matmuls, &matmuls, 1));
      // The wait probe: matmuls, the all_reduce issued once the first is done,
      // as a run issues a gradient's all_reduce and goes on computing.
      Result<Program> probe = ParseProgram(ProbeProgramJson("wait-probe", n, static_cast<int>(matmuls), o.matmul_size,
                                                            0, o.mid_comm_bytes / 4, 0),
                                           "the interference's wait probe");
      if (!probe.ok()) return probe.status();
      const ScheduledProgram sp{*probe, ProgramOrderSchedule(*probe, "fifo")};
      Result<std::unique_ptr<RankSession>> session = RankSession::Create(sp, comm, RunOptions{});
      if (!session.ok()) return session.status();
      const int probe_ar = static_cast<int>(matmuls);  // the all_reduce follows the matmuls
      std::vector<double> computes, afters;
      hold_reps.emplace_back();
      for (int k = 0; k < std::max(o.min_samples, 8); ++k) {
        CONCERTO_RETURN_IF_ERROR(barrier());
        std::this_thread::sleep_for(std::chrono::microseconds(o.idle_us));
        Result<std::vector<OpRecord>> records = (*session)->Step();
        if (!records.ok()) return records.status();
        // From the step's start: the last rank's compute end, the slowest
        // rank's end of the all_reduce and its start on the last rank to
        // reach it (the model's wait ends when none of its ranks computes).
        float v[3] = {0, 0, 0};
        for (const OpRecord& r : *records) {
          if (r.op_index == probe_ar) {
            v[1] = std::max(v[1], static_cast<float>(r.end_us));
            v[2] = std::max(v[2], static_cast<float>(r.start_us));
          } else {
            v[0] = std::max(v[0], static_cast<float>(r.end_us));
          }
        }
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, v, v, 3));
        const double beside_us = std::max(0.0f, v[0] - v[2]);
        computes.push_back(beside_us);
        afters.push_back(std::max(0.0f, v[1] - v[0]));
        hold_reps.back().push_back({std::max(0.0f, v[1] - v[2]), beside_us});
      }
      m.mid_wait_compute_us.push_back(Median(computes));
      m.mid_wait_after_us.push_back(Median(afters));
    }
    for (size_t i = 0; i < kernels.size(); ++i) {
      round_medians.push_back(static_cast<float>(
          Median(std::vector<double>(alone[i].begin() + static_cast<int64_t>(alone_had[i]), alone[i].end()))));
      if (overlapped[i].size() == had[i]) {  // decided together below, so no rank is left waiting
        missing = true;
        round_medians.push_back(0);
        continue;
      }
      round_medians.push_back(static_cast<float>(
          Median(std::vector<double>(overlapped[i].begin() + static_cast<int64_t>(had[i]), overlapped[i].end()))));
    }
  }
  // Average the medians over the ranks (one all_reduce): every kernel's
  // over all rounds, then every round's.
  std::vector<float> medians;
  for (size_t i = 0; i < kernels.size(); ++i) {
    medians.push_back(static_cast<float>(Median(alone[i])));
    medians.push_back(overlapped[i].empty() ? 0.0f : static_cast<float>(Median(overlapped[i])));
  }
  medians.insert(medians.end(), round_medians.begin(), round_medians.end());
  // Rank 0's solo medians (the other ranks add 0): every kernel's over all
  // rounds, then every round's.
  const size_t solo_at = medians.size();
  for (size_t i = 0; i < kernels.size(); ++i)
    medians.push_back(comm.rank() == 0 && !solo[i].empty() ? static_cast<float>(Median(solo[i])) : 0.0f);
  medians.insert(medians.end(), solo_round_medians.begin(), solo_round_medians.end());
  const size_t comm_at = medians.size();
  medians.insert(medians.end(), comm_round_medians.begin(), comm_round_medians.end());
  const size_t small_at = medians.size();
  medians.insert(medians.end(), small_round_medians.begin(), small_round_medians.end());
  medians.push_back(missing ? 1.0f : 0.0f);
  CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, medians.data(), medians.data(),
                                          static_cast<int64_t>(medians.size())));
  if (medians.back() > 0.5f)
    return Status::Error("interference: in some round a kernel never ran entirely while the all_reduce of " +
                         std::to_string(o.comm_bytes) + " bytes was in flight (the collective is too short for "
                         "the kernel; raise comm_bytes or max_time_s)");
  std::vector<double> small_waits;  // per round: the small all_reduce's wait beside compute
  m.ranks = n;
  m.comm_bytes = o.comm_bytes;
  m.collectives = collectives;
  const size_t nk = kernels.size();
  for (size_t i = 0; i < nk; ++i)
    m.kernels.push_back({kernels[i].label, medians[2 * i] / n, medians[2 * i + 1] / n,
                         static_cast<int>(alone[i].size()), static_cast<int>(overlapped[i].size()),
                         medians[solo_at + i]});
  for (int r = 0; r < o.rounds; ++r) {
    std::vector<InterferenceKernel> round(nk);
    for (size_t i = 0; i < nk; ++i) {
      round[i].alone_us = medians[2 * nk + 2 * (r * nk + i)] / n;
      round[i].overlapped_us = medians[2 * nk + 2 * (r * nk + i) + 1] / n;
    }
    m.round_factors.push_back(InterferenceFactor(round));
    // Co-running per kernel class: compute-bound (the matmul) and streaming
    // (the add) suffer very differently from a rank beside them.
    std::vector<double> solo_compute, alone_compute, solo_memory, alone_memory;
    for (size_t i = 0; i < nk; ++i) {
      const bool memory = OpInfo(kernels[i].op.compute_type).kernel_class == KernelClass::kStreaming;
      (memory ? solo_memory : solo_compute).push_back(medians[solo_at + nk + r * nk + i]);
      (memory ? alone_memory : alone_compute).push_back(round[i].alone_us);
    }
    m.corun_round_factors.push_back(CorunSlowdown(solo_compute, alone_compute));
    m.corun_memory_round_factors.push_back(CorunSlowdown(solo_memory, alone_memory));
    m.comm_alone_us.push_back(medians[comm_at + 2 * r] / n);
    m.comm_computing_us.push_back(medians[comm_at + 2 * r + 1] / n);
    m.small_comm_alone_us.push_back(medians[small_at + 2 * r] / n);
    m.small_comm_computing_us.push_back(medians[small_at + 2 * r + 1] / n);
    small_waits.push_back(std::max(0.0, m.small_comm_computing_us.back() - m.small_comm_alone_us.back()));
    // The back-to-back stream's all_reduces follow each other on a busy
    // thread: no hold (the simulator holds only a message whose stream
    // idled before it).
    m.comm_corun_round_factors.push_back(CorunSlowdown({m.comm_alone_us.back()}, {m.comm_computing_us.back()}));
    // The holds: after its hold H the all_reduce moved at 1 / (1 + c) while
    // the compute (C from its start) went on and at full speed after, its
    // time after idle T in all. Ended after the compute: H = C - (1 + c)
    // (T - (its time - C)); within it: H = its time - (1 + c) T. Clamped to
    // [0, C]; the mean over repetitions (when MPI's thread gets its slice
    // varies, the model wants the expected hold).
    const double speed = 1 + m.comm_corun_round_factors.back(), alone_us = m.mid_idle_us[r];
    double sum = 0;
    for (const auto& [time_us, beside_us] : hold_reps[r]) {
      const double hold = time_us > beside_us ? beside_us - speed * (alone_us - (time_us - beside_us))
                                              : time_us - speed * alone_us;
      m.hold_samples_us.push_back(std::clamp(hold, 0.0, beside_us));
      sum += m.hold_samples_us.back();
    }
    m.hold_round_us.push_back(hold_reps[r].empty() ? 0 : sum / static_cast<double>(hold_reps[r].size()));
  }
  m.interference = MedianFactor(m.round_factors);
  m.corun = MedianFactor(m.corun_round_factors);
  m.corun_memory = MedianFactor(m.corun_memory_round_factors);
  m.comm_corun = MedianFactor(m.comm_corun_round_factors);
  m.small_comm_bytes = o.small_comm_bytes;
  m.comm_corun_latency_us = MedianFactor(small_waits);
  m.mid_comm_bytes = o.mid_comm_bytes;
  std::vector<double> bursts;
  for (size_t r = 0; r < m.mid_idle_us.size(); ++r)
    bursts.push_back(std::max(0.0, m.mid_back_to_back_us[r] - m.mid_idle_us[r]));
  m.link_burst_us = MedianFactor(bursts);
  m.comm_corun_hold_us = MedianFactor(m.hold_round_us);
  m.compute_jitter = std::min(1.0, MedianFactor(m.jitter_round));
  return m;
}

double MedianFactor(const std::vector<double>& factors) { return factors.empty() ? 0 : Median(factors); }

double CorunSlowdown(const std::vector<double>& solo_us, const std::vector<double>& corun_us) {
  if (solo_us.empty() || solo_us.size() != corun_us.size()) return 0;
  double solo = 0, corun = 0;
  for (size_t i = 0; i < solo_us.size(); ++i) solo += solo_us[i], corun += corun_us[i];
  if (!(solo > 0) || !(corun > 0)) return 0;
  return std::clamp(corun / solo - 1, 0.0, 10.0);
}

Result<InterferenceMeasurement> MeasureInterferenceInProcess(int ranks, const InterferenceOptions& options) {
  if (ranks < 2) return Status::Error("interference: needs at least 2 ranks, got " + std::to_string(ranks));
  FakeWorld world(ranks);
  std::vector<Result<InterferenceMeasurement>> results(ranks, Status::Error("rank did not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] { results[r] = MeasureInterference(world.endpoint(r), options); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r)
    if (!results[r].ok()) return results[r].status();
  return results[0];
}

std::string WriteInterference(const InterferenceMeasurement& m) {
  nlohmann::json j = {{"format", "concerto-interference"},
                      {"ranks", m.ranks},
                      {"comm_bytes", m.comm_bytes},
                      {"collectives", m.collectives},
                      {"interference", m.interference},
                      {"round_factors", m.round_factors},
                      {"corun", m.corun},
                      {"corun_round_factors", m.corun_round_factors},
                      {"corun_memory", m.corun_memory},
                      {"corun_memory_round_factors", m.corun_memory_round_factors},
                      {"comm_corun", m.comm_corun},
                      {"comm_corun_round_factors", m.comm_corun_round_factors},
                      {"comm_alone_us", m.comm_alone_us},
                      {"comm_computing_us", m.comm_computing_us},
                      {"small_comm_bytes", m.small_comm_bytes},
                      {"comm_corun_latency_us", m.comm_corun_latency_us},
                      {"small_comm_alone_us", m.small_comm_alone_us},
                      {"small_comm_computing_us", m.small_comm_computing_us},
                      {"mid_comm_bytes", m.mid_comm_bytes},
                      {"mid_back_to_back_us", m.mid_back_to_back_us},
                      {"mid_idle_us", m.mid_idle_us},
                      {"link_burst_us", m.link_burst_us},
                      {"mid_wait_compute_us", m.mid_wait_compute_us},
                      {"mid_wait_after_us", m.mid_wait_after_us},
                      {"hold_round_us", m.hold_round_us},
                      {"hold_samples_us", m.hold_samples_us},
                      {"comm_corun_hold_us", m.comm_corun_hold_us},
                      {"jitter_segment_us", m.jitter_segment_us},
                      {"jitter_round", m.jitter_round},
                      {"compute_jitter", m.compute_jitter},
                      {"kernels", nlohmann::json::array()}};
  for (const InterferenceKernel& k : m.kernels)
    j["kernels"].push_back({{"kernel", k.kernel},
                            {"alone_us", k.alone_us},
                            {"overlapped_us", k.overlapped_us},
                            {"alone_reps", k.alone_reps},
                            {"overlapped_reps", k.overlapped_reps},
                            {"solo_us", k.solo_us}});
  return DumpJson(j, 1) + "\n";
}

Result<InterferenceMeasurement> ReadInterference(const std::string& path) {
  Result<nlohmann::json> parsed = ReadJsonFile(path);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("format", "") != "concerto-interference" || !j.contains("kernels") ||
      !j["kernels"].is_array())
    return Status::Error(path + ": not an interference file (format 'concerto-interference' with a 'kernels' list)");
  InterferenceMeasurement m;
  m.ranks = j.value("ranks", 0);
  m.comm_bytes = j.value("comm_bytes", int64_t{0});
  m.collectives = j.value("collectives", 0);
  for (size_t i = 0; i < j["kernels"].size(); ++i) {
    const nlohmann::json& e = j["kernels"][i];
    const std::string where = path + ": kernel " + std::to_string(i) + ": ";
    for (const char* field : {"alone_us", "overlapped_us"})
      if (!e.is_object() || !e.contains(field) || !e[field].is_number() || !(e[field].get<double>() > 0))
        return Status::Error(where + "field '" + field + "' must be a positive number");
    if (e.contains("solo_us") && (!e["solo_us"].is_number() || !(e["solo_us"].get<double>() >= 0)))
      return Status::Error(where + "field 'solo_us' must be a number >= 0");
    m.kernels.push_back({e.value("kernel", ""), e["alone_us"].get<double>(), e["overlapped_us"].get<double>(),
                         e.value("alone_reps", 0), e.value("overlapped_reps", 0), e.value("solo_us", 0.0)});
  }
  if (!j.contains("interference") || !j["interference"].is_number() || !(j["interference"].get<double>() >= 0) ||
      j["interference"].get<double>() > 10)
    return Status::Error(path + ": field 'interference' must be a number in [0, 10]");
  m.interference = j["interference"].get<double>();
  // Optional fields: a number in [0, max] (a factor: max 10; a time in us:
  // max 1e7; absent: left as it is) and a list of numbers (absent or not a
  // list: empty).
  auto bounded = [&](const char* name, double max, const char* max_text, double* into) -> Status {
    if (!j.contains(name)) return Status::Ok();
    if (!j[name].is_number() || !(j[name].get<double>() >= 0) || j[name].get<double>() > max)
      return Status::Error(path + ": field '" + name + "' must be a number in [0, " + max_text + "]");
    *into = j[name].get<double>();
    return Status::Ok();
  };
  auto factor = [&](const char* name, double* into) { return bounded(name, 10, "10", into); };
  auto time_us = [&](const char* name, double* into) { return bounded(name, 1e7, "1e7", into); };
  auto numbers = [&](const char* name, std::vector<double>* into) {
    if (j.contains(name) && j[name].is_array())
      for (const nlohmann::json& f : j[name])
        if (f.is_number()) into->push_back(f.get<double>());
  };
  numbers("round_factors", &m.round_factors);
  CONCERTO_RETURN_IF_ERROR(factor("corun", &m.corun));  // absent before the thirteenth session: 0
  m.corun_memory = m.corun;  // files written before the fourteenth session: one factor for every kernel
  CONCERTO_RETURN_IF_ERROR(factor("corun_memory", &m.corun_memory));
  CONCERTO_RETURN_IF_ERROR(factor("comm_corun", &m.comm_corun));  // absent before the fourteenth session: 0
  numbers("corun_round_factors", &m.corun_round_factors);
  numbers("corun_memory_round_factors", &m.corun_memory_round_factors);
  numbers("comm_corun_round_factors", &m.comm_corun_round_factors);
  numbers("comm_alone_us", &m.comm_alone_us);
  numbers("comm_computing_us", &m.comm_computing_us);
  CONCERTO_RETURN_IF_ERROR(time_us("comm_corun_latency_us", &m.comm_corun_latency_us));  // absent before the
                                                                                          // sixteenth session: 0
  m.small_comm_bytes = j.value("small_comm_bytes", int64_t{0});
  numbers("small_comm_alone_us", &m.small_comm_alone_us);
  numbers("small_comm_computing_us", &m.small_comm_computing_us);
  // Absent before the eighteenth session: 0.
  CONCERTO_RETURN_IF_ERROR(time_us("link_burst_us", &m.link_burst_us));
  CONCERTO_RETURN_IF_ERROR(time_us("comm_corun_hold_us", &m.comm_corun_hold_us));
  m.mid_comm_bytes = j.value("mid_comm_bytes", int64_t{0});
  numbers("mid_back_to_back_us", &m.mid_back_to_back_us);
  numbers("mid_idle_us", &m.mid_idle_us);
  numbers("mid_wait_compute_us", &m.mid_wait_compute_us);
  numbers("mid_wait_after_us", &m.mid_wait_after_us);
  numbers("hold_round_us", &m.hold_round_us);
  numbers("hold_samples_us", &m.hold_samples_us);
  // Absent before the nineteenth session: 0.
  CONCERTO_RETURN_IF_ERROR(bounded("compute_jitter", 1, "1", &m.compute_jitter));
  numbers("jitter_segment_us", &m.jitter_segment_us);
  numbers("jitter_round", &m.jitter_round);
  return m;
}

ClusterSpec MakeCpuLocalCluster(const ComputeFit& compute, const CollectiveFit& comm, int ranks,
                                const std::string& device_name, double interference, double corun_slowdown,
                                double corun_slowdown_memory, double comm_corun_slowdown,
                                double comm_corun_latency_us, double link_burst_us,
                                double comm_corun_hold_us, double compute_jitter) {
  ClusterSpec c;
  c.name = "cpu-local";
  c.description = "this machine, fitted by `concerto profile`: fp32 kernels of the runtime, one process per "
                  "device, collectives as measured";
  c.nodes = 1;
  c.devices_per_node = std::max(1, ranks);
  c.device.name = device_name;
  c.device.peak_tflops_bf16 = c.device.peak_tflops_fp16 = c.device.peak_tflops_fp32 = compute.matmul_tflops;
  c.device.memory_bandwidth_gbps = compute.memory_gbps;
  c.device.memory_gb = 1;
  c.device.matmul_efficiency = 1;
  c.device.vector_efficiency = compute.vector_efficiency;
  c.device.memory_efficiency = 1;
  c.device.launch_overhead_us = compute.launch_overhead_us;
  c.intra_node = LinkSpec{comm.bandwidth_gbps, comm.latency_us};
  c.inter_node = c.intra_node;
  c.topology.intra_link = comm.intra_link;
  c.collective_algorithm = "ring";
  c.interference = std::clamp(interference, 0.0, 10.0);
  c.corun_slowdown = std::clamp(corun_slowdown, 0.0, 10.0);
  c.corun_slowdown_memory = corun_slowdown_memory < 0 ? -1 : std::clamp(corun_slowdown_memory, 0.0, 10.0);
  c.comm_corun_slowdown = std::clamp(comm_corun_slowdown, 0.0, 10.0);
  c.comm_corun_latency_us = std::clamp(comm_corun_latency_us, 0.0, 1e7);
  c.link_burst_us = std::clamp(link_burst_us, 0.0, 1e7);
  c.comm_corun_hold_us = std::clamp(comm_corun_hold_us, 0.0, c.comm_corun_latency_us);
  c.compute_jitter = std::clamp(compute_jitter, 0.0, 1.0);
  return c;
}

ProfileDb MakeProfileDb(const std::string& device, const std::vector<KernelSample>& kernels,
                        const std::vector<CollectiveSample>& collectives, const Program* program,
                        const ClusterSpec& cluster) {
  ProfileDb db;
  std::set<std::string> added;
  for (const KernelSample& k : kernels)
    if (added.insert(k.signature).second) db.Add(device, k.signature, k.time_us);
  if (!program) return db;
  std::map<std::tuple<int, int, int64_t>, double> measured;
  for (const CollectiveSample& s : collectives)
    measured[{static_cast<int>(s.spec.type), s.spec.group_size, s.spec.bytes}] = s.time_us;
  for (const Role& role : program->roles) {
    const Graph& g = program->GraphOf(role);
    const GraphIndex index = GraphIndex::Build(g);
    const int rank = role.ranks.empty() ? 0 : role.ranks.front();
    const PriceContext ctx{g, index, program->mesh, rank};
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kCollective) continue;
      const int n = static_cast<int>(GroupRanks(program->mesh, op.group, rank).size());
      int64_t bytes = 0;
      for (const std::string& t : op.inputs) bytes += 4 * g.tensors[index.tensor.at(t)].NumElements();
      auto it = measured.find({static_cast<int>(op.collective), n, bytes});
      if (it == measured.end()) continue;
      const std::string sig = ProfileDb::Signature(op, ctx, cluster);
      if (added.insert(sig).second) db.Add(device, sig, it->second);
    }
  }
  return db;
}

Result<std::vector<TraceSample>> DurationsFromTrace(const std::string& trace_text, const std::string& source,
                                                    const Program& program, const ClusterSpec& cluster,
                                                    bool collectives) {
  std::vector<GraphIndex> indexes;
  for (const Graph& g : program.graphs) indexes.push_back(GraphIndex::Build(g));
  std::map<std::string, std::vector<double>> by_signature;
  // A collective's instance (graph, op id, its n-th occurrence on a rank): the shortest span over
  // the ranks that ran it (the last to arrive waited for nobody), and its signature.
  std::map<std::tuple<int, int64_t, int>, std::pair<double, std::string>> instances;
  std::map<std::tuple<int, int, int64_t>, int> occurrences;  // (rank, graph, op id) -> seen so far
  const int ranks = program.mesh.NumRanks();
  // One event (an element of the event array), read as it is parsed.
  auto take = [&](const nlohmann::json& e, size_t at) -> Status {
    const std::string where = source + ": event " + std::to_string(at);
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string() || e["ph"] != "X") return Status::Ok();
    if (!e.contains("pid") || !e["pid"].is_number_integer() || !e.contains("dur") || !e["dur"].is_number() ||
        !e.contains("args") || !e["args"].is_object() || !e["args"].contains("id") ||
        !e["args"]["id"].is_number_integer() || !e.contains("name") || !e["name"].is_string())
      return Status::Error(where + ": an op event needs pid (the rank), name, dur and args.id (integers, a string)");
    // Read wide, then range-checked: a pid or id beyond int must not wrap onto a valid one.
    const int64_t rank64 = e["pid"].is_number_unsigned() && e["pid"].get<uint64_t>() > INT64_MAX
                               ? INT64_MAX
                               : e["pid"].get<int64_t>();
    if (rank64 < 0 || rank64 >= ranks)
      return Status::Error(where + ": rank " + e["pid"].dump() + " is not in the program's " +
                           std::to_string(ranks) + " ranks (give the program the run executed: --write-program)");
    const int rank = static_cast<int>(rank64);
    const int role = program.RoleOfRank(rank);
    if (role < 0) return Status::Error(where + ": rank " + std::to_string(rank) + " runs no role of the program");
    const int graph = program.GraphIndex(program.roles[role].graph);
    if (graph < 0) return Status::Error(where + ": the program's role has no graph");
    const Graph& g = program.graphs[graph];
    const GraphIndex& index = indexes[graph];
    const nlohmann::json& id_json = e["args"]["id"];
    auto op_at = index.op.end();
    if (!(id_json.is_number_unsigned() && id_json.get<uint64_t>() > INT64_MAX) &&
        id_json.get<int64_t>() >= INT32_MIN && id_json.get<int64_t>() <= INT32_MAX)
      op_at = index.op.find(static_cast<int>(id_json.get<int64_t>()));
    if (op_at == index.op.end())
      return Status::Error(where + ": op id " + id_json.dump() + " is not in graph '" + g.name + "'");
    const Op& op = g.ops[op_at->second];
    if (e["name"].get<std::string>() != op.name)
      return Status::Error(where + ": names '" + e["name"].get<std::string>() + "' but op " + std::to_string(op.id) +
                           " of '" + g.name + "' is '" + op.name + "' (a trace of another program?)");
    const bool collective = op.kind == OpKind::kCollective;
    if (op.kind != OpKind::kCompute && !(collectives && collective)) return Status::Ok();
    const double dur = e["dur"].get<double>();
    if (!std::isfinite(dur) || dur < 0 || dur > kMaxProfiledUs)
      return Status::Error(where + ": dur must be finite, >= 0 and at most 1e12 us (kMaxProfiledUs), got " +
                           e["dur"].dump());
    const PriceContext ctx{g, index, program.mesh, rank};
    if (!collective) {
      by_signature[ProfileDb::Signature(op, ctx, cluster)].push_back(dur);
      return Status::Ok();
    }
    const int n = occurrences[{rank, graph, op.id}]++;
    auto [it, fresh] = instances.try_emplace({graph, op.id, n}, dur, ProfileDb::Signature(op, ctx, cluster));
    if (!fresh) it->second.first = std::min(it->second.first, dur);
    return Status::Ok();
  };
  // The events are taken one by one as the parser completes them and then
  // dropped, so a trace costs its text and one event, not a document tree of
  // 8.5x its size. A trace is an array of events or an object whose
  // "traceEvents" is one; nothing else of it is kept.
  using Event = nlohmann::json::parse_event_t;
  struct Stop {};  // a bad event ends the parse; its message is in `failed`
  Status failed = Status::Ok();
  int element_depth = -1;  // the depth of the event array's elements while it is being read
  bool found = false;
  std::string top_key;
  size_t at = 0;
  auto callback = [&](int depth, Event event, nlohmann::json& parsed) -> bool {
    if (event == Event::key && depth == 1) {
      top_key = parsed.is_string() ? parsed.get<std::string>() : std::string();
    } else if (event == Event::array_start && !found && (depth == 0 || (depth == 1 && top_key == "traceEvents"))) {
      found = true;
      element_depth = depth + 1;
    } else if (depth == element_depth &&
               (event == Event::object_end || event == Event::array_end || event == Event::value)) {
      if (Status st = take(parsed, at++); !st.ok()) {
        failed = st;
        throw Stop{};
      }
      return false;
    } else if (element_depth >= 0 && depth > element_depth) {
      return true;  // inside an event
    } else if (event == Event::array_end && depth == element_depth - 1) {
      element_depth = -1;
    }
    // Complete members of a top-level object (the event array included) are not kept.
    return !(depth == 1 && (event == Event::object_end || event == Event::array_end || event == Event::value));
  };
  try {
    const nlohmann::json rest = nlohmann::json::parse(trace_text, callback);  // the events were taken
    (void)rest;
  } catch (const Stop&) {
    return failed;
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(source + ": not JSON: " + e.what());
  }
  if (!found) return Status::Error(source + ": expected a Chrome trace (an array of events)");
  for (const auto& [key, span] : instances) by_signature[span.second].push_back(span.first);
  std::vector<TraceSample> out;
  for (const auto& [signature, durations] : by_signature)
    out.push_back({signature, MidMedian(durations), static_cast<int>(durations.size())});
  if (out.empty()) return Status::Error(source + ": no compute op events (is it a trace of `concerto run --trace`?)");
  return out;
}

MergedProfile MergeProfiles(const std::vector<ProfileDb>& dbs) {
  assert(!dbs.empty());
  std::map<std::pair<std::string, std::string>, std::vector<double>> by_key;
  for (const ProfileDb& db : dbs)
    for (const auto& [key, duration_us] : db.entries()) by_key[key].push_back(duration_us);
  MergedProfile out;
  std::vector<double> spreads;
  for (auto& [key, durations] : by_key) {
    std::sort(durations.begin(), durations.end());
    const size_t n = durations.size();
    out.db.Add(key.first, key.second, MidMedian(durations));
    if (n != dbs.size()) continue;
    ++out.entries_in_all;
    if (n < 2 || durations.front() <= 0) continue;
    const double spread = durations.back() / durations.front();
    spreads.push_back(spread);
    if (spread > out.max_spread) {
      out.max_spread = spread;
      out.max_spread_signature = key.second;
    }
  }
  if (!spreads.empty()) out.median_spread = MidMedian(spreads);
  return out;
}

}  // namespace concerto
