// The operator's view: a sampling thread and its last hour.
#include "api/operator_stats.h"

#include <pqxx/pqxx>

#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "queue/open_work.h"
#include "queue/pg.h"

namespace hr::api {

using nlohmann::json;

namespace {

json opt(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json sample_json(const LoadSample& s) {
  return {{"t", static_cast<double>(s.t_ms) / 1000},
          {"sync_tokens_per_s", s.sync_tokens_per_s},
          {"async_tokens_per_s", s.async_tokens_per_s},
          {"sync_ttft_p50_ms", opt(s.sync_ttft_p50_ms)},
          {"sync_ttft_p99_ms", opt(s.sync_ttft_p99_ms)},
          {"credits_per_s", s.credits_per_s},
          {"queued", s.queued},
          {"running", s.running},
          {"workers", s.workers},
          {"utilization", s.utilization},
          {"kv_used", s.kv_used}};
}

json worker_json(const WorkerLoadNow& w) {
  const queue::WorkerInfo& i = w.info;
  return {{"id", i.id},
          {"model", i.model},
          {"url", i.url},
          {"capacity", i.capacity},
          {"sync_load", i.sync_load},
          {"async_running", i.async_running},
          {"utilization", i.utilization},
          {"kv_used_blocks", std::max(0, i.total_kv_blocks - i.free_kv_blocks)},
          {"kv_total_blocks", i.total_kv_blocks},
          {"credits_per_s", w.credits_per_s},
          {"draining", i.draining},
          {"heartbeat_at", static_cast<double>(i.heartbeat_ms) / 1000}};
}

}  // namespace

OperatorStats::OperatorStats(OperatorStatsOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { loop(); });
}

OperatorStats::~OperatorStats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

json OperatorStats::view() const {
  std::lock_guard<std::mutex> lock(mu_);
  json samples = json::array();
  for (const LoadSample& s : samples_) samples.push_back(sample_json(s));
  json workers = json::array();
  for (const WorkerLoadNow& w : workers_) workers.push_back(worker_json(w));
  return {{"interval_s", static_cast<double>(options_.interval_ms) / 1000},
          {"window_s", options_.window_s},
          {"now", static_cast<double>(SystemClock::instance().now_unix_ms()) / 1000},
          {"models", options_.models},
          {"samples", std::move(samples)},
          {"workers", std::move(workers)}};
}

void OperatorStats::set_local_workers(std::function<std::vector<queue::WorkerInfo>()> local) {
  std::lock_guard<std::mutex> lock(local_mu_);
  local_ = std::move(local);
}

void OperatorStats::loop() {
  LoadSampler sampler;
  std::unique_ptr<pqxx::connection> db;
  std::unique_ptr<queue::WorkerRegistry> registry;
  const size_t keep = static_cast<size_t>(
      std::max<int64_t>(1, int64_t{options_.window_s} * 1000 / options_.interval_ms));
  bool warned = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    // What cannot be read now is left out of this sample (and connected again for the next).
    if (!db) {
      auto c = queue::pg_connect(options_.database_url);
      if (c.is_ok()) db = std::move(c).value();
    }
    if (!registry) {
      auto r = queue::WorkerRegistry::connect(options_.redis_url);
      if (r.is_ok()) registry = std::move(r).value();
    }
    std::map<std::string, int64_t> open;
    std::vector<queue::WorkerInfo> workers;
    Status failed = Status::ok();
    if (db) {
      auto o = queue::open_requests_by_model(*db);
      if (o.is_ok()) {
        open = std::move(o).value();
      } else {
        failed = o.status();
        db.reset();
      }
    }
    {
      std::lock_guard<std::mutex> guard(local_mu_);
      if (local_) workers = local_();
    }
    for (const std::string& model : options_.models) {
      if (!registry) break;
      auto live = registry->live(model);
      if (!live.is_ok()) {
        failed = live.status();
        registry.reset();
        break;
      }
      for (queue::WorkerInfo& w : *live) {
        const bool known = std::any_of(workers.begin(), workers.end(), [&](const auto& o) {
          return o.model == w.model && o.id == w.id;
        });
        if (!known) workers.push_back(std::move(w));
      }
    }
    if ((!db || !registry || !failed.is_ok()) && !warned) {
      log::warn("operator_stats.sample_incomplete",
                {{"error", failed.is_ok() ? Status(StatusCode::kUnavailable,
                                                   "Postgres or Redis cannot be reached")
                                          : failed}});
    }
    warned = !db || !registry || !failed.is_ok();
    LoadSample s = sampler.add(SystemClock::instance().now_unix_ms(), workers, open);
    lock.lock();
    samples_.push_back(std::move(s));
    while (samples_.size() > keep) samples_.pop_front();
    workers_ = sampler.workers();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.interval_ms), [&] { return stop_; });
  }
}

}  // namespace hr::api
