// fp32 CPU kernels for the IR's compute types (docs/ir.md section 1.6):
// matmul through OpenBLAS cblas_sgemm, conv2d as im2col + cblas_dgemm, the rest as plain loops. Row
// reductions (norms, softmax, loss) accumulate in double and store fp32.
#include "concerto/runtime/kernels.h"

#include "concerto/ir/op_registry.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace concerto {

namespace {

/// Scratch vector number `slot` (0-7) of the context's KernelScratch, or of
/// `local` (this call's own) when the context has none. Callers `assign` it:
/// a vector kept between calls keeps its capacity, nothing is mapped again.
std::vector<double>& Scratch(const KernelContext& ctx, KernelScratch& local, int slot) {
  KernelScratch& s = ctx.scratch ? *ctx.scratch : local;
  assert(slot >= 0 && slot < static_cast<int>(s.buffers.size()) && "scratch slot out of range");
  return s.buffers[static_cast<size_t>(slot)];
}

/// Elements of `t`.
int64_t Numel(const KernelArg& t) { return t.meta->NumElements(); }
/// Size of the last dimension (1 for a scalar).
int64_t LastDim(const Tensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }
/// Number of rows when `t` is viewed as [rows, last dim].
int64_t Rows(const Tensor& t) {
  const int64_t last = LastDim(t);
  return last == 0 ? 0 : t.NumElements() / last;
}
/// Whether `d` is an integer dtype (ids, labels).
bool IsInteger(DType d) { return d == DType::kI32 || d == DType::kI64; }

/// "op N 'name': <type>: <what>".
Status OpError(const Op& op, const std::string& what) {
  return Status::Error(OpLabel(op) + ": " + std::string(ToString(op.compute_type)) + ": " + what);
}

/// Whether `v` holds an integral value.
bool Integral(double v) { return std::isfinite(v) && v == std::floor(v); }

/// Checks that attribute `key`, if present (or `required`), is integral and
/// within [lo, hi].
Status CheckIntAttr(const Op& op, const std::string& key, bool required, double lo, double hi) {
  auto it = op.attrs.find(key);
  if (it == op.attrs.end())
    return required ? OpError(op, "missing required attribute '" + key + "'") : Status::Ok();
  const double v = it->second;
  if (!Integral(v) || v < lo || v > hi)
    return OpError(op, "attribute '" + key + "' must be an integer in [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "], got " + std::to_string(v));
  return Status::Ok();
}

/// The id an integer tensor stores at `i` (ids live in fp32, exact below 2^24).
int64_t IdAt(const KernelArg& ids, int64_t i) { return static_cast<int64_t>(ids.data[i]); }

// ---- matmul ----------------------------------------------------------------

/// c = op(a) @ op(b), leading dims of `a` batch; `b` 2-D (broadcast) or
/// batched like `a`.
Status Matmul(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const Tensor& a = *in[0].meta;
  const Tensor& b = *in[1].meta;
  const bool ta = op.Attr("transpose_a", 0) != 0, tb = op.Attr("transpose_b", 0) != 0;
  const size_t ra = a.shape.size(), rb = b.shape.size();
  const int64_t a_rows = a.shape[ra - 2], a_cols = a.shape[ra - 1];
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
  const int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  const int64_t batch = a_rows * a_cols == 0 ? 0 : a.NumElements() / (a_rows * a_cols);
  float* c = out[0].data;
  if (m == 0 || n == 0 || k == 0 || batch == 0) {
    std::fill(c, c + Numel(out[0]), 0.0f);
    return Status::Ok();
  }
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n);
  const bool b_batched = rb > 2;
  if (!b_batched && !ta) {  // one call: the batch folds into the rows of a
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(batch * m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, in[0].data, lda, in[1].data, ldb, 0.0f, c,
                static_cast<int>(n));
    return Status::Ok();
  }
  for (int64_t i = 0; i < batch; ++i)
    cblas_sgemm(CblasRowMajor, opa, opb, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), 1.0f, in[0].data + i * m * k, lda,
                in[1].data + (b_batched ? i * k * n : 0), ldb, 0.0f, c + i * m * n,
                static_cast<int>(n));
  return Status::Ok();
}

// ---- elementwise -----------------------------------------------------------

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluA = 0.044715;

/// gelu with the tanh approximation.
double Gelu(double x) { return 0.5 * x * (1 + std::tanh(kGeluC * (x + kGeluA * x * x * x))); }
/// d gelu / dx.
double GeluDeriv(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluC * (1 + 3 * kGeluA * x * x);
}
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
/// The exact gelu, x Phi(x) (PyTorch's default, approximate='none').
double GeluExact(double x) { return 0.5 * x * (1 + std::erf(x * kInvSqrt2)); }
/// d exact gelu / dx = Phi(x) + x phi(x).
double GeluExactDeriv(double x) {
  return 0.5 * (1 + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
}
/// 1 / (1 + exp(-x)).
double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
/// x sigmoid(x).
double Silu(double x) { return x * Sigmoid(x); }
/// d silu / dx.
double SiluDeriv(double x) {
  const double s = Sigmoid(x);
  return s * (1 + x * (1 - s));
}

/// z = x + y, y broadcast over x's leading dims (y's shape is a suffix of x's).
void Add(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t nx = Numel(in[0]), ny = Numel(in[1]);
  const float *x = in[0].data, *y = in[1].data;
  float* z = out[0].data;
  if (ny == nx) {
    for (int64_t i = 0; i < nx; ++i) z[i] = x[i] + y[i];
    return;
  }
  for (int64_t i = 0; i < nx; ++i) z[i] = x[i] + y[ny == 0 ? 0 : i % ny];
}

/// out[0][i] = f(in[0][i]) for a unary function.
template <typename F>
void Unary(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out, F f) {
  const int64_t n = Numel(in[0]);
  for (int64_t i = 0; i < n; ++i) out[0].data[i] = static_cast<float>(f(in[0].data[i]));
}

/// out[0][i] = f(in[0][i], in[1][i]).
template <typename F>
void Binary(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out, F f) {
  const int64_t n = Numel(out[0]);
  for (int64_t i = 0; i < n; ++i)
    out[0].data[i] = static_cast<float>(f(in[0].data[i], in[1].data[i]));
}

/// dgate = dy * up * silu'(gate), dup = dy * silu(gate).
void SwigluGrad(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t n = Numel(in[0]);
  for (int64_t i = 0; i < n; ++i) {
    const double dy = in[0].data[i], g = in[1].data[i], up = in[2].data[i];
    out[0].data[i] = static_cast<float>(dy * up * SiluDeriv(g));
    out[1].data[i] = static_cast<float>(dy * Silu(g));
  }
}

// ---- norms -----------------------------------------------------------------

/// Mean and 1/sqrt(var + eps) of one row (biased variance).
void RowStats(const float* x, int64_t h, double eps, double* mean, double* rstd) {
  double sum = 0;
  for (int64_t j = 0; j < h; ++j) sum += x[j];
  const double mu = h ? sum / h : 0;
  double var = 0;
  for (int64_t j = 0; j < h; ++j) var += (x[j] - mu) * (x[j] - mu);
  var = h ? var / h : 0;
  *mean = mu;
  *rstd = 1 / std::sqrt(var + eps);
}

/// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dim.
void LayerNorm(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const double eps = op.Attr("eps", 1e-5);
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  const float *gamma = in[1].data, *beta = in[2].data;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0].data + r * h;
    float* y = out[0].data + r * h;
    double mean = 0, rstd = 0;
    RowStats(x, h, eps, &mean, &rstd);
    for (int64_t j = 0; j < h; ++j) y[j] = static_cast<float>((x[j] - mean) * rstd * gamma[j] + beta[j]);
  }
}

