// Large answers in flight per account. A poll of a big batch, or the output of one that is still
// running, is sent a page at a time (each page read from Postgres as the client takes the last
// one), so one such answer holds about a page of memory however large the batch; a client that
// never reads holds its page until the write timeout. The slots bound how many of these one
// account may have open at once, so that no account can make the API hold much memory for it:
// past its limit a client gets 429 with Retry-After. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hr::api {

class ResponseSlots {
 public:
  explicit ResponseSlots(int per_account) : per_account_(per_account) {}

  // A slot of `account`'s, held until the last copy of the handle is destroyed; null when the
  // account holds its limit already.
  std::shared_ptr<void> take(const std::string& account);

  int per_account() const { return per_account_; }
  int held(const std::string& account);

 private:
  void give_back(const std::string& account);

  const int per_account_;
  std::mutex mu_;
  std::unordered_map<std::string, int> held_;  // guarded by mu_; accounts holding none are absent
};

}  // namespace hr::api
