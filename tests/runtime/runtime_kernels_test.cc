// The runtime's fp32 kernels (src/runtime/kernels.cc) against docs/ir.md:
// every backward op is checked against central finite differences of its
// forward op on tiny shapes; forward ops against direct formulas; the ops
// whose result depends on the rank's shard (embedding, gather_target,
// cross_entropy_grad) on a sharded rank.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "concerto/ir/op_registry.h"
#include "concerto/ir/verifier.h"
#include "concerto/runtime/kernels.h"

namespace concerto {
namespace {

using Values = std::vector<std::vector<float>>;

/// A tensor description for a kernel argument.
Tensor T(const std::string& name, std::vector<int64_t> shape, DType dtype = DType::kF32,
         std::vector<std::vector<std::string>> sharding = {}) {
  Tensor t;
  t.name = name;
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.sharding = std::move(sharding);
  return t;
}

/// A compute op of `type` with `attrs` over tensors named in0.., out0...
Op MakeOp(ComputeType type, size_t nin, size_t nout, std::map<std::string, double> attrs = {}) {
  Op op;
  op.name = std::string(ToString(type));
  op.kind = OpKind::kCompute;
  op.compute_type = type;
  op.attrs = std::move(attrs);
  for (size_t i = 0; i < nin; ++i) op.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < nout; ++i) op.outputs.push_back("out" + std::to_string(i));
  return op;
}

/// Uniform values in [lo, hi) from a fixed seed.
std::vector<float> Random(int64_t n, unsigned seed, float lo = -1, float hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

/// Runs `op` on (ins, in_values) into fresh outputs; fails the test on error.
Values Exec(const Op& op, const std::vector<Tensor>& ins, Values in_values,
           const std::vector<Tensor>& outs, const Mesh& mesh = {}, int rank = 0,
           KernelScratch* scratch = nullptr) {
  std::vector<const Tensor*> in_meta, out_meta;
  for (const Tensor& t : ins) in_meta.push_back(&t);
  for (const Tensor& t : outs) out_meta.push_back(&t);
  Status check = CheckKernel(op, in_meta, out_meta);
  EXPECT_TRUE(check.ok()) << check.message();
  Values out_values(outs.size());
  std::vector<KernelArg> in, out;
  for (size_t i = 0; i < ins.size(); ++i) in.push_back({&ins[i], in_values[i].data()});
  for (size_t i = 0; i < outs.size(); ++i) {
    out_values[i].assign(outs[i].NumElements(), NAN);
    out.push_back({&outs[i], out_values[i].data()});
  }
  Status st = RunKernel(op, in, out, KernelContext{&mesh, rank, scratch});
  EXPECT_TRUE(st.ok()) << st.message();
  return out_values;
}

/// sum_k dot(w_k, y_k) in double.
double Objective(const Values& y, const Values& w) {
  double s = 0;
  for (size_t k = 0; k < y.size(); ++k)
    for (size_t i = 0; i < y[k].size(); ++i) s += static_cast<double>(w[k][i]) * y[k][i];
  return s;
}

/// Checks `analytic` (the gradient of sum_k dot(w_k, forward(x)_k) with
/// respect to input `which`) against central differences, element by element.
void ExpectGradient(const std::function<Values(const Values&)>& forward, const Values& x,
                    const Values& w, int which, const std::vector<float>& analytic,
                    const std::string& label, double eps = 1e-2, double tol = 5e-4) {
  ASSERT_EQ(analytic.size(), x[which].size()) << label;
  double scale = 0;
  for (float g : analytic) scale = std::max(scale, std::fabs(static_cast<double>(g)));
  for (size_t i = 0; i < x[which].size(); ++i) {
    Values plus = x, minus = x;
    plus[which][i] += static_cast<float>(eps);
    minus[which][i] -= static_cast<float>(eps);
    const double h = static_cast<double>(plus[which][i]) - minus[which][i];
    const double numeric = (Objective(forward(plus), w) - Objective(forward(minus), w)) / h;
    EXPECT_NEAR(analytic[i], numeric, tol * std::max(1.0, scale))
        << label << ": d/d input " << which << " [" << i << "]";
  }
}

/// Random output weights shaped like `outs`.
Values Weights(const std::vector<Tensor>& outs, unsigned seed) {
  Values w;
  for (const Tensor& t : outs) w.push_back(Random(t.NumElements(), seed++));
  return w;
}

// ---- forward ops -------------------------------------------------------------

/// Naive c = op(a) @ op(b) for one batch entry.
std::vector<float> NaiveMatmul(const float* a, const float* b, int64_t m, int64_t k, int64_t n,
                               bool ta, bool tb) {
  std::vector<float> c(m * n, 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l)
        s += static_cast<double>(ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
      c[i * n + j] = static_cast<float>(s);
    }
  return c;
}

TEST(RuntimeKernels, MatmulTransposesAndBatches) {
  const int64_t batch = 3, m = 4, k = 5, n = 2;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int b_batched = 0; b_batched < 2; ++b_batched) {
        Tensor a = T("in0", ta ? std::vector<int64_t>{batch, k, m} : std::vector<int64_t>{batch, m, k});
        std::vector<int64_t> bs = tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n};
        if (b_batched) bs.insert(bs.begin(), batch);
        Tensor b = T("in1", bs), c = T("out0", {batch, m, n});
        Values in = {Random(a.NumElements(), 1), Random(b.NumElements(), 2)};
        Op op = MakeOp(ComputeType::kMatmul, 2, 1, {{"transpose_a", ta}, {"transpose_b", tb}});
        Values out = Exec(op, {a, b}, in, {c});
        for (int64_t i = 0; i < batch; ++i) {
          std::vector<float> want = NaiveMatmul(in[0].data() + i * m * k,
                                                in[1].data() + (b_batched ? i * k * n : 0), m, k,
                                                n, ta, tb);
          for (int64_t j = 0; j < m * n; ++j)
            EXPECT_NEAR(out[0][i * m * n + j], want[j], 1e-5)
                << "ta=" << ta << " tb=" << tb << " batched=" << b_batched;
        }
      }
}