/// (dy, x, gamma) -> (dx, dgamma, dbeta) of layer_norm.
void LayerNormGrad(const Op& op, const std::vector<KernelArg>& in,
                   const std::vector<KernelArg>& out) {
  const double eps = op.Attr("eps", 1e-5);
  const int64_t h = LastDim(*in[1].meta), rows = Rows(*in[1].meta);
  const float* gamma = in[2].data;
  std::vector<double> dgamma(h, 0.0), dbeta(h, 0.0), xhat(h), g(h);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dy = in[0].data + r * h;
    const float* x = in[1].data + r * h;
    double mean = 0, rstd = 0;
    RowStats(x, h, eps, &mean, &rstd);
    double mean_g = 0, mean_gx = 0;
    for (int64_t j = 0; j < h; ++j) {
      xhat[j] = (x[j] - mean) * rstd;
      g[j] = static_cast<double>(dy[j]) * gamma[j];
      mean_g += g[j];
      mean_gx += g[j] * xhat[j];
      dgamma[j] += static_cast<double>(dy[j]) * xhat[j];
      dbeta[j] += dy[j];
    }
    mean_g /= h;
    mean_gx /= h;
    float* dx = out[0].data + r * h;
    for (int64_t j = 0; j < h; ++j) dx[j] = static_cast<float>(rstd * (g[j] - mean_g - xhat[j] * mean_gx));
  }
  for (int64_t j = 0; j < h; ++j) {
    out[1].data[j] = static_cast<float>(dgamma[j]);
    out[2].data[j] = static_cast<float>(dbeta[j]);
  }
}

/// 1/sqrt(mean(x^2) + eps) of one row.
double RmsScale(const float* x, int64_t h, double eps) {
  double sq = 0;
  for (int64_t j = 0; j < h; ++j) sq += static_cast<double>(x[j]) * x[j];
  return 1 / std::sqrt((h ? sq / h : 0) + eps);
}

/// y = x / sqrt(mean(x^2) + eps) * gamma over the last dim.
void RmsNorm(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const double eps = op.Attr("eps", 1e-6);
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0].data + r * h;
    float* y = out[0].data + r * h;
    const double s = RmsScale(x, h, eps);
    for (int64_t j = 0; j < h; ++j) y[j] = static_cast<float>(x[j] * s * in[1].data[j]);
  }
}

/// (dy, x, gamma) -> (dx, dgamma) of rms_norm.
void RmsNormGrad(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const double eps = op.Attr("eps", 1e-6);
  const int64_t h = LastDim(*in[1].meta), rows = Rows(*in[1].meta);
  const float* gamma = in[2].data;
  std::vector<double> dgamma(h, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* dy = in[0].data + r * h;
    const float* x = in[1].data + r * h;
    const double s = RmsScale(x, h, eps);
    double gx = 0;  // sum of dy * gamma * x
    for (int64_t j = 0; j < h; ++j) {
      gx += static_cast<double>(dy[j]) * gamma[j] * x[j];
      dgamma[j] += static_cast<double>(dy[j]) * x[j] * s;
    }
    const double c = s * s * s * gx / h;
    float* dx = out[0].data + r * h;
    for (int64_t j = 0; j < h; ++j)
      dx[j] = static_cast<float>(s * dy[j] * gamma[j] - c * x[j]);
  }
  for (int64_t j = 0; j < h; ++j) out[1].data[j] = static_cast<float>(dgamma[j]);
}

// ---- softmax ---------------------------------------------------------------

/// Softmax of one row of `h` values into `y` (double accumulation).
void SoftmaxRow(const float* x, int64_t h, float* y) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < h; ++j) mx = std::max(mx, x[j]);
  double sum = 0;
  for (int64_t j = 0; j < h; ++j) sum += std::exp(static_cast<double>(x[j]) - mx);
  for (int64_t j = 0; j < h; ++j) y[j] = static_cast<float>(std::exp(static_cast<double>(x[j]) - mx) / sum);
}

/// Softmax over the last dim.
void Softmax(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  for (int64_t r = 0; r < rows; ++r) SoftmaxRow(in[0].data + r * h, h, out[0].data + r * h);
}

/// dx = y * (dy - sum(dy * y)) over the last dim.
void SoftmaxGrad(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  for (int64_t r = 0; r < rows; ++r) {
    const float *dy = in[0].data + r * h, *y = in[1].data + r * h;
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) dot += static_cast<double>(dy[j]) * y[j];
    float* dx = out[0].data + r * h;
    for (int64_t j = 0; j < h; ++j) dx[j] = static_cast<float>(y[j] * (dy[j] - dot));
  }
}

// ---- attention -------------------------------------------------------------

/// Sizes of an attention op: q [b, s, heads*d], k = v [b, s, kv_heads*d].
struct AttnDims {
  int64_t b = 0, s = 0, heads = 0, kv_heads = 0, d = 0;
  bool causal = false;
  double scale = 1;

  /// Offset of row (batch bi, position i) head h in q (stride heads*d).
  int64_t Q(int64_t bi, int64_t i, int64_t h) const { return (bi * s + i) * heads * d + h * d; }
  /// Offset of row (bi, j) kv head g in k or v (stride kv_heads*d).
  int64_t KV(int64_t bi, int64_t j, int64_t g) const { return (bi * s + j) * kv_heads * d + g * d; }
  /// The kv head of query head h.
  int64_t Group(int64_t h) const { return h / (heads / kv_heads); }
};

/// The sizes of attention op `op` with query tensor `q`.
AttnDims MakeAttnDims(const Op& op, const Tensor& q) {
  AttnDims a;
  a.b = q.shape[0];
  a.s = q.shape[1];
  a.heads = static_cast<int64_t>(op.Attr("heads", 1));
  a.kv_heads = static_cast<int64_t>(op.Attr("kv_heads", static_cast<double>(a.heads)));
  a.d = q.shape[2] / a.heads;
  a.causal = op.Attr("causal", 0) != 0;
  a.scale = op.Attr("scale", 1 / std::sqrt(static_cast<double>(a.d)));
  return a;
}

/// The probabilities P [s, s] of batch bi, query head h (masked entries 0).
void AttentionProbs(const AttnDims& a, const float* q, const float* k, int64_t bi, int64_t h,
                    std::vector<float>* p) {
  const int64_t g = a.Group(h);
  p->assign(a.s * a.s, 0.0f);
  for (int64_t i = 0; i < a.s; ++i) {
    const float* qi = q + a.Q(bi, i, h);
    const int64_t visible = a.causal ? i + 1 : a.s;
    float* row = p->data() + i * a.s;
    for (int64_t j = 0; j < visible; ++j) {
      const float* kj = k + a.KV(bi, j, g);
      double dot = 0;
      for (int64_t t = 0; t < a.d; ++t) dot += static_cast<double>(qi[t]) * kj[t];
      row[j] = static_cast<float>(a.scale * dot);
    }
    SoftmaxRow(row, visible, row);
  }
}

/// o = softmax(scale q k^T + mask) v per batch and query head.
void Attention(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const AttnDims a = MakeAttnDims(op, *in[0].meta);
  const float *q = in[0].data, *k = in[1].data, *v = in[2].data;
  float* o = out[0].data;
  std::vector<float> p;
  std::vector<double> acc(a.d);
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int64_t h = 0; h < a.heads; ++h) {
      AttentionProbs(a, q, k, bi, h, &p);
      const int64_t g = a.Group(h);
      for (int64_t i = 0; i < a.s; ++i) {
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < a.s; ++j) {
          const float pij = p[i * a.s + j];
          if (pij == 0) continue;
          const float* vj = v + a.KV(bi, j, g);
          for (int64_t t = 0; t < a.d; ++t) acc[t] += static_cast<double>(pij) * vj[t];
        }
        float* oi = o + a.Q(bi, i, h);
        for (int64_t t = 0; t < a.d; ++t) oi[t] = static_cast<float>(acc[t]);
      }
    }
}

