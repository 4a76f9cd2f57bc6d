// Shared by the store's translation units: the SQL for how long a new batch or file is kept, the
// first of the request's own seconds, the account's default and the server's. Private to queue/.
#pragma once

#include <string>

namespace hr::queue {

// A SQL expression (integer seconds) from the numbered parameters that hold the request's seconds
// (NULL when it named none), the account id and the server's default, e.g. ("$18", "$2", "$19").
inline std::string chosen_retention(const std::string& own, const std::string& account,
                                    const std::string& server_default) {
  return "coalesce(" + own +
         "::integer, (SELECT retention_seconds FROM accounts WHERE id = " + account + "::uuid), " +
         server_default + "::integer)";
}

}  // namespace hr::queue