TEST(RuntimeKernels, ElementwiseForwards) {
  Tensor x = T("in0", {2, 3}), y = T("in1", {3}), z = T("out0", {2, 3});
  Values in = {Random(6, 3), Random(3, 4)};
  Values add = Exec(MakeOp(ComputeType::kAdd, 2, 1), {x, y}, in, {z});
  Values scale = Exec(MakeOp(ComputeType::kScale, 1, 1, {{"scale", -0.5}}), {x}, {in[0]}, {z});
  Values gelu = Exec(MakeOp(ComputeType::kGelu, 1, 1), {x}, {in[0]}, {z});
  Values silu = Exec(MakeOp(ComputeType::kSilu, 1, 1), {x}, {in[0]}, {z});
  Values mul = Exec(MakeOp(ComputeType::kMul, 2, 1), {x, x}, {in[0], in[0]}, {z});
  for (int i = 0; i < 6; ++i) {
    const double v = in[0][i];
    EXPECT_FLOAT_EQ(add[0][i], in[0][i] + in[1][i % 3]);
    EXPECT_FLOAT_EQ(scale[0][i], -0.5f * in[0][i]);
    EXPECT_NEAR(gelu[0][i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-6);
    EXPECT_NEAR(silu[0][i], v / (1 + std::exp(-v)), 1e-6);
    EXPECT_FLOAT_EQ(mul[0][i], in[0][i] * in[0][i]);
  }
}

TEST(RuntimeKernels, NormsAndSoftmaxForwards) {
  Tensor x = T("in0", {2, 4}), g = T("in1", {4}), b = T("in2", {4}), y = T("out0", {2, 4});
  Values in = {Random(8, 5), Random(4, 6, 0.5, 1.5), Random(4, 7)};
  Values ln = Exec(MakeOp(ComputeType::kLayerNorm, 3, 1, {{"eps", 1e-5}}), {x, g, b}, in, {y});
  Values rms = Exec(MakeOp(ComputeType::kRmsNorm, 2, 1), {x, g}, {in[0], in[1]}, {y});
  Values sm = Exec(MakeOp(ComputeType::kSoftmax, 1, 1), {x}, {in[0]}, {y});
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0, sq = 0, z = 0;
    for (int j = 0; j < 4; ++j) mean += in[0][r * 4 + j] / 4.0;
    for (int j = 0; j < 4; ++j) {
      const double v = in[0][r * 4 + j];
      var += (v - mean) * (v - mean) / 4;
      sq += v * v / 4;
      z += std::exp(v);
    }
    for (int j = 0; j < 4; ++j) {
      const double v = in[0][r * 4 + j];
      EXPECT_NEAR(ln[0][r * 4 + j], (v - mean) / std::sqrt(var + 1e-5) * in[1][j] + in[2][j], 1e-5);
      EXPECT_NEAR(rms[0][r * 4 + j], v / std::sqrt(sq + 1e-6) * in[1][j], 1e-5);
      EXPECT_NEAR(sm[0][r * 4 + j], std::exp(v) / z, 1e-6);
    }
  }
}

/// Attention per its definition with explicit loops (no shared code).
std::vector<float> NaiveAttention(const Values& in, int64_t b, int64_t s, int64_t heads,
                                  int64_t kv, int64_t d, bool causal, double scale) {
  std::vector<float> o(b * s * heads * d, 0.0f);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kv);
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> w(s, 0.0);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < s; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (int64_t t = 0; t < d; ++t)
            dot += in[0][(bi * s + i) * heads * d + h * d + t] * in[1][(bi * s + j) * kv * d + g * d + t];
          w[j] = scale * dot;
          mx = std::max(mx, w[j]);
        }
        for (int64_t j = 0; j < s; ++j) {
          w[j] = causal && j > i ? 0 : std::exp(w[j] - mx);
          z += w[j];
        }
        for (int64_t j = 0; j < s; ++j)
          for (int64_t t = 0; t < d; ++t)
            o[(bi * s + i) * heads * d + h * d + t] +=
                static_cast<float>(w[j] / z * in[2][(bi * s + j) * kv * d + g * d + t]);
      }
    }
  return o;
}

TEST(RuntimeKernels, AttentionForwardGroupedCausal) {
  const int64_t b = 2, s = 3, heads = 4, kv = 2, d = 2;
  Tensor q = T("in0", {b, s, heads * d}), k = T("in1", {b, s, kv * d}), v = T("in2", {b, s, kv * d});
  Tensor o = T("out0", {b, s, heads * d});
  Values in = {Random(q.NumElements(), 8), Random(k.NumElements(), 9), Random(v.NumElements(), 10)};
  for (int causal = 0; causal < 2; ++causal) {
    Op op = MakeOp(ComputeType::kAttention, 3, 1, {{"heads", heads}, {"kv_heads", kv}, {"causal", causal}});
    Values out = Exec(op, {q, k, v}, in, {o});
    std::vector<float> want = NaiveAttention(in, b, s, heads, kv, d, causal, 1 / std::sqrt(2.0));
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[0][i], want[i], 1e-5) << "causal=" << causal;
  }
  Op scaled = MakeOp(ComputeType::kAttention, 3, 1, {{"heads", heads}, {"kv_heads", kv}, {"scale", 0.3}});
  Values out = Exec(scaled, {q, k, v}, in, {o});
  std::vector<float> want = NaiveAttention(in, b, s, heads, kv, d, false, 0.3);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[0][i], want[i], 1e-5) << "scale attr";
}

TEST(RuntimeKernels, EmbeddingOnAShardedTable) {
  // Vocabulary 6 split over tp=2: rank 1 holds rows 3..5.
  Mesh mesh;
  mesh.axes = {{"tp", 2}};
  Tensor table = T("in0", {3, 2}, DType::kF32, {{"tp"}, {}});
  Tensor ids = T("in1", {2, 2}, DType::kI32, {{}, {}});
  Tensor y = T("out0", {2, 2, 2});
  Values in = {{10, 11, 20, 21, 30, 31}, {0, 3, 5, 4}};
  Values out = Exec(MakeOp(ComputeType::kEmbedding, 2, 1), {table, ids}, in, {y}, mesh, 1);
  EXPECT_EQ(out[0], (std::vector<float>{0, 0, 10, 11, 30, 31, 20, 21}));
  Values rank0 = Exec(MakeOp(ComputeType::kEmbedding, 2, 1), {table, ids}, in, {y}, mesh, 0);
  EXPECT_EQ(rank0[0], (std::vector<float>{10, 11, 0, 0, 0, 0, 0, 0}));
  // embedding_grad scatters dy back into the rows this rank holds.
  Tensor dy = T("in0", {2, 2, 2}), dtable = T("out0", {3, 2}, DType::kF32, {{"tp"}, {}});
  Values g = Exec(MakeOp(ComputeType::kEmbeddingGrad, 2, 1), {dy, ids},
                 {{1, 1, 2, 2, 3, 3, 4, 4}, {0, 3, 3, 4}}, {dtable}, mesh, 1);
  EXPECT_EQ(g[0], (std::vector<float>{5, 5, 4, 4, 0, 0}));
}

