// Vision models (lower/vision.h): ViT and Wide ResNet forwards as
// torchvision computes them, the autodiff backward, Adam, and a plan applied
// by the SPMD partitioner.
#include "concerto/lower/vision.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "concerto/ir/autodiff.h"
#include "concerto/ir/op_registry.h"
#include "concerto/lower/graph_builder.h"
#include "concerto/lower/sharding_plan.h"
#include "concerto/util/did_you_mean.h"
#include "concerto/util/input_file.h"
#include "spec_fields.h"

namespace concerto {
namespace {

using lower::Attrs;
using lower::GraphBuilder;
using lower::Shape;
using lower::Sharding;

int64_t Elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Sharding Whole(size_t rank) { return Sharding(rank); }

/// Builds one forward; remembers the parameters (in creation order) and the
/// loss. Names follow the module: "L3.attn.q.w", "s2.b0.conv1.w".
class Forward {
 public:
  Forward(Graph* g, DType dtype) : b_(g), dtype_(dtype) {}

  GraphBuilder& b() { return b_; }
  const std::vector<std::string>& params() const { return params_; }

  std::string Param(const std::string& name, Shape shape) {
    params_.push_back(name);
    const size_t r = shape.size();
    return b_.AddTensor(name, std::move(shape), dtype_, Whole(r));
  }
  std::string Act(const std::string& name, Shape shape, DType dtype = DType::kF32) {
    const size_t r = shape.size();
    return b_.AddTensor(name, std::move(shape), dtype == DType::kF32 ? dtype_ : dtype, Whole(r));
  }
  const Shape& ShapeOf(const std::string& t) const { return b_.Get(t).shape; }

  /// The runtime's all-ones constant [1, n] (docs/runtime.md), declared once.
  std::string Ones(int64_t n) {
    const std::string name = "const.ones." + std::to_string(n);
    if (ones_.insert(name).second) b_.AddTensor(name, {1, n}, dtype_, Whole(2));
    return name;
  }

  std::string Reshape(const std::string& x, const std::string& name, Shape shape) {
    std::string y = Act(name, std::move(shape));
    b_.AddCompute(name, ComputeType::kIdentity, {x}, {y}, 0);
    return y;
  }

  std::string Matmul(const std::string& name, const std::string& a, const std::string& w, bool ta = false,
                     bool tb = false) {
    const Shape& as = ShapeOf(a);
    const Shape& ws = ShapeOf(w);
    const int64_t m = ta ? as[as.size() - 1] : as[as.size() - 2], k = ta ? as[as.size() - 2] : as.back();
    const int64_t n = tb ? ws[ws.size() - 2] : ws.back();
    Shape out(as.begin(), as.end() - 2);
    const int64_t batch = Elements(out);
    out.push_back(m);
    out.push_back(n);
    std::string y = Act(name, out);
    b_.AddCompute(name, ComputeType::kMatmul, {a, w}, {y}, 2.0 * batch * m * n * k,
                  {{"transpose_a", ta ? 1 : 0}, {"transpose_b", tb ? 1 : 0}});
    return y;
  }

  std::string Elementwise(const std::string& name, ComputeType type, std::vector<std::string> in,
                          Attrs attrs = {}) {
    std::string y = Act(name, ShapeOf(in[0]));
    const double flops = FlopsPerUnit(type) * static_cast<double>(Elements(ShapeOf(in[0])));
    b_.AddCompute(name, type, std::move(in), {y}, flops, std::move(attrs));
    return y;
  }

  /// x @ w + bias (a Linear with w [in, out]).
  std::string Linear(const std::string& name, const std::string& x, int64_t in, int64_t out) {
    const std::string w = Param(name + ".w", {in, out});
    const std::string bias = Param(name + ".b", {out});
    return Elementwise(name + ".bias", ComputeType::kAdd, {Matmul(name, x, w), bias});
  }

  std::string LayerNorm(const std::string& name, const std::string& x, double eps) {
    const int64_t h = ShapeOf(x).back();
    return Elementwise(name, ComputeType::kLayerNorm, {x, Param(name + ".gamma", {h}), Param(name + ".beta", {h})},
                       {{"eps", eps}});
  }

