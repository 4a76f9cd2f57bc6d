// A small fork-join pool for the CPU backend's per-token loops. Workers sleep on a condition
// variable between jobs (no spinning, so they never steal cycles from BLAS or the caller).
// parallel_for() is called by one thread at a time.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hr::engine {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // including the calling thread
  ~ThreadPool();

  // Runs fn(i) for i in [0, n), split in contiguous chunks over the pool; inline when n < min_n.
  void parallel_for(int n, int min_n, const std::function<void(int begin, int end)>& fn);
  int size() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void worker(int index);

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // Guarded by mu_.
  const std::function<void(int, int)>* job_ = nullptr;
  int job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace hr::engine