TEST(RuntimeKernels, ScratchKeptBetweenCallsGivesTheSameResults) {
  // embedding_grad's accumulator and conv2d_grad's buffers come from the
  // caller's KernelScratch when it passes one: the same values as a call
  // with its own buffers, and the buffer stays for the next call (stale
  // contents from a larger earlier call change nothing).
  Mesh mesh;
  mesh.axes = {{"tp", 2}};
  Tensor ids = T("in1", {2, 2}, DType::kI32, {{}, {}});
  Tensor dy = T("in0", {2, 2, 2}), dtable = T("out0", {3, 2}, DType::kF32, {{"tp"}, {}});
  const Op grad = MakeOp(ComputeType::kEmbeddingGrad, 2, 1);
  KernelScratch scratch;
  const Values first = {{1, 1, 2, 2, 3, 3, 4, 4}, {0, 3, 3, 4}}, second = {{7, 7, 1, 1, 1, 1, 2, 2}, {4, 4, 5, 0}};
  EXPECT_EQ(Exec(grad, {dy, ids}, first, {dtable}, mesh, 1, &scratch), Exec(grad, {dy, ids}, first, {dtable}, mesh, 1));
  EXPECT_GE(scratch.buffers[0].capacity(), 6u);
  const double* kept = scratch.buffers[0].data();
  EXPECT_EQ(Exec(grad, {dy, ids}, second, {dtable}, mesh, 1, &scratch)[0], (std::vector<float>{0, 0, 8, 8, 1, 1}));
  EXPECT_EQ(scratch.buffers[0].data(), kept);  // not allocated again
  Tensor x = T("in1", {1, 2, 4, 4}), w = T("in2", {3, 2, 3, 3}), y = T("in0", {1, 3, 4, 4});
  const Op conv_grad = MakeOp(ComputeType::kConv2dGrad, 3, 2, {{"padding", 1}});
  const Values in = {Random(48, 1), Random(32, 2), Random(54, 3)};
  Values own = Exec(conv_grad, {y, x, w}, in, {x, w});
  Exec(grad, {dy, ids}, first, {dtable}, mesh, 1, &scratch);  // another kernel used slot 0 in between
  EXPECT_EQ(Exec(conv_grad, {y, x, w}, in, {x, w}, {}, 0, &scratch), own);
  EXPECT_EQ(Exec(conv_grad, {y, x, w}, in, {x, w}, {}, 0, &scratch), own);
}

TEST(RuntimeKernels, VocabShardedLossPieces) {
  Mesh mesh;
  mesh.axes = {{"tp", 2}};
  Tensor logits = T("in0", {2, 3}, DType::kF32, {{}, {"tp"}});  // rank 1: vocab 3..5
  Tensor labels = T("in1", {2}, DType::kI32);
  Tensor t = T("out0", {2});
  Values in = {{1, 2, 3, 4, 5, 6}, {4, 1}};
  Values target = Exec(MakeOp(ComputeType::kGatherTarget, 2, 1), {logits, labels}, in, {t}, mesh, 1);
  EXPECT_EQ(target[0], (std::vector<float>{2, 0}));
  Values mx = Exec(MakeOp(ComputeType::kReduceMax, 1, 1), {logits}, {in[0]}, {t});
  EXPECT_EQ(mx[0], (std::vector<float>{3, 6}));
  Values z = Exec(MakeOp(ComputeType::kSumExp, 2, 1), {logits, T("in1", {2})}, {in[0], mx[0]}, {t});
  EXPECT_NEAR(z[0][0], std::exp(-2.0) + std::exp(-1.0) + 1, 1e-6);
  Tensor m = T("in0", {2}), zz = T("in1", {2}), tt = T("in2", {2}), loss = T("out0", {});
  Values l = Exec(MakeOp(ComputeType::kCrossEntropy, 3, 1), {m, zz, tt}, {{1, 2}, {2, 3}, {0.5, 1}}, {loss});
  EXPECT_NEAR(l[0][0], (std::log(2.0) + 1 - 0.5 + std::log(3.0) + 2 - 1) / 2, 1e-6);
  Values l4 = Exec(MakeOp(ComputeType::kCrossEntropy, 3, 1, {{"denominator", 4}}), {m, zz, tt},
                  {{1, 2}, {2, 3}, {0.5, 1}}, {loss});
  EXPECT_NEAR(l4[0][0], l[0][0] / 2, 1e-6);
}

TEST(RuntimeKernels, AdamStep) {
  Tensor p = T("in0", {3});
  Op op = MakeOp(ComputeType::kAdam, 4, 3,
                 {{"lr", 0.1}, {"beta1", 0.8}, {"beta2", 0.9}, {"eps", 1e-3}, {"step", 2},
                  {"weight_decay", 0.01}});
  Values in = {{1, -2, 0.5}, {0.3, -0.1, 0}, {0.1, 0.2, -0.3}, {0.01, 0.02, 0.03}};
  Values out = Exec(op, {p, p, p, p}, in, {p, p, p});
  for (int i = 0; i < 3; ++i) {
    const double g = in[1][i];
    const double m = 0.8 * in[2][i] + 0.2 * g, v = 0.9 * in[3][i] + 0.1 * g * g;
    const double mh = m / (1 - 0.64), vh = v / (1 - 0.81);
    EXPECT_NEAR(out[0][i], in[0][i] - 0.1 * mh / (std::sqrt(vh) + 1e-3) - 0.1 * 0.01 * in[0][i], 1e-6);
    EXPECT_NEAR(out[1][i], m, 1e-7);
    EXPECT_NEAR(out[2][i], v, 1e-7);
  }
}

TEST(RuntimeKernels, SliceConcatCastIdentity) {
  Tensor x = T("in0", {2, 5});
  Values in = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
  Values sl = Exec(MakeOp(ComputeType::kSlice, 1, 1, {{"axis", 1}, {"start", 1}, {"len", 3}}), {x},
                  in, {T("out0", {2, 3})});
  EXPECT_EQ(sl[0], (std::vector<float>{1, 2, 3, 6, 7, 8}));
  Values cat = Exec(MakeOp(ComputeType::kConcat, 2, 1, {{"axis", 1}}), {T("in0", {2, 1}), T("in1", {2, 2})},
                   {{0, 1}, {2, 3, 4, 5}}, {T("out0", {2, 3})});
  EXPECT_EQ(cat[0], (std::vector<float>{0, 2, 3, 1, 4, 5}));
  Values cast = Exec(MakeOp(ComputeType::kCast, 1, 1), {T("in0", {3})}, {{1.7f, -1.7f, 2.0f}},
                    {T("out0", {3}, DType::kI32)});
  EXPECT_EQ(cast[0], (std::vector<float>{1, -1, 2}));
  Values to_bf16 = Exec(MakeOp(ComputeType::kCast, 1, 1), {T("in0", {1})}, {{1.2345678f}},
                       {T("out0", {1}, DType::kBF16)});
  EXPECT_EQ(to_bf16[0][0], 1.2345678f);  // every float dtype is fp32 in the runtime
  Values id = Exec(MakeOp(ComputeType::kIdentity, 2, 2), {x, T("in1", {2})}, {in[0], {7, 8}},
                  {T("out0", {10}), T("out1", {1, 2})});
  EXPECT_EQ(id[0], in[0]);
  EXPECT_EQ(id[1], (std::vector<float>{7, 8}));
}

