// Fork-join pool with guided self-scheduling: each claim takes 1/(2 * threads) of what is left
// (at least a grain of n / (8 * threads)), so big chunks come first and the last ones are small
// enough that no thread waits long for another to finish.
#include "engine/thread_pool.h"

#include "base/priority.h"

#include <algorithm>
#include <chrono>

namespace hr::engine {
namespace {

using Clock = std::chrono::steady_clock;

// How long a worker spins for the next job before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

constexpr uint64_t kIndexMask = 0xffffffffu;

}  // namespace

ThreadPool::ThreadPool(int num_threads, int nice) {
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, nice] {
      lower_thread_priority(nice);
      worker();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_relaxed);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t epoch = epoch_.load(std::memory_order_acquire);
    if (epoch == seen) {
      Clock::time_point deadline = Clock::now() + kSpin;
      for (int i = 1; epoch == seen && !stop_.load(std::memory_order_relaxed); ++i) {
        cpu_relax();
        if (i % 64 == 0 && Clock::now() > deadline) break;
        epoch = epoch_.load(std::memory_order_acquire);
      }
    }
    if (epoch == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      ++num_sleeping_;
      start_cv_.wait(lock, [&] {
        return stop_.load(std::memory_order_relaxed) ||
               epoch_.load(std::memory_order_acquire) != seen;
      });
      --num_sleeping_;
      epoch = epoch_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = epoch;
    run_chunks(epoch);
  }
}

void ThreadPool::run_chunks(uint64_t epoch) {
  // The job's fields as of `epoch` (or later). A claim succeeds only while `epoch` is current and
  // unfinished, and then they are that job's: the caller moves next_ to the following epoch before
  // it rewrites them (so a field read here that belongs to a later job comes with a next_ of a
  // later epoch, and no claim), and it does so only after every claimed chunk has reported done.
  const std::function<void(int, int)>* fn = job_.load(std::memory_order_acquire);
  const int n = job_n_.load(std::memory_order_acquire);
  const int grain = job_grain_.load(std::memory_order_acquire);
  const int share = 2 * size();
  uint64_t cur = next_.load(std::memory_order_acquire);
  for (;;) {
    if ((cur >> 32) != epoch) return;
    int begin = static_cast<int>(cur & kIndexMask);
    if (begin >= n) return;
    int end = begin + std::max(grain, (n - begin + share - 1) / share);
    end = std::min(end, n);
    if (!next_.compare_exchange_weak(cur, (epoch << 32) | static_cast<uint64_t>(end),
                                     std::memory_order_acq_rel, std::memory_order_acquire)) {
      continue;
    }
    (*fn)(begin, end);
    done_.fetch_add(end - begin, std::memory_order_release);
    cur = next_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int n, int min_n, const std::function<void(int, int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n < min_n) {
    fn(0, n);
    return;
  }
  const uint64_t epoch = epoch_.load(std::memory_order_relaxed) + 1;
  // First close the last job to late claimers: a worker that read the last epoch but reads the
  // fields below must not claim indices of this job under the last one's epoch (it would run them
  // twice, and its count in done_ would let this call return early).
  next_.store(epoch << 32, std::memory_order_seq_cst);
  job_.store(&fn, std::memory_order_release);
  job_n_.store(n, std::memory_order_release);
  job_grain_.store(std::max(1, n / (8 * size())), std::memory_order_release);
  done_.store(0, std::memory_order_release);
  epoch_.store(epoch, std::memory_order_release);
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake = num_sleeping_ > 0;
  }
  if (wake) start_cv_.notify_all();
  run_chunks(epoch);
  // Every chunk is claimed; wait for the ones other threads are running.
  for (int i = 0; done_.load(std::memory_order_acquire) < n; ++i) {
    if (i < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace hr::engine
