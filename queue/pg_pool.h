// A bounded set of Postgres connections shared by many threads, each connection lent to one
// thread at a time. A thread's first connection() borrows one (opened on first use, waiting while
// all are lent) and its later calls get the same one until it gives it back with release(). A
// request handler thus borrows on its first query and gives back when it is done, or before it
// waits on something slow (an inference), so that many more handler threads than connections can
// share the database.
#pragma once

#include <pqxx/pqxx>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace hr::queue {

class PgPool {
 public:
  // At most `size` connections to `url`; a thread waits up to `wait` for one to be given back.
  PgPool(std::string url, int size, std::chrono::milliseconds wait);
  ~PgPool();
  PgPool(const PgPool&) = delete;
  PgPool& operator=(const PgPool&) = delete;

  // While it lives, the calling thread's database calls are bounded: past `limit` a watchdog
  // shuts its connection's socket down (a frozen server answers nothing, not even an error, and
  // TCP keepalives are answered by its kernel), so that the call fails kUnavailable at once and
  // with_connection does not try again. For calls that must answer quickly (authentication,
  // polls, health); a bulk write is not bounded.
  class Bound {
   public:
    Bound(PgPool* pool, std::chrono::milliseconds limit);
    ~Bound();
    Bound(const Bound&) = delete;
    Bound& operator=(const Bound&) = delete;

   private:
    PgPool* pool_;
  };
  // True when the calling thread's Bound has run out.
  bool past_bound() const;

  // The calling thread's connection: the one it holds, else one borrowed (and reopened if it was
  // closed). kResourceExhausted when none is given back within the wait; kUnavailable when the
  // server cannot be reached.
  [[nodiscard]] Result<pqxx::connection*> connection();
  // Gives the calling thread's connection back, if it holds one.
  void release();
  // Closes the calling thread's connection (it broke) and frees its place.
  void drop();
  // Runs `fn(pqxx::connection&) -> Result<T>` on the calling thread's connection; when the
  // connection turns out to be broken (kUnavailable: the server restarted since it was opened,
  // say), reconnects and tries once more.
  template <typename T, typename Fn>
  [[nodiscard]] Result<T> with_connection(Fn&& fn) {
    for (int attempt = 0;; ++attempt) {
      Result<pqxx::connection*> c = connection();
      if (!c.is_ok()) return c.status();
      Result<T> r = fn(**c);
      if (r.is_ok() || r.status().code() != StatusCode::kUnavailable) return r;
      if (past_bound()) {
        drop();
        return Status(StatusCode::kUnavailable, "postgres did not answer in time");
      }
      if (attempt == 1) return r;
      drop();
    }
  }
  // What to tell a client about a failed database call: kUnavailable (the connection is dropped,
  // so that the next call reconnects) becomes "the database is unavailable; retry later"; any
  // other failure is returned as it is. Logged either way.
  Status client_status(const Status& failure);

  int size() const { return size_; }
  int lent() const;
  int open() const;  // lent and idle

 private:
  const std::string url_;
  const int size_;
  const std::chrono::milliseconds wait_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<pqxx::connection>> idle_;
  std::unordered_map<std::thread::id, std::unique_ptr<pqxx::connection>> lent_;
  int opening_ = 0;  // places taken by connections being opened (outside the lock)
  // Bounded threads' deadlines (steady ns), and those whose socket the watchdog shut down.
  std::unordered_map<std::thread::id, int64_t> deadlines_;  // guarded by mu_
  std::unordered_map<std::thread::id, bool> timed_out_;     // guarded by mu_
  std::thread watchdog_;                                    // started by the first Bound
  std::condition_variable watchdog_cv_;  // (its own: cv_'s notify_one is for connection waiters)
  bool stopping_ = false;                // guarded by mu_
  void watch();
  // Opens a connection, giving up at `deadline_ns` (steady) while it goes on in the background.
  Result<std::unique_ptr<pqxx::connection>> open_by(int64_t deadline_ns);
};

}  // namespace hr::queue
