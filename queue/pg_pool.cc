// A bounded, lazily opened Postgres connection pool with per-thread loans.
#include "queue/pg_pool.h"

#include <sys/socket.h>

#include <algorithm>
#include <optional>

#include "base/clock.h"
#include "base/log.h"
#include "queue/pg.h"

namespace hr::queue {
namespace {

// Connections the calling thread holds, from any pool: release() with none held (every piece of
// every streamed answer calls it) returns without taking the pool's lock.
thread_local int t_loans = 0;

}  // namespace

PgPool::PgPool(std::string url, int size, std::chrono::milliseconds wait)
    : url_(std::move(url)), size_(size < 1 ? 1 : size), wait_(wait) {}

PgPool::~PgPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

PgPool::Bound::Bound(PgPool* pool, std::chrono::milliseconds limit) : pool_(pool) {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  pool_->deadlines_[std::this_thread::get_id()] =
      steady_now_ns() + static_cast<int64_t>(limit.count()) * 1000000;
  if (!pool_->watchdog_.joinable()) pool_->watchdog_ = std::thread([p = pool_] { p->watch(); });
}

PgPool::Bound::~Bound() {
  std::lock_guard<std::mutex> lock(pool_->mu_);
  pool_->deadlines_.erase(std::this_thread::get_id());
  pool_->timed_out_.erase(std::this_thread::get_id());
}

bool PgPool::past_bound() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = deadlines_.find(std::this_thread::get_id());
  return it != deadlines_.end() && steady_now_ns() >= it->second;
}

void PgPool::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const int64_t now = steady_now_ns();
    for (const auto& [thread, deadline] : deadlines_) {
      if (deadline > now || timed_out_.count(thread) > 0) continue;
      auto it = lent_.find(thread);
      if (it == lent_.end() || !it->second) continue;
      timed_out_[thread] = true;
      // The thread is blocked reading this socket: shutting it down wakes it with an error (the
      // connection is then dropped and reopened by a later call).
      const int fd = it->second->sock();
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
      log::warn("db.call_timed_out", {{"over_ms", (now - deadline) / 1000000}});
    }
    watchdog_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_; });
  }
}

Result<pqxx::connection*> PgPool::connection() {
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock<std::mutex> lock(mu_);
  if (auto it = lent_.find(me); it != lent_.end()) {
    if (it->second->is_open()) return it->second.get();
    lent_.erase(it);  // closed under us: its place is taken again below
    --t_loans;
    cv_.notify_one();
  }
  const auto room = [&] {
    return !idle_.empty() || static_cast<int>(lent_.size()) + opening_ < size_;
  };
  if (!cv_.wait_for(lock, wait_, room)) {
    return Status(StatusCode::kResourceExhausted,
                  "all " + std::to_string(size_) + " database connections are busy; retry later");
  }
  while (!idle_.empty()) {
    std::unique_ptr<pqxx::connection> c = std::move(idle_.back());
    idle_.pop_back();
    if (!c->is_open()) continue;  // its place is free again; open a new one below
    pqxx::connection* raw = c.get();
    lent_[me] = std::move(c);
    ++t_loans;
    return raw;
  }
  ++opening_;
  int64_t deadline = 0;
  if (auto d = deadlines_.find(me); d != deadlines_.end()) deadline = d->second;
  lock.unlock();
  Result<std::unique_ptr<pqxx::connection>> opened =
      deadline != 0 ? open_by(deadline) : pg_connect(url_);
  lock.lock();
  --opening_;
  if (!opened.is_ok()) {
    cv_.notify_one();
    return opened.status();
  }
  pqxx::connection* raw = opened->get();
  lent_[me] = std::move(opened).value();
  ++t_loans;
  return raw;
}

Result<std::unique_ptr<pqxx::connection>> PgPool::open_by(int64_t deadline_ns) {
  // The connect runs on a thread of its own, which the caller stops waiting for at the deadline
  // (a frozen server holds a connect for connect_timeout, 2 s at least); it touches only the
  // shared state, so it may outlive the pool, and closes what it opened if nobody took it.
  struct Opening {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;
    std::optional<Result<std::unique_ptr<pqxx::connection>>> result;
  };
  auto state = std::make_shared<Opening>();
  std::thread([state, url = url_] {
    Result<std::unique_ptr<pqxx::connection>> r = pg_connect(url);
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->abandoned) return;  // r closes here
    state->result.emplace(std::move(r));
    state->done = true;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(state->mu);
  const int64_t left_ns = std::max<int64_t>(0, deadline_ns - steady_now_ns());
  if (!state->cv.wait_for(lock, std::chrono::nanoseconds(left_ns), [&] { return state->done; })) {
    state->abandoned = true;
    return Status(StatusCode::kUnavailable, "postgres did not answer in time (connecting)");
  }
  return std::move(*state->result);
}

void PgPool::release() {
  if (t_loans == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = lent_.find(std::this_thread::get_id());
  if (it == lent_.end()) return;
  if (it->second->is_open()) idle_.push_back(std::move(it->second));
  lent_.erase(it);
  --t_loans;
  cv_.notify_one();
}

void PgPool::drop() {
  if (t_loans == 0) return;
  std::unique_ptr<pqxx::connection> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = lent_.find(std::this_thread::get_id());
    if (it == lent_.end()) return;
    closing = std::move(it->second);
    lent_.erase(it);
    --t_loans;
    cv_.notify_one();
  }
  closing.reset();  // outside the lock: closing talks to the server
}

int PgPool::lent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(lent_.size());
}

int PgPool::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(lent_.size() + idle_.size());
}

Status PgPool::client_status(const Status& failure) {
  log::warn("api.db_error", {{"error", failure}});
  if (failure.code() != StatusCode::kUnavailable) return failure;
  drop();
  return Status(StatusCode::kUnavailable, "the database is unavailable; retry later");
}

}  // namespace hr::queue
