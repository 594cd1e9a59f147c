// Profiling: the least-squares fits on exact synthetic data, the
// cpu-local cluster file, the profile database the cost model reads, and
// collective timing over FakeWorld.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "concerto/cost/cluster.h"
#include "concerto/cost/cost_model.h"
#include "concerto/lower/frontend.h"
#include "concerto/profile/profile.h"
#include "concerto/driver/job.h"
#include "concerto/report/report.h"

namespace concerto {
namespace {

TEST(FitLine, RecoversAnExactLine) {
  // y = 2x + 3 at x = 1, 2, 3: 5, 7, 9.
  Result<LinearFit> f = FitLine({1, 2, 3}, {5, 7, 9});
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(f->slope, 2, 1e-12);
  EXPECT_NEAR(f->intercept, 3, 1e-12);
  EXPECT_NEAR(f->r2, 1, 1e-12);
  EXPECT_FALSE(FitLine({1, 1}, {2, 3}).ok());  // no spread in x
}

TEST(FitCollectives, RecoversAlphaAndBetaOfRingCollectives) {
  // alpha = 10 us per step, B = 1 GB/s = 1e3 bytes/us (1e-3 us per byte).
  // all_reduce n=2 (2 steps, factor 1): S=4096: 20 + 4.096 = 24.096 us;
  //   S=2^21: 20 + 2097.152 = 2117.152 us; S=2^22: 20 + 4194.304 = 4214.304 us.
  // all_gather n=4 (3 steps, factor 3), S=16384: 30 + 49.152 = 79.152 us.
  std::vector<CollectiveSample> samples = {
      {{CollectiveType::kAllReduce, 2, 4096}, 24.096, 1},
      {{CollectiveType::kAllReduce, 2, 1 << 21}, 2117.152, 1},
      {{CollectiveType::kAllReduce, 2, 1 << 22}, 4214.304, 1},
      {{CollectiveType::kAllGather, 4, 16384}, 79.152, 1}};
  Result<CollectiveFit> f = FitCollectives(samples);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NEAR(f->latency_us, 10, 1e-6);
  EXPECT_NEAR(f->bandwidth_gbps, 1, 1e-9);
  EXPECT_NEAR(f->max_rel_error, 0, 1e-6);
  EXPECT_EQ(f->points, 4);
  // With one all_reduce of 1 MiB or more the bandwidth comes from every
  // large sample (here that one); the data are exact, so the same alpha
  // and B come back.
  samples.erase(samples.begin() + 1);
  Result<CollectiveFit> one = FitCollectives(samples);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_NEAR(one->latency_us, 10, 1e-6);
  EXPECT_NEAR(one->bandwidth_gbps, 1, 1e-6);
  EXPECT_NE(FitCollectives({}).status().message().find("no samples"), std::string::npos);
}

TEST(FitCollectives, OneWayTransfersTellABusFromPorts) {
  // A bus of 1 GB/s (1e3 bytes/us), alpha 10 us per step, two ranks: a ring's
  // two senders get 0.5 GB/s each. all_reduce n=2 (2 steps, factor 1 x 2
  // senders): S=4096: 20 + 8.192 = 28.192 us; S=2^21: 20 + 4194.304 =
  // 4214.304 us; S=2^22: 20 + 8388.608 = 8408.608 us. Fitted as ports the
  // same samples say 0.5 GB/s per rank.
  const std::vector<CollectiveSample> samples = {{{CollectiveType::kAllReduce, 2, 4096}, 28.192, 1},
                                                 {{CollectiveType::kAllReduce, 2, 1 << 21}, 4214.304, 1},
                                                 {{CollectiveType::kAllReduce, 2, 1 << 22}, 8408.608, 1}};
  // A lone transfer of 2^21 bytes alone on the bus: 10 + 2097.152 us (a
  // port would take 10 + 4194.304).
  const std::vector<OneWaySample> bus_one_way = {{1 << 20, 10 + 1048.576, 1}, {1 << 21, 10 + 2097.152, 1}};
  Result<CollectiveFit> bus = FitCollectives(samples, bus_one_way);
  ASSERT_TRUE(bus.ok()) << bus.status().message();
  EXPECT_EQ(bus->intra_link, "bus");
  EXPECT_NEAR(bus->bandwidth_gbps, 1, 1e-6);
  EXPECT_NEAR(bus->latency_us, 10, 1e-6);
  EXPECT_NEAR(bus->ports_gbps, 0.5, 1e-6);
  EXPECT_NEAR(bus->bus_gbps, 1, 1e-6);
  EXPECT_NEAR(bus->bus_one_way_error, 0, 1e-6);
  EXPECT_NEAR(bus->one_way_gbps, 2097152.0 / 2107.152 / 1e3, 1e-9);
  EXPECT_EQ(bus->one_way_points, 2);
  // One-way transfers no faster than a ring's rank: ports.
  const std::vector<OneWaySample> ports_one_way = {{1 << 21, 10 + 4194.304, 1}};
  Result<CollectiveFit> ports = FitCollectives(samples, ports_one_way);
  ASSERT_TRUE(ports.ok());
  EXPECT_EQ(ports->intra_link, "nvswitch");
  EXPECT_NEAR(ports->bandwidth_gbps, 0.5, 1e-6);
  // No one-way samples: ports, as before they were measured.
  EXPECT_EQ(FitCollectives(samples)->intra_link, "nvswitch");
  // The cpu-local cluster takes the medium.
  EXPECT_EQ(MakeCpuLocalCluster(ComputeFit{}, *bus, 2, "cpu-local", 0).topology.intra_link, "bus");
}

TEST(ProfileOneWay, TimesRankZeroToOneOverFakeWorldAndRoundTrips) {
  EXPECT_EQ(DefaultOneWaySizes(16 << 20), (std::vector<int64_t>{1 << 20, 4 << 20, 16 << 20}));
  EXPECT_EQ(DefaultOneWaySizes(256 << 10), (std::vector<int64_t>{64 << 10, 256 << 10}));
  EXPECT_TRUE(DefaultOneWaySizes(16 << 10).empty());
  std::vector<OneWaySample> one_way;
  Result<std::vector<CollectiveSample>> s =
      ProfileCollectivesInProcess(3, {{CollectiveType::kAllReduce, 3, 4096}}, 2, &one_way, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(one_way.size(), 3u);  // 64 KiB, 256 KiB, 1 MiB
  for (const OneWaySample& x : one_way) {
    EXPECT_GT(x.time_us, 0);
    EXPECT_EQ(x.reps, 2);
  }
  const std::string path = ::testing::TempDir() + "/one_way_samples.json";
  {
    std::ofstream(path) << WriteCollectiveSamples(*s, 3, one_way);
  }
  std::vector<OneWaySample> back;
  Result<std::vector<CollectiveSample>> read = ReadCollectiveSamples(path, &back);
  ASSERT_TRUE(read.ok()) << read.status().message();
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[2].bytes, 1 << 20);
  EXPECT_DOUBLE_EQ(back[2].time_us, one_way[2].time_us);
  {
    std::ofstream(path) << R"({"format": "concerto-collective-samples", "samples": [], "one_way": [{"bytes": -4, "time_us": 1}]})";
  }
  Result<std::vector<CollectiveSample>> bad = ReadCollectiveSamples(path, &back);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("one_way 0: field 'bytes'"), std::string::npos) << bad.status().message();
}

TEST(FitCompute, RecoversRateBandwidthAndLaunchOverhead) {
  // matmul: t = flops / 1e4 + 5 (1e4 flop/us = 0.01 TFLOP/s);
  // add: t = bytes / 1e3 + 2 (1e3 bytes/us = 1 GB/s; launch 2 us).
  std::vector<KernelSample> samples;
  for (double flops : {1e6, 4e6}) samples.push_back({"m", ComputeType::kMatmul, flops, 0, flops / 1e4 + 5, 3});
  for (double bytes : {1e4, 3e4}) samples.push_back({"a", ComputeType::kAdd, 0, bytes, bytes / 1e3 + 2, 3});
  Result<ComputeFit> f = FitCompute(samples);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NEAR(f->matmul_tflops, 0.01, 1e-12);
  EXPECT_NEAR(f->memory_gbps, 1, 1e-9);
  EXPECT_NEAR(f->launch_overhead_us, 2, 1e-9);
  samples.pop_back();
  EXPECT_FALSE(FitCompute(samples).ok());  // one memory point cannot fix a line
}

TEST(CpuLocalCluster, IsAValidClusterFile) {
  ComputeFit compute;
  compute.matmul_tflops = 0.05;
  compute.memory_gbps = 8;
  compute.launch_overhead_us = 1.5;
  compute.vector_efficiency = 0.2;
  CollectiveFit comm;
  comm.latency_us = 40;
  comm.bandwidth_gbps = 0.12;
  const ClusterSpec c = MakeCpuLocalCluster(compute, comm, 2, "cpu-local");
  const std::string path = testing::TempDir() + "/cpu-local.json";
  {
    std::ofstream out(path);
    out << ClusterToJson(c);
  }
  Result<ClusterSpec> back = LoadCluster(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, c);
  EXPECT_EQ(back->NumDevices(), 2);
  EXPECT_DOUBLE_EQ(back->intra_node.bandwidth_gbps, 0.12);
  EXPECT_DOUBLE_EQ(back->device.peak_tflops_bf16, 0.05);
}

TEST(CollectiveSpecs, RoundTripAndRejectBadText) {
  const std::vector<CollectiveSpec> specs = {{CollectiveType::kAllReduce, 2, 4096},
                                             {CollectiveType::kReduceScatter, 4, 65536}};
  const std::string text = FormatCollectiveSpecs(specs);
  EXPECT_EQ(text, "all_reduce:2:4096,reduce_scatter:4:65536");
  Result<std::vector<CollectiveSpec>> back = ParseCollectiveSpecs(text);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].type, CollectiveType::kReduceScatter);
  EXPECT_EQ((*back)[1].bytes, 65536);
  EXPECT_NE(ParseCollectiveSpecs("all_sum:2:4").status().message().find("unknown collective type"),
            std::string::npos);
  EXPECT_NE(ParseCollectiveSpecs("all_reduce:x:4").status().message().find("integers"), std::string::npos);
}

