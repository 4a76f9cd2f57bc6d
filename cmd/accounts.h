// `headroom accounts`: an account's settings and what it holds, and setting its defaults.
#pragma once

#include <optional>
#include <string>

#include "queue/config.h"

namespace hr::cmd {

// Prints the account as JSON.
int run_accounts_show(const queue::StoreConfig& store, const std::string& account);
// Sets the account's default retention in days (0: the server's --retention-days), then prints
// the account.
int run_accounts_set(const queue::StoreConfig& store, const std::string& account,
                     std::optional<double> retention_days);

}  // namespace hr::cmd
