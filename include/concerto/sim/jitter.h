#pragma once
// The expected last arrival at a rendezvous whose members' arrivals vary
// (ClusterSpec::compute_jitter; docs/cost-model.md, "Jitter").

#include <vector>

namespace concerto {

/// One member of a rendezvous: its arrival time (the simulated one, the
/// mean) and the standard deviation of the real one, in microseconds;
/// `count` ranks arrive so (a role's representative stands for its ranks).
struct Arrival {
  double mean_us = 0;
  double sd_us = 0;
  int count = 1;
};

/// Mean and standard deviation of the largest of `n` independent standard
/// normal variables (n >= 1; n = 1: 0 and 1), by quadrature, cached.
struct MaxMoments {
  double mean = 0;
  double sd = 1;
};
MaxMoments StandardNormalMaxMoments(int n);

/// The expected time the last member arrives: the maximum of the arrivals
/// as normal variables, by Clark's moment matching (exact for two, C. E.
/// Clark, "The greatest of a finite set of random variables", Operations
/// Research 9(2), 1961), the `count` ranks of one member first as the
/// largest of `count` (StandardNormalMaxMoments). At least the latest mean;
/// the latest mean when every sd is 0. An empty list gives 0.
double ExpectedLastArrival(const std::vector<Arrival>& arrivals);

}  // namespace concerto