TEST(ProfileCollectives, TimesEverySpecOverFakeWorld) {
  const std::vector<CollectiveSpec> specs = {{CollectiveType::kAllReduce, 2, 4096},
                                             {CollectiveType::kAllGather, 3, 4096},
                                             {CollectiveType::kAllToAll, 3, 12288}};
  Result<std::vector<CollectiveSample>> s = ProfileCollectivesInProcess(3, specs, 2);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 3u);
  for (const CollectiveSample& x : *s) {
    EXPECT_GT(x.time_us, 0);
    EXPECT_EQ(x.reps, 2);
  }
  // 4100 bytes of all_to_all over 3 ranks is not 3 whole fp32 chunks.
  Result<std::vector<CollectiveSample>> bad =
      ProfileCollectivesInProcess(3, {{CollectiveType::kAllToAll, 3, 4100}}, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("multiple of 12"), std::string::npos) << bad.status().message();
}

TEST(ProfileKernels, FeedsTheProfiledCostModel) {
  Result<Program> p = LowerModelPlan("gpt-tiny", "dp=2");
  ASSERT_TRUE(p.ok()) << p.status().message();
  ClusterSpec cluster;
  cluster.name = "cpu-local";
  cluster.device.name = "cpu-local";
  cluster.devices_per_node = 2;
  KernelProfileOptions quick;
  quick.min_time_s = 0;
  quick.min_reps = 1;
  quick.max_reps = 1;
  Result<std::vector<KernelSample>> kernels = ProfileKernels(*p, cluster, quick);
  ASSERT_TRUE(kernels.ok()) << kernels.status().message();
  ASSERT_FALSE(kernels->empty());
  // Pretend every collective of the program was measured at 100 us.
  std::vector<CollectiveSample> comm;
  for (const CollectiveSpec& s : ProgramCollectiveSpecs(*p)) comm.push_back({s, 100, 1});
  ASSERT_FALSE(comm.empty());
  ProfileDb db = MakeProfileDb("cpu-local", *kernels, comm, &*p, cluster);
  EXPECT_GT(db.size(), kernels->size());
  // Every compute and collective op of the program is now priced from the
  // database; nothing falls back to the analytic model.
  cluster.device.peak_tflops_bf16 = cluster.device.peak_tflops_fp16 = cluster.device.peak_tflops_fp32 = 1;
  cluster.device.memory_bandwidth_gbps = 1;
  cluster.device.memory_gb = 1;
  cluster.intra_node = cluster.inter_node = LinkSpec{1, 1};
  const ProfiledCostModel model(db, cluster);
  const CostReport report = SummarizeCosts(*p, model);
  int compute_and_collectives = 0;
  for (const Op& op : p->graphs[0].ops)
    compute_and_collectives += op.kind == OpKind::kCompute || op.kind == OpKind::kCollective;
  EXPECT_EQ(report.profiled_ops, compute_and_collectives);
}