/// Gradient of one (batch, query head) of attention; accumulates into dk, dv.
void AttentionGradHead(const AttnDims& a, const std::vector<KernelArg>& in, int64_t bi, int64_t h,
                       const std::vector<KernelArg>& out, std::vector<float>* p,
                       std::vector<float>* ds) {
  const float *dout = in[0].data, *q = in[1].data, *k = in[2].data, *v = in[3].data;
  float *dq = out[0].data, *dk = out[1].data, *dv = out[2].data;
  const int64_t g = a.Group(h);
  AttentionProbs(a, q, k, bi, h, p);
  ds->assign(a.s * a.s, 0.0f);
  const float* o = in.size() == 5 ? in[4].data : nullptr;  // the forward output, if given
  for (int64_t i = 0; i < a.s; ++i) {
    const float* doi = dout + a.Q(bi, i, h);
    double rowdot = 0;
    for (int64_t j = 0; j < a.s; ++j) {  // dP = do v^T, kept in ds
      const float pij = (*p)[i * a.s + j];
      if (pij == 0) continue;
      const float* vj = v + a.KV(bi, j, g);
      double dot = 0;
      for (int64_t t = 0; t < a.d; ++t) dot += static_cast<double>(doi[t]) * vj[t];
      (*ds)[i * a.s + j] = static_cast<float>(dot);
      if (!o) rowdot += dot * pij;
    }
    if (o) {  // flash-style: rowsum(P dP) = rowsum(do o), from the forward output
      const float* oi = o + a.Q(bi, i, h);
      for (int64_t t = 0; t < a.d; ++t) rowdot += static_cast<double>(doi[t]) * oi[t];
    }
    for (int64_t j = 0; j < a.s; ++j) {  // dS = P (dP - rowsum(P dP))
      const float pij = (*p)[i * a.s + j];
      (*ds)[i * a.s + j] = pij == 0 ? 0.0f : static_cast<float>(pij * ((*ds)[i * a.s + j] - rowdot));
    }
  }
  for (int64_t i = 0; i < a.s; ++i) {
    float* dqi = dq + a.Q(bi, i, h);
    const float* qi = q + a.Q(bi, i, h);
    const float* doi = dout + a.Q(bi, i, h);
    for (int64_t j = 0; j < a.s; ++j) {
      const float dsij = (*ds)[i * a.s + j], pij = (*p)[i * a.s + j];
      if (pij == 0) continue;
      const float* kj = k + a.KV(bi, j, g);
      float* dkj = dk + a.KV(bi, j, g);
      float* dvj = dv + a.KV(bi, j, g);
      const float sd = static_cast<float>(a.scale * dsij);
      for (int64_t t = 0; t < a.d; ++t) {
        dqi[t] += sd * kj[t];
        dkj[t] += sd * qi[t];
        dvj[t] += pij * doi[t];
      }
    }
  }
}

/// (do, q, k, v[, o]) -> (dq, dk, dv), recomputing the probabilities; with
/// the forward output o the row sums come from it as in FlashAttention's
/// backward.
void AttentionGrad(const Op& op, const std::vector<KernelArg>& in,
                   const std::vector<KernelArg>& out) {
  const AttnDims a = MakeAttnDims(op, *in[1].meta);
  for (const KernelArg& t : out) std::fill(t.data, t.data + Numel(t), 0.0f);
  std::vector<float> p, ds;
  for (int64_t bi = 0; bi < a.b; ++bi)
    for (int64_t h = 0; h < a.heads; ++h) AttentionGradHead(a, in, bi, h, out, &p, &ds);
}

// ---- embedding and loss -----------------------------------------------------

/// y[i] = table[ids[i] - row0], zero outside this rank's rows.
void Embedding(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
               const KernelContext& ctx) {
  const Tensor& table = *in[0].meta;
  const int64_t rows = table.shape[0], h = table.shape[1];
  const int64_t row0 = ShardOffset(table, 0, *ctx.mesh, ctx.rank);
  const int64_t n = Numel(in[1]);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = IdAt(in[1], i) - row0;
    float* y = out[0].data + i * h;
    if (r >= 0 && r < rows) {
      std::memcpy(y, in[0].data + r * h, sizeof(float) * h);
    } else {
      std::fill(y, y + h, 0.0f);
    }
  }
}

/// dtable[v] = sum of dy[i] over ids[i] - row0 == v.
void EmbeddingGrad(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
                   const KernelContext& ctx) {
  const Tensor& dtable = *out[0].meta;
  const int64_t rows = dtable.shape[0], h = dtable.shape[1];
  const int64_t row0 = ShardOffset(dtable, 0, *ctx.mesh, ctx.rank);
  KernelScratch local;
  std::vector<double>& acc = Scratch(ctx, local, 0);
  acc.assign(static_cast<size_t>(rows * h), 0.0);
  const int64_t n = Numel(in[1]);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = IdAt(in[1], i) - row0;
    if (r < 0 || r >= rows) continue;
    const float* dy = in[0].data + i * h;
    for (int64_t j = 0; j < h; ++j) acc[r * h + j] += dy[j];
  }
  for (int64_t i = 0; i < rows * h; ++i) out[0].data[i] = static_cast<float>(acc[i]);
}

/// m = max over the last dim.
void ReduceMax(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0].data + r * h;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < h; ++j) m = std::max(m, x[j]);
    out[0].data[r] = m;
  }
}

/// z = sum(exp(x - m)) over the last dim.
void SumExp(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t h = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0].data + r * h;
    const double m = in[1].data[r];
    double z = 0;
    for (int64_t j = 0; j < h; ++j) z += std::exp(x[j] - m);
    out[0].data[r] = static_cast<float>(z);
  }
}

/// t[i] = logits[i, labels[i] - col0], 0 outside this rank's vocab shard.
void GatherTarget(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
                  const KernelContext& ctx) {
  const Tensor& logits = *in[0].meta;
  const int last = static_cast<int>(logits.shape.size()) - 1;
  const int64_t v = LastDim(logits), rows = Rows(logits);
  const int64_t col0 = ShardOffset(logits, last, *ctx.mesh, ctx.rank);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = IdAt(in[1], r) - col0;
    out[0].data[r] = c >= 0 && c < v ? in[0].data[r * v + c] : 0.0f;
  }
}

/// loss = sum(log z + m - target) / denominator.
void CrossEntropy(const Op& op, const std::vector<KernelArg>& in,
                  const std::vector<KernelArg>& out) {
  const int64_t n = Numel(in[2]);
  const double denom = op.Attr("denominator", static_cast<double>(n));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::log(static_cast<double>(in[1].data[i])) + in[0].data[i] - in[2].data[i];
  out[0].data[0] = static_cast<float>(sum / denom);
}

/// dlogits = (exp(logits - m) / z - onehot(labels - col0)) / denominator.
void CrossEntropyGrad(const Op& op, const std::vector<KernelArg>& in,
                      const std::vector<KernelArg>& out, const KernelContext& ctx) {
  const Tensor& logits = *in[0].meta;
  const int last = static_cast<int>(logits.shape.size()) - 1;
  const int64_t v = LastDim(logits), rows = Rows(logits);
  const double denom = op.Attr("denominator", static_cast<double>(Numel(in[3])));
  const int64_t col0 = ShardOffset(logits, last, *ctx.mesh, ctx.rank);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in[0].data + r * v;
    float* dx = out[0].data + r * v;
    const double m = in[1].data[r], z = in[2].data[r];
    const int64_t c = IdAt(in[3], r) - col0;
    for (int64_t j = 0; j < v; ++j)
      dx[j] = static_cast<float>((std::exp(x[j] - m) / z - (j == c ? 1.0 : 0.0)) / denom);
  }
}

