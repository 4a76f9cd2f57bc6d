// A thread per rank of a parallel engine (docs/parallel-engine.md), for the object's lifetime:
// run() gives every rank's thread the same work and returns once all of it has returned, with the
// first error. Ranks on devices of their own run at once. Ranks that take turns let one thread's
// worth of order drive ranks that each keep their own thread and call stack: only the rank
// holding the turn runs, rank 0 first; pass() hands the turn to the next rank (after the last,
// back to rank 0) and waits until it comes back; a rank whose work returns hands it on for good.
// Virtual ranks on one device take turns: each rank enqueues its kernels up to a collective,
// passes, and the last rank to arrive enqueues the collective over every rank's buffers on the
// stream they share, so that every rank's work before a collective precedes it and everything
// after follows it, captured graphs included. Every rank must pass the same number of times; a
// rank that fails ends the turns, and every pass() then returns its error. run() from one thread
// at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"

namespace hr::engine {

class RankThreads {
 public:
  // `size` threads, each first calling thread_start(rank) if given.
  RankThreads(int size, bool take_turns, std::function<void(int)> thread_start = nullptr);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;
  int size() const { return size_; }
  bool take_turns() const { return take_turns_; }
  // Runs work(rank) on every rank's thread (one at a time as the turn goes round, when taking
  // turns). Returns once every rank's work has returned.
  [[nodiscard]] Status run(const std::function<Status(int)>& work);
  // From rank `rank`'s work, while it holds the turn: hands the turn on and waits for it back.
  // An error unless taking turns.
  [[nodiscard]] Status pass(int rank);

 private:
  void loop(int rank, const std::function<void(int)>& thread_start);

  const int size_;
  const bool take_turns_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<Status(int)>* work_ = nullptr;  // the run in progress (guarded by mu_)
  uint64_t generation_ = 0;                           // runs started (guarded by mu_)
  int finished_ = 0;  // ranks whose work returned this run (guarded by mu_)
  int turn_ = 0;      // guarded by mu_
  bool failed_ = false;
  bool stop_ = false;
  Status error_ = Status::ok();
  std::vector<std::thread> threads_;
};

}  // namespace hr::engine