  /// conv2d without bias, then batch norm with per-rank statistics.
  std::string ConvBn(const std::string& name, const std::string& x, int64_t cout, int k, int stride, int pad) {
    const Shape& xs = ShapeOf(x);
    const int64_t n = xs[0], cin = xs[1], h = xs[2];
    const int64_t p = (h + 2 * pad - k) / stride + 1;
    const std::string w = Param(name + ".conv.w", {cout, cin, k, k});
    std::string y = Act(name + ".conv", {n, cout, p, p});
    b_.AddCompute(name + ".conv", ComputeType::kConv2d, {x, w}, {y}, 2.0 * n * cout * p * p * cin * k * k,
                  {{"stride", stride}, {"padding", pad}});
    std::string z = Act(name + ".bn", {n, cout, p, p});
    std::string mean = Act(name + ".bn.mean", {cout}, DType::kF32);
    std::string invstd = Act(name + ".bn.invstd", {cout}, DType::kF32);
    b_.AddCompute(name + ".bn", ComputeType::kBatchNorm,
                  {y, Param(name + ".bn.gamma", {cout}), Param(name + ".bn.beta", {cout})}, {z, mean, invstd},
                  FlopsPerUnit(ComputeType::kBatchNorm) * static_cast<double>(Elements(ShapeOf(y))),
                  {{"eps", 1e-5}, {"local_stats", 1}});
    return z;
  }

  /// The mean cross entropy of logits [N, C] against labels [N]; returns the loss.
  std::string Loss(const std::string& logits, int64_t n) {
    const std::string labels = b_.AddTensor("labels", {n}, DType::kI64, Whole(1));
    std::string m = Act("loss.max", {n}, DType::kF32), z = Act("loss.sum_exp", {n}, DType::kF32);
    std::string t = Act("loss.target", {n}, DType::kF32);
    std::string loss = b_.AddTensor("loss", {}, DType::kF32, {});
    const double elems = static_cast<double>(Elements(ShapeOf(logits)));
    b_.AddCompute("loss.max", ComputeType::kReduceMax, {logits}, {m}, FlopsPerUnit(ComputeType::kReduceMax) * elems);
    b_.AddCompute("loss.sum_exp", ComputeType::kSumExp, {logits, m}, {z}, FlopsPerUnit(ComputeType::kSumExp) * elems);
    b_.AddCompute("loss.target", ComputeType::kGatherTarget, {logits, labels}, {t}, 0);
    b_.AddCompute("loss", ComputeType::kCrossEntropy, {m, z, t}, {loss},
                  FlopsPerUnit(ComputeType::kCrossEntropy) * static_cast<double>(n));
    return loss;
  }

