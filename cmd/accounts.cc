// `headroom accounts show|set`.
#include "cmd/accounts.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "queue/accounts.h"
#include "queue/pg.h"

namespace hr::cmd {

namespace {

int fail(const Status& st) {
  std::fprintf(stderr, "headroom: %s\n", st.to_string().c_str());
  return 1;
}

nlohmann::json opt(const std::optional<int64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

int run_accounts_show(const queue::StoreConfig& store, const std::string& account) {
  auto conn = queue::pg_connect(store.database_url);
  if (!conn.is_ok()) return fail(conn.status());
  auto a = queue::get_account(**conn, account);
  if (!a.is_ok()) return fail(a.status());
  nlohmann::json j = {
      {"id", a->id},
      {"name", a->name},
      {"created_at", a->created_at_ms / 1000},
      {"retention_days", a->retention_seconds
                             ? nlohmann::json(static_cast<double>(*a->retention_seconds) / 86400)
                             : nlohmann::json(nullptr)},
      {"max_enqueued_requests", opt(a->max_enqueued_requests)},
      {"max_enqueued_tokens", opt(a->max_enqueued_tokens)},
      {"sync_requests_per_minute", opt(a->sync.requests_per_minute)},
      {"sync_tokens_per_minute", opt(a->sync.tokens_per_minute)},
      {"max_concurrent_sync", opt(a->sync.concurrent)},
      {"weight", a->weight},
      {"default_priority", a->default_priority},
      {"operator", a->is_operator},
      {"active_keys", a->num_active_keys},
      {"batches", a->num_batches},
      {"open_batches", a->num_open_batches},
      {"pending_requests", a->num_pending_requests},
      {"pending_tokens", a->num_pending_tokens}};
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

int run_accounts_set(const queue::StoreConfig& store, const std::string& account,
                     const AccountChanges& changes) {
  auto conn = queue::pg_connect(store.database_url);
  if (!conn.is_ok()) return fail(conn.status());
  if (changes.retention_days) {
    std::optional<int64_t> seconds;
    if (*changes.retention_days != 0) {
      seconds = static_cast<int64_t>(*changes.retention_days * 86400);
    }
    Status st = queue::set_account_retention(**conn, account, seconds);
    if (!st.is_ok()) return fail(st);
  }
  if (changes.max_enqueued_requests) {
    std::optional<int64_t> max;
    if (*changes.max_enqueued_requests != 0) max = *changes.max_enqueued_requests;
    Status st = queue::set_account_max_enqueued(**conn, account, max);
    if (!st.is_ok()) return fail(st);
  }
  if (changes.max_enqueued_tokens) {
    std::optional<int64_t> max;
    if (*changes.max_enqueued_tokens != 0) max = *changes.max_enqueued_tokens;
    Status st = queue::set_account_max_enqueued_tokens(**conn, account, max);
    if (!st.is_ok()) return fail(st);
  }
  if (changes.sync.any()) {
    Status st = queue::set_sync_limits(**conn, account, changes.sync);
    if (!st.is_ok()) return fail(st);
  }
  if (changes.weight || changes.default_priority) {
    Status st = queue::set_account_share(**conn, account, changes.weight, changes.default_priority);
    if (!st.is_ok()) return fail(st);
  }
  if (changes.is_operator) {
    Status st = queue::set_account_operator(**conn, account, *changes.is_operator);
    if (!st.is_ok()) return fail(st);
  }
  conn->reset();
  return run_accounts_show(store, account);
}

}  // namespace hr::cmd
