#include "concerto/sim/jitter.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>
#include <mutex>

namespace concerto {
namespace {

double Pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double Cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

/// Mean and standard deviation of max(X, Y) for independent normals
/// (Clark 1961, equations 2-3); the result is treated as normal again.
Arrival ClarkMax(const Arrival& x, const Arrival& y) {
  const double a2 = x.sd_us * x.sd_us + y.sd_us * y.sd_us;
  if (a2 <= 0) return {std::max(x.mean_us, y.mean_us), 0, 1};
  const double a = std::sqrt(a2), alpha = (x.mean_us - y.mean_us) / a;
  const double px = Cdf(alpha), py = Cdf(-alpha), d = Pdf(alpha);
  const double m1 = x.mean_us * px + y.mean_us * py + a * d;
  const double m2 = (x.mean_us * x.mean_us + x.sd_us * x.sd_us) * px +
                    (y.mean_us * y.mean_us + y.sd_us * y.sd_us) * py + (x.mean_us + y.mean_us) * a * d;
  // Rounding can make the variance a hair negative when one side dominates.
  return {std::max(m1, std::max(x.mean_us, y.mean_us)), std::sqrt(std::max(0.0, m2 - m1 * m1)), 1};
}

}  // namespace

MaxMoments StandardNormalMaxMoments(int n) {
  assert(n >= 1 && "the largest of at least one variable");
  if (n <= 1) return {0, 1};
  static std::mutex mu;
  static std::map<int, MaxMoments> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(n); it != cache.end()) return it->second;
  // The density of the largest is n phi(x) Phi(x)^(n-1); the midpoint rule
  // over [-10, 10] in 4000 steps is exact to 1e-9 for these smooth tails.
  const int steps = 4000;
  const double lo = -10, h = 20.0 / steps;
  double m1 = 0, m2 = 0;
  for (int i = 0; i < steps; ++i) {
    const double x = lo + (i + 0.5) * h;
    const double w = n * Pdf(x) * std::pow(Cdf(x), n - 1) * h;
    m1 += x * w;
    m2 += x * x * w;
  }
  const MaxMoments m{m1, std::sqrt(std::max(0.0, m2 - m1 * m1))};
  cache.emplace(n, m);
  return m;
}

double ExpectedLastArrival(const std::vector<Arrival>& arrivals) {
  if (arrivals.empty()) return 0;
  double latest = arrivals.front().mean_us;
  bool any_sd = false;
  for (const Arrival& a : arrivals) {
    latest = std::max(latest, a.mean_us);
    any_sd = any_sd || (a.sd_us > 0 && (a.count > 1 || arrivals.size() > 1));
  }
  if (!any_sd) return latest;
  // Latest means first: Clark's approximation is best when it adds the
  // smaller terms to a dominant one.
  std::vector<Arrival> sorted = arrivals;
  std::sort(sorted.begin(), sorted.end(), [](const Arrival& a, const Arrival& b) { return a.mean_us > b.mean_us; });
  Arrival acc;
  bool first = true;
  for (const Arrival& a : sorted) {
    const MaxMoments k = StandardNormalMaxMoments(std::max(1, a.count));
    const Arrival group{a.mean_us + k.mean * a.sd_us, k.sd * a.sd_us, 1};
    acc = first ? group : ClarkMax(acc, group);
    first = false;
  }
  return std::max(latest, acc.mean_us);
}

}  // namespace concerto