 private:
  GraphBuilder b_;
  DType dtype_;
  std::vector<std::string> params_;
  std::set<std::string> ones_;
};

/// torchvision's VisionTransformer forward: patch conv (+ bias plane), class
/// token, positions, pre-norm encoder layers, final norm, the class token's head.
std::string VitForward(const VisionConfig& c, int64_t n, Forward& f) {
  const int64_t d = c.hidden, grid = c.image / c.patch, s = grid * grid + 1;
  GraphBuilder& b = f.b();
  const std::string images = f.Act("images", {n, 3, c.image, c.image});
  const std::string pw = f.Param("patch.w", {d, 3, c.patch, c.patch});
  std::string y = f.Act("patch.conv", {n, d, grid, grid});
  b.AddCompute("patch.conv", ComputeType::kConv2d, {images, pw}, {y},
               2.0 * n * d * grid * grid * 3 * c.patch * c.patch, {{"stride", c.patch}, {"padding", 0}});
  // The conv bias [d] as a [d, grid, grid] plane (ones-matmul), added over the batch.
  const std::string pcol = f.Reshape(f.Param("patch.b", {d}), "patch.b.col", {d, 1});
  const std::string plane = f.Reshape(f.Matmul("patch.b.plane", pcol, f.Ones(grid * grid)), "patch.b.dgg",
                                      {d, grid, grid});
  y = f.Elementwise("patch.bias", ComputeType::kAdd, {y, plane});
  y = f.Reshape(y, "patch.flat", {n, d, grid * grid});
  std::string tokens = f.Act("patch.tokens", {n, grid * grid, d});
  b.AddCompute("patch.tokens", ComputeType::kTranspose, {y}, {tokens}, 0, {{"axis0", 1}, {"axis1", 2}});
  // The class token expanded over the batch: ones[1, n]^T @ cls[1, d].
  const std::string cls = f.Matmul("cls.expand", f.Ones(n), f.Param("cls", {1, d}), true);
  const std::string cls3 = f.Reshape(cls, "cls.rows", {n, 1, d});
  std::string x = f.Act("embed.cat", {n, s, d});
  b.AddCompute("embed.cat", ComputeType::kConcat, {cls3, tokens}, {x}, 0, {{"axis", 1}});
  x = f.Elementwise("embed.pos", ComputeType::kAdd, {x, f.Param("pos", {s, d})});
  for (int l = 0; l < c.layers; ++l) {
    b.SetLayer(l);
    const std::string p = "L" + std::to_string(l);
    const std::string h = f.LayerNorm(p + ".ln1", x, 1e-6);
    const std::string q = f.Linear(p + ".attn.q", h, d, d), k = f.Linear(p + ".attn.k", h, d, d);
    const std::string v = f.Linear(p + ".attn.v", h, d, d);
    std::string o = f.Act(p + ".attn", {n, s, d});
    b.AddCompute(p + ".attn", ComputeType::kAttention, {q, k, v}, {o}, 4.0 * n * s * s * d,
                 {{"heads", c.heads}, {"causal", 0}});
    x = f.Elementwise(p + ".attn.res", ComputeType::kAdd, {x, f.Linear(p + ".attn.o", o, d, d)});
    const std::string h2 = f.LayerNorm(p + ".ln2", x, 1e-6);
    const std::string a = f.Elementwise(p + ".mlp.gelu", ComputeType::kGelu, {f.Linear(p + ".mlp.fc1", h2, d, c.mlp)},
                                        {{"exact", 1}});
    x = f.Elementwise(p + ".mlp.res", ComputeType::kAdd, {x, f.Linear(p + ".mlp.fc2", a, c.mlp, d)});
  }
  b.SetLayer(-1);
  x = f.LayerNorm("ln_f", x, 1e-6);
  std::string first = f.Act("cls.out", {n, 1, d});
  b.AddCompute("cls.out", ComputeType::kSlice, {x}, {first}, 0, {{"axis", 1}, {"start", 0}, {"len", 1}});
  return f.Linear("head", f.Reshape(first, "cls.flat", {n, d}), d, c.classes);
}

/// torchvision's ResNet with Bottleneck blocks (v1.5: the stride on the 3x3),
/// the 3x3 `width_factor` times wider; global average pool as a ones-matmul.
std::string WideResnetForward(const VisionConfig& c, int64_t n, Forward& f) {
  GraphBuilder& b = f.b();
  const std::string images = f.Act("images", {n, 3, c.image, c.image});
  std::string x = f.Elementwise("stem.relu", ComputeType::kRelu, {f.ConvBn("stem", images, 64, 7, 2, 3)});
  const int64_t h = f.ShapeOf(x)[2], p = (h + 2 - 3) / 2 + 1;
  std::string pooled = f.Act("stem.pool", {n, 64, p, p});
  b.AddCompute("stem.pool", ComputeType::kMaxPool2d, {x}, {pooled}, 9.0 * n * 64 * p * p,
               {{"kernel", 3}, {"stride", 2}, {"padding", 1}});
  x = pooled;
  int64_t cin = 64;
  int layer = 0;
  const int planes[4] = {64, 128, 256, 512};
  for (int st = 0; st < 4; ++st) {
    const int64_t width = planes[st] * c.width_factor, cout = planes[st] * 4;
    for (int bl = 0; bl < c.blocks[static_cast<size_t>(st)]; ++bl) {
      b.SetLayer(layer++);
      const int stride = (bl == 0 && st > 0) ? 2 : 1;
      const std::string p = fmt::format("s{}.b{}", st, bl);
      std::string y = f.Elementwise(p + ".relu1", ComputeType::kRelu, {f.ConvBn(p + ".1", x, width, 1, 1, 0)});
      y = f.Elementwise(p + ".relu2", ComputeType::kRelu, {f.ConvBn(p + ".2", y, width, 3, stride, 1)});
      y = f.ConvBn(p + ".3", y, cout, 1, 1, 0);
      const std::string skip = bl == 0 ? f.ConvBn(p + ".down", x, cout, 1, stride, 0) : x;
      x = f.Elementwise(p + ".relu3", ComputeType::kRelu, {f.Elementwise(p + ".res", ComputeType::kAdd, {y, skip})});
      cin = cout;
    }
  }
  b.SetLayer(-1);
  const Shape& xs = f.ShapeOf(x);
  const int64_t plane = xs[2] * xs[3];
  const std::string rows = f.Reshape(x, "pool.rows", {n * cin, plane});
  const std::string sum = f.Matmul("pool.sum", rows, f.Ones(plane), false, true);
  const std::string mean = f.Elementwise("pool.mean", ComputeType::kScale, {sum}, {{"scale", 1.0 / plane}});
  return f.Linear("fc", f.Reshape(mean, "pool.out", {n, cin}), cin, c.classes);
}

/// Appends one Adam op per parameter (fp32 moments, fp32 master copy when the
/// parameters are not fp32), in the autodiff's gradient order.
void AddAdam(Graph* g, const std::vector<std::string>& params, const std::map<std::string, std::string>& grads) {
  std::map<std::string, const Tensor*> by_name;
  for (const Tensor& t : g->tensors) by_name[t.name] = &t;
  int next_id = 0;
  for (const Op& op : g->ops) next_id = std::max(next_id, op.id + 1);
  std::vector<Tensor> added;
  std::vector<Op> ops;
  for (const std::string& p : params) {
    auto it = grads.find(p);
    if (it == grads.end()) continue;
    const Tensor& t = *by_name.at(p);
    auto declare = [&](const std::string& name, DType dtype) {
      Tensor n = t;
      n.name = name;
      n.dtype = dtype;
      added.push_back(n);
      return name;
    };
    Op op;
    op.id = next_id++;
    op.name = p + ".adam";
    op.kind = OpKind::kCompute;
    op.stream = "compute";
    op.compute_type = ComputeType::kAdam;
    op.inputs = {p, it->second, declare(p + ".adam_m", DType::kF32), declare(p + ".adam_v", DType::kF32)};
    op.outputs = {declare(p + ".next", t.dtype), declare(p + ".adam_m.next", DType::kF32),
                  declare(p + ".adam_v.next", DType::kF32)};
    if (t.dtype != DType::kF32) {
      op.inputs.push_back(declare(p + ".master", DType::kF32));
      op.outputs.push_back(declare(p + ".master.next", DType::kF32));
    }
    op.attrs = {{"lr", 1e-4}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"step", 1}};
    op.flops = FlopsPerUnit(ComputeType::kAdam) * static_cast<double>(t.NumElements());
    op.tags.phase = Phase::kOptimizer;
    op.tags.microbatch = 0;
    ops.push_back(op);
  }
  for (Tensor& t : added) g->tensors.push_back(std::move(t));
  std::map<std::string, int64_t> bytes_of;
  for (const Tensor& t : g->tensors) bytes_of[t.name] = t.Bytes();
  for (Op& op : ops) {
    double bytes = 0;
    for (const auto* names : {&op.inputs, &op.outputs})
      for (const std::string& n : *names) bytes += static_cast<double>(bytes_of.at(n));
    op.bytes = bytes;
    g->ops.push_back(std::move(op));
  }
}

/// ZeRO-3 as DeepSpeed runs it: the partitioner gathers a parameter once and
/// keeps it from its forward use to its backward use; DeepSpeed frees it after
/// the forward and gathers it again for the backward. For every forward
/// parameter gather read by backward ops, a second gather (same shard, group
/// and stream) is inserted before the first of them, which read its output.
/// Returns the number of gathers added.
int RegatherForBackward(Graph* g) {
  int next_id = 0;
  for (const Op& op : g->ops) next_id = std::max(next_id, op.id + 1);
  std::map<std::string, size_t> tensor_at;
  for (size_t i = 0; i < g->tensors.size(); ++i) tensor_at[g->tensors[i].name] = i;
  std::vector<Op> out;
  std::map<std::string, std::string> renamed;  // gathered parameter -> its backward gather's output
  std::map<std::string, const Op*> fwd_gather;
  for (const Op& op : g->ops)
    if (op.kind == OpKind::kCollective && op.collective == CollectiveType::kAllGather &&
        op.tags.purpose == "param_gather" && op.tags.phase == Phase::kForward)
      fwd_gather[op.outputs[0]] = &op;
  int added = 0;
  std::vector<Tensor> new_tensors;
  for (const Op& op : g->ops) {
    Op copy = op;
    if (op.tags.phase != Phase::kForward) {
      for (std::string& in : copy.inputs) {
        auto it = fwd_gather.find(in);
        if (it == fwd_gather.end()) continue;
        auto done = renamed.find(in);
        if (done == renamed.end()) {
          Tensor t = g->tensors[tensor_at.at(in)];
          t.name = in + ".bwd";
          new_tensors.push_back(t);
          Op gather = *it->second;
          gather.id = next_id++;
          gather.name = it->second->name + ".bwd";
          gather.outputs = {t.name};
          gather.tags = op.tags;
          gather.tags.purpose = "param_gather";
          out.push_back(std::move(gather));
          done = renamed.emplace(in, t.name).first;
          ++added;
        }
        in = done->second;
      }
    }
    out.push_back(std::move(copy));
  }
  for (Tensor& t : new_tensors) g->tensors.push_back(std::move(t));
  g->ops = std::move(out);
  return added;
}

}  // namespace