TEST(FitCollectives, TakesAlphaFromTheSmallestMessagesOnly) {
  // alpha = 20 us per step, B = 1e3 bytes/us. 4 KiB all_reduce n=2 (2
  // steps, factor 1): 40 + 4.096 = 44.096 us; all_gather 4 KiB (1 step,
  // factor 1): 20 + 4.096 = 24.096; one 4 KiB outlier (a broadcast queued
  // behind a token bucket: 5000 us, per step 4995.9). Mid-size samples
  // inflated by a shaper's bucket (64 KiB: 3000 us) must not move alpha:
  // the median of the three 4 KiB remainders (20, 20, 4995.9) is 20.
  // Large: 2^22 bytes all_reduce 40 + 4194.304, 2^21: 40 + 2097.152.
  std::vector<CollectiveSample> samples = {
      {{CollectiveType::kAllReduce, 2, 4096}, 44.096, 1},
      {{CollectiveType::kAllGather, 2, 4096}, 24.096, 1},
      {{CollectiveType::kBroadcast, 2, 4096}, 5000, 1},
      {{CollectiveType::kAllReduce, 2, 65536}, 3000, 1},
      {{CollectiveType::kAllGather, 2, 65536}, 3000, 1},
      {{CollectiveType::kAllReduce, 2, 1 << 21}, 2137.152, 1},
      {{CollectiveType::kAllReduce, 2, 1 << 22}, 4234.304, 1}};
  Result<CollectiveFit> f = FitCollectives(samples);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_NEAR(f->latency_us, 20, 1e-6);
  EXPECT_NEAR(f->bandwidth_gbps, 1, 1e-9);
}