TEST(RuntimeKernels, CheckKernelRejectsMissingAttributes) {
  Tensor q = T("in0", {1, 2, 4}), o = T("out0", {1, 2, 4});
  Op op = MakeOp(ComputeType::kAttention, 3, 1);
  Status st = CheckKernel(op, {&q, &q, &q}, {&o});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing required attribute 'heads'"), std::string::npos) << st.message();
  Op sl = MakeOp(ComputeType::kSlice, 1, 1, {{"axis", 0.5}, {"start", 0}});
  EXPECT_FALSE(CheckKernel(sl, {&q}, {&o}).ok());
}

TEST(RuntimeKernels, OneKernelPerRegistryEntryInEnumOrder) {
  // The runtime's facet of the op registry: a kernel for every compute type,
  // in the registry's order, with its operand counts.
  const std::vector<CpuKernel>& k = CpuKernels();
  ASSERT_EQ(k.size(), OpRegistry().size());
  for (size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(k[i].type, OpRegistry()[i].type) << OpRegistry()[i].name;
    EXPECT_NE(k[i].run, nullptr) << OpRegistry()[i].name;
    EXPECT_EQ(FindCpuKernel(k[i].type), &k[i]);
  }
}

TEST(RuntimeKernels, IntegerAttributesAreCheckedAgainstTheRegistrysBounds) {
  // transpose's axis0 is an integer in [0, 1e15] by its registry entry: -1
  // and 0.5 are rejected by CheckKernel, naming the attribute; 0 passes.
  ASSERT_NE(FindAttr(ComputeType::kTranspose, "axis0"), nullptr);
  EXPECT_TRUE(FindAttr(ComputeType::kTranspose, "axis0")->integer);
  Tensor x = T("in0", {2, 3}), y = T("out0", {3, 2});
  for (double bad : {-1.0, 0.5}) {
    Op op = MakeOp(ComputeType::kTranspose, 1, 1, {{"axis0", bad}, {"axis1", 1}});
    Status st = CheckKernel(op, {&x}, {&y});
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("axis0"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(CheckKernel(MakeOp(ComputeType::kTranspose, 1, 1, {{"axis0", 0}, {"axis1", 1}}), {&x}, {&y}).ok());
}

// ---- backward ops against finite differences --------------------------------

TEST(RuntimeKernelGradients, GeluSiluSwiglu) {
  Tensor x = T("in0", {2, 3}), y = T("out0", {2, 3});
  Values in = {Random(6, 11, -2, 2), Random(6, 12, -2, 2)};
  Values w = Weights({y}, 13);
  struct Pair { ComputeType fwd, bwd; };
  for (Pair p : {Pair{ComputeType::kGelu, ComputeType::kGeluGrad},
                 Pair{ComputeType::kSilu, ComputeType::kSiluGrad}}) {
    auto fwd = [&](const Values& v) { return Exec(MakeOp(p.fwd, 1, 1), {x}, {v[0]}, {y}); };
    Values dx = Exec(MakeOp(p.bwd, 2, 1), {x, x}, {w[0], in[0]}, {y});
    ExpectGradient(fwd, {in[0]}, w, 0, dx[0], std::string(ToString(p.bwd)));
  }
  auto swiglu = [&](const Values& v) { return Exec(MakeOp(ComputeType::kSwiglu, 2, 1), {x, x}, v, {y}); };
  Values g = Exec(MakeOp(ComputeType::kSwigluGrad, 3, 2), {x, x, x}, {w[0], in[0], in[1]}, {y, y});
  ExpectGradient(swiglu, in, w, 0, g[0], "swiglu_grad dgate");
  ExpectGradient(swiglu, in, w, 1, g[1], "swiglu_grad dup");
}

TEST(RuntimeKernelGradients, LayerNorm) {
  Tensor x = T("in0", {3, 5}), g = T("in1", {5}), y = T("out0", {3, 5});
  Values in = {Random(15, 21), Random(5, 22, 0.5, 1.5), Random(5, 23)};
  Values w = Weights({y}, 24);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kLayerNorm, 3, 1), {x, g, g}, v, {y}); };
  Values grads = Exec(MakeOp(ComputeType::kLayerNormGrad, 3, 3), {y, x, g}, {w[0], in[0], in[1]},
                     {x, g, g});
  ExpectGradient(fwd, in, w, 0, grads[0], "layer_norm_grad dx");
  ExpectGradient(fwd, in, w, 1, grads[1], "layer_norm_grad dgamma");
  ExpectGradient(fwd, in, w, 2, grads[2], "layer_norm_grad dbeta");
}

TEST(RuntimeKernelGradients, RmsNorm) {
  Tensor x = T("in0", {3, 5}), g = T("in1", {5}), y = T("out0", {3, 5});
  Values in = {Random(15, 31), Random(5, 32, 0.5, 1.5)};
  Values w = Weights({y}, 33);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kRmsNorm, 2, 1), {x, g}, v, {y}); };
  Values grads = Exec(MakeOp(ComputeType::kRmsNormGrad, 3, 2), {y, x, g}, {w[0], in[0], in[1]}, {x, g});
  ExpectGradient(fwd, in, w, 0, grads[0], "rms_norm_grad dx");
  ExpectGradient(fwd, in, w, 1, grads[1], "rms_norm_grad dgamma");
}

TEST(RuntimeKernelGradients, Softmax) {
  Tensor x = T("in0", {2, 4}), y = T("out0", {2, 4});
  Values in = {Random(8, 41, -2, 2)};
  Values w = Weights({y}, 42);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kSoftmax, 1, 1), {x}, v, {y}); };
  Values probs = fwd(in);
  Values dx = Exec(MakeOp(ComputeType::kSoftmaxGrad, 2, 1), {y, y}, {w[0], probs[0]}, {x});
  ExpectGradient(fwd, in, w, 0, dx[0], "softmax_grad");
}

TEST(RuntimeKernelGradients, AttentionGroupedCausalAndFull) {
  const int64_t b = 2, s = 3, heads = 4, kv = 2, d = 2;
  Tensor q = T("in0", {b, s, heads * d}), k = T("in1", {b, s, kv * d}), v = T("in2", {b, s, kv * d});
  Tensor o = T("out0", {b, s, heads * d});
  Values in = {Random(q.NumElements(), 51), Random(k.NumElements(), 52), Random(v.NumElements(), 53)};
  Values w = Weights({o}, 54);
  for (int causal = 0; causal < 2; ++causal) {
    std::map<std::string, double> attrs = {{"heads", heads}, {"kv_heads", kv}, {"causal", causal}};
    if (causal) attrs["scale"] = 0.4;
    auto fwd = [&](const Values& x) { return Exec(MakeOp(ComputeType::kAttention, 3, 1, attrs), {q, k, v}, x, {o}); };
    Values grads = Exec(MakeOp(ComputeType::kAttentionGrad, 4, 3, attrs), {o, q, k, v},
                       {w[0], in[0], in[1], in[2]}, {q, k, v});
    const std::string label = causal ? "attention_grad causal" : "attention_grad";
    ExpectGradient(fwd, in, w, 0, grads[0], label + " dq");
    ExpectGradient(fwd, in, w, 1, grads[1], label + " dk");
    ExpectGradient(fwd, in, w, 2, grads[2], label + " dv");
  }
}