/// One Adam step with bias correction and decoupled weight decay.
void Adam(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const double lr = op.Attr("lr", 1e-3), b1 = op.Attr("beta1", 0.9), b2 = op.Attr("beta2", 0.999);
  const double eps = op.Attr("eps", 1e-8), step = op.Attr("step", 1);
  const double wd = op.Attr("weight_decay", 0);
  const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
  const int64_t n = Numel(in[0]);
  const bool master = in.size() == 5;  // mixed precision: update the f32 master copy
  for (int64_t i = 0; i < n; ++i) {
    const double p = master ? in[4].data[i] : in[0].data[i], g = in[1].data[i];
    const double m = b1 * in[2].data[i] + (1 - b1) * g;
    const double v = b2 * in[3].data[i] + (1 - b2) * g * g;
    const double next = p - lr * (m / c1) / (std::sqrt(v / c2) + eps) - lr * wd * p;
    out[0].data[i] = static_cast<float>(next);
    out[1].data[i] = static_cast<float>(m);
    out[2].data[i] = static_cast<float>(v);
    if (master) out[3].data[i] = static_cast<float>(next);
  }
}

// ---- data movement ----------------------------------------------------------

/// Product of shape[begin:end].
int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= shape[i];
  return p;
}

/// y = x[start : start + len] along attrs.axis.
void Slice(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const Tensor& x = *in[0].meta;
  const size_t axis = static_cast<size_t>(op.Attr("axis", 0));
  const int64_t start = static_cast<int64_t>(op.Attr("start", 0));
  const int64_t len = out[0].meta->shape[axis];
  const int64_t outer = Product(x.shape, 0, axis), inner = Product(x.shape, axis + 1, x.shape.size());
  const int64_t dim = x.shape[axis];
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out[0].data + o * len * inner, in[0].data + (o * dim + start) * inner,
                sizeof(float) * len * inner);
}

/// y = the inputs concatenated along attrs.axis.
void Concat(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const Tensor& y = *out[0].meta;
  const size_t axis = static_cast<size_t>(op.Attr("axis", 0));
  const int64_t outer = Product(y.shape, 0, axis), inner = Product(y.shape, axis + 1, y.shape.size());
  const int64_t ydim = y.shape[axis];
  int64_t offset = 0;
  for (const KernelArg& x : in) {
    const int64_t xdim = x.meta->shape[axis];
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(out[0].data + (o * ydim + offset) * inner, x.data + o * xdim * inner,
                  sizeof(float) * xdim * inner);
    offset += xdim;
  }
}

/// y = x in y's dtype: truncation toward zero for integer outputs, else a
/// copy (every float dtype is stored and computed as fp32).
void Cast(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const bool to_int = IsInteger(out[0].meta->dtype);
  const int64_t n = Numel(in[0]);
  for (int64_t i = 0; i < n; ++i) out[0].data[i] = to_int ? std::trunc(in[0].data[i]) : in[0].data[i];
}

/// y_i = x_i (row-major reinterpretation: a copy of the elements).
void Identity(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  for (size_t i = 0; i < in.size(); ++i)
    std::memcpy(out[i].data, in[i].data, sizeof(float) * Numel(in[i]));
}

// ---- mixture of experts ------------------------------------------------------

/// Row r of `probs` [rows, E]: the indices of its k largest values, largest
/// first, ties to the lower index.
std::vector<int64_t> TopIndices(const float* p, int64_t experts, int64_t k) {
  std::vector<int64_t> order(experts);
  for (int64_t e = 0; e < experts; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [p](int64_t a, int64_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
  });
  order.resize(k);
  return order;
}

/// (probs [..., E]) -> (gates [..., k], ids [..., k]): the k largest
/// probabilities of each row and their expert ids; with normalize 1 the
/// gates are divided by their sum.
void TopK(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t experts = LastDim(*in[0].meta), rows = Rows(*in[0].meta);
  const int64_t k = LastDim(*out[0].meta);
  const bool normalize = op.Attr("normalize", 0) != 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = in[0].data + r * experts;
    const std::vector<int64_t> top = TopIndices(p, experts, k);
    double sum = 0;
    for (int64_t e : top) sum += p[e];
    for (int64_t j = 0; j < k; ++j) {
      out[0].data[r * k + j] = static_cast<float>(normalize ? p[top[j]] / sum : p[top[j]]);
      out[1].data[r * k + j] = static_cast<float>(top[j]);
    }
  }
}

/// (dgates, ids, probs) -> dprobs: dgates scattered to the chosen experts;
/// with normalize 1 through g_j = p_j / S: dp_i = (dg_i - sum_j dg_j g_j) / S.
Status TopKGrad(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const int64_t experts = LastDim(*in[2].meta), rows = Rows(*in[2].meta);
  const int64_t k = LastDim(*in[0].meta);
  const bool normalize = op.Attr("normalize", 0) != 0;
  std::fill(out[0].data, out[0].data + Numel(out[0]), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = in[2].data + r * experts;
    const float* dg = in[0].data + r * k;
    float* dp = out[0].data + r * experts;
    double sum = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = IdAt(in[1], r * k + j);
      if (e < 0 || e >= experts)
        return OpError(op, "expert id " + std::to_string(e) + " outside [0, " + std::to_string(experts) + ")");
      sum += p[e];
    }
    for (int64_t j = 0; j < k; ++j) dot += static_cast<double>(dg[j]) * p[IdAt(in[1], r * k + j)] / sum;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = IdAt(in[1], r * k + j);
      dp[e] += static_cast<float>(normalize ? (dg[j] - dot) / sum : dg[j]);
    }
  }
  return Status::Ok();
}

/// Sizes of a MoE op: tokens [G, n, h], ids [G, n, k], buffers [E, G*C, h].
struct MoeDims {
  int64_t groups = 0, tokens = 0, h = 0, k = 0, experts = 0, capacity = 0;
};

/// The sizes from the tokens tensor `x`, the ids and the buffers tensor.
MoeDims MakeMoeDims(const Tensor& x, const Tensor& ids, const Tensor& buffers) {
  MoeDims d;
  d.groups = x.shape[0];
  d.tokens = x.shape[1];
  d.h = x.shape[2];
  d.k = ids.shape[2];
  d.experts = buffers.shape[0];
  d.capacity = d.groups ? buffers.shape[1] / d.groups : 0;
  return d;
}

/// For every (group, token, choice) in row-major order, the buffer row it is
/// dispatched to (e * G*C + g*C + c), or -1 when expert e's C slots of group g
/// are already taken: slots are handed out in token order, then choice order.
Result<std::vector<int64_t>> MoeSlots(const Op& op, const KernelArg& ids, const MoeDims& d) {
  std::vector<int64_t> slots(d.groups * d.tokens * d.k, -1);
  std::vector<int64_t> used(d.experts);
  for (int64_t g = 0; g < d.groups; ++g) {
    std::fill(used.begin(), used.end(), 0);
    for (int64_t i = 0; i < d.tokens * d.k; ++i) {
      const int64_t flat = g * d.tokens * d.k + i;
      const int64_t e = IdAt(ids, flat);
      if (e < 0 || e >= d.experts)
        return OpError(op, "expert id " + std::to_string(e) + " at index " + std::to_string(flat) +
                               " is outside [0, " + std::to_string(d.experts) + ")");
      if (used[e] < d.capacity) slots[flat] = e * d.groups * d.capacity + g * d.capacity + used[e]++;
    }
  }
  return slots;
}

/// (x [G, n, h], ids) -> buffers [E, G*C, h]: each kept (token, choice)
/// copies the token's row into its slot; unused slots are 0.
Status MoeDispatch(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const MoeDims d = MakeMoeDims(*in[0].meta, *in[1].meta, *out[0].meta);
  Result<std::vector<int64_t>> slots = MoeSlots(op, in[1], d);
  if (!slots.ok()) return slots.status();
  std::fill(out[0].data, out[0].data + Numel(out[0]), 0.0f);
  for (size_t i = 0; i < slots->size(); ++i)
    if ((*slots)[i] >= 0)
      std::memcpy(out[0].data + (*slots)[i] * d.h, in[0].data + (i / d.k) * d.h, sizeof(float) * d.h);
  return Status::Ok();
}

