// Batch forecasts from a per-model view read once a second.
#include "api/queue_forecasts.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "queue/open_work.h"

namespace hr::api {

namespace {

// How long the view's reads may take (a frozen database or Redis must not hold up a poll).
constexpr std::chrono::milliseconds kReadLimit{500};
constexpr int64_t kRedisRetryNs = 5'000'000'000;

std::string unix_seconds(int64_t unix_ms) { return std::to_string(unix_ms / 1000); }

}  // namespace

QueueForecasts::QueueForecasts(queue::PgPool* pool, std::string redis_url, int64_t refresh_ms)
    : pool_(pool), redis_url_(std::move(redis_url)), refresh_ns_(refresh_ms * 1'000'000) {}

QueueForecasts::~QueueForecasts() = default;

std::optional<double> QueueForecasts::read_rate(const std::string& model) {
  std::lock_guard<std::mutex> lock(redis_mu_);
  if (!redis_) {
    if (steady_now_ns() < redis_retry_ns_) return std::nullopt;
    auto c = queue::RedisClient::connect(redis_url_, static_cast<int>(kReadLimit.count()));
    if (!c.is_ok()) {
      redis_retry_ns_ = steady_now_ns() + kRedisRetryNs;
      return std::nullopt;
    }
    redis_ = std::move(c).value();
  }
  Result<std::optional<double>> r = queue::read_model_rate(*redis_, model);
  if (!r.is_ok()) {
    redis_.reset();
    redis_retry_ns_ = steady_now_ns() + kRedisRetryNs;
    return std::nullopt;
  }
  return *r;
}

QueueForecasts::View QueueForecasts::view_of(const std::string& model, int64_t needed_unix_ms) {
  const int64_t started_unix_ms = SystemClock::instance().now_unix_ms();
  {
    std::lock_guard<std::mutex> lock(mu_);
    View& v = views_[model];
    const bool stale =
        steady_now_ns() - v.fetched_ns >= refresh_ns_ || v.fetched_unix_ms < needed_unix_ms;
    // One caller reads a stale view again; the others use what there is meanwhile.
    if (!stale || v.fetching) return v;
    v.fetching = true;
  }
  std::optional<double> rate = read_rate(model);
  Result<std::vector<queue::OpenBatch>> batches = [&] {
    queue::PgPool::Bound quick(pool_, kReadLimit);
    return pool_->with_connection<std::vector<queue::OpenBatch>>(
        [&](pqxx::connection& c) { return queue::read_open_batches(c, model); });
  }();
  std::lock_guard<std::mutex> lock(mu_);
  View& v = views_[model];
  v.fetching = false;
  v.fetched_ns = steady_now_ns();
  v.fetched_unix_ms = started_unix_ms;
  v.rate = rate;
  if (batches.is_ok()) {
    v.estimate = std::make_shared<const queue::QueueEstimate>(std::move(batches).value());
  } else {
    v.estimate.reset();
    log::debug("forecast.read_failed", {{"model", model}, {"error", batches.status()}});
  }
  return v;
}

std::optional<BatchForecast> QueueForecasts::forecast(const std::string& model,
                                                      const std::string& batch_id,
                                                      int64_t created_unix_ms) {
  View v = view_of(model, 0);
  auto find = [&](const View& view) -> std::optional<BatchForecast> {
    if (!view.estimate || !view.rate) return std::nullopt;
    std::optional<queue::QueueEstimate::Outlook> o = view.estimate->outlook(batch_id, *view.rate);
    if (!o || !o->seconds) return std::nullopt;
    BatchForecast f;
    f.rate_per_s = *view.rate;
    f.completion_at_ms =
        SystemClock::instance().now_unix_ms() + static_cast<int64_t>(std::ceil(*o->seconds * 1000));
    f.positions = std::move(o->positions);
    return f;
  };
  if (auto f = find(v)) return f;
  if (!v.estimate || !v.rate || v.fetched_unix_ms >= created_unix_ms) return std::nullopt;
  return find(view_of(model, created_unix_ms));  // submitted since the view was read
}

void QueueForecasts::describe(const BatchForecast& f, const std::optional<int64_t>& deadline_ms,
                              nlohmann::json* out) {
  (*out)["estimated_completion_at"] = (f.completion_at_ms + 500) / 1000;  // to the nearest second
  if (deadline_ms && f.completion_at_ms > *deadline_ms) {
    char rate[32];
    std::snprintf(rate, sizeof(rate), "%.1f", f.rate_per_s);
    (*out)["warnings"] = nlohmann::json::array(
        {{{"code", "deadline_at_risk"},
          {"message", "at the model's current throughput (" + std::string(rate) +
                          " requests/s, shared with the work queued ahead) this batch is "
                          "estimated to finish at " +
                          unix_seconds(f.completion_at_ms) + ", after its deadline " +
                          unix_seconds(*deadline_ms) +
                          " (unix seconds); requests not started by the deadline expire"}}});
  }
}

}  // namespace hr::api