TEST(RuntimeKernelGradients, Embedding) {
  Mesh mesh;
  mesh.axes = {{"tp", 2}};
  Tensor table = T("in0", {3, 2}, DType::kF32, {{"tp"}, {}});
  Tensor ids = T("in1", {2, 3}, DType::kI32);
  Tensor y = T("out0", {2, 3, 2});
  Values in = {Random(6, 61), {0, 3, 4, 4, 5, 2}};
  Values w = Weights({y}, 62);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kEmbedding, 2, 1), {table, ids}, v, {y}, mesh, 1); };
  Values g = Exec(MakeOp(ComputeType::kEmbeddingGrad, 2, 1), {y, ids}, {w[0], in[1]}, {table}, mesh, 1);
  ExpectGradient(fwd, in, w, 0, g[0], "embedding_grad");
}

TEST(RuntimeKernelGradients, CrossEntropyOnAVocabShard) {
  // The loss of the full vocabulary (one rank) differentiated against
  // cross_entropy_grad on both vocab shards (tp=2) with a denominator attr.
  Mesh mesh;
  mesh.axes = {{"tp", 2}};
  const int64_t rows = 3, vocab = 4;
  Tensor logits = T("in0", {rows, vocab}), labels = T("in1", {rows}, DType::kI32);
  Tensor row = T("out0", {rows}), loss = T("out0", {1});
  Values in = {Random(rows * vocab, 71, -2, 2), {1, 3, 0}};
  const double denom = 5;
  auto fwd = [&](const Values& v) {
    Values m = Exec(MakeOp(ComputeType::kReduceMax, 1, 1), {logits}, {v[0]}, {row});
    Values z = Exec(MakeOp(ComputeType::kSumExp, 2, 1), {logits, row}, {v[0], m[0]}, {row});
    Values t = Exec(MakeOp(ComputeType::kGatherTarget, 2, 1), {logits, labels}, {v[0], v[1]}, {row});
    return Exec(MakeOp(ComputeType::kCrossEntropy, 3, 1, {{"denominator", denom}}), {row, row, row},
               {m[0], z[0], t[0]}, {loss});
  };
  Values m = Exec(MakeOp(ComputeType::kReduceMax, 1, 1), {logits}, {in[0]}, {row});
  Values z = Exec(MakeOp(ComputeType::kSumExp, 2, 1), {logits, row}, {in[0], m[0]}, {row});
  // Each tp rank computes the gradient of its half of the vocabulary.
  Tensor shard = T("in0", {rows, vocab / 2}, DType::kF32, {{}, {"tp"}});
  std::vector<float> full(rows * vocab);
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> part(rows * vocab / 2);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < vocab / 2; ++j) part[r * 2 + j] = in[0][r * vocab + rank * 2 + j];
    Values g = Exec(MakeOp(ComputeType::kCrossEntropyGrad, 4, 1, {{"denominator", denom}}),
                   {shard, row, row, labels}, {part, m[0], z[0], in[1]}, {shard}, mesh, rank);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < vocab / 2; ++j) full[r * vocab + rank * 2 + j] = g[0][r * 2 + j];
  }
  ExpectGradient(fwd, in, {{1.0f}}, 0, full, "cross_entropy_grad");
}

TEST(RuntimeKernelGradients, MatmulWeightAndInputGrads) {
  // The frontends' linear-layer gradients: dX = dY W^T, dW = X^T dY (2-D views).
  Tensor x = T("in0", {2, 3, 4}), wt = T("in1", {4, 5}), y = T("out0", {2, 3, 5});
  Values in = {Random(24, 81), Random(20, 82)};
  Values w = Weights({y}, 83);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kMatmul, 2, 1), {x, wt}, v, {y}); };
  Values dx = Exec(MakeOp(ComputeType::kMatmul, 2, 1, {{"transpose_b", 1}}), {y, wt}, {w[0], in[1]}, {x});
  Values dw = Exec(MakeOp(ComputeType::kMatmul, 2, 1, {{"transpose_a", 1}}),
                  {T("in0", {6, 4}), T("in1", {6, 5})}, {in[0], w[0]}, {wt});
  ExpectGradient(fwd, in, w, 0, dx[0], "matmul dX");
  ExpectGradient(fwd, in, w, 1, dw[0], "matmul dW");
}

// ---- mixture of experts ------------------------------------------------------

TEST(RuntimeKernels, TopKPicksLargestWithTiesToTheLowerId) {
  // Row 0: 0.1 0.4 0.2 0.3 -> ids 1, 3; gates 0.4, 0.3 (normalized: 4/7, 3/7).
  // Row 1: 0.25 x 4 (a tie) -> ids 0, 1.
  Tensor p = T("in0", {2, 4}), gates = T("out0", {2, 2}), ids = T("out1", {2, 2}, DType::kI32);
  Values in = {{0.1f, 0.4f, 0.2f, 0.3f, 0.25f, 0.25f, 0.25f, 0.25f}};
  Values out = Exec(MakeOp(ComputeType::kTopK, 1, 2, {{"k", 2}}), {p}, in, {gates, ids});
  EXPECT_EQ(out[1], (std::vector<float>{1, 3, 0, 1}));
  EXPECT_EQ(out[0], (std::vector<float>{0.4f, 0.3f, 0.25f, 0.25f}));
  Values norm = Exec(MakeOp(ComputeType::kTopK, 1, 2, {{"k", 2}, {"normalize", 1}}), {p}, in, {gates, ids});
  EXPECT_NEAR(norm[0][0], 4.0 / 7, 1e-6);
  EXPECT_NEAR(norm[0][1], 3.0 / 7, 1e-6);
  EXPECT_NEAR(norm[0][2], 0.5, 1e-6);
}

