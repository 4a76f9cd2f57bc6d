// Forecasts shown on a batch while it is open (docs/fair-share.md): when it should finish
// (`estimated_completion_at`), where its queued requests stand (`queue_position`), and a warning
// when its deadline looks out of reach. From the model's open batches (Postgres) and its
// throughput (published by the dispatcher in Redis), read at most once a second per model and
// shared by every call: a poll costs no query of its own. Best effort: when either cannot be read
// in time, or no throughput is known yet, a batch has no forecast and nothing else changes.
// Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "queue/estimate.h"
#include "queue/pg_pool.h"
#include "queue/redis.h"

namespace hr::api {

struct BatchForecast {
  int64_t completion_at_ms = 0;  // estimated, wall clock
  double rate_per_s = 0;         // the model's throughput it was made with
  std::optional<queue::QueueEstimate::Positions> positions;
};

class QueueForecasts {
 public:
  QueueForecasts(queue::PgPool* pool, std::string redis_url, int64_t refresh_ms = 1000);
  ~QueueForecasts();

  // The forecast for open batch `batch_id` of `model`, created at `created_unix_ms` (or just
  // before: a view read before then is read again); none when there is none to give.
  std::optional<BatchForecast> forecast(const std::string& model, const std::string& batch_id,
                                        int64_t created_unix_ms);

  // The fields a batch's answers carry: estimated_completion_at (unix seconds) and, when the
  // forecast passes `deadline_ms`, a warning saying so (both shapes' "warnings").
  static void describe(const BatchForecast& f, const std::optional<int64_t>& deadline_ms,
                       nlohmann::json* out);

 private:
  struct View {
    std::shared_ptr<const queue::QueueEstimate> estimate;
    std::optional<double> rate;
    int64_t fetched_ns = 0;
    int64_t fetched_unix_ms = 0;
    bool fetching = false;
  };
  // The model's view, read again when older than refresh_ms or read before `needed_unix_ms`.
  View view_of(const std::string& model, int64_t needed_unix_ms);
  std::optional<double> read_rate(const std::string& model);

  queue::PgPool* pool_;
  std::string redis_url_;
  int64_t refresh_ns_;
  std::mutex mu_;
  std::map<std::string, View> views_;  // guarded by mu_
  std::mutex redis_mu_;
  std::unique_ptr<queue::RedisClient> redis_;  // guarded by redis_mu_
  int64_t redis_retry_ns_ = 0;                 // guarded by redis_mu_: no connect before then
};

}  // namespace hr::api
