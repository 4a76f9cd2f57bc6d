// Live workers in Redis: each worker announces itself (its model, the URL of its sync endpoint and
// its current load) with a heartbeat, and the API reads the live ones for a model to route sync
// requests. A worker that stops heartbeating (killed, partitioned) drops out after `ttl_ms`.
//
// Keys: hr:worker:{model}:{id} holds the worker's JSON with a TTL; hr:workers:{model} is a sorted
// set of ids scored by the time their entry expires, so a lookup reads one range and one MGET.
// Not thread-safe: one WorkerRegistry per thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/redis.h"

namespace hr::queue {

// What a worker's process has counted since it started; two announcements give rates (the
// dashboard's operator view).
struct WorkerTotals {
  int64_t started_ms = 0;      // when the counting began: a restarted worker counts from 0 again
  double sync_tokens = 0;      // generated for sync requests
  double async_tokens = 0;     // generated for async requests
  double credits_granted = 0;  // headroom credits granted to pull async requests
  // Sync requests' times to their first token: cumulative counts at metrics::latency_buckets().
  std::vector<uint64_t> sync_ttft;
};

struct WorkerInfo {
  std::string id;  // unique among the model's workers (the worker name)
  std::string model;
  std::string url;    // base URL of its sync endpoint, e.g. http://10.0.0.5:7001
  int capacity = 0;   // sync requests it runs at once (the engine's sequence slots)
  int sync_load = 0;  // sync requests it holds now, running or waiting
  int async_running = 0;
  int free_kv_blocks = 0;
  int total_kv_blocks = 0;
  double utilization = 0;    // busy fraction of its device, 0..1
  bool draining = false;     // stopping: takes no new sync requests
  int64_t heartbeat_ms = 0;  // wall clock of the announcement
  WorkerTotals totals;

  nlohmann::json to_json() const;
  static Result<WorkerInfo> from_json(const nlohmann::json& j);
};

// The live workers of `model`, in no particular order, on a caller's connection (what
// WorkerRegistry::live reads). Also forgets expired ids.
[[nodiscard]] Result<std::vector<WorkerInfo>> live_workers(RedisClient& redis,
                                                           const std::string& model);
// The ids of `model`'s live workers that are not draining, sorted: where the relay may send a
// worker's own work (cache-aware dispatch).
[[nodiscard]] Result<std::vector<std::string>> live_worker_ids(RedisClient& redis,
                                                               const std::string& model);

class WorkerRegistry {
 public:
  [[nodiscard]] static Result<std::unique_ptr<WorkerRegistry>> connect(const std::string& redis_url,
                                                                       int timeout_ms = 2000);
  // Announces (or refreshes) `w`; it counts as live for `ttl_ms` from now.
  [[nodiscard]] Status announce(const WorkerInfo& w, int ttl_ms);
  // Removes the worker at once (a clean stop).
  [[nodiscard]] Status withdraw(const std::string& model, const std::string& id);
  // The live workers of `model`, in no particular order. Also forgets expired ids.
  [[nodiscard]] Result<std::vector<WorkerInfo>> live(const std::string& model);

 private:
  explicit WorkerRegistry(std::unique_ptr<RedisClient> redis) : redis_(std::move(redis)) {}
  std::unique_ptr<RedisClient> redis_;
};

}  // namespace hr::queue