TEST(RuntimeKernels, MoeDispatchDropsOverCapacityInTokenOrder) {
  // G = 1 group of n = 3 tokens (h = 2), k = 2, E = 2 experts, capacity C = 2:
  // ids (0,1) (0,1) (1,0): expert 0 takes tokens 0, 1 and drops token 2's
  // second choice; expert 1 takes tokens 0, 1 and drops token 2's first.
  Tensor x = T("in0", {1, 3, 2}), ids = T("in1", {1, 3, 2}, DType::kI32);
  Tensor buf = T("out0", {2, 2, 2});
  Values in = {{1, 2, 3, 4, 5, 6}, {0, 1, 0, 1, 1, 0}};
  Values out = Exec(MakeOp(ComputeType::kMoeDispatch, 2, 1), {x, ids}, in, {buf});
  EXPECT_EQ(out[0], (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
  // Two groups of one token, capacity 1 per group: each group has its own slots.
  Tensor x2 = T("in0", {2, 1, 2}), ids2 = T("in1", {2, 1, 1}, DType::kI32), buf2 = T("out0", {2, 2, 2});
  Values out2 = Exec(MakeOp(ComputeType::kMoeDispatch, 2, 1), {x2, ids2}, {{1, 2, 3, 4}, {1, 1}}, {buf2});
  EXPECT_EQ(out2[0], (std::vector<float>{0, 0, 0, 0, 1, 2, 3, 4}));
  // Combine with gates 0.5 (first choice) and 2 (second choice).
  Tensor gates = T("in2", {1, 3, 2}), y = T("out0", {1, 3, 2});
  Values comb = Exec(MakeOp(ComputeType::kMoeCombine, 3, 1), {buf, ids, gates},
                     {out[0], in[1], {0.5f, 2, 0.5f, 2, 0.5f, 2}}, {y});
  // token 0: 0.5 * [1, 2] + 2 * [1, 2] = [2.5, 5]; token 1: 2.5 * [3, 4] = [7.5, 10];
  // token 2: both choices dropped, 0.
  EXPECT_EQ(comb[0], (std::vector<float>{2.5f, 5, 7.5f, 10, 0, 0}));
  // An id outside [0, E) is an error naming the op.
  Tensor one = T("out0", {2, 2, 2});
  std::vector<const Tensor*> ins = {&x, &ids}, outs = {&one};
  ASSERT_TRUE(CheckKernel(MakeOp(ComputeType::kMoeDispatch, 2, 1), ins, outs).ok());
  std::vector<float> bad_ids = {0, 2, 0, 0, 0, 0}, xv = in[0], o(8);
  Mesh mesh;
  Status st = RunKernel(MakeOp(ComputeType::kMoeDispatch, 2, 1), {{&x, xv.data()}, {&ids, bad_ids.data()}},
                        {{&one, o.data()}}, KernelContext{&mesh, 0});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("expert id 2 at index 1 is outside [0, 2)"), std::string::npos) << st.message();
}

TEST(RuntimeKernels, TransposeSwapsTwoDims) {
  // x [2, 3, 2]: x[i][j][l] = 100 i + 10 j + l; swap dims 0 and 2 -> [2, 3, 2]
  // with y[l][j][i] = x[i][j][l]; swap dims 0 and 1 -> [3, 2, 2].
  Tensor x = T("in0", {2, 3, 2}), y02 = T("out0", {2, 3, 2}), y01 = T("out0", {3, 2, 2});
  std::vector<float> v;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int l = 0; l < 2; ++l) v.push_back(100 * i + 10 * j + l);
  Values a = Exec(MakeOp(ComputeType::kTranspose, 1, 1, {{"axis0", 2}, {"axis1", 0}}), {x}, {v}, {y02});
  Values b = Exec(MakeOp(ComputeType::kTranspose, 1, 1, {{"axis0", 0}, {"axis1", 1}}), {x}, {v}, {y01});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(a[0][(l * 3 + j) * 2 + i], 100 * i + 10 * j + l);
        EXPECT_EQ(b[0][(j * 2 + i) * 2 + l], 100 * i + 10 * j + l);
      }
}

TEST(RuntimeKernelGradients, TopKPlainAndNormalized) {
  // Probabilities at least 0.05 apart, so the +-1e-2 steps keep the choice.
  Tensor p = T("in0", {2, 4}), gates = T("out0", {2, 2}), ids = T("out1", {2, 2}, DType::kI32);
  Values in = {{0.10f, 0.45f, 0.20f, 0.30f, 0.50f, 0.05f, 0.35f, 0.15f}};
  Values w = {Random(4, 91), {0, 0, 0, 0}};
  for (int normalize = 0; normalize < 2; ++normalize) {
    std::map<std::string, double> attrs = {{"k", 2}, {"normalize", normalize}};
    auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kTopK, 1, 2, attrs), {p}, v, {gates, ids}); };
    Values top = fwd(in);
    Values dp = Exec(MakeOp(ComputeType::kTopKGrad, 3, 1, {{"normalize", normalize}}), {gates, ids, p},
                     {w[0], top[1], in[0]}, {p});
    ExpectGradient(fwd, in, w, 0, dp[0], normalize ? "top_k_grad normalized" : "top_k_grad");
  }
}

TEST(RuntimeKernelGradients, MoeDispatchAndCombine) {
  // G = 2 groups of n = 3 tokens, h = 2, k = 2, E = 3, capacity C = 1: some
  // choices are dropped, and their gradients must be 0 too.
  const int64_t G = 2, n = 3, h = 2, k = 2, E = 3, C = 1;
  Tensor x = T("in0", {G, n, h}), ids = T("in1", {G, n, k}, DType::kI32), gates = T("in2", {G, n, k});
  Tensor buf = T("out0", {E, G * C, h}), tok = T("out0", {G, n, h});
  const std::vector<float> id = {0, 1, 1, 2, 2, 0, 2, 1, 0, 2, 1, 0};
  Values in = {Random(G * n * h, 101), id};
  Values w = Weights({buf}, 102);
  auto dispatch = [&](const Values& v) { return Exec(MakeOp(ComputeType::kMoeDispatch, 2, 1), {x, ids}, v, {buf}); };
  Values dx = Exec(MakeOp(ComputeType::kMoeDispatchGrad, 2, 1), {buf, ids}, {w[0], id}, {tok});
  ExpectGradient(dispatch, in, w, 0, dx[0], "moe_dispatch_grad");
  // combine: d/dy and d/dgates.
  Values cin = {Random(E * G * C * h, 103), id, Random(G * n * k, 104, 0, 1)};
  Values cw = Weights({tok}, 105);
  auto combine = [&](const Values& v) { return Exec(MakeOp(ComputeType::kMoeCombine, 3, 1), {buf, ids, gates}, v, {tok}); };
  Values g = Exec(MakeOp(ComputeType::kMoeCombineGrad, 4, 2), {tok, buf, ids, gates},
                  {cw[0], cin[0], id, cin[2]}, {buf, gates});
  ExpectGradient(combine, cin, cw, 0, g[0], "moe_combine_grad dy");
  ExpectGradient(combine, cin, cw, 2, g[1], "moe_combine_grad dgates");
}

// ---- convolutional networks ----------------------------------------------------

