// Remote window workers in one process: each worker is a thread running
// ServeWindowBatches with a solver of its own, connected to the scheduler's
// side by two message queues (the fake of the MPI link).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "concerto/schedule/window_batch.h"

namespace concerto::testing {

/// A blocking queue of messages.
class MessageQueue {
 public:
  void Push(std::string m) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(m));
    }
    cv_.notify_one();
  }
  std::string Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !q_.empty(); });
    std::string m = std::move(q_.front());
    q_.pop_front();
    return m;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> q_;
};

/// `n` workers on threads; Shutdown (the DistributedBatchSolver's) ends them
/// and the destructor joins them. `served` counts the batches each answered.
class FakeWindowWorkers : public WindowWorkerLink {
 public:
  explicit FakeWindowWorkers(int n) : to_(n), from_(n), served_(n, 0) {
    for (int w = 0; w < n; ++w)
      threads_.emplace_back([this, w] {
        std::unique_ptr<WindowSolver> solver = MakeWindowSolver("gecode").value();
        (void)ServeWindowBatches([&] { return Result<std::string>(to_[w].Pop()); },
                                       [&](const std::string& m) {
                                         served_[w]++;
                                         from_[w].Push(m);
                                         return Status::Ok();
                                       },
                                       *solver);
      });
  }
  ~FakeWindowWorkers() override {
    for (std::thread& t : threads_) t.join();
  }
  int workers() const override { return static_cast<int>(to_.size()); }
  Status Send(int worker, const std::string& bytes) override {
    to_[worker - 1].Push(bytes);
    return Status::Ok();
  }
  Result<std::string> Receive(int worker) override { return from_[worker - 1].Pop(); }
  int served(int worker) const { return served_[worker - 1]; }

 private:
  std::vector<MessageQueue> to_, from_;
  std::vector<int> served_;
  std::vector<std::thread> threads_;
};

}  // namespace concerto::testing