TEST(Interference, FactorIsTheSlowdownOfTheKernelMix) {
  // matmul 100 -> 120 us, add 50 -> 60 us: (120 + 60) / (100 + 50) - 1 = 0.2.
  const std::vector<InterferenceKernel> k = {{"matmul", 100, 120, 3, 3}, {"add", 50, 60, 3, 3}};
  EXPECT_NEAR(InterferenceFactor(k), 0.2, 1e-12);
  // Faster while overlapped (noise) clamps to 0; no kernels: 0.
  EXPECT_EQ(InterferenceFactor({{"matmul", 100, 90, 3, 3}}), 0);
  EXPECT_EQ(InterferenceFactor({}), 0);
  // The lower median of the rounds: {0, 0.3, 0.1, 2.0} sorted 0, 0.1, 0.3, 2.0 -> 0.1.
  EXPECT_DOUBLE_EQ(MedianFactor({0, 0.3, 0.1, 2.0}), 0.1);
  EXPECT_EQ(MedianFactor({}), 0);
}

TEST(Interference, CorunSlowdownIsTheKernelMixWhileEveryRankComputes) {
  // matmul 100 us on rank 0 alone, 130 us while every rank computes; add
  // 50 -> 50: (130 + 50) / (100 + 50) - 1 = 0.2.
  EXPECT_NEAR(CorunSlowdown({100, 50}, {130, 50}), 0.2, 1e-12);
  // Faster co-running (noise) clamps to 0; mismatched, empty or zero sums: 0.
  EXPECT_EQ(CorunSlowdown({100}, {90}), 0);
  EXPECT_EQ(CorunSlowdown({100, 50}, {130}), 0);
  EXPECT_EQ(CorunSlowdown({}, {}), 0);
  EXPECT_EQ(CorunSlowdown({0}, {10}), 0);
  EXPECT_EQ(CorunSlowdown({1}, {1000}), 10);  // clamped as interference is
}