/// 0.1 * (a random permutation of 0..n-1) - 0.05 (n - 1): values 0.1 apart
/// and at least 0.05 from 0, so a finite difference of 1e-2 never changes a
/// window's maximum nor crosses relu's kink.
std::vector<float> Spaced(int64_t n, unsigned seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(i) - 0.05f * static_cast<float>(n) + 0.05f;
  std::mt19937 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) std::swap(v[i], v[gen() % (i + 1)]);
  return v;
}

TEST(RuntimeKernels, Conv2dAgainstTheDefinition) {
  // x [1, 1, 3, 3] = 1..9, w [1, 1, 2, 2] = [[1, 0], [0, -1]], stride 1, no
  // padding: y[p][q] = x[p][q] - x[p+1][q+1] = -4 everywhere (2 x 2).
  // With padding 1 and stride 2: y [1, 1, 2, 2]; y[0][0] = 1*0 - x[0][0] = -1,
  // y[0][1] = 0 - x[0][2] = -3, y[1][0] = 0 - x[2][0] = -7,
  // y[1][1] = x[1][1] - x[2][2] = 5 - 9 = -4.
  Tensor x = T("in0", {1, 1, 3, 3}), w = T("in1", {1, 1, 2, 2}), y = T("out0", {1, 1, 2, 2});
  Values in = {{1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 0, 0, -1}};
  EXPECT_EQ(Exec(MakeOp(ComputeType::kConv2d, 2, 1), {x, w}, in, {y})[0], (std::vector<float>{-4, -4, -4, -4}));
  EXPECT_EQ(Exec(MakeOp(ComputeType::kConv2d, 2, 1, {{"stride", 2}, {"padding", 1}}), {x, w}, in, {y})[0],
            (std::vector<float>{-1, -3, -7, -4}));
}

TEST(RuntimeKernels, MaxPool2dAgainstTheDefinition) {
  // x [1, 1, 4, 4] = 0..15 row-major; kernel 2, stride 2: the bottom-right of
  // each block, 5, 7, 13, 15. Kernel 3, stride 2, padding 1 (3 x ... windows
  // clipped at the border): 5, 7, 13, 15 as well (padding never wins).
  Tensor x = T("in0", {1, 1, 4, 4}), y = T("out0", {1, 1, 2, 2});
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  EXPECT_EQ(Exec(MakeOp(ComputeType::kMaxPool2d, 1, 1, {{"kernel", 2}}), {x}, {v}, {y})[0],
            (std::vector<float>{5, 7, 13, 15}));
  EXPECT_EQ(Exec(MakeOp(ComputeType::kMaxPool2d, 1, 1, {{"kernel", 3}, {"stride", 2}, {"padding", 1}}), {x}, {v}, {y})[0],
            (std::vector<float>{5, 7, 13, 15}));
}

TEST(RuntimeKernelGradients, Relu) {
  Tensor x = T("in0", {4, 6}), y = T("out0", {4, 6});
  Values in = {Spaced(24, 31)};  // no value within 1e-2 of the kink
  Values w = Weights({y}, 32);
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kRelu, 1, 1), {x}, v, {y}); };
  Values g = Exec(MakeOp(ComputeType::kReluGrad, 2, 1), {y, x}, {w[0], in[0]}, {x});
  ExpectGradient(fwd, in, w, 0, g[0], "relu_grad");
}

TEST(RuntimeKernelGradients, Conv2dStridedPaddedNonSquare) {
  // x [2, 3, 5, 4], w [4, 3, 3, 2], stride 2, padding 1: y [2, 4, 3, 3].
  for (auto [stride, pad] : {std::pair{1, 0}, std::pair{2, 1}}) {
    const int64_t p = (5 + 2 * pad - 3) / stride + 1, q = (4 + 2 * pad - 2) / stride + 1;
    Tensor x = T("in0", {2, 3, 5, 4}), w = T("in1", {4, 3, 3, 2}), y = T("out0", {2, 4, p, q});
    const std::map<std::string, double> attrs = {{"stride", stride}, {"padding", pad}};
    Values in = {Random(120, 41), Random(72, 42)};
    Values wt = Weights({y}, 43);
    auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kConv2d, 2, 1, attrs), {x, w}, v, {y}); };
    Values g = Exec(MakeOp(ComputeType::kConv2dGrad, 3, 2, attrs), {y, x, w}, {wt[0], in[0], in[1]}, {x, w});
    const std::string label = "conv2d_grad stride " + std::to_string(stride) + " padding " + std::to_string(pad);
    ExpectGradient(fwd, in, wt, 0, g[0], label + " dx");
    ExpectGradient(fwd, in, wt, 1, g[1], label + " dw");
  }
}

TEST(RuntimeKernelGradients, MaxPool2dOverlappingAndTiled) {
  // Kernel 3, stride 2, padding 1 (windows overlap: an x element's gradient
  // sums over every window it wins) and kernel 2, stride 2 (tiles).
  for (auto [kernel, stride, pad] : {std::tuple{3, 2, 1}, std::tuple{2, 2, 0}}) {
    const int64_t p = (6 + 2 * pad - kernel) / stride + 1, q = (5 + 2 * pad - kernel) / stride + 1;
    Tensor x = T("in0", {2, 2, 6, 5}), y = T("out0", {2, 2, p, q});
    const std::map<std::string, double> attrs = {{"kernel", kernel}, {"stride", stride}, {"padding", pad}};
    Values in = {Spaced(120, 51)};
    Values w = Weights({y}, 52);
    auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kMaxPool2d, 1, 1, attrs), {x}, v, {y}); };
    Values g = Exec(MakeOp(ComputeType::kMaxPool2dGrad, 2, 1, attrs), {y, x}, {w[0], in[0]}, {x});
    ExpectGradient(fwd, in, w, 0, g[0], "max_pool2d_grad kernel " + std::to_string(kernel));
  }
}

TEST(RuntimeKernels, BatchNormUsesTheBatchStatistics) {
  // x [2, 2, 1, 2]: channel 0 holds 1, 3 (n=0) and 5, 7 (n=1): mean 4,
  // biased variance (9 + 1 + 1 + 9) / 4 = 5; channel 1 is constant 2: mean 2,
  // variance 0. eps 0: invstd 1/sqrt(5) and (eps 1e-5 for channel 1) 1/sqrt(1e-5).
  Tensor x = T("in0", {2, 2, 1, 2}), g = T("in1", {2}), mean = T("out1", {2});
  Values out = Exec(MakeOp(ComputeType::kBatchNorm, 3, 3, {{"eps", 1e-5}}), {x, g, g},
                    {{1, 3, 2, 2, 5, 7, 2, 2}, {1, 1}, {0, 10}}, {x, mean, mean});
  EXPECT_FLOAT_EQ(out[1][0], 4);
  EXPECT_FLOAT_EQ(out[1][1], 2);
  EXPECT_NEAR(out[2][0], 1 / std::sqrt(5 + 1e-5), 1e-6);
  EXPECT_NEAR(out[0][0], -3 / std::sqrt(5 + 1e-5), 1e-5);  // (1 - 4) / sqrt(5)
  EXPECT_FLOAT_EQ(out[0][2], 10);                            // channel 1: 0 * gamma + beta
}

