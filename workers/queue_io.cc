// The worker's queue I/O thread.
#include "workers/queue_io.h"

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/log.h"
#include "workers/worker.h"

namespace hr::workers {

QueueIo::QueueIo(const WorkerConfig& config, const queue::StoreConfig& store, WorkerStats& stats,
                 std::function<void()> wake)
    : config_(config), store_(store), stats_(stats), wake_(std::move(wake)) {}

QueueIo::~QueueIo() { stop({}); }

void QueueIo::start() {
  thread_ = std::thread([this] { loop(); });
}

void QueueIo::stop(const std::vector<queue::Lease>& unfinished) {
  std::lock_guard<std::mutex> stopping(stop_mu_);
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    to_release_.insert(to_release_.end(), unfinished.begin(), unfinished.end());
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void QueueIo::abandon(const std::string& message, int wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  for (const auto& [id, lease] : held_)
    failed_.push_back({lease, "inference_error", message, true});
  held_.clear();
  to_release_.insert(to_release_.end(), pulled_.begin(), pulled_.end());
  pulled_.clear();
  want_ = 0;
  want_catch_up_ = 0;
  abandoned_ = true;
  next_flush_ns_ = 0;
  cv_.notify_all();
  handed_back_cv_.wait_for(lock, std::chrono::milliseconds(wait_ms),
                           [&] { return handed_back_ || exited_; });
}

void QueueIo::want(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_) return;
  if (n == want_) return;
  want_ = n;
  if (n > 0) cv_.notify_all();
}

void QueueIo::want_catch_up(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_) return;
  if (n == want_catch_up_) return;
  want_catch_up_ = n;
  if (n > 0) cv_.notify_all();
}

int QueueIo::in_transit() const {
  std::lock_guard<std::mutex> lock(mu_);
  // (A catch-up pull asks for all the room it may take, not what it will find: not counted.)
  return pulling_ + static_cast<int>(pulled_.size());
}

int QueueIo::catch_up_in_transit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pulling_catch_up_ +
         static_cast<int>(std::count_if(pulled_.begin(), pulled_.end(),
                                        [](const queue::Lease& l) { return l.catch_up; }));
}

std::vector<queue::Lease> QueueIo::take_pulled() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<queue::Lease> out;
  out.swap(pulled_);
  return out;
}

void QueueIo::complete(queue::Completion c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // (Abandoned: every lease held went back as a failure, and a step the abort ended part-way
    // may still answer; its answer is not written.)
    if (abandoned_) return;
    done_.push_back(std::move(c));
  }
  cv_.notify_all();
}

void QueueIo::release(std::vector<queue::Lease> leases) {
  if (leases.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    to_release_.insert(to_release_.end(), std::make_move_iterator(leases.begin()),
                       std::make_move_iterator(leases.end()));
  }
  cv_.notify_all();
}

void QueueIo::fail(queue::Failure f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_.push_back(std::move(f));
  }
  cv_.notify_all();
}

void QueueIo::hold(int64_t id, const queue::Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  held_[id] = lease;
}

void QueueIo::drop(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.erase(id);
}

std::vector<int64_t> QueueIo::take_lost() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  out.swap(lost_);
  return out;
}

bool QueueIo::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connected_;
}

namespace {

// Writes the items queued in `queued` with `write` (called with `lock` held; unlocks around the
// I/O) and counts them in `recorded`; after a failed write they stay queued, in order, for the
// next try, and the error is returned.
template <typename Item, typename Write>
Status write_queued(std::vector<Item>& queued, std::atomic<int64_t>& recorded, Write write,
                    std::unique_lock<std::mutex>& lock) {
  if (queued.empty()) return Status::ok();
  std::vector<Item> batch;
  batch.swap(queued);
  lock.unlock();
  auto r = write(batch);
  lock.lock();
  if (r.is_ok()) {
    recorded += static_cast<int64_t>(batch.size());
    return Status::ok();
  }
  queued.insert(queued.begin(), std::make_move_iterator(batch.begin()),
                std::make_move_iterator(batch.end()));
  return r.status();
}

int64_t ms_to_ns(int64_t ms) { return ms * 1000000; }

}  // namespace

void QueueIo::flush(queue::LeaseClient& leases, std::unique_lock<std::mutex>& lock) {
  if (done_.empty() && failed_.empty()) return;
  if (steady_now_ns() < next_flush_ns_) return;  // backing off
  Status st = write_queued(
      done_, stats_.completed,
      [&](const std::vector<queue::Completion>& b) { return leases.complete(b); }, lock);
  const char* event = "worker.complete_failed";
  if (st.is_ok()) {
    st = write_queued(
        failed_, stats_.failed,
        [&](const std::vector<queue::Failure>& b) { return leases.fail(b); }, lock);
    event = "worker.fail_failed";
  }
  if (st.is_ok()) {
    write_pacer_.succeeded();
    next_flush_ns_ = 0;
  } else {
    next_flush_ns_ = steady_now_ns() + ms_to_ns(write_pacer_.failed(event, st));
  }
}

