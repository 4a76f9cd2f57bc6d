// The API's state shared by its route files (api.cc, sync_routes.cc, async_routes.cc, health.cc):
// configuration, the database pool, the key cache and the health checks, and the helpers the
// routes share. Private to api/.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "api/api.h"
#include "api/errors.h"
#include "api/key_revocations.h"
#include "api/openai_batch.h"
#include "api/operator_stats.h"
#include "api/queue_forecasts.h"
#include "api/response_slots.h"
#include "api/sync_limits.h"
#include "api/webhooks_api.h"
#include "base/token_bucket.h"
#include "queue/pg_pool.h"
#include "queue/redis.h"
#include "queue/store.h"

namespace hr::api {

using nlohmann::json;

// Errors in the project's shape, or in OpenAI's on the OpenAI routes.
enum class ErrorShape { kWorkersAi, kOpenAi };

// The routes of OpenAI's API answer errors in OpenAI's shape (what its SDKs parse).
bool is_openai_path(std::string_view path);
http::HttpResponse shaped_error(const Status& st, ErrorShape shape);
std::map<std::string, std::string> parse_query(std::string_view q);
// obj[key] as a flag: absent, null or not a boolean is false.
bool flag(const json& obj, const char* key);

// A check that callers without a key may ask for (/readyz, /metrics): one caller at a time runs
// it, and those who arrive meanwhile take its answer, so that however many callers there are,
// the check runs once at a time (and holds at most one pooled database connection). A check that
// throws answers an internal error, to its caller and to those waiting on it.
class SharedCheck {
 public:
  Status run(const std::function<Status()>& check);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;   // guarded by mu_
  uint64_t finished_ = 0;  // guarded by mu_: checks run to their end
  Status last_;            // guarded by mu_: the answer of the last one
};

// How long a quick database call (a key's lookup, a poll's batch row, a list, the health check)
// may take before it answers 503: a frozen database must not hang the API (queue::PgPool::Bound).
constexpr std::chrono::milliseconds kQuickDbCall{1500};

struct Api::Impl {
  static thread_local int64_t parse_ns_;      // JSON parse time of the current request, for logs
  std::atomic<SyncInference*> sync{nullptr};  // none: sync calls answer 429
  ApiConfig config;
  queue::StoreConfig store;
  WebhookApiContext webhooks;
  std::vector<ModelSpec> models;
  BatchLimits limits;
  std::unique_ptr<OpenAiBatchApi> openai;  // /v1/files and /v1/batches
  // Accounts' limits on sync calls, counted in Redis across API processes.
  std::unique_ptr<SyncLimiter> sync_limits;

  std::mutex auth_mu;
  struct CachedKey {
    std::string account_id;
    int64_t expires_ms;
  };
  std::unordered_map<std::string, CachedKey> auth_cache;  // guarded by auth_mu; key = sha256 hex
  // Keys the database did not know, for 10 s (a client sending a bad key again and again costs
  // one lookup), and the rate at which keys in neither cache are looked up: callers without a
  // key must not be able to load the database (guessing ran 2,582 lookups a second, and real
  // requests slowed from 1 ms to 41 ms); past it they get 429 with Retry-After. Keys already
  // cached are not affected. A revocation empties both caches, a creation the unknown keys.
  std::unordered_map<std::string, int64_t> bad_keys;  // guarded by auth_mu; sha256 hex -> until
  std::unique_ptr<TokenBucket> key_lookups;  // config.key_lookups_per_s, twice that in a burst
  // Unknown keys per client address (config.key_lookups_per_client_per_s): a client whose
  // bucket is empty is not looked up; only keys that turn out bad spend from it.
  std::unordered_map<std::string, std::shared_ptr<TokenBucket>> client_bad_keys;  // auth_mu
  // Empties auth_cache whenever a key is revoked (started last, stopped first).
  std::unique_ptr<KeyRevocationListener> revocations;
  // Large answers in flight per account (config.max_large_answers_per_account).
  std::unique_ptr<ResponseSlots> large_answers;
  // Open batches' forecasts (estimated completion, queue positions).
  std::unique_ptr<QueueForecasts> forecasts;
  // The deployment's load over the last hour (GET /v1/operator/stats).
  std::unique_ptr<OperatorStats> operator_stats;

