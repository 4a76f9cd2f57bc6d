// The migration runner.
#include "queue/migrate.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/log.h"
#include "queue/pg.h"

namespace hr::queue {
namespace {

// Arbitrary constant identifying the migration lock among advisory locks.
constexpr int64_t kMigrationLockKey = 0x68726d6967726174;  // "hrmigrat"

std::string fnv1a_hex(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

Result<Migration> make_migration(const std::string& file_name, std::string sql) {
  size_t us = file_name.find('_');
  bool ok = us == 4 && file_name.size() > 9 && file_name.ends_with(".sql");
  for (size_t i = 0; ok && i < 4; ++i) ok = std::isdigit(static_cast<unsigned char>(file_name[i]));
  if (!ok) {
    return invalid_argument("migration file name must look like NNNN_name.sql: " + file_name);
  }
  Migration m;
  m.version = std::stoi(file_name.substr(0, 4));
  m.name = file_name;
  m.checksum = fnv1a_hex(sql);
  m.sql = std::move(sql);
  return m;
}

Result<std::vector<Migration>> load_migrations_dir(const std::string& dir) {
  std::vector<Migration> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return invalid_argument("cannot read migrations directory " + dir + ": " + ec.message());
  for (const auto& entry : it) {
    if (!entry.is_regular_file() || entry.path().extension() != ".sql") continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    HR_ASSIGN_OR_RETURN(Migration m, make_migration(entry.path().filename().string(), ss.str()));
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(),
            [](const Migration& a, const Migration& b) { return a.version < b.version; });
  for (size_t i = 1; i < out.size(); ++i) {
    if (out[i].version == out[i - 1].version) {
      return invalid_argument("two migrations share version " + std::to_string(out[i].version) +
                              ": " + out[i - 1].name + ", " + out[i].name);
    }
  }
  return out;
}

Result<MigrateReport> migrate(const std::string& database_url,
                              const std::vector<Migration>& migrations) {
  HR_ASSIGN_OR_RETURN(auto conn, pg_connect(database_url));
  MigrateReport report;
  Status st = pg_guard("migrate", [&]() -> Status {
    // A migration may rewrite large tables, and a second migrator waits for the first: neither
    // is held to the session timeouts the connection comes with (pg.h).
    pqxx::nontransaction(*conn).exec("SET statement_timeout = 0; SET lock_timeout = 0");
    // Session-level lock: a second migrator blocks here until the first one is done.
    pqxx::nontransaction(*conn).exec("SELECT pg_advisory_lock(" +
                                     std::to_string(kMigrationLockKey) + ")");
    struct Unlock {
      pqxx::connection& c;
      ~Unlock() {
        try {
          pqxx::nontransaction(c).exec("SELECT pg_advisory_unlock(" +
                                       std::to_string(kMigrationLockKey) + ")");
        } catch (...) {
          // The lock goes with the session when the connection closes.
        }
      }
    } unlock{*conn};
    pqxx::nontransaction(*conn).exec(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())");
    std::map<int, std::pair<std::string, std::string>> applied;
    {
      pqxx::nontransaction tx(*conn);
      for (const auto& row : tx.exec("SELECT version, name, checksum FROM schema_migrations")) {
        applied[row[0].as<int>()] = {row[1].as<std::string>(), row[2].as<std::string>()};
      }
    }
    for (const Migration& m : migrations) {
      auto it = applied.find(m.version);
      if (it != applied.end()) {
        if (it->second.second != m.checksum) {
          return Status(StatusCode::kFailedPrecondition,
                        "migration " + m.name + " was changed after it was applied (as " +
                            it->second.first + "); add a new migration instead");
        }
        ++report.num_already_applied;
        continue;
      }
      try {
        pqxx::work tx(*conn);
        tx.exec(m.sql);
        tx.exec_params(
            "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            m.version, m.name, m.checksum);
        tx.commit();
      } catch (const std::exception& e) {
        return pg_error(e, "migration " + m.name);
      }
      log::info("migrate.applied", {{"file", m.name}});
      report.applied.push_back(m.name);
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return report;
}

}  // namespace hr::queue
