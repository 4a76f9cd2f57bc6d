// Per-account sync limits in Redis.
#include "api/sync_limits.h"

#include <algorithm>
#include <utility>

#include "base/clock.h"
#include "base/ids.h"
#include "base/log.h"

namespace hr::api {

namespace {

// Checks and charges every limit of one call at once. A generic cell rate algorithm per minute
// limit: the key holds the "theoretical arrival time" (TAT) in ms; a call of cost c moves it by
// c * 60000 / limit, and is refused when that would put it more than a minute past now.
// KEYS: requests key, tokens key, calls-at-once key.
// ARGV: now ms, requests/min (0: none), tokens/min (0: none), tokens, calls at once (0: none),
//       call id, lease ms.
// Returns {0} when admitted, else {limit, retry after ms}: 1 requests, 2 tokens, 3 calls at once,
// 4 a call of more tokens than a minute allows.
constexpr const char* kAdmitScript = R"lua(
local now = tonumber(ARGV[1])
local function charge(key, limit, cost)
  if limit <= 0 then return 0, nil end
  local step = 60000 / limit
  if cost * step > 60000 then return -1, nil end
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local next_tat = tat + cost * step
  local over = next_tat - now - 60000
  if over > 0 then return over, nil end
  return 0, next_tat
end
local r_over, r_tat = charge(KEYS[1], tonumber(ARGV[2]), 1)
if r_over > 0 then return {1, math.ceil(r_over)} end
local t_over, t_tat = charge(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
if t_over < 0 then return {4, 0} end
if t_over > 0 then return {2, math.ceil(t_over)} end
local calls = tonumber(ARGV[5])
if calls > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= calls then
    return {3, 1000}
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[7]), ARGV[6])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
end
if r_tat then redis.call('SET', KEYS[1], r_tat, 'PX', math.ceil(r_tat - now) + 1000) end
if t_tat then redis.call('SET', KEYS[2], t_tat, 'PX', math.ceil(t_tat - now) + 1000) end
return {0}
)lua";

// Corrects a tokens-per-minute charge by ARGV[3] tokens (negative: a refund).
// KEYS: tokens key. ARGV: now ms, tokens/min, tokens.
constexpr const char* kSettleScript = R"lua(
local now = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
tat = tat + tonumber(ARGV[3]) * 60000 / tonumber(ARGV[2])
if tat <= now then redis.call('DEL', KEYS[1]) return 0 end
redis.call('SET', KEYS[1], tat, 'PX', math.ceil(tat - now) + 1000)
return 0
)lua";

std::string key_of(const char* what, const std::string& account) {
  return std::string("hr:limit:") + what + ":" + account;
}

std::string number(std::optional<int64_t> v) { return std::to_string(v.value_or(0)); }

}  // namespace

// A pooled Redis connection for one scope (null when Redis cannot be reached); a broken one is
// reset by its user and replaced by the next.
struct SyncLimiter::Lent {
  explicit Lent(SyncLimiter* owner) : owner_(owner), client(owner->take()) {}
  ~Lent() { owner_->give_back(std::move(client)); }
  Lent(const Lent&) = delete;
  Lent& operator=(const Lent&) = delete;

 private:
  SyncLimiter* owner_;

 public:
  std::unique_ptr<queue::RedisClient> client;
};

SyncLimiter::SyncLimiter(SyncLimiterOptions options,
                         std::function<Result<SyncLimits>(const std::string&)> load)
    : options_(std::move(options)), load_(std::move(load)) {
  renewer_ = std::thread([this] { renew_loop(); });
}

SyncLimiter::~SyncLimiter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  renewer_.join();
}

std::unique_ptr<queue::RedisClient> SyncLimiter::take() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !idle_.empty() || open_ < options_.pool_size; });
  if (!idle_.empty()) {
    std::unique_ptr<queue::RedisClient> c = std::move(idle_.back());
    idle_.pop_back();
    return c;
  }
  ++open_;
  lock.unlock();
  auto c = queue::RedisClient::connect(options_.redis_url, 1000);
  return c.is_ok() ? std::move(c).value() : nullptr;
}

void SyncLimiter::give_back(std::unique_ptr<queue::RedisClient> client) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (client) {
      idle_.push_back(std::move(client));
    } else {
      --open_;
    }
  }
  cv_.notify_all();
}

SyncLimits SyncLimiter::limits_of(const std::string& account) {
  const int64_t now = SystemClock::instance().now_unix_ms();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = limits_.find(account);
    if (it != limits_.end() && now - it->second.read_ms < options_.limits_cache_ms) {
      return it->second.limits;
    }
  }
  Result<SyncLimits> read = load_(account);
  std::lock_guard<std::mutex> lock(mu_);
  Cached& c = limits_[account];
  if (read.is_ok()) c.limits = *read;
  c.read_ms = now;  // a failed read is tried again after the same while
  return c.limits;
}