  // Database connections shared by the handler threads: a thread borrows one on its first query
  // and gives it back when its request is answered, or before it waits on an inference.
  std::unique_ptr<queue::PgPool> pool;
  // /readyz and /metrics: the queue depth read from Postgres (which also shows that it answers),
  // and a ping of Redis over one connection of their own (used inside redis_check only).
  SharedCheck database_check;
  SharedCheck redis_check;
  std::unique_ptr<queue::RedisClient> probe_redis;

  // A database failure as the answer to the client (the connection is dropped when it broke).
  http::HttpResponse db_error(const Status& st, ErrorShape shape = ErrorShape::kWorkersAi) {
    return shaped_error(pool->client_status(st), shape);
  }

  Result<std::string> authenticate(const http::HttpRequest& req);

  const ModelSpec* find_model(const std::string& name) const {
    for (const auto& m : models) {
      if (m.name == name) return &m;
    }
    return nullptr;
  }

  // Answers `req`; a streamed answer's body goes to *stream (nullptr: this caller cannot stream,
  // and stream: true is refused).
  http::HttpResponse handle(const http::HttpRequest& req, http::BodyStream* stream = nullptr);
  http::HttpResponse readyz();
  // The checks behind database_check and redis_check.
  Status read_queue_depth();
  Status ping_redis();
  // Prometheus text: this process's metrics plus the queue depth per model from Postgres.
  http::HttpResponse metrics_page();
  http::HttpResponse run_model(const http::HttpRequest& req, const std::string& account,
                               const std::string& model,
                               const std::map<std::string, std::string>& query,
                               http::BodyStream* stream);
  http::HttpResponse submit(const http::HttpRequest& req, const std::string& account,
                            const ModelSpec& model, const json& body);
  // A large batch's results go out a page at a time through *stream (collected whole when it is
  // null). `query`: include=partial (results while it runs), from=N (responses from the N-th
  // request on) and limit=M (at most M of them): a client reads a big batch's results in pieces
  // and resumes where it stopped.
  http::HttpResponse poll(const std::string& account, const std::string& request_id,
                          const std::map<std::string, std::string>& query,
                          http::BodyStream* stream);
  http::HttpResponse cancel(const std::string& account, const std::string& request_id);
  http::HttpResponse remove(const std::string& account, const std::string& request_id);
  // Not found (saying when, for an expired batch), or the database failure.
  http::HttpResponse missing_or_db_error(const Status& st, const std::string& request_id);
  http::HttpResponse retry(const http::HttpRequest& req, const std::string& account,
                           const std::string& request_id);
  http::HttpResponse list(const std::string& account,
                          const std::map<std::string, std::string>& query);
  // Validates and runs one sync request; on success returns the answer and the normalized body.
  // Refused by the account's sync limits: *retry_after_s says when to try again.
  Result<SyncAnswer> run_sync(const http::HttpRequest& req, const std::string& account,
                              const json& body, const ModelSpec& model, int* retry_after_s);
  // Admits a sync call against the account's limits: its permit, or the answer refusing it
  // (429 with Retry-After naming the limit, in `shape`).
  std::variant<SyncPermit, http::HttpResponse> admit_sync(const std::string& account,
                                                          const wire::ChatRequest& request,
                                                          ErrorShape shape);
  http::HttpResponse chat_completions(const http::HttpRequest& req, const std::string& account);
  http::Reply chat_completions_stream(const http::HttpRequest& req, const std::string& account,
                                      json body);
  // Workers-AI text generation with stream: true: {"response": delta} events, then the usage.
  http::Reply run_model_stream(const http::HttpRequest& req, const std::string& account, json body,
                               const ModelSpec& model);
  // Where and how a sync call runs: the model, the x-session-affinity header, options.rejectIfBusy,
  // and the account (whose prompts alone may share cached prefixes).
  SyncCall sync_call(const http::HttpRequest& req, const std::string& account, const json& body,
                     const ModelSpec& model) const;
  Result<SyncInference*> sync_for(const ModelSpec& model) const;
  http::HttpResponse models_list();
  // GET /v1/operator/stats: for operators' keys only (403 otherwise).
  http::HttpResponse operator_view(const std::string& account);
};

// Gives the thread's database connection back to the pool when it goes out of scope.
struct GiveBack {
  queue::PgPool* pool;
  ~GiveBack() { pool->release(); }
};

}  // namespace hr::api