/// out[token] = the sum over the token's kept slots of gate x rows[slot]
/// (gate 1 when `gates` is null; a dropped choice adds nothing), in double.
void SumSlotRows(const MoeDims& d, const std::vector<int64_t>& slots, const float* rows, const float* gates,
                 float* out) {
  std::vector<double> acc(d.h);
  for (int64_t t = 0; t < d.groups * d.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < d.k; ++j) {
      const int64_t slot = slots[t * d.k + j];
      if (slot < 0) continue;
      const double gate = gates ? gates[t * d.k + j] : 1.0;
      for (int64_t c = 0; c < d.h; ++c) acc[c] += gate * rows[slot * d.h + c];
    }
    for (int64_t c = 0; c < d.h; ++c) out[t * d.h + c] = static_cast<float>(acc[c]);
  }
}

/// (dbuffers, ids) -> dx [G, n, h]: each token sums the rows of its kept slots.
Status MoeDispatchGrad(const Op& op, const std::vector<KernelArg>& in,
                       const std::vector<KernelArg>& out) {
  const MoeDims d = MakeMoeDims(*out[0].meta, *in[1].meta, *in[0].meta);
  Result<std::vector<int64_t>> slots = MoeSlots(op, in[1], d);
  if (!slots.ok()) return slots.status();
  SumSlotRows(d, *slots, in[0].data, nullptr, out[0].data);
  return Status::Ok();
}

/// (y [E, G*C, h], ids, gates) -> out [G, n, h]: each token sums its kept
/// slots' rows weighted by their gates (a dropped choice adds nothing).
Status MoeCombine(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const MoeDims d = MakeMoeDims(*out[0].meta, *in[1].meta, *in[0].meta);
  Result<std::vector<int64_t>> slots = MoeSlots(op, in[1], d);
  if (!slots.ok()) return slots.status();
  SumSlotRows(d, *slots, in[0].data, in[2].data, out[0].data);
  return Status::Ok();
}

/// (dout, y, ids, gates) -> (dy, dgates): dy[slot] = gate * dout[token]
/// (unused slots 0); dgates = dot(dout[token], y[slot]), 0 when dropped.
Status MoeCombineGrad(const Op& op, const std::vector<KernelArg>& in,
                      const std::vector<KernelArg>& out) {
  const MoeDims d = MakeMoeDims(*in[0].meta, *in[2].meta, *in[1].meta);
  Result<std::vector<int64_t>> slots = MoeSlots(op, in[2], d);
  if (!slots.ok()) return slots.status();
  std::fill(out[0].data, out[0].data + Numel(out[0]), 0.0f);
  for (int64_t t = 0; t < d.groups * d.tokens; ++t) {
    const float* dout = in[0].data + t * d.h;
    for (int64_t j = 0; j < d.k; ++j) {
      const int64_t slot = (*slots)[t * d.k + j];
      double dot = 0;
      if (slot >= 0) {
        const float gate = in[3].data[t * d.k + j];
        const float* y = in[1].data + slot * d.h;
        float* dy = out[0].data + slot * d.h;
        for (int64_t c = 0; c < d.h; ++c) {
          dy[c] = gate * dout[c];
          dot += static_cast<double>(dout[c]) * y[c];
        }
      }
      out[1].data[t * d.k + j] = static_cast<float>(dot);
    }
  }
  return Status::Ok();
}

/// y = x with dims axis0 and axis1 swapped (a strided copy).
void Transpose(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const std::vector<int64_t>& shape = in[0].meta->shape;
  size_t a = static_cast<size_t>(op.Attr("axis0", 0)), b = static_cast<size_t>(op.Attr("axis1", 0));
  if (a > b) std::swap(a, b);
  const int64_t n = Numel(in[0]);
  if (a == b || n == 0) {
    std::memcpy(out[0].data, in[0].data, sizeof(float) * n);
    return;
  }
  // x viewed as [outer, A, middle, B, inner] -> y [outer, B, middle, A, inner].
  const int64_t outer = Product(shape, 0, a), dim_a = shape[a];
  const int64_t middle = Product(shape, a + 1, b), dim_b = shape[b];
  const int64_t inner = Product(shape, b + 1, shape.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < dim_a; ++i)
      for (int64_t m = 0; m < middle; ++m)
        for (int64_t j = 0; j < dim_b; ++j) {
          const int64_t src = (((o * dim_a + i) * middle + m) * dim_b + j) * inner;
          const int64_t dst = (((o * dim_b + j) * middle + m) * dim_a + i) * inner;
          std::memcpy(out[0].data + dst, in[0].data + src, sizeof(float) * inner);
        }
}

// ---- convolution and pooling (NCHW) ------------------------------------------

/// The geometry of a window op over x [N, C, H, W]: kernel R x S, stride,
/// padding, output P x Q (the shape rule checked that it fits).
struct Window2d {
  int64_t n, c, h, w, r, s, stride, pad, p, q;
};
Window2d ConvWindow(const Op& op, const Tensor& x, const Tensor& w) {
  const int64_t stride = static_cast<int64_t>(op.Attr("stride", 1)), pad = static_cast<int64_t>(op.Attr("padding", 0));
  const int64_t h = x.shape[2], wd = x.shape[3], r = w.shape[2], s = w.shape[3];
  return {x.shape[0], x.shape[1], h, wd, r, s, stride, pad, (h + 2 * pad - r) / stride + 1, (wd + 2 * pad - s) / stride + 1};
}
Window2d PoolWindow(const Op& op, const Tensor& x) {
  const int64_t k = static_cast<int64_t>(op.Attr("kernel", 1));
  const int64_t stride = static_cast<int64_t>(op.Attr("stride", static_cast<double>(k)));
  const int64_t pad = static_cast<int64_t>(op.Attr("padding", 0));
  const int64_t h = x.shape[2], wd = x.shape[3];
  return {x.shape[0], x.shape[1], h, wd, k, k, stride, pad, (h + 2 * pad - k) / stride + 1, (wd + 2 * pad - k) / stride + 1};
}

/// Calls fn(x_at, i, j) for every tap (i, j) of output position (p, q)'s
/// window that falls inside x (padding taps are skipped); x_at is the tap's
/// offset within one [H, W] plane.
template <typename Fn>
void ForEachTap(const Window2d& g, int64_t p, int64_t q, Fn fn) {
  for (int64_t i = 0; i < g.r; ++i) {
    const int64_t hi = p * g.stride - g.pad + i;
    if (hi < 0 || hi >= g.h) continue;
    for (int64_t j = 0; j < g.s; ++j) {
      const int64_t wi = q * g.stride - g.pad + j;
      if (wi >= 0 && wi < g.w) fn(hi * g.w + wi, i, j);
    }
  }
}

/// Image n's column matrix, in double: cols[(c R + i) S + j][p Q + q] =
/// x[n, c, p*stride - pad + i, q*stride - pad + j] (0 in the padding), so
/// that conv2d is one GEMM per image (w [K, C R S] times cols [C R S, P Q]).
void Im2Col(const Window2d& g, const float* x, int64_t n, std::vector<double>& cols) {
  const int64_t pq = g.p * g.q;
  cols.assign(static_cast<size_t>(g.c * g.r * g.s * pq), 0.0);
  for (int64_t c = 0; c < g.c; ++c) {
    const float* plane = x + (n * g.c + c) * g.h * g.w;
    for (int64_t p = 0; p < g.p; ++p)
      for (int64_t q = 0; q < g.q; ++q)
        ForEachTap(g, p, q, [&](int64_t x_plane, int64_t i, int64_t j) {
          cols[static_cast<size_t>(((c * g.r + i) * g.s + j) * pq + p * g.q + q)] = plane[x_plane];
        });
  }
}

