// Postgres connection and error mapping.
#include "queue/pg.h"

namespace hr::queue {

std::string with_client_timeouts(const std::string& url) {
  struct Param {
    const char* key;
    const char* value;      // as a key=value pair
    const char* uri_value;  // percent-encoded for a URI's query
  };
  static constexpr Param kParams[] = {
      {"connect_timeout", "2", "2"},
      {"keepalives", "1", "1"},
      {"keepalives_idle", "10", "10"},
      {"keepalives_interval", "5", "5"},
      {"keepalives_count", "3", "3"},
      {"options", "'-c statement_timeout=60000 -c lock_timeout=10000'",
       "-c%20statement_timeout%3D60000%20-c%20lock_timeout%3D10000"},
  };
  const bool uri = url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0;
  std::string out = url;
  for (const Param& p : kParams) {
    const std::string key = std::string(p.key) + "=";
    const size_t at = url.find(key);
    // A parameter the URL sets already is kept (keepalives= is not a prefix of keepalives_idle=).
    if (at != std::string::npos &&
        (at == 0 || url[at - 1] == '?' || url[at - 1] == '&' || url[at - 1] == ' ')) {
      continue;
    }
    if (uri) {
      out += (out.find('?') == std::string::npos ? "?" : "&") + key + p.uri_value;
    } else {
      out += " " + key + p.value;
    }
  }
  return out;
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
    // Class 08 (connection exception), 57P (operator intervention, e.g. shutdown), 53
    // (resources), and a statement or lock wait past its session's timeout (57014, 55P03).
    if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0 || state.rfind("53", 0) == 0 ||
        state == "57014" || state == "55P03") {
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
