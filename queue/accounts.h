// Accounts as operators see them (`headroom accounts`): settings and a summary of what they hold.
// Keys are store.h's. Functions take a connection owned by the caller's thread.
#pragma once

#include <pqxx/pqxx>

#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace hr::queue {

// Limits on an account's sync calls (none: no limit).
struct SyncLimits {
  std::optional<int64_t> requests_per_minute;
  std::optional<int64_t> tokens_per_minute;
  std::optional<int64_t> concurrent;
  bool any() const { return requests_per_minute || tokens_per_minute || concurrent; }
};

struct AccountInfo {
  std::string id;
  std::string name;
  int64_t created_at_ms = 0;
  std::optional<int64_t> retention_seconds;      // its default retention; none: the server's
  std::optional<int64_t> max_enqueued_requests;  // none: no limit
  std::optional<int64_t> max_enqueued_tokens;    // none: no limit
  SyncLimits sync;                               // limits on its sync calls
  double weight = 1;         // its share of each model's queue against other accounts
  int default_priority = 0;  // of its batches that name none
  bool is_operator = false;  // its keys may read the deployment's load
  int num_active_keys = 0;
  int64_t num_batches = 0;           // stored (not yet purged)
  int64_t num_open_batches = 0;      // queued or running
  int64_t num_pending_requests = 0;  // requests of open batches not yet ended
  int64_t num_pending_tokens = 0;    // their token estimates (max_enqueued_tokens counts them)
};

// kNotFound when there is no account of that name.
[[nodiscard]] Result<AccountInfo> get_account(pqxx::connection& conn, const std::string& name);

// Sets the account's default retention (nullopt: the server's). Applies to batches and files
// created from now on. kNotFound when there is no account of that name.
[[nodiscard]] Status set_account_retention(pqxx::connection& conn, const std::string& name,
                                           std::optional<int64_t> seconds);

// Sets the most requests the account may have queued or running at once (nullopt: no limit).
[[nodiscard]] Status set_account_max_enqueued(pqxx::connection& conn, const std::string& name,
                                              std::optional<int64_t> max_requests);

// Sets the most tokens (estimates: prompt bytes / 4 and max_tokens) the account's queued and
// running requests may hold (nullopt: no limit).
[[nodiscard]] Status set_account_max_enqueued_tokens(pqxx::connection& conn,
                                                     const std::string& name,
                                                     std::optional<int64_t> max_tokens);

// The limits on the sync calls of the account with this id (kNotFound when there is none).
[[nodiscard]] Result<SyncLimits> get_sync_limits(pqxx::connection& conn,
                                                 const std::string& account_id);

// Changes the account's sync limits: each one given is set (0: no limit); the others stay.
[[nodiscard]] Status set_sync_limits(pqxx::connection& conn, const std::string& name,
                                     const SyncLimits& changes);

// The account's share of the queue (fair_share.h): its weight (0 < w <= kMaxAccountWeight) and
// the priority of its batches that name none (kMinPriority..kMaxPriority). What is not given
// stays.
inline constexpr double kMaxAccountWeight = 1000;
inline constexpr int kMinPriority = -100;
inline constexpr int kMaxPriority = 100;
[[nodiscard]] Status set_account_share(pqxx::connection& conn, const std::string& name,
                                       std::optional<double> weight,
                                       std::optional<int> default_priority);

// Grants (or withdraws) the operator's view: the account's keys may read the whole deployment's
// load (GET /v1/operator/stats). kNotFound when there is no account of that name.
[[nodiscard]] Status set_account_operator(pqxx::connection& conn, const std::string& name,
                                          bool is_operator);

// Whether the account with this id is an operator's (false when there is no such account).
[[nodiscard]] Result<bool> is_operator(pqxx::connection& conn, const std::string& account_id);

}  // namespace hr::queue