/// The transpose of Im2Col: adds every column entry back onto image n of dx.
void Col2ImAdd(const Window2d& g, const std::vector<double>& cols, int64_t n, double* dx) {
  const int64_t pq = g.p * g.q;
  for (int64_t c = 0; c < g.c; ++c) {
    double* plane = dx + (n * g.c + c) * g.h * g.w;
    for (int64_t p = 0; p < g.p; ++p)
      for (int64_t q = 0; q < g.q; ++q)
        ForEachTap(g, p, q, [&](int64_t x_plane, int64_t i, int64_t j) {
          plane[x_plane] += cols[static_cast<size_t>(((c * g.r + i) * g.s + j) * pq + p * g.q + q)];
        });
  }
}

/// `t`'s elements widened to double, in `v`.
const std::vector<double>& Widen(const float* t, int64_t n, std::vector<double>& v) {
  v.assign(t, t + n);
  return v;
}

/// y[n, k, p, q] = sum_{c, i, j} x[n, c, p*stride - pad + i, q*stride - pad + j] w[k, c, i, j]
/// (zero outside x): one double GEMM per image over its column matrix.
void Conv2dForward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
                   const KernelContext& ctx) {
  const Window2d g = ConvWindow(op, *in[0].meta, *in[1].meta);
  const int64_t k_out = in[1].meta->shape[0], crs = g.c * g.r * g.s, pq = g.p * g.q;
  KernelScratch local;
  const std::vector<double>& w = Widen(in[1].data, Numel(in[1]), Scratch(ctx, local, 0));
  std::vector<double>& cols = Scratch(ctx, local, 1);
  std::vector<double>& y = Scratch(ctx, local, 2);
  y.assign(static_cast<size_t>(k_out * pq), 0.0);
  for (int64_t n = 0; n < g.n; ++n) {
    Im2Col(g, in[0].data, n, cols);
    if (crs > 0 && pq > 0)
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(k_out), static_cast<int>(pq),
                  static_cast<int>(crs), 1.0, w.data(), static_cast<int>(crs), cols.data(), static_cast<int>(pq),
                  0.0, y.data(), static_cast<int>(pq));
    else
      std::fill(y.begin(), y.end(), 0.0);
    float* y_n = out[0].data + n * k_out * pq;
    for (size_t i = 0; i < y.size(); ++i) y_n[i] = static_cast<float>(y[i]);
  }
}

/// (dy, x, w) -> (dx, dw) by the same column matrices, in double:
/// dw += dy_n cols_n^T and dcols_n = w^T dy_n, scattered back onto dx.
void Conv2dBackward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
                    const KernelContext& ctx) {
  const Window2d g = ConvWindow(op, *in[1].meta, *in[2].meta);
  const int64_t k_out = in[2].meta->shape[0], crs = g.c * g.r * g.s, pq = g.p * g.q;
  KernelScratch local;
  const std::vector<double>& w = Widen(in[2].data, Numel(in[2]), Scratch(ctx, local, 0));
  std::vector<double>& dx = Scratch(ctx, local, 1);
  std::vector<double>& dw = Scratch(ctx, local, 2);
  std::vector<double>& cols = Scratch(ctx, local, 3);
  std::vector<double>& dcols = Scratch(ctx, local, 4);
  dx.assign(static_cast<size_t>(Numel(out[0])), 0.0);
  dw.assign(static_cast<size_t>(Numel(out[1])), 0.0);
  dcols.assign(static_cast<size_t>(crs * pq), 0.0);
  if (crs > 0 && pq > 0 && k_out > 0)
    for (int64_t n = 0; n < g.n; ++n) {
      const std::vector<double>& dy = Widen(in[0].data + n * k_out * pq, k_out * pq, Scratch(ctx, local, 5));
      Im2Col(g, in[1].data, n, cols);
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(k_out), static_cast<int>(crs),
                  static_cast<int>(pq), 1.0, dy.data(), static_cast<int>(pq), cols.data(), static_cast<int>(pq),
                  1.0, dw.data(), static_cast<int>(crs));
      cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(crs), static_cast<int>(pq),
                  static_cast<int>(k_out), 1.0, w.data(), static_cast<int>(crs), dy.data(), static_cast<int>(pq),
                  0.0, dcols.data(), static_cast<int>(pq));
      Col2ImAdd(g, dcols, n, dx.data());
    }
  for (size_t i = 0; i < dx.size(); ++i) out[0].data[i] = static_cast<float>(dx[i]);
  for (size_t i = 0; i < dw.size(); ++i) out[1].data[i] = static_cast<float>(dw[i]);
}

/// The flat index in x of the first maximum of output (n, c, p, q)'s window
/// (padding never wins: it is outside x), or -1 for a window of padding only.
int64_t PoolArgmax(const float* x, const Window2d& g, int64_t n, int64_t c, int64_t p, int64_t q) {
  const int64_t base = (n * g.c + c) * g.h * g.w;
  int64_t best = -1;
  ForEachTap(g, p, q, [&](int64_t x_plane, int64_t, int64_t) {
    if (best < 0 || x[base + x_plane] > x[best]) best = base + x_plane;
  });
  return best;
}

void MaxPool2dForward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const Window2d g = PoolWindow(op, *in[0].meta);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t p = 0; p < g.p; ++p)
        for (int64_t q = 0; q < g.q; ++q) {
          const int64_t at = PoolArgmax(in[0].data, g, n, c, p, q);
          out[0].data[((n * g.c + c) * g.p + p) * g.q + q] = at < 0 ? 0.0f : in[0].data[at];
        }
}

/// (dy, x) -> dx: each dy to its window's first maximum (summed where
/// windows overlap).
void MaxPool2dBackward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const Window2d g = PoolWindow(op, *in[1].meta);
  std::fill(out[0].data, out[0].data + Numel(out[0]), 0.0f);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t p = 0; p < g.p; ++p)
        for (int64_t q = 0; q < g.q; ++q) {
          const int64_t at = PoolArgmax(in[1].data, g, n, c, p, q);
          if (at >= 0) out[0].data[at] += in[0].data[((n * g.c + c) * g.p + p) * g.q + q];
        }
}

// ---- batch norm (training: batch statistics) ----------------------------------

/// x [N, C, rest...] viewed as [N, C, inner].
struct ChannelView {
  int64_t n, c, inner;
};
ChannelView Channels(const Tensor& x) {
  const int64_t n = x.shape[0], c = x.shape[1];
  const int64_t inner = n * c == 0 ? 0 : x.NumElements() / (n * c);
  return {n, c, inner};
}

/// (x, gamma, beta) -> (y, mean, invstd): per channel over N and the
/// spatial dims, biased variance, y = (x - mean) invstd gamma + beta.
void BatchNormForward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const ChannelView v = Channels(*in[0].meta);
  const bool sync = in.size() == 5;  // the global sum and squared deviations of batch_norm_stats, over `count`
  const double eps = op.Attr("eps", 1e-5);
  const double count = sync ? op.Attr("count", 1) : static_cast<double>(v.n * v.inner);
  const float* x = in[0].data;
  for (int64_t c = 0; c < v.c; ++c) {
    double mean = 0, var = 0;
    if (sync) {
      mean = in[3].data[c] / count;
      var = std::max(0.0, static_cast<double>(in[4].data[c]) / count);
    } else {
      double sum = 0, sq = 0;
      for (int64_t n = 0; n < v.n; ++n)
        for (int64_t i = 0; i < v.inner; ++i) sum += x[(n * v.c + c) * v.inner + i];
      mean = count > 0 ? sum / count : 0;
      for (int64_t n = 0; n < v.n; ++n)
        for (int64_t i = 0; i < v.inner; ++i) {
          const double d = x[(n * v.c + c) * v.inner + i] - mean;
          sq += d * d;
        }
      var = count > 0 ? sq / count : 0;
    }
    const double invstd = 1.0 / std::sqrt(var + eps);
    out[1].data[c] = static_cast<float>(mean);
    out[2].data[c] = static_cast<float>(invstd);
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t i = 0; i < v.inner; ++i) {
        const int64_t at = (n * v.c + c) * v.inner + i;
        out[0].data[at] = static_cast<float>((x[at] - mean) * invstd * in[1].data[c] + in[2].data[c]);
      }
  }
}

