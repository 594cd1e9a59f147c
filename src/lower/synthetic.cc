#include "concerto/lower/synthetic.h"

#include <algorithm>
#include <random>
#include <string>

namespace concerto {

Program SyntheticProgram(const SyntheticSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  Program p;
  p.name = "synthetic-" + std::to_string(spec.num_ops);
  p.mesh.axes = {{"dp", spec.ranks}};
  Graph g;
  g.name = "main";
  const int64_t n = 512;  // every tensor is [n, n] bf16
  auto add_tensor = [&](const std::string& name) {
    Tensor t;
    t.name = name;
    t.shape = {n, n};
    t.dtype = DType::kBF16;
    t.sharding = {{}, {}};
    g.tensors.push_back(std::move(t));
    return g.tensors.back().name;
  };
  std::vector<std::string> produced = {add_tensor("input")};
  const std::string weight = add_tensor("weight");
  std::uniform_int_distribution<int> back(1, 6);
  std::uniform_real_distribution<double> scale(0.5, 2.0);
  for (int i = 0; i < spec.num_ops; ++i) {
    Op op;
    op.id = i;
    std::string out = add_tensor("t" + std::to_string(i));
    const std::string& last = produced.back();
    if (spec.comm_every > 0 && i % spec.comm_every == spec.comm_every - 1) {
      op.name = "ar" + std::to_string(i);
      op.kind = OpKind::kCollective;
      op.stream = "comm";
      op.collective = CollectiveType::kAllReduce;
      op.group.axes = {"dp"};
      int k = std::min<int>(back(rng), static_cast<int>(produced.size()));
      op.inputs = {produced[produced.size() - k]};
      op.message_bytes = static_cast<int64_t>(n * n * 2 * scale(rng) * 4);
      op.tags.purpose = "grad_sync";
      op.tags.phase = Phase::kBackward;
    } else if (i % 3 == 0) {
      op.name = "mm" + std::to_string(i);
      op.stream = "compute";
      op.compute_type = ComputeType::kMatmul;
      op.inputs = {last, weight};
      op.flops = 2.0 * n * n * n * scale(rng);
      op.bytes = 3.0 * n * n * 2;
    } else {
      op.name = "ew" + std::to_string(i);
      op.stream = "compute";
      op.compute_type = ComputeType::kAdd;
      int k = std::min<int>(back(rng), static_cast<int>(produced.size()));
      op.inputs = {last, spec.fan_in > 1 ? produced[produced.size() - k] : last};
      op.bytes = 3.0 * n * n * 2 * scale(rng);
      op.flops = static_cast<double>(n * n);
    }
    op.outputs = {out};
    g.ops.push_back(std::move(op));
    produced.push_back(out);
  }
  p.graphs.push_back(std::move(g));
  Role role{"spmd", "main", {}};
  for (int r = 0; r < spec.ranks; ++r) role.ranks.push_back(r);
  p.roles.push_back(std::move(role));
  return p;
}

}  // namespace concerto