TEST(Interference, MeasuresOverFakeWorldAndRoundTrips) {
  InterferenceOptions o;
  o.comm_bytes = 1 << 16;
  o.matmul_size = 64;
  o.add_elements = 1 << 12;
  o.rounds = 2;
  o.min_samples = 2;
  o.min_time_s = 0.01;
  o.mid_comm_bytes = 1 << 16;
  o.idle_us = 1000;
  Result<InterferenceMeasurement> m = MeasureInterferenceInProcess(2, o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->kernels.size(), 2u);
  EXPECT_EQ(m->kernels[0].kernel, "matmul 64x64x64");
  EXPECT_EQ(m->kernels[1].kernel, "add 4096 floats");
  for (const InterferenceKernel& k : m->kernels) {
    EXPECT_GT(k.alone_us, 0);
    EXPECT_GT(k.overlapped_us, 0);
    EXPECT_GE(k.overlapped_reps, 2 * o.min_samples);  // every round keeps at least min_samples
  }
  EXPECT_EQ(m->round_factors.size(), 2u);
  EXPECT_DOUBLE_EQ(m->interference, MedianFactor(m->round_factors));
  // The solo phase (rank 0 alone) gives the co-run slowdown, per round.
  for (const InterferenceKernel& k : m->kernels) EXPECT_GT(k.solo_us, 0);
  EXPECT_EQ(m->corun_round_factors.size(), 2u);
  EXPECT_DOUBLE_EQ(m->corun, MedianFactor(m->corun_round_factors));
  EXPECT_GE(m->collectives, 2);
  // The small all_reduce alone and beside compute, per round; the latency is
  // the median of the per-round differences (clamped at 0).
  ASSERT_EQ(m->small_comm_alone_us.size(), 2u);
  ASSERT_EQ(m->small_comm_computing_us.size(), 2u);
  EXPECT_EQ(m->small_comm_bytes, o.small_comm_bytes);
  std::vector<double> waits;
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(m->small_comm_alone_us[r], 0);
    EXPECT_GT(m->small_comm_computing_us[r], 0);
    waits.push_back(std::max(0.0, m->small_comm_computing_us[r] - m->small_comm_alone_us[r]));
  }
  EXPECT_DOUBLE_EQ(m->comm_corun_latency_us, MedianFactor(waits));
  // The mid-size all_reduce: per round right after another, after an idle
  // pause and beside the kernels; the burst is the median of the per-round
  // differences (clamped at 0), the wait rate the median of the rounds'.
  EXPECT_EQ(m->mid_comm_bytes, o.mid_comm_bytes);
  ASSERT_EQ(m->mid_back_to_back_us.size(), 2u);
  ASSERT_EQ(m->mid_idle_us.size(), 2u);
  ASSERT_EQ(m->hold_round_us.size(), 2u);
  std::vector<double> bursts;
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(m->mid_back_to_back_us[r], 0);
    EXPECT_GT(m->mid_idle_us[r], 0);
    EXPECT_GE(m->mid_wait_compute_us[r], 0);  // the matmuls after the all_reduce's start (threads: may be none)
    EXPECT_GE(m->hold_round_us[r], 0);
    bursts.push_back(std::max(0.0, m->mid_back_to_back_us[r] - m->mid_idle_us[r]));
  }
  EXPECT_DOUBLE_EQ(m->link_burst_us, MedianFactor(bursts));
  EXPECT_DOUBLE_EQ(m->comm_corun_hold_us, MedianFactor(m->hold_round_us));
  ASSERT_EQ(m->hold_samples_us.size(), 16u);  // 8 repetitions per round
  // The jitter: per round the executor's segment of kernels and its spread.
  ASSERT_EQ(m->jitter_round.size(), 2u);
  ASSERT_EQ(m->jitter_segment_us.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(m->jitter_round[r], 0);
    EXPECT_GT(m->jitter_segment_us[r], 0);
  }
  EXPECT_DOUBLE_EQ(m->compute_jitter, std::min(1.0, MedianFactor(m->jitter_round)));
  for (double h : m->hold_samples_us) EXPECT_GE(h, 0);
  const std::string path = testing::TempDir() + "/interference.json";
  {
    std::ofstream out(path);
    out << WriteInterference(*m);
  }
  Result<InterferenceMeasurement> back = ReadInterference(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_DOUBLE_EQ(back->interference, m->interference);
  EXPECT_EQ(back->round_factors, m->round_factors);
  EXPECT_DOUBLE_EQ(back->kernels[1].overlapped_us, m->kernels[1].overlapped_us);
  EXPECT_DOUBLE_EQ(back->kernels[0].solo_us, m->kernels[0].solo_us);
  EXPECT_DOUBLE_EQ(back->corun, m->corun);
  EXPECT_EQ(back->corun_round_factors, m->corun_round_factors);
  EXPECT_DOUBLE_EQ(back->comm_corun_latency_us, m->comm_corun_latency_us);
  EXPECT_EQ(back->small_comm_computing_us, m->small_comm_computing_us);
  EXPECT_DOUBLE_EQ(back->link_burst_us, m->link_burst_us);
  EXPECT_DOUBLE_EQ(back->comm_corun_hold_us, m->comm_corun_hold_us);
  EXPECT_EQ(back->mid_idle_us, m->mid_idle_us);
  EXPECT_EQ(back->hold_round_us, m->hold_round_us);
  EXPECT_DOUBLE_EQ(back->compute_jitter, m->compute_jitter);
  EXPECT_EQ(back->jitter_round, m->jitter_round);
  // The cluster takes the factor, the latency, the burst and the hold (at
  // most the latency).
  EXPECT_DOUBLE_EQ(
      MakeCpuLocalCluster(ComputeFit{}, CollectiveFit{}, 2, "cpu-local", 0, 0, -1, 0, 1500).comm_corun_latency_us, 1500);
  const ClusterSpec fitted = MakeCpuLocalCluster(ComputeFit{}, CollectiveFit{}, 2, "cpu-local", 0, 0, -1, 0, 1500, 1200, 700);
  EXPECT_DOUBLE_EQ(fitted.link_burst_us, 1200);
  EXPECT_DOUBLE_EQ(fitted.comm_corun_hold_us, 700);
  EXPECT_DOUBLE_EQ(
      MakeCpuLocalCluster(ComputeFit{}, CollectiveFit{}, 2, "cpu-local", 0, 0, -1, 0, 1500, 0, 9000).comm_corun_hold_us,
      1500);
  EXPECT_DOUBLE_EQ(MakeCpuLocalCluster(ComputeFit{}, CollectiveFit{}, 2, "cpu-local", 0.25).interference, 0.25);
  EXPECT_DOUBLE_EQ(
      MakeCpuLocalCluster(ComputeFit{}, CollectiveFit{}, 2, "cpu-local", 0, 0, -1, 0, 0, 0, 0, 0.05).compute_jitter,
      0.05);
  // Errors name what is wrong.
  EXPECT_NE(MeasureInterferenceInProcess(1, o).status().message().find("at least 2 ranks"), std::string::npos);
  o.comm_bytes = 6;
  EXPECT_NE(MeasureInterferenceInProcess(2, o).status().message().find("multiple of 4"), std::string::npos);
  o.comm_bytes = 1 << 16;
  o.small_comm_bytes = 0;
  EXPECT_NE(MeasureInterferenceInProcess(2, o).status().message().find("small_comm_bytes must be a positive"),
            std::string::npos);
  o.small_comm_bytes = 2048;
  o.mid_comm_bytes = 10;
  EXPECT_NE(MeasureInterferenceInProcess(2, o).status().message().find("mid_comm_bytes must be a positive multiple of 4"),
            std::string::npos);
  {
    std::ofstream out(path);
    out << R"({"format": "concerto-interference", "interference": 0.1, "comm_corun_latency_us": -3, "kernels": []})";
  }
  EXPECT_NE(ReadInterference(path).status().message().find("field 'comm_corun_latency_us' must be a number"),
            std::string::npos);
  {
    std::ofstream out(path);
    out << R"({"format": "concerto-interference", "interference": 0.1, "comm_corun_hold_us": -2, "kernels": []})";
  }
  EXPECT_NE(ReadInterference(path).status().message().find("field 'comm_corun_hold_us' must be a number"),
            std::string::npos);
  {
    std::ofstream out(path);
    out << R"({"format": "concerto-interference", "interference": 0.1, "compute_jitter": 3, "kernels": []})";
  }
  EXPECT_NE(ReadInterference(path).status().message().find("field 'compute_jitter' must be a number in [0, 1]"),
            std::string::npos);
  {
    std::ofstream out(path);
    out << R"({"format": "concerto-interference", "interference": 0.1, "kernels": [{"alone_us": -1}]})";
  }
  EXPECT_NE(ReadInterference(path).status().message().find("kernel 0: field 'alone_us'"), std::string::npos);
}