/// (dy, x, gamma, mean, invstd) -> (dx, dgamma, dbeta): with xhat = (x -
/// mean) invstd and M elements per channel, dbeta = sum dy, dgamma = sum dy
/// xhat, dx = gamma invstd (dy - dbeta / M - xhat dgamma / M).
void BatchNormBackward(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const ChannelView v = Channels(*in[1].meta);
  const bool sync = in.size() == 6;  // the global sums of batch_norm_grad_stats, over `count` elements
  const double count = sync ? op.Attr("count", 1) : static_cast<double>(v.n * v.inner);
  const float *dy = in[0].data, *x = in[1].data;
  for (int64_t c = 0; c < v.c; ++c) {
    const double mean = in[3].data[c], invstd = in[4].data[c], gamma = in[2].data[c];
    double dbeta = 0, dgamma = 0;
    if (sync) {
      dbeta = in[5].data[c];
      dgamma = in[5].data[v.c + c];
    } else {
      for (int64_t n = 0; n < v.n; ++n)
        for (int64_t i = 0; i < v.inner; ++i) {
          const int64_t at = (n * v.c + c) * v.inner + i;
          dbeta += dy[at];
          dgamma += dy[at] * (x[at] - mean) * invstd;
        }
    }
    out[1].data[c] = static_cast<float>(dgamma);
    out[2].data[c] = static_cast<float>(dbeta);
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t i = 0; i < v.inner; ++i) {
        const int64_t at = (n * v.c + c) * v.inner + i;
        const double xhat = (x[at] - mean) * invstd;
        out[0].data[at] =
            static_cast<float>(gamma * invstd * (dy[at] - (dbeta + xhat * dgamma) / std::max(count, 1.0)));
      }
  }
}

/// (x) -> [1, C]: per channel, the sum of x over this rank's part; (x, sum)
/// -> [1, C]: the sum of (x - sum / count)^2, the squared deviations from
/// the global mean (two passes, as batch_norm computes its own variance: sum
/// x^2 - count mean^2 in fp32 loses the variance where mean^2 >> var).
void BatchNormStats(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const ChannelView v = Channels(*in[0].meta);
  const bool deviations = in.size() == 2;
  const double count = deviations ? op.Attr("count", 1) : 1;
  for (int64_t c = 0; c < v.c; ++c) {
    const double mean = deviations ? in[1].data[c] / count : 0;
    double sum = 0;
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t i = 0; i < v.inner; ++i) {
        const double x = in[0].data[(n * v.c + c) * v.inner + i];
        sum += deviations ? (x - mean) * (x - mean) : x;
      }
    out[0].data[c] = static_cast<float>(sum);
  }
}

/// (dy, x, mean, invstd) -> [2, C]: per channel, the sum of dy and of dy xhat.
void BatchNormGradStats(const std::vector<KernelArg>& in, const std::vector<KernelArg>& out) {
  const ChannelView v = Channels(*in[1].meta);
  for (int64_t c = 0; c < v.c; ++c) {
    const double mean = in[2].data[c], invstd = in[3].data[c];
    double sum = 0, dot = 0;
    for (int64_t n = 0; n < v.n; ++n)
      for (int64_t i = 0; i < v.inner; ++i) {
        const int64_t at = (n * v.c + c) * v.inner + i;
        sum += in[0].data[at];
        dot += in[0].data[at] * (in[1].data[at] - mean) * invstd;
      }
    out[0].data[c] = static_cast<float>(sum);
    out[0].data[v.c + c] = static_cast<float>(dot);
  }
}

/// The attribute checks of one op: the integer attributes of its registry
/// entry within their bounds, then what the bounds cannot say.
Status CheckAttrs(const Op& op, const std::vector<const Tensor*>& inputs) {
  for (const AttrInfo& a : OpInfo(op.compute_type).attrs)
    if (a.integer) CONCERTO_RETURN_IF_ERROR(CheckIntAttr(op, std::string(a.name), a.required, a.lo, a.hi));
  switch (op.compute_type) {
    case ComputeType::kAttention:
    case ComputeType::kAttentionGrad: {
      const int64_t heads = static_cast<int64_t>(op.Attr("heads", 1));
      const int64_t kv = static_cast<int64_t>(op.Attr("kv_heads", static_cast<double>(heads)));
      const Tensor& q = *inputs[op.compute_type == ComputeType::kAttention ? 0 : 1];
      if (heads % kv != 0 || q.shape.size() != 3 || q.shape[2] % heads != 0)
        return OpError(op, "heads must divide q's last dim and kv_heads must divide heads");
      return Status::Ok();
    }
    case ComputeType::kCrossEntropy:
    case ComputeType::kCrossEntropyGrad:
      if (op.Attr("denominator", 1) == 0) return OpError(op, "denominator must not be 0");
      return Status::Ok();
    default:
      return Status::Ok();
  }
}

/// Ids are stored in fp32, exact below 2^24: an embedding table must have
/// fewer rows (the initializer checks the global id ranges).
Status CheckIdRange(const Op& op, const std::vector<const Tensor*>& inputs) {
  constexpr int64_t kExact = int64_t{1} << 24;
  if (op.compute_type == ComputeType::kEmbedding && inputs[0]->shape[0] >= kExact)
    return OpError(op, "embedding tables of 2^24 or more rows are not exact with fp32 ids");
  return Status::Ok();
}

}  // namespace

int64_t ShardOffset(const Tensor& tensor, int dim, const Mesh& mesh, int rank) {
  if (tensor.sharding.empty() || tensor.sharding[dim].empty()) return 0;
  const std::vector<int> coords = mesh.Coords(rank);
  int64_t block = 0;
  for (const std::string& axis : tensor.sharding[dim]) {
    const int a = mesh.AxisIndex(axis);
    assert(a >= 0);
    block = block * mesh.axes[a].size + coords[a];
  }
  return block * tensor.shape[dim];
}

std::vector<int64_t> GlobalShape(const Tensor& tensor, const Mesh& mesh) {
  std::vector<int64_t> shape = tensor.shape;
  for (size_t d = 0; d < tensor.sharding.size() && d < shape.size(); ++d)
    for (const std::string& axis : tensor.sharding[d]) {
      const int a = mesh.AxisIndex(axis);
      assert(a >= 0);
      shape[d] *= mesh.axes[a].size;
    }
  return shape;
}

void SetBlasThreads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

Status CheckKernel(const Op& op, const std::vector<const Tensor*>& inputs,
                   const std::vector<const Tensor*>& outputs) {
  assert(op.kind == OpKind::kCompute);
  const CpuKernel* kernel = FindCpuKernel(op.compute_type);
  if (kernel == nullptr) return Status::Error(OpLabel(op) + ": the runtime has no kernel for this compute type");
  const int nin = kernel->inputs, nout = kernel->outputs;
  // Optional trailing operands: Adam's f32 master copy (in and out), the
  // attention grad's forward output (flash-style row sums).
  const bool adam_master = op.compute_type == ComputeType::kAdam && inputs.size() == 5 && outputs.size() == 4;
  const bool attn_out = op.compute_type == ComputeType::kAttentionGrad && inputs.size() == 5;
  const bool sync_bn = (op.compute_type == ComputeType::kBatchNorm && inputs.size() == 5) ||
                       (op.compute_type == ComputeType::kBatchNormGrad && inputs.size() == 6) ||
                       (op.compute_type == ComputeType::kBatchNormStats && inputs.size() == 2);
  const bool in_ok = nin == -1 ? !inputs.empty() || op.compute_type == ComputeType::kIdentity
                               : static_cast<int>(inputs.size()) == nin || adam_master || attn_out || sync_bn;
  const bool out_ok = nout == -1 ? outputs.size() == inputs.size()
                                 : static_cast<int>(outputs.size()) == nout || adam_master;
  if (!in_ok || !out_ok)
    return OpError(op, "unexpected number of inputs or outputs (" + std::to_string(inputs.size()) +
                           " -> " + std::to_string(outputs.size()) + ")");
  for (const Tensor* t : outputs)
    for (const Tensor* u : inputs)
      if (t == u) return OpError(op, "tensor '" + t->name + "' is both an input and an output");
  CONCERTO_RETURN_IF_ERROR(CheckAttrs(op, inputs));
  return CheckIdRange(op, inputs);
}