std::vector<std::string> VisionPresetNames() {
  return {"vit-b16", "vit-l16", "vit-h14", "wide-resnet50-2", "wide-resnet101-2"};
}

Result<VisionConfig> VisionPreset(const std::string& name) {
  VisionConfig c;
  c.name = name;
  // Sizes: Dosovitskiy et al. 2021, table 1 (ViT), and torchvision's resnet.py (Zagoruyko & Komodakis widths).
  if (name == "vit-b16") {
    c.layers = 12, c.hidden = 768, c.heads = 12, c.mlp = 3072, c.patch = 16, c.batch = 32;
  } else if (name == "vit-l16") {
    c.layers = 24, c.hidden = 1024, c.heads = 16, c.mlp = 4096, c.patch = 16, c.batch = 16;
  } else if (name == "vit-h14") {
    c.layers = 32, c.hidden = 1280, c.heads = 16, c.mlp = 5120, c.patch = 14, c.batch = 8;
  } else if (name == "wide-resnet50-2") {
    c.kind = VisionConfig::Kind::kWideResnet, c.blocks = {3, 4, 6, 3}, c.batch = 32;
  } else if (name == "wide-resnet101-2") {
    c.kind = VisionConfig::Kind::kWideResnet, c.blocks = {3, 4, 23, 3}, c.batch = 32;
  } else {
    return Status::Error("unknown vision model '" + name + "'" + DidYouMean(name, VisionPresetNames()));
  }
  return c;
}