TEST(RuntimeKernelGradients, BatchNormOverBatchAndSpatialDims) {
  Tensor x = T("in0", {3, 2, 2, 3}), g = T("in1", {2}), y = T("out0", {3, 2, 2, 3}), c = T("out1", {2});
  Values in = {Random(36, 61), Random(2, 62, 0.5, 1.5), Random(2, 63)};
  Values w = {Random(36, 64), std::vector<float>(2, 0.0f), std::vector<float>(2, 0.0f)};  // only y is weighted
  const std::map<std::string, double> attrs = {{"eps", 1e-5}};
  auto fwd = [&](const Values& v) { return Exec(MakeOp(ComputeType::kBatchNorm, 3, 3, attrs), {x, g, g}, v, {y, c, c}); };
  Values stats = fwd(in);
  Values grads = Exec(MakeOp(ComputeType::kBatchNormGrad, 5, 3, attrs), {y, x, g, c, c},
                      {w[0], in[0], in[1], stats[1], stats[2]}, {x, g, g});
  ExpectGradient(fwd, in, w, 0, grads[0], "batch_norm_grad dx", 1e-3, 2e-3);
  ExpectGradient(fwd, in, w, 1, grads[1], "batch_norm_grad dgamma", 1e-3, 2e-3);
  ExpectGradient(fwd, in, w, 2, grads[2], "batch_norm_grad dbeta", 1e-3, 2e-3);
}

TEST(RuntimeKernels, SynchronisedBatchNormFromSumsEqualsBatchNorm) {
  // One rank holding the whole batch: batch_norm_stats' sum and squared deviations (count = 3 x 2 x 3 =
  // 18 elements per channel) give the same y, mean, invstd and gradients as batch_norm computing its
  // own statistics. The input is far from zero mean (about 100, variance about 1/3): sum x^2 is then
  // about 1.8e5, whose fp32 rounding (0.008) alone moves E[x^2] - mean^2 by 4e-4, the variance by
  // 1e-3 (relative) and y by more than the tolerance; the two passes keep it.
  Tensor x = T("in0", {3, 2, 2, 3}), g = T("in1", {2}), y = T("out0", {3, 2, 2, 3}), c = T("out1", {2});
  Tensor sum = T("sum", {1, 2}), sums = T("sums", {2, 2});
  Values in = {Random(36, 71), Random(2, 72, 0.5, 1.5), Random(2, 73)};
  for (float& v : in[0]) v += 100;
  const std::map<std::string, double> attrs = {{"eps", 1e-5}}, sync = {{"eps", 1e-5}, {"count", 18}};
  Values plain = Exec(MakeOp(ComputeType::kBatchNorm, 3, 3, attrs), {x, g, g}, in, {y, c, c});
  Values s1 = Exec(MakeOp(ComputeType::kBatchNormStats, 1, 1), {x}, {in[0]}, {sum});
  Values s2 = Exec(MakeOp(ComputeType::kBatchNormStats, 2, 1, {{"count", 18}}), {x, sum}, {in[0], s1[0]}, {sum});
  Values synced = Exec(MakeOp(ComputeType::kBatchNorm, 5, 3, sync), {x, g, g, sum, sum},
                       {in[0], in[1], in[2], s1[0], s2[0]}, {y, c, c});
  for (size_t k = 0; k < 3; ++k)
    for (size_t i = 0; i < plain[k].size(); ++i)
      EXPECT_NEAR(synced[k][i], plain[k][i], 2e-5 * std::max(1.0f, std::abs(plain[k][i]))) << k << " " << i;
  Values dy = {Random(36, 74)};
  Values grad = Exec(MakeOp(ComputeType::kBatchNormGrad, 5, 3, attrs), {y, x, g, c, c},
                     {dy[0], in[0], in[1], plain[1], plain[2]}, {x, g, g});
  Values gs = Exec(MakeOp(ComputeType::kBatchNormGradStats, 4, 1), {y, x, c, c}, {dy[0], in[0], plain[1], plain[2]},
                   {sums});
  Values sgrad = Exec(MakeOp(ComputeType::kBatchNormGrad, 6, 3, sync), {y, x, g, c, c, sums},
                      {dy[0], in[0], in[1], plain[1], plain[2], gs[0]}, {x, g, g});
  for (size_t k = 0; k < 3; ++k)
    for (size_t i = 0; i < grad[k].size(); ++i) EXPECT_NEAR(sgrad[k][i], grad[k][i], 2e-5) << k << " " << i;
}

TEST(RuntimeKernels, ConvAndPoolShapeErrorsNameWhatIsWrong) {
  Tensor x = T("x", {1, 3, 5, 5}), w = T("w", {8, 4, 3, 3}), y = T("y", {1, 8, 3, 3});
  Op conv = MakeOp(ComputeType::kConv2d, 2, 1);
  EXPECT_EQ(CheckComputeShapes(conv, {&x, &w}, {&y}),
            "conv2d: input 0 'x' [1, 3, 5, 5] has 3 channels, input 1 'w' [8, 4, 3, 3] expects 4");
  Tensor big = T("w", {8, 3, 7, 7});
  EXPECT_EQ(CheckComputeShapes(conv, {&x, &big}, {&y}),
            "conv2d: a 7x7 kernel with stride 1 and padding 0 does not fit input 0 'x' [1, 3, 5, 5]");
  Tensor ok = T("w", {8, 3, 3, 3}), wrong = T("y", {1, 8, 5, 5});
  EXPECT_NE(CheckComputeShapes(conv, {&x, &ok}, {&wrong}).find("must have shape [1, 8, 3, 3]"), std::string::npos);
  Op pool = MakeOp(ComputeType::kMaxPool2d, 1, 1, {{"kernel", 2}, {"padding", 2}});
  Tensor py = T("y", {1, 3, 4, 4});
  EXPECT_EQ(CheckComputeShapes(pool, {&x}, {&py}), "max_pool2d: padding 2 is more than half the kernel 2");
  Op nokernel = MakeOp(ComputeType::kMaxPool2d, 1, 1);
  EXPECT_EQ(CheckComputeShapes(nokernel, {&x}, {&py}), "max_pool2d: missing attribute 'kernel'");
  Tensor gamma = T("gamma", {4}), stats = T("mean", {3});
  EXPECT_EQ(CheckComputeShapes(MakeOp(ComputeType::kBatchNorm, 3, 3), {&x, &gamma, &gamma}, {&x, &stats, &stats}),
            "batch_norm: input 1 'gamma' [4] must have shape [3] (one per channel of x)");
}

}  // namespace
}  // namespace concerto
