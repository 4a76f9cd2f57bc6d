// Schema migrations: migrations/NNNN_name.sql applied in order, each in its own transaction and
// recorded in schema_migrations, under a Postgres advisory lock so concurrent migrators are safe
// (the second waits, then finds nothing to do). Forward-only: an applied file whose contents
// changed is an error. The files are compiled into the binary; a directory can override them.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace hr::queue {

struct Migration {
  int version = 0;   // NNNN
  std::string name;  // file name, e.g. "0001_accounts.sql"
  std::string sql;
  std::string checksum;  // hex FNV-1a 64 of `sql`
};

struct MigrateReport {
  std::vector<std::string> applied;  // file names applied by this run, in order
  int num_already_applied = 0;
};

// The migrations compiled into this binary, in order.
const std::vector<Migration>& bundled_migrations();

// Reads NNNN_name.sql files from `dir`; errors on a bad name or a duplicate version.
[[nodiscard]] Result<std::vector<Migration>> load_migrations_dir(const std::string& dir);

// Builds a Migration from a file name and its contents; errors on a bad name.
[[nodiscard]] Result<Migration> make_migration(const std::string& file_name, std::string sql);

// Applies the pending migrations. A failure rolls back that file's transaction (earlier files
// stay applied) and names the file and the database's message.
[[nodiscard]] Result<MigrateReport> migrate(const std::string& database_url,
                                            const std::vector<Migration>& migrations);

}  // namespace hr::queue