namespace {

/// Reads one vision spec: every field checked, unknown ones named.
class VisionSpecReader {
 public:
  explicit VisionSpecReader(const std::string& source) : source_(source) {}

  Result<VisionConfig> Read(const YAML::Node& root, const std::string& family) {
    c_.kind = family == "vit" ? VisionConfig::Kind::kVit : VisionConfig::Kind::kWideResnet;
    c_.name = std::filesystem::path(source_).stem().string();
    if (c_.kind == VisionConfig::Kind::kWideResnet) c_.blocks = {3, 4, 6, 3};
    const bool vit = c_.kind == VisionConfig::Kind::kVit;
    const std::map<std::string, int*> ints =
        vit ? std::map<std::string, int*>{{"image", &c_.image}, {"classes", &c_.classes}, {"batch", &c_.batch},
                                         {"patch", &c_.patch},  {"layers", &c_.layers},   {"hidden", &c_.hidden},
                                         {"heads", &c_.heads},  {"mlp", &c_.mlp}}
            : std::map<std::string, int*>{{"image", &c_.image},
                                         {"classes", &c_.classes},
                                         {"batch", &c_.batch},
                                         {"width_factor", &c_.width_factor}};
    for (const auto& kv : root) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (key == "family") continue;
      if (key == "name") {
        if (!kv.second.IsScalar()) return FieldError(key, "must be a string");
        c_.name = kv.second.Scalar();
      } else if (key == "dtype") {
        CONCERTO_RETURN_IF_ERROR(Field(key, spec::FloatDType(kv.second, &c_.dtype)));
      } else if (key == "blocks" && !vit) {
        if (!kv.second.IsSequence() || kv.second.size() != 4)
          return FieldError(key, "must be a list of four block counts (one per stage)");
        for (size_t i = 0; i < 4; ++i)
          CONCERTO_RETURN_IF_ERROR(Field(key, spec::PositiveInt(kv.second[i], kMaxVisionDim, &c_.blocks[i])));
      } else if (auto it = ints.find(key); it != ints.end()) {
        CONCERTO_RETURN_IF_ERROR(Field(key, spec::PositiveInt(kv.second, kMaxVisionDim, it->second)));
      } else {
        std::string known = "name, family, dtype";
        for (const auto& [k, v] : ints) known += ", " + k;
        if (!vit) known += ", blocks";
        return FieldError(key, "unknown field for family " + family + " (known: " + known + ")");
      }
    }
    if (vit && c_.image % c_.patch != 0)
      return Status::Error(source_ + ": patch (" + std::to_string(c_.patch) + ") must divide image (" +
                           std::to_string(c_.image) + ")");
    if (vit && c_.hidden % c_.heads != 0)
      return Status::Error(source_ + ": heads (" + std::to_string(c_.heads) + ") must divide hidden (" +
                           std::to_string(c_.hidden) + ")");
    if (!vit && c_.image < 32)
      return Status::Error(source_ + ": image (" + std::to_string(c_.image) +
                           ") must be at least 32 (the stem and three strided stages halve it five times)");
    if (Status size = ValidateVisionSize(c_, c_.batch); !size.ok())
      return Status::Error(source_ + ": " + size.message());
    return c_;
  }

