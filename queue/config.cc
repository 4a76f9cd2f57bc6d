// StoreConfig flags and validation.
#include "queue/config.h"

#include "base/cli.h"
#include "base/secret_box.h"
#include "base/url.h"

namespace hr::queue {

void StoreConfig::bind(CLI::App& app, bool with_redis) {
  cli::add(app, "--database-url", database_url, "PostgreSQL URL (postgresql://user@host:port/db)");
  if (with_redis) cli::add(app, "--redis-url", redis_url, "Redis URL (redis://host:port/db)");
  cli::add(app, "--secret-key-file", secret_key_file,
           "File of 64 hex digits: the key sealing webhook secrets in the database (every "
           "process on one database needs the same one)");
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
  if (!secret_key_file.empty()) return secrets::load_key_file(secret_key_file);
  return Status::ok();
}

std::vector<std::string> StoreConfig::service_endpoints() const {
  std::vector<std::string> out;
  auto add = [&](const std::string& url, uint16_t default_port) {
    Result<Url> u = parse_url(url);
    if (!u.is_ok()) return;
    const std::string host = u->host.find(':') != std::string::npos ? "[" + u->host + "]" : u->host;
    out.push_back(host + ":" + std::to_string(u->port != 0 ? u->port : default_port));
  };
  add(database_url, 5432);
  add(redis_url, 6379);
  return out;
}

}  // namespace hr::queue
