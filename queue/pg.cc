// Postgres connection and error mapping.
#include "queue/pg.h"

namespace hr::queue {

std::string with_client_timeouts(const std::string& url) {
  if (url.find("connect_timeout") != std::string::npos) return url;
  const bool uri = url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0;
  if (uri) {
    return url + (url.find('?') == std::string::npos ? "?" : "&") +
           "connect_timeout=2&keepalives=1&keepalives_idle=10&keepalives_interval=5&"
           "keepalives_count=3";
  }
  return url +
         " connect_timeout=2 keepalives=1 keepalives_idle=10 keepalives_interval=5 "
         "keepalives_count=3";
}

Result<std::unique_ptr<pqxx::connection>> pg_connect(const std::string& url) {
  try {
    return std::make_unique<pqxx::connection>(with_client_timeouts(url));
  } catch (const std::exception& e) {
    return pg_error(e, "connect");
  }
}

Status pg_error(const std::exception& e, std::string_view op) {
  std::string what = e.what();
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  std::string msg = "postgres " + std::string(op) + ": " + what;
  if (dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr ||
      dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr) {
    return Status(StatusCode::kUnavailable, msg);
  }
  if (auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
    const std::string& state = sql->sqlstate();
    // Class 08 (connection exception), 57P (operator intervention, e.g. shutdown), 53 (resources).
    if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0 || state.rfind("53", 0) == 0) {
      return Status(StatusCode::kUnavailable, msg);
    }
    if (state == "40001" || state == "40P01") return Status(StatusCode::kConflict, msg);
  }
  return Status(StatusCode::kInternal, msg);
}

std::string pg_text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out + "}";
}

}  // namespace hr::queue
