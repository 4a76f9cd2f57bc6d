// Per-account limits on sync calls (docs/quotas.md): requests per minute, tokens per minute and
// calls at once, held in Redis so that every API process counts against the same numbers.
//  - Per minute: a generic cell rate algorithm per account and limit (one key holding the time at
//    which the account's allowance is next whole), so a minute's worth may come in a burst and
//    then the calls are spaced out; one Lua script checks and charges every limit atomically.
//  - Tokens are charged at admission as the prompt's estimate (its bytes / 4) plus max_tokens,
//    and settled to the real count when the answer is done.
//  - Calls at once: a sorted set per account of the calls in progress, scored by when their
//    lease ends; each process renews its own calls' leases, so those of a process that died
//    mid-call lapse after `lease_ms` and the count comes right again.
// Redis failing lets calls through (a warning, paced): the limits guard fairness, not safety.
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "base/retry_pacer.h"
#include "base/status.h"
#include "queue/accounts.h"
#include "queue/redis.h"

namespace hr::api {

using queue::SyncLimits;

struct SyncLimiterOptions {
  std::string redis_url;
  int64_t lease_ms = 60000;        // a call's slot lapses this long after its process stops
  int64_t limits_cache_ms = 5000;  // an account's limits are read again after this long
  int pool_size = 4;               // Redis connections
};

class SyncLimiter;

// A call admitted: holds its slot among the account's calls at once until it is destroyed, and
// settles its tokens with settle(). Move-only.
class SyncPermit {
 public:
  SyncPermit() = default;
  SyncPermit(SyncPermit&& other) noexcept { *this = std::move(other); }
  SyncPermit& operator=(SyncPermit&& other) noexcept;
  ~SyncPermit();
  // The call's real token count (prompt and answer): the per-minute charge is corrected by the
  // difference with the estimate. Once.
  void settle(int64_t tokens);

 private:
  friend class SyncLimiter;
  SyncLimiter* limiter_ = nullptr;
  std::string account_;
  std::string call_id_;   // in the account's set of calls at once; empty when not counted
  int64_t estimate_ = 0;  // tokens charged at admission
  int64_t tpm_ = 0;       // the tokens-per-minute limit it was charged under (0: none)
  bool settled_ = false;
};

// A call refused: the limit it would pass (the error's field) and when to try again.
struct SyncRefusal {
  Status status;
  int retry_after_s = 1;  // 0 when trying again cannot help (a call too big for any minute)
};

class SyncLimiter {
 public:
  // `load` reads an account's limits (from Postgres); called at most every limits_cache_ms per
  // account. A failure keeps the last limits read (none at first).
  SyncLimiter(SyncLimiterOptions options,
              std::function<Result<SyncLimits>(const std::string& account)> load);
  ~SyncLimiter();
  SyncLimiter(const SyncLimiter&) = delete;
  SyncLimiter& operator=(const SyncLimiter&) = delete;

  // Admits a call of about `estimated_tokens` for `account`, or says which limit refuses it.
  std::variant<SyncPermit, SyncRefusal> admit(const std::string& account, int64_t estimated_tokens);

 private:
  friend class SyncPermit;
  struct Lent;  // a pooled Redis connection, given back when destroyed
  // A Redis connection from the pool (null: Redis cannot be reached), and giving it back (null:
  // it broke).
  std::unique_ptr<queue::RedisClient> take();
  void give_back(std::unique_ptr<queue::RedisClient> client);
  SyncLimits limits_of(const std::string& account);
  void release(SyncPermit& permit);
  void settle(SyncPermit& permit, int64_t tokens);
  void renew_loop();

  SyncLimiterOptions options_;
  std::function<Result<SyncLimits>(const std::string&)> load_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<queue::RedisClient>> idle_;  // guarded by mu_
  int open_ = 0;                                           // guarded by mu_: connections made
  struct Cached {
    SyncLimits limits;
    int64_t read_ms = 0;
  };
  std::map<std::string, Cached> limits_;     // guarded by mu_
  std::map<std::string, std::string> live_;  // guarded by mu_: call id → account
  RetryPacer pacer_;                         // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread renewer_;
};

}  // namespace hr::api
