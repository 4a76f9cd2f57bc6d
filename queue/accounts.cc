// Account settings and summaries.
#include "queue/accounts.h"

#include "queue/pg.h"

namespace hr::queue {

namespace {

// Runs `sql`, an UPDATE of the account named $1 that RETURNs a row, with `args` as $2 on;
// kNotFound when there is no account of that name.
template <typename... Args>
Status update_account(pqxx::connection& conn, const char* what, const std::string& name,
                      const char* sql, const Args&... args) {
  return pg_guard(what, [&]() -> Status {
    pqxx::nontransaction tx(conn);
    if (tx.exec_params(sql, name, args...).empty()) {
      return not_found("no account named '" + name + "'");
    }
    return Status::ok();
  });
}

}  // namespace

Result<AccountInfo> get_account(pqxx::connection& conn, const std::string& name) {
  AccountInfo out;
  Status st = pg_guard("get account", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params(
        "SELECT a.id::text, a.name, (extract(epoch FROM a.created_at) * 1000)::bigint, "
        "  a.retention_seconds, "
        "  (SELECT count(*) FROM api_keys k WHERE k.account_id = a.id AND k.revoked_at IS NULL), "
        "  (SELECT count(*) FROM batches b WHERE b.account_id = a.id), "
        "  (SELECT count(*) FROM batches b WHERE b.account_id = a.id AND b.finished_at IS NULL), "
        "  (SELECT coalesce(sum(num_total - num_completed - num_failed - num_cancelled - "
        "     num_expired), 0) FROM batches b WHERE b.account_id = a.id "
        "     AND b.finished_at IS NULL), a.max_enqueued_requests, a.weight, a.default_priority, "
        "a.sync_requests_per_minute, a.sync_tokens_per_minute, a.max_concurrent_sync, "
        "a.max_enqueued_tokens, "
        "  (SELECT coalesce(sum(enqueued_tokens * (num_total - num_completed - num_failed - "
        "     num_cancelled - num_expired) / greatest(num_total, 1)), 0) FROM batches b "
        "     WHERE b.account_id = a.id AND b.finished_at IS NULL), a.operator "
        "FROM accounts a WHERE a.name = $1",
        name);
    if (r.empty()) return not_found("no account named '" + name + "'");
    const pqxx::row& row = r[0];
    out.id = row[0].as<std::string>();
    out.name = row[1].as<std::string>();
    out.created_at_ms = row[2].as<int64_t>();
    if (!row[3].is_null()) out.retention_seconds = row[3].as<int64_t>();
    out.num_active_keys = row[4].as<int>();
    out.num_batches = row[5].as<int64_t>();
    out.num_open_batches = row[6].as<int64_t>();
    out.num_pending_requests = row[7].as<int64_t>();
    if (!row[8].is_null()) out.max_enqueued_requests = row[8].as<int64_t>();
    out.weight = row[9].as<double>();
    out.default_priority = row[10].as<int>();
    if (!row[11].is_null()) out.sync.requests_per_minute = row[11].as<int64_t>();
    if (!row[12].is_null()) out.sync.tokens_per_minute = row[12].as<int64_t>();
    if (!row[13].is_null()) out.sync.concurrent = row[13].as<int64_t>();
    if (!row[14].is_null()) out.max_enqueued_tokens = row[14].as<int64_t>();
    out.num_pending_tokens = row[15].as<int64_t>();
    out.is_operator = row[16].as<bool>();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Status set_account_retention(pqxx::connection& conn, const std::string& name,
                             std::optional<int64_t> seconds) {
  if (seconds && (*seconds < 60 || *seconds > int64_t{3650} * 86400)) {
    return invalid_argument("the retention must be a minute to 3650 days", "retention-days");
  }
  return update_account(conn, "set account retention", name,
                        "UPDATE accounts SET retention_seconds = $2 WHERE name = $1 RETURNING 1",
                        seconds);
}

Status set_account_max_enqueued(pqxx::connection& conn, const std::string& name,
                                std::optional<int64_t> max_requests) {
  if (max_requests && *max_requests < 1) {
    return invalid_argument("the limit must be at least 1", "max-enqueued-requests");
  }
  return update_account(
      conn, "set account limit", name,
      "UPDATE accounts SET max_enqueued_requests = $2 WHERE name = $1 RETURNING 1", max_requests);
}

Status set_account_max_enqueued_tokens(pqxx::connection& conn, const std::string& name,
                                       std::optional<int64_t> max_tokens) {
  if (max_tokens && *max_tokens < 1) {
    return invalid_argument("the limit must be at least 1", "max-enqueued-tokens");
  }
  return update_account(conn, "set account token limit", name,
                        "UPDATE accounts SET max_enqueued_tokens = $2 WHERE name = $1 RETURNING 1",
                        max_tokens);
}

Status set_account_share(pqxx::connection& conn, const std::string& name,
                         std::optional<double> weight, std::optional<int> default_priority) {
  if (weight && !(*weight > 0 && *weight <= kMaxAccountWeight)) {
    return invalid_argument("the weight must be more than 0 and at most 1000", "weight");
  }
  if (default_priority && (*default_priority < kMinPriority || *default_priority > kMaxPriority)) {
    return invalid_argument("the priority must be -100 to 100", "default-priority");
  }
  return update_account(
      conn, "set account share", name,
      "UPDATE accounts SET weight = coalesce($2, weight), "
      "default_priority = coalesce($3, default_priority) WHERE name = $1 RETURNING 1",
      weight, default_priority);
}

Status set_account_operator(pqxx::connection& conn, const std::string& name, bool is_operator) {
  return update_account(conn, "set account operator", name,
                        "UPDATE accounts SET operator = $2 WHERE name = $1 RETURNING 1",
                        is_operator);
}

Result<bool> is_operator(pqxx::connection& conn, const std::string& account_id) {
  bool out = false;
  Status st = pg_guard("is operator", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r =
        tx.exec_params("SELECT operator FROM accounts WHERE id = $1::uuid", account_id);
    out = !r.empty() && r[0][0].as<bool>();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<SyncLimits> get_sync_limits(pqxx::connection& conn, const std::string& account_id) {
  SyncLimits out;
  Status st = pg_guard("get sync limits", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params(
        "SELECT sync_requests_per_minute, sync_tokens_per_minute, max_concurrent_sync "
        "FROM accounts WHERE id = $1::uuid",
        account_id);
    if (r.empty()) return not_found("no such account");
    if (!r[0][0].is_null()) out.requests_per_minute = r[0][0].as<int64_t>();
    if (!r[0][1].is_null()) out.tokens_per_minute = r[0][1].as<int64_t>();
    if (!r[0][2].is_null()) out.concurrent = r[0][2].as<int64_t>();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Status set_sync_limits(pqxx::connection& conn, const std::string& name, const SyncLimits& changes) {
  for (const auto& [v, field] : {std::pair{changes.requests_per_minute, "sync-requests-per-minute"},
                                 std::pair{changes.tokens_per_minute, "sync-tokens-per-minute"},
                                 std::pair{changes.concurrent, "max-concurrent-sync"}}) {
    if (v && *v < 0) return invalid_argument("a limit must be 0 (none) or more", field);
  }
  // Each: absent stays, 0 lifts, more sets.
  return update_account(
      conn, "set sync limits", name,
      "UPDATE accounts SET "
      "sync_requests_per_minute = CASE WHEN $2::bigint IS NULL THEN sync_requests_per_minute "
      "  ELSE nullif($2::bigint, 0) END, "
      "sync_tokens_per_minute = CASE WHEN $3::bigint IS NULL THEN sync_tokens_per_minute "
      "  ELSE nullif($3::bigint, 0) END, "
      "max_concurrent_sync = CASE WHEN $4::bigint IS NULL THEN max_concurrent_sync "
      "  ELSE nullif($4::bigint, 0) END "
      "WHERE name = $1 RETURNING 1",
      changes.requests_per_minute, changes.tokens_per_minute, changes.concurrent);
}

}  // namespace hr::queue
