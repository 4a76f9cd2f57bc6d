// The operator's view of the deployment (GET /v1/operator/stats): a thread samples the load every
// interval (api/load_sampler.h: live workers from the registry, open requests from Postgres) and
// keeps the last hour of samples in memory; the route answers them with the live workers.
//
// Each API process samples on its own: its history starts when it started. Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/load_sampler.h"

namespace hr::api {

struct OperatorStatsOptions {
  std::string database_url;
  std::string redis_url;
  std::vector<std::string> models;  // whose workers are sampled
  int interval_ms = 5000;
  int window_s = 3600;  // samples older than this are dropped
};

class OperatorStats {
 public:
  explicit OperatorStats(OperatorStatsOptions options);
  ~OperatorStats();  // stops and joins the thread
  OperatorStats(const OperatorStats&) = delete;
  OperatorStats& operator=(const OperatorStats&) = delete;

  // The samples, oldest first, and the live workers of the last one (the route's result).
  nlohmann::json view() const;
  // Workers in this process (`serve`), sampled with those the registry holds (null: none). Once
  // this returns, the sampling thread no longer calls the previous function: what it reads may
  // go away.
  void set_local_workers(std::function<std::vector<queue::WorkerInfo>()> local);

 private:
  void loop();

  OperatorStatsOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<LoadSample> samples_;
  std::vector<WorkerLoadNow> workers_;
  std::mutex local_mu_;  // held while local_ is replaced or called
  std::function<std::vector<queue::WorkerInfo>()> local_;
  std::thread thread_;
};

}  // namespace hr::api