// The closed loop's reader: a trace of a (here simulated) run gives back each
// compute signature's duration; a profile database of them prices the same
// program as the run measured it. On a simulated trace that is the cost
// model's own durations, so re-simulating on the database reproduces the run.
TEST(FromTrace, ComputeDurationsOfARunTraceBecomeProfileEntries) {
  JobSpec spec;
  spec.model = "gpt-tiny";
  spec.plan = "dp=2";
  spec.scheduler = "fifo";
  spec.cluster = "commodity-4x8";
  // No interference: a span in the timeline is then the op's own duration (a
  // real run's spans include what slowed them; docs/runtime.md, "Closing the loop").
  spec.options.concerto.sim.interference = 0;
  Result<JobResult> job = RunJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().message();
  const ScheduledProgram& sp = job->run.scheduled;
  const std::string trace = ChromeTrace(sp, job->run.timeline);
  Result<std::vector<TraceSample>> samples = DurationsFromTrace(trace, "t.json", sp.program, job->cost->cluster());
  ASSERT_TRUE(samples.ok()) << samples.status().message();
  int ops = 0;
  ProfileDb db;
  for (const TraceSample& t : *samples) {
    ops += t.count;
    EXPECT_EQ(t.signature.find("all_reduce"), std::string::npos) << "communication is left out: " << t.signature;
    db.Add(job->cost->cluster().device.name, t.signature, t.median_us);
  }
  int compute_ops = 0;
  for (const Graph& g : sp.program.graphs)
    for (const Op& op : g.ops) compute_ops += op.kind == OpKind::kCompute;
  // One rank per role is simulated (dp ranks are alike), so each op once.
  EXPECT_EQ(ops, compute_ops * static_cast<int>(job->run.timeline.ranks.size()));
  // Re-simulated on the database (every compute op now priced by the profile), the step is the same.
  const ProfiledCostModel profiled(db, job->cost->cluster());
  EXPECT_EQ(SummarizeCosts(sp.program, profiled).analytic_ops,
            static_cast<int>(sp.program.graphs[0].ops.size()) - compute_ops);
  Result<RunResult> again = RunGivenSchedule(sp.program, sp.schedule, profiled, spec.options);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_NEAR(again->summary.makespan_us, job->run.summary.makespan_us, 1e-6 * job->run.summary.makespan_us);

  // A trace of another program is named as such.
  nlohmann::json other = nlohmann::json::parse(trace);
  nlohmann::json& events = other.is_array() ? other : other["traceEvents"];
  for (nlohmann::json& e : events)
    if (e.value("ph", "") == "X") {
      e["name"] = "renamed";
      break;
    }
  Result<std::vector<TraceSample>> bad = DurationsFromTrace(other.dump(), "t.json", sp.program, job->cost->cluster());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.json: event"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("(a trace of another program?)"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(DurationsFromTrace("{}", "t.json", sp.program, job->cost->cluster()).ok());
  EXPECT_FALSE(DurationsFromTrace("{\"traceEvents\": 5}", "t.json", sp.program, job->cost->cluster()).ok());

  // The events are read as they are parsed (a trace costs its text, not a
  // document of 8.5x it): both forms of the format give the same samples, and
  // a top-level member other than traceEvents is not read as events.
  nlohmann::json wrapped = nlohmann::json::parse(trace);
  nlohmann::json as_array = wrapped.is_array() ? wrapped : wrapped["traceEvents"];
  nlohmann::json with_other = {{"other", {{{"ph", "X"}, {"pid", 99}}}}, {"traceEvents", as_array}};
  for (const nlohmann::json& form : {as_array, with_other}) {
    Result<std::vector<TraceSample>> same = DurationsFromTrace(form.dump(), "t.json", sp.program, job->cost->cluster());
    ASSERT_TRUE(same.ok()) << same.status().message();
    ASSERT_EQ(same->size(), samples->size());
    for (size_t i = 0; i < same->size(); ++i) {
      EXPECT_EQ((*same)[i].signature, (*samples)[i].signature);
      EXPECT_EQ((*same)[i].count, (*samples)[i].count);
    }
  }

  // With collectives: each all_reduce instance once (the shortest span over its ranks), and the
  // step re-simulated on a database that now prices every op is the same step.
  Result<std::vector<TraceSample>> all =
      DurationsFromTrace(trace, "t.json", sp.program, job->cost->cluster(), /*collectives=*/true);
  ASSERT_TRUE(all.ok()) << all.status().message();
  ProfileDb full;
  int collective_instances = 0;
  for (const TraceSample& t : *all) {
    if (t.signature.rfind("all_reduce", 0) == 0) collective_instances += t.count;
    full.Add(job->cost->cluster().device.name, t.signature, t.median_us);
  }
  int collective_ops = 0;
  for (const Op& op : sp.program.graphs[0].ops) collective_ops += op.kind == OpKind::kCollective;
  EXPECT_GT(collective_ops, 0);
  EXPECT_EQ(collective_instances, collective_ops);
  const ProfiledCostModel all_profiled(full, job->cost->cluster());
  EXPECT_EQ(SummarizeCosts(sp.program, all_profiled).analytic_ops, 0);
  Result<RunResult> replay = RunGivenSchedule(sp.program, sp.schedule, all_profiled, spec.options);
  ASSERT_TRUE(replay.ok()) << replay.status().message();
  EXPECT_NEAR(replay->summary.makespan_us, job->run.summary.makespan_us, 1e-6 * job->run.summary.makespan_us);
}