std::variant<SyncPermit, SyncRefusal> SyncLimiter::admit(const std::string& account,
                                                         int64_t estimated_tokens) {
  SyncPermit permit;
  const SyncLimits limits = limits_of(account);
  if (!limits.any()) return permit;
  const std::string call_id = new_uuid_v4().to_string();
  const int64_t now = SystemClock::instance().now_unix_ms();
  Result<queue::RedisReply> r = Status(StatusCode::kUnavailable, "no connection to Redis");
  {
    Lent lent(this);
    if (lent.client) {
      r = lent.client->command(
          {"EVAL", kAdmitScript, "3", key_of("rpm", account), key_of("tpm", account),
           key_of("calls", account), std::to_string(now), number(limits.requests_per_minute),
           number(limits.tokens_per_minute), std::to_string(estimated_tokens),
           number(limits.concurrent), call_id, std::to_string(options_.lease_ms)});
      if (!r.is_ok()) lent.client.reset();  // broken: a new one next time
    }
  }
  if (r.is_ok() && r->is_error()) r = Status(StatusCode::kUnavailable, "redis EVAL: " + r->str);
  if (!r.is_ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    (void)pacer_.failed("api.sync_limits_unavailable", r.status());
    return permit;  // let it through: see the header
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pacer_.succeeded();
  }
  const int64_t code = r->elements.empty() ? 0 : r->elements[0].integer;
  if (code != 0) {
    const int64_t retry_ms = r->elements.size() > 1 ? r->elements[1].integer : 1000;
    SyncRefusal refusal;
    refusal.retry_after_s = static_cast<int>(std::max<int64_t>(1, (retry_ms + 999) / 1000));
    switch (code) {
      case 1:
        refusal.status =
            Status(StatusCode::kResourceExhausted,
                   "Rate limit reached: at most " + number(limits.requests_per_minute) +
                       " sync requests per minute for this account",
                   "sync_requests_per_minute");
        break;
      case 2:
        refusal.status = Status(StatusCode::kResourceExhausted,
                                "Rate limit reached: at most " + number(limits.tokens_per_minute) +
                                    " sync tokens (prompt and max_tokens) per minute for this "
                                    "account",
                                "sync_tokens_per_minute");
        break;
      case 3:
        refusal.status = Status(StatusCode::kResourceExhausted,
                                "Too many sync requests at once: at most " +
                                    number(limits.concurrent) + " for this account",
                                "max_concurrent_sync");
        break;
      default:
        refusal.retry_after_s = 0;
        refusal.status = Status(
            StatusCode::kInvalidArgument,
            "this request may use " + std::to_string(estimated_tokens) +
                " tokens (its prompt and max_tokens), more than the account's " +
                number(limits.tokens_per_minute) + " sync tokens per minute: lower max_tokens",
            "max_tokens");
        break;
    }
    return refusal;
  }
  permit.limiter_ = this;
  permit.account_ = account;
  permit.estimate_ = estimated_tokens;
  permit.tpm_ = limits.tokens_per_minute.value_or(0);
  if (limits.concurrent) {
    permit.call_id_ = call_id;
    std::lock_guard<std::mutex> lock(mu_);
    live_[call_id] = account;
  }
  return permit;
}

void SyncLimiter::release(SyncPermit& permit) {
  if (permit.call_id_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(permit.call_id_);
  }
  Lent lent(this);
  if (!lent.client) return;  // its lease lapses
  if (!lent.client->command({"ZREM", key_of("calls", permit.account_), permit.call_id_}).is_ok()) {
    lent.client.reset();
  }
}

void SyncLimiter::settle(SyncPermit& permit, int64_t tokens) {
  if (permit.tpm_ <= 0 || tokens == permit.estimate_) return;
  Lent lent(this);
  if (!lent.client) return;
  if (!lent.client
           ->command({"EVAL", kSettleScript, "1", key_of("tpm", permit.account_),
                      std::to_string(SystemClock::instance().now_unix_ms()),
                      std::to_string(permit.tpm_), std::to_string(tokens - permit.estimate_)})
           .is_ok()) {
    lent.client.reset();
  }
}

// Every third of a lease, this process's calls in progress get a new lease end (ZADD XX: a call
// released meanwhile is not added back).
void SyncLimiter::renew_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, options_.lease_ms / 3)),
                 [&] { return stop_; });
    if (stop_ || live_.empty()) continue;
    std::map<std::string, std::vector<std::string>> per_account;
    for (const auto& [call, account] : live_) per_account[account].push_back(call);
    lock.unlock();
    {
      Lent lent(this);
      const std::string until =
          std::to_string(SystemClock::instance().now_unix_ms() + options_.lease_ms);
      for (const auto& [account, calls] : per_account) {
        if (!lent.client) break;
        std::vector<std::string> cmd = {"ZADD", key_of("calls", account), "XX"};
        for (const std::string& c : calls) cmd.insert(cmd.end(), {until, c});
        std::vector<std::vector<std::string>> both = {
            cmd, {"PEXPIRE", key_of("calls", account), std::to_string(options_.lease_ms)}};
        if (!lent.client->pipeline(both).is_ok()) lent.client.reset();
      }
    }
    lock.lock();
  }
}

SyncPermit& SyncPermit::operator=(SyncPermit&& other) noexcept {
  if (this != &other) {
    if (limiter_) limiter_->release(*this);
    limiter_ = std::exchange(other.limiter_, nullptr);
    account_ = std::move(other.account_);
    call_id_ = std::move(other.call_id_);
    estimate_ = other.estimate_;
    tpm_ = other.tpm_;
    settled_ = other.settled_;
  }
  return *this;
}

SyncPermit::~SyncPermit() {
  if (limiter_) limiter_->release(*this);
}

void SyncPermit::settle(int64_t tokens) {
  if (!limiter_ || settled_) return;
  settled_ = true;
  limiter_->settle(*this, tokens);
}

}  // namespace hr::api