void QueueIo::loop() {
  std::unique_ptr<queue::LeaseClient> leases;
  const int64_t renew_every_ns = int64_t{config_.lease_seconds} * 1000000000 / 3;
  const int64_t poll_ns = int64_t{config_.idle_poll_ms} * 1000000;
  const int64_t catch_up_poll_ns = int64_t{config_.catch_up_poll_ms} * 1000000;
  int64_t last_renew = steady_now_ns();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!leases) {
      lock.unlock();
      queue::LeaseOptions lo{config_.model_name, config_.worker_name, config_.lease_seconds * 1000,
                             config_.max_attempts};
      auto c = queue::LeaseClient::create(store_.database_url, store_.redis_url, lo);
      lock.lock();
      if (!c.is_ok()) {
        const int64_t delay = connect_pacer_.failed("worker.queue_unavailable", c.status());
        if (stop_) break;
        cv_.wait_for(lock, std::chrono::milliseconds(delay), [&] { return stop_; });
        continue;
      }
      connect_pacer_.succeeded();
      leases = std::move(c).value();
      connected_ = true;
    }
    flush(*leases, lock);
    if (stop_) break;
    if (!to_release_.empty()) {
      std::vector<queue::Lease> rest;
      rest.swap(to_release_);
      lock.unlock();
      auto released = leases->release(rest);
      lock.lock();
      // (Not released: their leases expire, and the requests run elsewhere then.)
      if (released.is_ok()) stats_.released += static_cast<int64_t>(rest.size());
    }
    if (abandoned_ && !handed_back_ && failed_.empty() && to_release_.empty()) {
      handed_back_ = true;
      handed_back_cv_.notify_all();
    }
    bool woke_step_loop = false;
    int64_t now = steady_now_ns();
    // Catch-up first: it is started at once, the rest only into headroom.
    for (bool catch_up : {true, false}) {
      int& want = catch_up ? want_catch_up_ : want_;
      int& pulling = catch_up ? pulling_catch_up_ : pulling_;
      int64_t& next_pull = catch_up ? next_catch_up_pull_ns_ : next_pull_ns_;
      if (want <= 0 || now < next_pull) continue;
      const int n = want;
      want = 0;
      pulling = n;
      lock.unlock();
      auto got = catch_up ? leases->pull_catch_up(n) : leases->pull(n, 0);
      lock.lock();
      pulling = 0;
      if (!got.is_ok()) {
        next_pull =
            steady_now_ns() + ms_to_ns(pull_pacer_.failed("worker.pull_failed", got.status()));
      } else if (got->empty()) {
        pull_pacer_.succeeded();
        // Nothing queued: look again in a while.
        next_pull = steady_now_ns() + (catch_up ? catch_up_poll_ns : poll_ns);
      } else {
        pull_pacer_.succeeded();
        next_pull = 0;
        stats_.pulled += static_cast<int64_t>(got->size());
        if (catch_up) stats_.caught_up += static_cast<int64_t>(got->size());
        // (Pulled for a step loop since found stuck: handed back at once.)
        auto& into = abandoned_ ? to_release_ : pulled_;
        into.insert(into.end(), std::make_move_iterator(got->begin()),
                    std::make_move_iterator(got->end()));
        woke_step_loop = !abandoned_;
      }
    }
    // The renewal's schedule runs whether or not a lease is held: with none, a renewal left due
    // would make the wait below end at once, every time (a busy loop while idle).
    if (now - last_renew > renew_every_ns && held_.empty()) last_renew = now;
    if (now - last_renew > renew_every_ns) {
      std::vector<int64_t> ids;
      std::vector<queue::Lease> snapshot;
      for (const auto& [id, l] : held_) {
        ids.push_back(id);
        snapshot.push_back(l);
      }
      lock.unlock();
      auto lost = leases->renew(snapshot);
      lock.lock();
      if (lost.is_ok()) {
        for (const queue::RequestRef& ref : *lost) {
          for (size_t i = 0; i < snapshot.size(); ++i) {
            if (snapshot[i].ref == ref) {
              lost_.push_back(ids[i]);
              held_.erase(ids[i]);
            }
          }
        }
        woke_step_loop = woke_step_loop || !lost->empty();
        renew_pacer_.succeeded();
      } else {
        // (Renewals keep their schedule, a third of the lease: only the warnings are paced.)
        (void)renew_pacer_.failed("worker.renew_failed", lost.status());
      }
      last_renew = now;
    }
    if (woke_step_loop) {
      lock.unlock();
      wake_();
      lock.lock();
    }
    // Sleep until there are results to record, a pull is due, or the renewal is.
    now = steady_now_ns();
    int64_t until = last_renew + renew_every_ns;
    if (want_ > 0) until = std::min(until, std::max(next_pull_ns_, now));
    if (want_catch_up_ > 0) until = std::min(until, std::max(next_catch_up_pull_ns_, now));
    const bool results_waiting = !done_.empty() || !failed_.empty();
    if (results_waiting) until = std::min(until, std::max(next_flush_ns_, now));
    until = std::min(until, now + poll_ns);
    cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(0, until - now)), [&] {
      const int64_t t = steady_now_ns();
      return stop_ || !to_release_.empty() ||
             ((!done_.empty() || !failed_.empty()) && t >= next_flush_ns_) ||
             (want_ > 0 && t >= next_pull_ns_) ||
             (want_catch_up_ > 0 && t >= next_catch_up_pull_ns_);
    });
  }
  // Stopping: record what finished (one more try), hand back the rest.
  if (leases) {
    next_flush_ns_ = 0;
    flush(*leases, lock);
    std::vector<queue::Lease> rest = std::move(to_release_);
    rest.insert(rest.end(), std::make_move_iterator(pulled_.begin()),
                std::make_move_iterator(pulled_.end()));
    pulled_.clear();
    if (!done_.empty() || !failed_.empty()) {
      log::warn("worker.results_unrecorded",
                {{"completions", static_cast<int64_t>(done_.size())},
                 {"failures", static_cast<int64_t>(failed_.size())},
                 {"note", "their leases expire and the requests run again"}});
    }
    lock.unlock();
    if (!rest.empty() && leases->release(rest).is_ok()) {
      stats_.released += static_cast<int64_t>(rest.size());
    }
    lock.lock();
  }
  exited_ = true;
  handed_back_cv_.notify_all();
}

}  // namespace hr::workers