// A trace reader takes nothing it would have to narrow or guess: a rank or op id past int is
// named, not wrapped onto rank 0 / op 0; a "ph" or "name" of another type is an error, not an
// internal one; a duration near DBL_MAX is refused before any database holds it.
TEST(FromTrace, RefusesWhatItWouldTruncate) {
  JobSpec spec;
  spec.model = "gpt-tiny";
  spec.plan = "dp=2";
  spec.scheduler = "fifo";
  spec.cluster = "commodity-4x8";
  Result<JobResult> job = RunJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().message();
  const ScheduledProgram& sp = job->run.scheduled;
  const Op& op = sp.program.graphs[0].ops.front();
  auto event = [&](nlohmann::json pid, nlohmann::json id, nlohmann::json name, nlohmann::json dur) {
    return nlohmann::json::array({{{"ph", "X"}, {"pid", pid}, {"name", name}, {"dur", dur}, {"args", {{"id", id}}}}})
        .dump();
  };
  auto error = [&](const std::string& trace) {
    Result<std::vector<TraceSample>> r = DurationsFromTrace(trace, "t.json", sp.program, job->cost->cluster());
    return r.ok() ? std::string("accepted") : r.status().message();
  };
  EXPECT_EQ(error(event(0, op.id, op.name, 5.0)), "accepted");
  EXPECT_NE(error(event(4294967296LL, op.id, op.name, 5.0)).find("rank 4294967296 is not in"), std::string::npos);
  EXPECT_NE(error(event(0, 4294967296LL + op.id, op.name, 5.0)).find("op id 4294967296"), std::string::npos)
      << error(event(0, 4294967296LL + op.id, op.name, 5.0));
  EXPECT_NE(error(event(0, op.id, 7, 5.0)).find("needs pid (the rank), name"), std::string::npos);
  EXPECT_NE(error(event(0, op.id, op.name, 1.7e308)).find("at most 1e12 us"), std::string::npos);
  nlohmann::json ph = nlohmann::json::parse(event(0, op.id, op.name, 5.0));
  ph[0]["ph"] = 3;  // not an op event: skipped, so no compute event is left
  EXPECT_NE(error(ph.dump()).find("no compute op events"), std::string::npos) << error(ph.dump());
}

// Three rounds' databases of one machine: the merged entry is the median of
// the rounds that hold it (matmul: 10, 14, 12 -> 12; add, held by two: (4 +
// 6) / 2 = 5), and the spread (max / min) is over entries every round holds
// (matmul 14 / 10 = 1.4 is the only one).
TEST(MergeProfiles, PerEntryMedianAndSpread) {
  ProfileDb a, b, c;
  a.Add("cpu-local", "matmul|f32|x", 10);
  b.Add("cpu-local", "matmul|f32|x", 14);
  c.Add("cpu-local", "matmul|f32|x", 12);
  a.Add("cpu-local", "add|f32|y", 4);
  c.Add("cpu-local", "add|f32|y", 6);
  b.Add("other", "matmul|f32|x", 99);
  const MergedProfile m = MergeProfiles({a, b, c});
  EXPECT_DOUBLE_EQ(m.db.Lookup("cpu-local", "matmul|f32|x"), 12);
  EXPECT_DOUBLE_EQ(m.db.Lookup("cpu-local", "add|f32|y"), 5);
  EXPECT_DOUBLE_EQ(m.db.Lookup("other", "matmul|f32|x"), 99);
  EXPECT_EQ(m.db.size(), 3u);
  EXPECT_EQ(m.entries_in_all, 1);
  EXPECT_DOUBLE_EQ(m.median_spread, 1.4);
  EXPECT_DOUBLE_EQ(m.max_spread, 1.4);
  EXPECT_EQ(m.max_spread_signature, "matmul|f32|x");
}

TEST(MergeProfiles, OneDatabaseIsItself) {
  ProfileDb a;
  a.Add("cpu-local", "k", 7);
  const MergedProfile m = MergeProfiles({a});
  EXPECT_DOUBLE_EQ(m.db.Lookup("cpu-local", "k"), 7);
  EXPECT_EQ(m.entries_in_all, 1);
  EXPECT_DOUBLE_EQ(m.max_spread, 1);
}

