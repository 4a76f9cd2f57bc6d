// `headroom accounts`: an account's settings and what it holds, and setting its defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "queue/accounts.h"
#include "queue/config.h"

namespace hr::cmd {

// Prints the account as JSON.
int run_accounts_show(const queue::StoreConfig& store, const std::string& account);
// What `accounts set` changes; what is not given stays.
struct AccountChanges {
  std::optional<double> retention_days;          // 0: the server's --retention-days
  std::optional<int64_t> max_enqueued_requests;  // 0: no limit
  std::optional<int64_t> max_enqueued_tokens;    // 0: no limit
  std::optional<double> weight;                  // its share of the queue (1: the default)
  std::optional<int> default_priority;           // of its batches that name none
  queue::SyncLimits sync;                        // each given: set (0: no limit)
  std::optional<bool> is_operator;               // its keys may read the deployment's load
};

// Applies the changes, then prints the account.
int run_accounts_set(const queue::StoreConfig& store, const std::string& account,
                     const AccountChanges& changes);

}  // namespace hr::cmd