const std::vector<CpuKernel>& CpuKernels() {
  using T = ComputeType;
  using In = const std::vector<KernelArg>&;
  using Ctx = const KernelContext&;
  // CONCERTO_KERNEL(body): a kernel that cannot fail, as a KernelFn.
#define CONCERTO_KERNEL(body) +[](const Op& op, In in, In out, Ctx ctx) -> Status { \
    (void)op; (void)ctx; body; return Status::Ok(); }
  static const std::vector<CpuKernel> kernels = {
      {T::kMatmul, 2, 1, +[](const Op& op, In in, In out, Ctx) { return Matmul(op, in, out); }},
      {T::kAdd, 2, 1, CONCERTO_KERNEL(Add(in, out))},
      {T::kMul, 2, 1, CONCERTO_KERNEL(Binary(in, out, [](double x, double y) { return x * y; }))},
      {T::kScale, 1, 1, CONCERTO_KERNEL(const double s = op.Attr("scale", 1);
                                        Unary(in, out, [s](double x) { return x * s; }))},
      {T::kGelu, 1, 1, CONCERTO_KERNEL(if (op.Attr("exact", 0) != 0) Unary(in, out, GeluExact);
                                       else Unary(in, out, Gelu))},
      {T::kGeluGrad, 2, 1, CONCERTO_KERNEL(
           if (op.Attr("exact", 0) != 0) Binary(in, out, [](double dy, double x) { return dy * GeluExactDeriv(x); });
           else Binary(in, out, [](double dy, double x) { return dy * GeluDeriv(x); }))},
      {T::kSilu, 1, 1, CONCERTO_KERNEL(Unary(in, out, Silu))},
      {T::kSiluGrad, 2, 1, CONCERTO_KERNEL(Binary(in, out, [](double dy, double x) { return dy * SiluDeriv(x); }))},
      {T::kSwiglu, 2, 1, CONCERTO_KERNEL(Binary(in, out, [](double g, double up) { return Silu(g) * up; }))},
      {T::kSwigluGrad, 3, 2, CONCERTO_KERNEL(SwigluGrad(in, out))},
      {T::kLayerNorm, 3, 1, CONCERTO_KERNEL(LayerNorm(op, in, out))},
      {T::kLayerNormGrad, 3, 3, CONCERTO_KERNEL(LayerNormGrad(op, in, out))},
      {T::kRmsNorm, 2, 1, CONCERTO_KERNEL(RmsNorm(op, in, out))},
      {T::kRmsNormGrad, 3, 2, CONCERTO_KERNEL(RmsNormGrad(op, in, out))},
      {T::kSoftmax, 1, 1, CONCERTO_KERNEL(Softmax(in, out))},
      {T::kSoftmaxGrad, 2, 1, CONCERTO_KERNEL(SoftmaxGrad(in, out))},
      {T::kAttention, 3, 1, CONCERTO_KERNEL(Attention(op, in, out))},
      {T::kAttentionGrad, 4, 3, CONCERTO_KERNEL(AttentionGrad(op, in, out))},
      {T::kEmbedding, 2, 1, CONCERTO_KERNEL(Embedding(in, out, ctx))},
      {T::kEmbeddingGrad, 2, 1, CONCERTO_KERNEL(EmbeddingGrad(in, out, ctx))},
      {T::kReduceMax, 1, 1, CONCERTO_KERNEL(ReduceMax(in, out))},
      {T::kSumExp, 2, 1, CONCERTO_KERNEL(SumExp(in, out))},
      {T::kGatherTarget, 2, 1, CONCERTO_KERNEL(GatherTarget(in, out, ctx))},
      {T::kCrossEntropy, 3, 1, CONCERTO_KERNEL(CrossEntropy(op, in, out))},
      {T::kCrossEntropyGrad, 4, 1, CONCERTO_KERNEL(CrossEntropyGrad(op, in, out, ctx))},
      {T::kAdam, 4, 3, CONCERTO_KERNEL(Adam(op, in, out))},
      {T::kSlice, 1, 1, CONCERTO_KERNEL(Slice(op, in, out))},
      {T::kConcat, -1, 1, CONCERTO_KERNEL(Concat(op, in, out))},
      {T::kCast, 1, 1, CONCERTO_KERNEL(Cast(in, out))},
      {T::kIdentity, -1, -1, CONCERTO_KERNEL(Identity(in, out))},
      {T::kTopK, 1, 2, CONCERTO_KERNEL(TopK(op, in, out))},
      {T::kTopKGrad, 3, 1, +[](const Op& op, In in, In out, Ctx) { return TopKGrad(op, in, out); }},
      {T::kMoeDispatch, 2, 1, +[](const Op& op, In in, In out, Ctx) { return MoeDispatch(op, in, out); }},
      {T::kMoeDispatchGrad, 2, 1, +[](const Op& op, In in, In out, Ctx) { return MoeDispatchGrad(op, in, out); }},
      {T::kMoeCombine, 3, 1, +[](const Op& op, In in, In out, Ctx) { return MoeCombine(op, in, out); }},
      {T::kMoeCombineGrad, 4, 2, +[](const Op& op, In in, In out, Ctx) { return MoeCombineGrad(op, in, out); }},
      {T::kTranspose, 1, 1, CONCERTO_KERNEL(Transpose(op, in, out))},
      {T::kRelu, 1, 1, CONCERTO_KERNEL(Unary(in, out, [](double x) { return x > 0 ? x : 0.0; }))},
      {T::kReluGrad, 2, 1, CONCERTO_KERNEL(Binary(in, out, [](double dy, double x) { return x > 0 ? dy : 0.0; }))},
      {T::kConv2d, 2, 1, CONCERTO_KERNEL(Conv2dForward(op, in, out, ctx))},
      {T::kConv2dGrad, 3, 2, CONCERTO_KERNEL(Conv2dBackward(op, in, out, ctx))},
      {T::kMaxPool2d, 1, 1, CONCERTO_KERNEL(MaxPool2dForward(op, in, out))},
      {T::kMaxPool2dGrad, 2, 1, CONCERTO_KERNEL(MaxPool2dBackward(op, in, out))},
      {T::kBatchNorm, 3, 3, CONCERTO_KERNEL(BatchNormForward(op, in, out))},
      {T::kBatchNormGrad, 5, 3, CONCERTO_KERNEL(BatchNormBackward(op, in, out))},
      {T::kBatchNormStats, 1, 1, CONCERTO_KERNEL(BatchNormStats(op, in, out))},
      {T::kBatchNormGradStats, 4, 1, CONCERTO_KERNEL(BatchNormGradStats(in, out))},
  };
#undef CONCERTO_KERNEL
  return kernels;
}

const CpuKernel* FindCpuKernel(ComputeType type) {
  const std::vector<CpuKernel>& k = CpuKernels();
  const size_t i = static_cast<size_t>(type);
  return i < k.size() && k[i].type == type ? &k[i] : nullptr;
}

Status RunKernel(const Op& op, const std::vector<KernelArg>& in, const std::vector<KernelArg>& out,
                 const KernelContext& ctx) {
  const CpuKernel* kernel = FindCpuKernel(op.compute_type);
  assert(kernel != nullptr && "CheckKernel accepted the op");
  return kernel->run(op, in, out, ctx);
}

}  // namespace concerto
