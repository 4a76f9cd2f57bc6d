// The pool of open connections from the API to its workers.
#include "api/worker_connections.h"

#include "api/internal/worker_call.h"
#include "base/log.h"

namespace hr::api {

WorkerConnections::WorkerConnections(const RouterOptions& options)
    : options_(options), sweeper_([this] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; })) {
          lock.unlock();
          sweep();
          lock.lock();
        }
      }) {}

WorkerConnections::~WorkerConnections() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  sweeper_.join();
  idle_connections().add(-static_cast<double>(idle()));
}

void WorkerConnections::sweep() {
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = idle_.begin(); it != idle_.end();) {
    std::vector<std::unique_ptr<WorkerConnection>>& v = it->second;
    for (auto& c : v) {
      if (now - c->idle_since_ns >= keep_ns || !still_open(*c)) closed.push_back(std::move(c));
    }
    v.erase(std::remove(v.begin(), v.end(), nullptr), v.end());
    it = v.empty() ? idle_.erase(it) : std::next(it);
  }
  idle_connections().add(-static_cast<double>(closed.size()));
}

std::unique_ptr<WorkerConnection> WorkerConnections::take(const std::string& url) {
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::unique_ptr<WorkerConnection> c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return nullptr;
  std::vector<std::unique_ptr<WorkerConnection>>& v = it->second;
  // The most recently used first: the longer a connection has been idle, the likelier that the
  // worker is about to close it.
  while (!v.empty() && !c) {
    std::unique_ptr<WorkerConnection> last = std::move(v.back());
    v.pop_back();
    idle_connections().add(-1);
    if (now - last->idle_since_ns < keep_ns && still_open(*last)) {
      c = std::move(last);
    } else {
      closed.push_back(std::move(last));
    }
  }
  if (v.empty()) idle_.erase(it);
  return c;
}

void WorkerConnections::give_back(std::unique_ptr<WorkerConnection> c) {
  const size_t limit = static_cast<size_t>(std::max(0, options_.max_idle_per_worker));
  if (limit == 0) return;
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  c->idle_since_ns = now;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  // Oldest first in each list: those idle too long are closed, and the oldest beyond the limit.
  auto close_front = [&](std::vector<std::unique_ptr<WorkerConnection>>& v, size_t keep_at_most) {
    size_t drop = 0;
    while (drop < v.size() && now - v[drop]->idle_since_ns >= keep_ns) ++drop;
    if (v.size() - drop > keep_at_most) drop = v.size() - keep_at_most;
    for (size_t i = 0; i < drop; ++i) closed.push_back(std::move(v[i]));
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(drop));
    idle_connections().add(-static_cast<double>(drop));
  };
  // (Other workers' lists are swept by sweep().)
  std::vector<std::unique_ptr<WorkerConnection>>& v = idle_[c->url];
  close_front(v, limit - 1);
  v.push_back(std::move(c));
  idle_connections().add(1);
}

void WorkerConnections::forget(const std::string& url) {
  std::vector<std::unique_ptr<WorkerConnection>> closed;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return;
  closed = std::move(it->second);
  idle_.erase(it);
  idle_connections().add(-static_cast<double>(closed.size()));
}

size_t WorkerConnections::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [url, v] : idle_) n += v.size();
  return n;
}

}  // namespace hr::api
