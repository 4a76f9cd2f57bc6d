// Postgres access helpers on libpqxx 6.4: connecting from a postgresql:// URL and turning libpqxx
// exceptions into Status, so no exception leaves queue/. A pqxx::connection is used by one thread.
#pragma once

#include <pqxx/pqxx>

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::queue {

// Opens a connection; kUnavailable when the server cannot be reached.
// Opens a connection with client-side timeouts added to `url` (with_client_timeouts).
[[nodiscard]] Result<std::unique_ptr<pqxx::connection>> pg_connect(const std::string& url);
// `url` (a postgresql:// URI or key=value pairs) with connect_timeout=2, TCP keepalives (a dead
// peer noticed in about 20 s) and a session statement_timeout of 60 s and lock_timeout of 10 s,
// each unless the URL sets it already (`options` as a whole): a server that accepts the
// connection but never answers (frozen) fails the connect instead of hanging it, and a query or
// lock wait that runs away fails kUnavailable (retryable) instead of holding its caller.
std::string with_client_timeouts(const std::string& url);

// Maps a libpqxx exception to a Status: broken connections and in-doubt commits are kUnavailable
// (retryable), everything else kInternal. `op` names what was being done.
Status pg_error(const std::exception& e, std::string_view op);

// A Postgres text[] literal of plain words (event type names, ...): no element may need quoting.
std::string pg_text_array(const std::vector<std::string>& items);

// Runs `fn()` and converts any libpqxx exception it throws into a Status.
template <typename Fn>
Status pg_guard(std::string_view op, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return pg_error(e, op);
  }
}

// A Postgres connection that reopens itself: run() connects on first use, and a failure that
// means the connection is gone (kUnavailable) drops it so the next run() reconnects.
// Not thread-safe: one PgSession per thread.
class PgSession {
 public:
  explicit PgSession(std::string url) : url_(std::move(url)) {}

  // Runs fn(connection) and converts libpqxx exceptions into a Status.
  template <typename Fn>
  Status run(std::string_view op, Fn&& fn) {
    if (conn_ && !conn_->is_open()) conn_.reset();
    if (!conn_) {
      Result<std::unique_ptr<pqxx::connection>> c = pg_connect(url_);
      if (!c.is_ok()) return c.status();
      conn_ = std::move(c).value();
    }
    Status st = pg_guard(op, [&]() -> Status { return fn(*conn_); });
    if (st.code() == StatusCode::kUnavailable) conn_.reset();
    return st;
  }
  void reset() { conn_.reset(); }

 private:
  std::string url_;
  std::unique_ptr<pqxx::connection> conn_;
};

}  // namespace hr::queue
