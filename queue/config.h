// Where the shared state lives: the Postgres and Redis URLs every process needs. Filled from
// --database-url / HEADROOM_DATABASE_URL and --redis-url / HEADROOM_REDIS_URL (or a config file).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "base/status.h"

namespace hr::queue {

// Failed attempts (an error worth retrying, or a lease that expired) before a request ends failed.
// Workers and the dispatcher's janitor count the same attempts and must agree on the limit.
inline constexpr int kDefaultMaxAttempts = 5;

struct StoreConfig {
  std::string database_url = "postgresql://headroom@127.0.0.1:5432/headroom";
  std::string redis_url = "redis://127.0.0.1:6379/0";
  // The key that seals webhook secrets at rest (base/secret_box.h); empty: stored as given.
  std::string secret_key_file;

  void bind(CLI::App& app, bool with_redis = true);
  // Checks the URLs, and loads the secret key file when one is given (so that a bad one stops
  // the command before it starts).
  [[nodiscard]] Status validate() const;
  // Postgres's and Redis's "host:port" (default ports when the URLs give none): services that
  // webhooks must never target (webhooks::AddressPolicy::refuse_services).
  std::vector<std::string> service_endpoints() const;
};

}  // namespace hr::queue
