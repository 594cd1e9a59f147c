// concerto_corun_probe: when does an all_reduce issued beside compute end?
//
// Every rank issues one MPI_Iallreduce on a second thread, polled the way
// the runtime's MpiCommunicator::Wait polls (MPI_Test, yield for 200 spins,
// then sleep 20 us), while its main thread computes for C ms (a multiply-add
// loop over 256 KiB, in cache). Per message size and C, rank 0 prints the
// median over 7 repetitions of the all_reduce's end (ms after its issue) and
// of its end minus the compute's end. Between repetitions the ranks sleep
// 30 ms (a shaped link's token bucket refills, as between a run's messages).
// scripts/corun_probe.sh runs it on the testbed's shaped loopback; the
// figures are in docs/results.md ("Kernels timed on a run's values").
//
// usage: mpirun -n 2 concerto_corun_probe [--json]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

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

/// Polls `req` as MpiCommunicator::Wait does.
void Wait(MPI_Request* req) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spins < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 2000 ? 20 : 200));
    }
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < MPI_THREAD_MULTIPLE || size < 2) {
    if (rank == 0) std::fprintf(stderr, "concerto_corun_probe: needs 2+ ranks and MPI_THREAD_MULTIPLE\n");
    MPI_Finalize();
    return 2;
  }
  const std::vector<int> sizes_bytes = {2048, 65536, 524288, 4194304};
  const std::vector<double> computes_ms = {0, 5, 10, 20, 40};
  constexpr int kReps = 7;
  if (rank == 0 && json) std::printf("{\"ranks\": %d, \"rows\": [", size);
  bool first = true;
  for (int bytes : sizes_bytes) {
    std::vector<float> send(bytes / 4, 1.0f), recv(bytes / 4);
    for (double compute_ms : computes_ms) {
      std::vector<double> ends, after;
      for (int rep = 0; rep < kReps; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = Clock::now();
        Clock::time_point comm_end;
        std::thread comm([&] {
          MPI_Request req;
          MPI_Iallreduce(send.data(), recv.data(), bytes / 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
          Wait(&req);
          comm_end = Clock::now();
        });
        ComputeFor(compute_ms);
        const auto compute_end = Clock::now();
        comm.join();
        ends.push_back(MsBetween(t0, comm_end));
        after.push_back(MsBetween(compute_end, comm_end));
      }
      if (rank != 0) continue;
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
  if (rank == 0 && json) std::printf("\n]}\n");
  MPI_Finalize();
  return 0;
}
