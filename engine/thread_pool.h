// A small fork-join pool for the CPU backend's per-token loops. A job is cut into contiguous chunks
// that the caller and the workers claim one at a time, so a worker that is slow to wake (or was
// preempted: other processes share the cores) never holds the caller up: it finds the work done.
// Between jobs workers spin briefly (a decode step issues dozens of short jobs back to back, and
// waking a sleeping thread costs 5-50 us), then sleep on a condition variable.
// parallel_for() is called by one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hr::engine {

class ThreadPool {
 public:
  // num_threads includes the calling thread; the others run at `nice` (base/priority.h).
  explicit ThreadPool(int num_threads, int nice = 0);
  ~ThreadPool();

  // Runs fn(begin, end) over [0, n) in contiguous chunks on whichever threads claim them, the
  // caller included; inline when n < min_n. Returns when every chunk has run.
  void parallel_for(int n, int min_n, const std::function<void(int begin, int end)>& fn);
  int size() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void worker();
  // Claims and runs chunks of job `epoch` until none is left unclaimed.
  void run_chunks(uint64_t epoch);

  // The current job. Written by the caller before it publishes epoch_ (release); a worker reads
  // them after seeing the epoch and only uses them once it has claimed a chunk of that epoch.
  std::atomic<const std::function<void(int, int)>*> job_{nullptr};
  std::atomic<int> job_n_{0};
  std::atomic<int> job_grain_{0};   // smallest chunk
  std::atomic<uint64_t> epoch_{0};  // number of the current job
  std::atomic<uint64_t> next_{0};   // epoch << 32 | first index not yet claimed
  std::atomic<int> done_{0};        // indices of the current job that have run
  std::atomic<bool> stop_{false};   // set under mu_

  std::mutex mu_;
  std::condition_variable start_cv_;
  int num_sleeping_ = 0;  // guarded by mu_

  std::vector<std::thread> workers_;
};

}  // namespace hr::engine
