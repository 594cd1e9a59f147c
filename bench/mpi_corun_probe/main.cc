// concerto_corun_probe: when does an all_reduce issued beside compute end?
//
// Every rank issues one all_reduce through the runtime's own MpiCommunicator
// (so it is started and polled exactly as a run's stream thread does it) on
// a second thread, while its main thread computes for C ms (a multiply-add
// loop over 256 KiB, in cache). Per message size and C, rank 0 prints the
// median over 7 repetitions of the all_reduce's end on its slowest rank (ms
// after its issue; the rank that only hands its bytes to the socket ends
// earlier) and of that end minus the compute's end. Between repetitions the ranks sleep
// 30 ms (a shaped link's token bucket refills, as between a run's messages).
// scripts/corun_probe.sh runs it on the testbed's shaped loopback; the
// figures are in docs/results.md ("Kernels timed on a run's values").
//
// usage: mpirun -n 2 concerto_corun_probe [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "concerto/runtime/mpi_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

volatile float g_sink;

/// Multiply-adds over an in-cache array for `ms` milliseconds.
void ComputeFor(double ms) {
  std::vector<float> a(1 << 16, 1.0f);
  const auto t0 = Clock::now();
  float s = 0;
  while (MsBetween(t0, Clock::now()) < ms)
    for (int r = 0; r < 8; ++r)
      for (float x : a) s += x * 1.0001f;
  g_sink = s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

/// Runs the probe; an error names the failing call.
concerto::Status Probe(concerto::MpiCommunicator& comm, bool json) {
  using concerto::ReduceOp;
  using concerto::Status;
  std::vector<int> world(comm.size());
  for (int r = 0; r < comm.size(); ++r) world[r] = r;
  CONCERTO_RETURN_IF_ERROR(comm.CreateGroups({world}));
  float token = 0;
  auto barrier = [&] { return comm.AllReduce(world, ReduceOp::kSum, &token, &token, 1); };
  const bool print = comm.rank() == 0;
  const std::vector<int> sizes_bytes = {2048, 65536, 524288, 4194304};
  const std::vector<double> computes_ms = {0, 5, 10, 20, 40};
  constexpr int kReps = 7;
  if (print && json) std::printf("{\"ranks\": %d, \"rows\": [", comm.size());
  bool first = true;
  for (int bytes : sizes_bytes) {
    std::vector<float> send(bytes / 4, 1.0f), recv(bytes / 4);
    for (double compute_ms : computes_ms) {
      std::vector<double> ends, after;
      for (int rep = 0; rep < kReps; ++rep) {
        CONCERTO_RETURN_IF_ERROR(barrier());
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        CONCERTO_RETURN_IF_ERROR(barrier());
        const auto t0 = Clock::now();
        Clock::time_point comm_end;
        Status comm_status = Status::Ok();
        std::thread comm_thread([&] {
          comm_status = comm.AllReduce(world, ReduceOp::kSum, send.data(), recv.data(), bytes / 4);
          comm_end = Clock::now();
        });
        ComputeFor(compute_ms);
        const auto compute_end = Clock::now();
        comm_thread.join();
        CONCERTO_RETURN_IF_ERROR(comm_status);
        float slowest[2] = {static_cast<float>(MsBetween(t0, comm_end)),
                            static_cast<float>(MsBetween(compute_end, comm_end))};
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, slowest, slowest, 2));
        ends.push_back(slowest[0]);
        after.push_back(slowest[1]);
      }
      if (!print) continue;
      if (json) {
        std::printf("%s\n {\"bytes\": %d, \"compute_ms\": %.1f, \"end_ms\": %.3f, \"end_after_compute_ms\": %.3f}",
                    first ? "" : ",", bytes, compute_ms, Median(ends), Median(after));
      } else {
        std::printf("bytes %8d  compute %5.1f ms  all_reduce ends at %8.2f ms  (%+8.2f ms after the compute)\n",
                    bytes, compute_ms, Median(ends), Median(after));
      }
      first = false;
      std::fflush(stdout);
    }
  }
  if (print && json) std::printf("\n], \"gaps\": [");
  // The same all_reduce with nothing beside it, after the link and both
  // ranks idled for G ms (0: right after the barrier): what the price of an
  // isolated message owes to the idle time before it.
  first = true;
  for (int bytes : {65536, 524288, 4194304}) {
    std::vector<float> send(bytes / 4, 1.0f), recv(bytes / 4);
    for (int gap_ms : {0, 1, 2, 5, 10, 30}) {
      std::vector<double> ends;
      for (int rep = 0; rep < kReps; ++rep) {
        CONCERTO_RETURN_IF_ERROR(barrier());
        if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        const auto t0 = Clock::now();
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kSum, send.data(), recv.data(), bytes / 4));
        float slowest = static_cast<float>(MsBetween(t0, Clock::now()));
        CONCERTO_RETURN_IF_ERROR(comm.AllReduce(world, ReduceOp::kMax, &slowest, &slowest, 1));
        ends.push_back(slowest);
      }
      if (!print) continue;
      if (json) {
        std::printf("%s\n {\"bytes\": %d, \"gap_ms\": %d, \"end_ms\": %.3f}", first ? "" : ",", bytes, gap_ms,
                    Median(ends));
      } else {
        std::printf("bytes %8d  after %2d ms idle: all_reduce takes %8.2f ms\n", bytes, gap_ms, Median(ends));
      }
      first = false;
      std::fflush(stdout);
    }
  }
  if (print && json) std::printf("\n]}\n");
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  auto comm = concerto::MpiCommunicator::Create(&argc, &argv);
  if (!comm.ok()) {
    std::fprintf(stderr, "concerto_corun_probe: %s\n", comm.status().message().c_str());
    return 2;
  }
  if ((*comm)->size() < 2) {
    std::fprintf(stderr, "concerto_corun_probe: needs 2 or more ranks (mpirun -n 2)\n");
    return 2;
  }
  if (concerto::Status s = Probe(**comm, json); !s.ok()) {
    std::fprintf(stderr, "concerto_corun_probe: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