// A program's kernels timed once even when two programs share them.
TEST(ProfileKernels, SeenSignaturesAreSkipped) {
  Result<std::vector<Program>> programs = DefaultProfilePrograms();
  ASSERT_TRUE(programs.ok()) << programs.status().message();
  ClusterSpec shape;
  shape.name = shape.device.name = "cpu-local";
  shape.nodes = 1;
  shape.devices_per_node = 2;
  KernelProfileOptions quick;
  quick.min_time_s = 0;
  quick.min_reps = quick.max_reps = 1;
  std::set<std::string> seen;
  Result<std::vector<KernelSample>> first = ProfileKernels(programs->front(), shape, quick, &seen);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(seen.size(), first->size());
  Result<std::vector<KernelSample>> again = ProfileKernels(programs->front(), shape, quick, &seen);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

// Kernels timed in passes over the profile: each signature's median.
// Passes (us): a 100 / 300 / 110, b 10 / 10 / 40, c only in pass 2 (20).
// a: median 110; b: 10; c: 20 (one pass). Totals 110, 330, 150: spread 3.
// Two passes: the mean of the two (a 200).
TEST(MedianKernelPasses, PerSignatureMedianAndTheSpreadOfThePasses) {
  auto k = [](const std::string& sig, double us) { return KernelSample{sig, ComputeType::kMatmul, 0, 0, us, 3}; };
  const KernelPasses m = MedianKernelPasses({{k("a", 100), k("b", 10)},
                                             {k("a", 300), k("b", 10), k("c", 20)},
                                             {k("a", 110), k("b", 40)}});
  ASSERT_EQ(m.kernels.size(), 3u);
  EXPECT_EQ(m.kernels[0].signature, "a");
  EXPECT_DOUBLE_EQ(m.kernels[0].time_us, 110);
  EXPECT_EQ(m.kernels[0].reps, 9);
  EXPECT_DOUBLE_EQ(m.kernels[1].time_us, 10);
  EXPECT_EQ(m.kernels[2].signature, "c");
  EXPECT_DOUBLE_EQ(m.kernels[2].time_us, 20);
  EXPECT_EQ(m.pass_totals_us, (std::vector<double>{110, 330, 150}));
  EXPECT_DOUBLE_EQ(m.spread, 3);
  EXPECT_DOUBLE_EQ(MedianKernelPasses({{k("a", 100)}, {k("a", 300)}}).kernels[0].time_us, 200);
  EXPECT_DOUBLE_EQ(MedianKernelPasses({{k("a", 100)}}).spread, 1);
  EXPECT_TRUE(MedianKernelPasses({}).kernels.empty());
}

// The kernels are timed on values like a run's: libm's tanh and exp branch
// on sign and size, and gelu over the positive [0.01, 0.5) of the first fill
// ran 1.5x faster than over a run's activations (docs/results.md).
TEST(FillSynthetic, SignedUnitSpreadAndNonNegativeWhereTheKernelNeedsIt) {
  Tensor t;
  t.name = "x";
  t.shape = {4096};
  t.dtype = DType::kF32;
  std::vector<float> v(4096);
  FillSynthetic(t, 0, false, &v);
  double sum = 0, sq = 0;
  int negative = 0;
  for (float x : v) sum += x, sq += double(x) * x, negative += x < 0;
  const double mean = sum / v.size(), sd = std::sqrt(sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sd, 1.0, 0.05);
  EXPECT_GT(negative, 1800);  // about half
  EXPECT_LT(negative, 2300);

  std::vector<float> other(4096);
  FillSynthetic(t, 1, false, &other);
  double dot = 0;
  for (size_t i = 0; i < v.size(); ++i) dot += double(v[i]) * other[i];
  EXPECT_LT(std::fabs(dot / v.size()), 0.1);  // slots 0 and 1 uncorrelated (not the same values)

  std::vector<float> w(4096);
  FillSynthetic(t, 3, true, &w);
  for (float x : w) ASSERT_GE(x, 1.0f);

  Tensor ids = t;
  ids.dtype = DType::kI32;
  std::vector<float> z(4096, 7.0f);
  FillSynthetic(ids, 1, false, &z);
  for (float x : z) ASSERT_EQ(x, 0.0f);

  Op adam;
  adam.compute_type = ComputeType::kAdam;  // param, grad, m, v: v under a square root
  EXPECT_FALSE(NonNegativeInput(adam, 2));
  EXPECT_TRUE(NonNegativeInput(adam, 3));
  Op ce;
  ce.compute_type = ComputeType::kCrossEntropy;  // row max, sum of exponentials z (its log), target logit
  EXPECT_TRUE(NonNegativeInput(ce, 1));
  Op gelu;
  gelu.compute_type = ComputeType::kGelu;
  EXPECT_FALSE(NonNegativeInput(gelu, 0));
}

}  // namespace
}  // namespace concerto
