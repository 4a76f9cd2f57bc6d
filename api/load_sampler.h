// The deployment's load as one sample: rates (tokens a second, headroom credits a second) and the
// sync time-to-first-token percentiles over the time since the last sample, from the totals that
// live workers announce (queue::WorkerTotals), with the queue's depth per model.
//
// A worker's rates come from two of its announcements (its heartbeat's clock, not the
// sampler's); when it has not announced again since the last sample, its last rates stand. A
// worker that restarted (new start time, or a total that went down) counts from its new totals.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "queue/registry.h"

namespace hr::api {

struct WorkerLoadNow {
  queue::WorkerInfo info;
  double credits_per_s = 0;
};

struct LoadSample {
  int64_t t_ms = 0;
  double sync_tokens_per_s = 0;
  double async_tokens_per_s = 0;
  std::optional<double> sync_ttft_p50_ms;  // none: no sync request started lately
  std::optional<double> sync_ttft_p99_ms;
  double credits_per_s = 0;
  std::map<std::string, int64_t> queued;   // async requests waiting, by model
  std::map<std::string, int64_t> running;  // async requests on workers, by model
  int workers = 0;
  double utilization = 0;  // mean over the live workers, 0..1
  double kv_used = 0;      // KV blocks used over all blocks of the live workers, 0..1
};

// The q-quantile (0..1) of a histogram given as cumulative counts at `bounds` (Prometheus'
// histogram_quantile: linear within the bucket holding the rank); none when it counts nothing.
std::optional<double> histogram_quantile(const std::vector<double>& bounds,
                                         const std::vector<uint64_t>& cumulative, double q);

class LoadSampler {
 public:
  // A sample at `t_ms` of the live `workers` and the open requests by model (queued or running).
  LoadSample add(int64_t t_ms, const std::vector<queue::WorkerInfo>& workers,
                 const std::map<std::string, int64_t>& open_by_model);
  // The workers of the last sample, with their credit rates.
  const std::vector<WorkerLoadNow>& workers() const { return now_; }

 private:
  struct Seen {
    int64_t heartbeat_ms = 0;
    queue::WorkerTotals totals;
    double sync_tokens_per_s = 0;
    double async_tokens_per_s = 0;
    double credits_per_s = 0;
    std::vector<uint64_t> ttft_delta;  // counts in the last interval between two announcements
  };
  std::map<std::string, Seen> seen_;  // by model and worker id
  std::vector<WorkerLoadNow> now_;
};

}  // namespace hr::api