 private:
  Status FieldError(const std::string& field, const std::string& what) const {
    return Status::Error(source_ + ": field '" + field + "': " + what);
  }

  /// `read`'s error, if any, as an error of field `key`.
  Status Field(const std::string& key, const Status& read) const {
    return read.ok() ? read : FieldError(key, read.message());
  }

  static constexpr int64_t kMaxVisionDim = int64_t{1} << 20;

  const std::string& source_;
  VisionConfig c_;
};

}  // namespace

Result<std::optional<VisionConfig>> LoadVisionSpec(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::optional<VisionConfig>();
  Result<std::string> text = ReadInputFile(path, "model spec file", kMaxSmallInputBytes);
  if (!text.ok()) return text.status();
  return ParseVisionSpec(*text, path);
}

Result<std::optional<VisionConfig>> ParseVisionSpec(const std::string& text, const std::string& path) {
  try {
    const YAML::Node root = YAML::Load(text);
    if (!root.IsMap() || !root["family"] || !root["family"].IsScalar()) return std::optional<VisionConfig>();
    const std::string family = root["family"].Scalar();
    if (family != "vit" && family != "wide-resnet") return std::optional<VisionConfig>();
    Result<VisionConfig> c = VisionSpecReader(path).Read(root, family);
    if (!c.ok()) return c.status();
    return std::optional<VisionConfig>(*c);
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
}

Status ValidateVisionSize(const VisionConfig& c, int64_t images) {
  const std::string where = "model '" + c.name + "'";
  const int blocks = c.kind == VisionConfig::Kind::kVit
                         ? c.layers
                         : c.blocks[0] + c.blocks[1] + c.blocks[2] + c.blocks[3];
  if (blocks > kMaxModelLayers)
    return Status::Error(fmt::format("{}: {} must be at most {} in all (every one adds ops to the lowered "
                                     "program), got {}",
                                     where, c.kind == VisionConfig::Kind::kVit ? "layers" : "blocks",
                                     kMaxModelLayers, blocks));
  // The largest tensors, in doubles (they cannot overflow here); each at most
  // 2^40 elements, as for the decoders, so every int64 size the lowering
  // computes (bytes, flops) stays far from overflow.
  constexpr double kMaxElements = 1099511627776.0;  // 2^40
  const double n = static_cast<double>(images), image = c.image;
  std::vector<std::pair<std::string, double>> sizes = {{"the images (batch x 3 x image x image)", n * 3 * image * image}};
  if (c.kind == VisionConfig::Kind::kVit) {
    const double d = c.hidden, grid = image / c.patch, s = grid * grid + 1;
    sizes.push_back({"an activation (batch x tokens x max(hidden, mlp))", n * s * std::max(d, double(c.mlp))});
    sizes.push_back({"the attention scores (batch x heads x tokens x tokens)", n * c.heads * s * s});
    sizes.push_back({"the parameters", c.layers * (4 * d * d + 2 * d * c.mlp) + s * d + d * c.classes});
    sizes.push_back({"the head's logits (batch x classes)", n * c.classes});
  } else {
    const double planes[4] = {64, 128, 256, 512};
    double spatial = image / 4, widest = n * 64 * (image / 2) * (image / 2), weights = 0, cin = 64;
    for (size_t st = 0; st < 4; ++st) {
      const double width = planes[st] * c.width_factor, cout = planes[st] * 4;
      widest = std::max(widest, n * std::max(width, cout) * spatial * spatial);
      weights += c.blocks[st] * (cin * width + 9 * width * width + width * cout) + cin * cout;
      cin = cout;
      spatial = std::max(1.0, spatial / 2);
    }
    sizes.push_back({"an activation (batch x channels x height x width)", widest});
    sizes.push_back({"the parameters", weights + 2048 * double(c.classes)});
    sizes.push_back({"the head's logits (batch x classes)", n * c.classes});
  }
  for (const auto& [what, elements] : sizes)
    if (!(elements <= kMaxElements))
      return Status::Error(fmt::format("{}: {} would have {:.3g} elements, more than the limit of 2^40 "
                                       "(docs/ir.md \"Limits\")",
                                       where, what, elements));
  return Status::Ok();
}

Result<int64_t> VisionParameterCount(const VisionConfig& c) {
  CONCERTO_RETURN_IF_ERROR(ValidateVisionSize(c, c.batch));
  Graph g;
  Forward f(&g, c.dtype);
  if (c.kind == VisionConfig::Kind::kVit) VitForward(c, 1, f);
  else WideResnetForward(c, 1, f);
  int64_t n = 0;
  for (const std::string& p : f.params()) n += Elements(f.ShapeOf(p));
  return n;
}

Result<Program> LowerVisionUnsharded(const VisionConfig& c, int64_t images) {
  if (images < 1) return Status::Error("model '" + c.name + "': batch " + std::to_string(images) + " < 1");
  CONCERTO_RETURN_IF_ERROR(ValidateVisionSize(c, images));
  Program p;
  p.name = c.name;
  Graph g;
  g.name = "main";
  g.streams = {"compute"};
  Forward f(&g, c.dtype);
  f.b().SetPhase(Phase::kForward);
  const std::string logits = c.kind == VisionConfig::Kind::kVit ? VitForward(c, images, f) : WideResnetForward(c, images, f);
  const std::string loss = f.Loss(logits, images);
  const std::vector<std::string> params = f.params();
  Result<AutodiffResult> grads = Differentiate(&g, loss, params);
  if (!grads.ok()) return Status::Error("model '" + c.name + "': " + grads.status().message());
  AddAdam(&g, params, grads->grads);
  p.graphs.push_back(std::move(g));
  p.roles.push_back({"spmd", "main", {0}});
  return p;
}

Result<Program> LowerVision(const VisionConfig& c, const ParallelPlan& plan) {
  const std::string where = "plan '" + PlanToString(plan) + "' for model '" + c.name + "'";
  if (plan.pp != 1 || plan.ep != 1 || plan.sp || plan.microbatches != 1 || plan.dap != 1 || plan.vstages != 1 ||
      plan.recompute != Recompute::kNone || !plan.order.empty())
    return Status::Error(where + ": the vision frontend takes dp, tp (ViT) and zero only");
  const bool vit = c.kind == VisionConfig::Kind::kVit;
  if (!vit && plan.tp != 1) return Status::Error(where + ": tp applies to the ViTs only (a ResNet is data parallel)");
  if (plan.zero == 1 || plan.zero == 2)
    return Status::Error(where + ": zero=1 and zero=2 are not built for the vision presets (their optimizer would "
                         "update a rank's block of a replicated parameter, which the partitioner can only take with "
                         "an all-to-all); use zero=3, or concerto.torch's plan='dp=N,zero=2'");
  if (vit && c.heads % plan.tp != 0)
    return Status::Error(where + ": tp (" + std::to_string(plan.tp) + ") must divide heads (" + std::to_string(c.heads) + ")");
  Result<Program> unsharded = LowerVisionUnsharded(c, static_cast<int64_t>(c.batch) * plan.dp);
  if (!unsharded.ok()) return unsharded.status();
  // The plan as a sharding file: the batch over dp; Megatron's tp split; ZeRO's dim 0 over dp.
  ShardingPlan sp;
  sp.source = where;
  sp.mesh.axes = {MeshAxis{"dp", plan.dp}, MeshAxis{"tp", plan.tp}};
  auto rule = [&](const std::string& tensor, std::vector<DimSharding> dims) {
    sp.rules.push_back({tensor, false, std::move(dims)});
  };
  const Graph& g = unsharded->graphs[0];
  std::map<std::string, const Tensor*> tensors;
  for (const Tensor& t : g.tensors) tensors[t.name] = &t;
  rule("images", {{{"dp"}, {}}, {}, {}, {}});
  // The ViT's class-token expansion (ones[1, batch]^T @ cls): its rows follow the batch.
  const std::string batch_ones = "const.ones." + std::to_string(static_cast<int64_t>(c.batch) * plan.dp);
  if (vit && tensors.count(batch_ones)) rule(batch_ones, {{}, {{"dp"}, {}}});
  rule("labels", {{{"dp"}, {}}});
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kCompute || op.compute_type != ComputeType::kAdam) continue;
    const std::string& param = op.inputs[0];
    const Tensor& t = *tensors.at(param);
    std::vector<DimSharding> dims(t.shape.size());
    auto ends = [&](const std::string& suffix) {
      return param.size() >= suffix.size() && param.compare(param.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (plan.tp > 1) {
      if (ends(".attn.q.w") || ends(".attn.k.w") || ends(".attn.v.w") || ends(".mlp.fc1.w")) dims[1].axes = {"tp"};
      if (ends(".attn.q.b") || ends(".attn.k.b") || ends(".attn.v.b") || ends(".mlp.fc1.b")) dims[0].axes = {"tp"};
      if (ends(".attn.o.w") || ends(".mlp.fc2.w")) dims[0].axes = {"tp"};
    }
    std::vector<DimSharding> zdims = dims;
    const int64_t tp_split = zdims[0].axes.empty() ? 1 : plan.tp;
    const bool zero_fits = !t.shape.empty() && plan.dp > 1 && (t.shape[0] / tp_split) % plan.dp == 0;
    if (zero_fits) zdims[0].axes.insert(zdims[0].axes.begin(), "dp");
    auto with = [&](int stage) { return plan.zero >= stage && zero_fits ? zdims : dims; };  // stage 1 or 3
    bool any = false;
    for (const auto& d : dims) any = any || !d.axes.empty();
    if (any || (plan.zero >= 3 && zero_fits)) rule(param, with(3));
    if (tensors.count(param + ".master")) rule(param + ".master", with(1));
    if (any || (plan.zero >= 1 && zero_fits)) {
      rule(param + ".adam_m", with(1));
      rule(param + ".adam_v", with(1));
    }
    // The gradient is left to the partitioner: computed as a partial sum over dp and reduced to
    // what Adam needs (reduce-scattered under ZeRO-3).
  }
  Result<Program> out = PartitionProgram(*unsharded, sp);
  if (!out.ok()) return out.status();
  if (plan.zero == 3)
    for (Graph& graph : out->graphs) RegatherForBackward(&graph);
  out->name = fmt::format("{}.{}", c.name, PlanToString(plan));
  return out;
}

}  // namespace concerto
