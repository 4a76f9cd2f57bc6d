// The worker's queue traffic on its own thread, so that Postgres and Redis round trips never sit
// between two engine steps: pulling leases for the credits the step loop grants, recording
// completions and failures in batches, renewing the leases of running requests, and handing back
// what the worker will not finish.
//
// The step loop talks to it without blocking on I/O: want() says how many new requests it has
// room for, take_pulled() collects what arrived, complete()/fail() queue results, hold()/drop()
// maintain the set of leases to renew, take_lost() reports leases that were taken over.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/retry_pacer.h"
#include "queue/config.h"
#include "queue/lease.h"
#include "workers/worker_config.h"

namespace hr::workers {

struct WorkerStats;

class QueueIo {
 public:
  // `wake` is called (from the I/O thread) when pulled leases or lost leases are ready.
  QueueIo(const WorkerConfig& config, const queue::StoreConfig& store, WorkerStats& stats,
          std::function<void()> wake);
  ~QueueIo();
  void start();
  // Records every queued result, releases `unfinished` and the pulled leases nobody took, then
  // stops the thread.
  void stop(const std::vector<queue::Lease>& unfinished);
  // The step loop is stuck (workers/step_watchdog.h), from another thread: every held lease is
  // recorded as a retryable failure saying `message`, the pulled leases nobody took are handed
  // back, and no more are pulled, so that the queue gives the work to other workers at once.
  // Returns once the I/O thread has written them, or after `wait_ms` (Postgres failing: their
  // leases expire instead). stop() still hands back what it is given.
  void abandon(const std::string& message, int wait_ms);

  // The step loop has room for `n` more requests (the latest call wins; 0: none).
  void want(int n);
  // The step loop has room for `n` more catch-up requests (queue/stream.h: started at once,
  // preempting other queued work), whatever its headroom; looked for about every catch_up_poll_ms.
  void want_catch_up(int n);
  // Requests pulled or being pulled that the step loop has not taken yet (catch-up ones only once
  // they arrived); and catch-up ones, pulled or being pulled.
  int in_transit() const;
  int catch_up_in_transit() const;
  std::vector<queue::Lease> take_pulled();
  // Leases the step loop will not start (it is stopping): handed back to the queue at once.
  void release(std::vector<queue::Lease> leases);
  // A request's result, written with the next flush (dropped once abandoned: its lease went
  // back as a failure).
  void complete(queue::Completion c);
  void fail(queue::Failure f);
  // Leases to keep renewed while their requests run, keyed by engine id.
  void hold(int64_t id, const queue::Lease& lease);
  void drop(int64_t id);
  // Engine ids whose leases were lost (taken over or ended): stop working on them.
  std::vector<int64_t> take_lost();
  bool connected() const;

 private:
  void loop();
  void flush(queue::LeaseClient& leases, std::unique_lock<std::mutex>& lock);

  WorkerConfig config_;
  queue::StoreConfig store_;
  WorkerStats& stats_;
  std::function<void()> wake_;
  std::mutex stop_mu_;  // stop() may be called twice (the step loop, the destructor): one joins
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                               // guarded by mu_
  int want_ = 0;                                    // guarded by mu_
  int pulling_ = 0;                                 // guarded by mu_
  int want_catch_up_ = 0;                           // guarded by mu_
  int pulling_catch_up_ = 0;                        // guarded by mu_
  bool connected_ = false;                          // guarded by mu_
  std::vector<queue::Lease> pulled_;                // guarded by mu_
  std::vector<queue::Completion> done_;             // guarded by mu_
  std::vector<queue::Failure> failed_;              // guarded by mu_
  std::unordered_map<int64_t, queue::Lease> held_;  // guarded by mu_
  std::vector<int64_t> lost_;                       // guarded by mu_
  std::vector<queue::Lease> to_release_;            // guarded by mu_
  bool abandoned_ = false;                          // guarded by mu_: abandon() was called
  bool handed_back_ = false;  // guarded by mu_: ... and what it queued is written
  bool exited_ = false;       // guarded by mu_: the thread's loop has ended
  std::condition_variable handed_back_cv_;
  // While Postgres or Redis fail: each kind of call backs off on its own (only the I/O thread
  // uses these), and results are written again no sooner than next_flush_ns_.
  RetryPacer connect_pacer_, write_pacer_, pull_pacer_, renew_pacer_;
  int64_t next_flush_ns_ = 0;  // guarded by mu_
  // Pulls take turns with nothing found; only the I/O thread uses these.
  int64_t next_pull_ns_ = 0, next_catch_up_pull_ns_ = 0;
  std::thread thread_;
};

}  // namespace hr::workers
