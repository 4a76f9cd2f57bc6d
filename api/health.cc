// Health and metrics: GET /healthz (the process answers), GET /readyz (Postgres and Redis
// answer), GET /metrics (Prometheus text, with the queue depth per model from Postgres). None needs
// a key; however many callers there are, each check runs once at a time.
#include "api/internal/api_impl.h"
#include "base/log.h"
#include "base/metrics.h"
#include "queue/store.h"

namespace hr::api {

namespace beast_http = boost::beast::http;

Status SharedCheck::run(const std::function<Status()>& check) {
  std::unique_lock<std::mutex> lock(mu_);
  if (running_) {
    const uint64_t seen = finished_;
    cv_.wait(lock, [&] { return finished_ != seen; });
    return last_;
  }
  running_ = true;
  lock.unlock();
  Status result;
  try {
    result = check();
  } catch (const std::exception& e) {
    result = internal_error(e.what());
  }
  lock.lock();
  last_ = result;
  running_ = false;
  ++finished_;
  cv_.notify_all();
  return result;
}
http::HttpResponse Api::Impl::metrics_page() {
  // The handlers' database connections as this scrape found them (before it borrowed one).
  const int lent = pool->lent(), open = pool->open();
  const char* kPoolHelp =
      "Postgres connections of the API's handlers: lent to a request, or open and idle";
  metrics::gauge("headroom_api_db_connections", kPoolHelp, "state=\"lent\"").set(lent);
  metrics::gauge("headroom_api_db_connections", kPoolHelp, "state=\"idle\"").set(open - lent);
  Status st = database_check.run([this] { return read_queue_depth(); });
  metrics::gauge("headroom_metrics_database_up", "Whether the queue depth could be read")
      .set(st.is_ok() ? 1 : 0);
  http::HttpResponse res = http::json_response(200, metrics::render());
  res.set(beast_http::field::content_type, "text/plain; version=0.0.4");
  return res;
}

Status Api::Impl::read_queue_depth() {
  Result<std::vector<queue::PendingRequests>> pending = [&] {
    queue::PgPool::Bound quick(pool.get(), kQuickDbCall);
    return pool->with_connection<std::vector<queue::PendingRequests>>(
        [](pqxx::connection& c) { return queue::pending_requests_by_model(c); });
  }();
  if (pending.status().code() == StatusCode::kUnavailable) {
    pool->drop();
  } else {
    pool->release();
  }
  if (!pending.is_ok()) return pending.status();
  for (const queue::PendingRequests& p : *pending) {
    metrics::gauge("headroom_async_pending_requests",
                   "Requests of unfinished batches not yet ended (queued or running)",
                   "model=\"" + p.model + "\"")
        .set(static_cast<double>(p.num_pending));
  }
  return Status::ok();
}

Status Api::Impl::ping_redis() {
  if (!probe_redis) {
    auto r = queue::RedisClient::connect(store.redis_url, 1000);
    if (!r.is_ok()) return r.status();
    probe_redis = std::move(r).value();
  }
  auto pong = probe_redis->command({"PING"});
  if (!pong.is_ok()) pong = probe_redis->command({"PING"});  // stale (Redis restarted): reconnects
  return pong.status();
}

http::HttpResponse Api::Impl::readyz() {
  const Status pg = database_check.run([this] { return read_queue_depth(); });
  const Status rs = redis_check.run([this] { return ping_redis(); });
  // Anyone may ask: the answer says what is down, the log says why (the errors name hosts and
  // ports, which are not the public's to know).
  if (!pg.is_ok()) log::warn("api.readyz_postgres", {{"error", pg.message()}});
  if (!rs.is_ok()) log::warn("api.readyz_redis", {{"error", rs.message()}});
  json checks = {{"postgres", pg.is_ok() ? "ok" : "unavailable"},
                 {"redis", rs.is_ok() ? "ok" : "unavailable"}};
  const bool ok = pg.is_ok() && rs.is_ok();
  return http::json_response(ok ? 200 : 503, json{{"ready", ok}, {"checks", checks}}.dump());
}

}  // namespace hr::api
