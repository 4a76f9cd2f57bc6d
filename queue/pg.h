// Postgres access helpers on libpqxx 6.4: connecting from a postgresql:// URL and turning libpqxx
// exceptions into Status, so no exception leaves queue/. A pqxx::connection is used by one thread.
#pragma once

#include <pqxx/pqxx>

#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace hr::queue {

// Opens a connection; kUnavailable when the server cannot be reached.
[[nodiscard]] Result<std::unique_ptr<pqxx::connection>> pg_connect(const std::string& url);

// Maps a libpqxx exception to a Status: broken connections and in-doubt commits are kUnavailable
// (retryable), everything else kInternal. `op` names what was being done.
Status pg_error(const std::exception& e, std::string_view op);

// Runs `fn()` and converts any libpqxx exception it throws into a Status.
template <typename Fn>
Status pg_guard(std::string_view op, Fn&& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return pg_error(e, op);
  }
}

}  // namespace hr::queue
