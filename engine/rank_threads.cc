// A thread per rank: one mutex, one condition, and the rank whose turn it is when taking turns.
#include "engine/rank_threads.h"

#include <string>

namespace hr::engine {

RankThreads::RankThreads(int size, bool take_turns, std::function<void(int)> thread_start)
    : size_(size), take_turns_(take_turns) {
  threads_.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads_.emplace_back([this, r, thread_start] { loop(r, thread_start); });
  }
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::loop(int rank, const std::function<void(int)>& thread_start) {
  if (thread_start) thread_start(rank);
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (take_turns_) cv_.wait(lock, [&] { return turn_ == rank || failed_; });
    if (!failed_) {
      const std::function<Status(int)>& work = *work_;
      lock.unlock();
      Status st = work(rank);
      lock.lock();
      if (!st.is_ok() && !failed_) {
        failed_ = true;
        error_ = std::move(st);
      }
    }
    turn_ = rank + 1;
    ++finished_;
    cv_.notify_all();
  }
}

Status RankThreads::run(const std::function<Status(int)>& work) {
  std::unique_lock<std::mutex> lock(mu_);
  work_ = &work;
  turn_ = 0;
  finished_ = 0;
  failed_ = false;
  error_ = Status::ok();
  ++generation_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return finished_ == size_; });
  work_ = nullptr;
  return failed_ ? error_ : Status::ok();
}

Status RankThreads::pass(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!take_turns_) return internal_error("these ranks run at once: they take no turns");
  if (failed_) return error_;
  if (turn_ != rank) return internal_error("rank " + std::to_string(rank) + " passed out of turn");
  turn_ = (rank + 1) % size_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return turn_ == rank || failed_; });
  return failed_ ? error_ : Status::ok();
}

}  // namespace hr::engine
