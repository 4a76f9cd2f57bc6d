// StoreConfig flags and validation.
#include "queue/config.h"

#include "base/cli.h"
#include "base/url.h"

namespace hr::queue {

void StoreConfig::bind(CLI::App& app, bool with_redis) {
  cli::add(app, "--database-url", database_url, "PostgreSQL URL (postgresql://user@host:port/db)");
  if (with_redis) cli::add(app, "--redis-url", redis_url, "Redis URL (redis://host:port/db)");
}

Status StoreConfig::validate() const {
  Result<Url> db = parse_url(database_url);
  if (!db.is_ok() || (db->scheme != "postgresql" && db->scheme != "postgres")) {
    return invalid_argument("--database-url must be a postgresql:// URL", "database-url");
  }
  Result<Url> redis = parse_url(redis_url);
  if (!redis.is_ok() || redis->scheme != "redis") {
    return invalid_argument("--redis-url must be a redis:// URL", "redis-url");
  }
  return Status::ok();
}

}  // namespace hr::queue
