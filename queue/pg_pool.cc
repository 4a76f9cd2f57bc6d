// A bounded, lazily opened Postgres connection pool with per-thread loans.
#include "queue/pg_pool.h"

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
  lock.unlock();
  Result<std::unique_ptr<pqxx::connection>> opened = pg_connect(url_);
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
