// The worker's Prometheus metrics: per request class (sync, async) the latencies and token counts
// of each request, timed from its events; and the step loop's own counters and gauges (credits,
// pulls, steps, preemptions, prefix cache, KV cache, utilization). Registered once per process;
// worker_totals() sums them up for the heartbeat.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/metrics.h"
#include "engine/engine.h"
#include "queue/registry.h"

namespace hr::workers {

// Request metrics of one class (sync or async).
struct ClassMetrics {
  explicit ClassMetrics(const std::string& cls);
  std::string labels;
  metrics::Histogram& ttft;
  metrics::Histogram& itl;
  metrics::Histogram& e2e;
  metrics::Histogram& queue;
  metrics::Counter& prompt;
  metrics::Counter& cached;
  metrics::Counter& generated;
  metrics::Gauge& running;
  metrics::Gauge& waiting;
};

ClassMetrics& class_metrics(engine::RequestClass cls);

// Wraps a request's event callback so its tokens and its end are timed from `arrival_ns`.
std::function<void(const engine::TokenEvent&)> timed(
    std::function<void(const engine::TokenEvent&)> inner, engine::RequestClass cls,
    int64_t arrival_ns);

// The step loop's metrics.
struct LoopMetrics {
  LoopMetrics();
  // What the last step, admissions and cancellations left in the engine.
  void publish(const engine::Engine& eng);
  metrics::Counter& credits_granted;
  metrics::Counter& pulled;
  metrics::Counter& steps;
  metrics::Histogram& step_seconds;  // each step's time: what --step-timeout-seconds is set from
  metrics::Counter& preemptions;
  metrics::Counter& prefix_queries;
  metrics::Counter& prefix_hits;
  metrics::Gauge& kv_used;
  metrics::Gauge& kv_total;
  metrics::Gauge& kv_usage;
  metrics::Gauge& utilization;
  metrics::Counter& braked;
  metrics::Counter& streams_cancelled;
  metrics::Counter& calls_cancelled;
  metrics::Counter& flex_expired;
};

// The process's totals since it started, announced with each heartbeat.
queue::WorkerTotals worker_totals();

}  // namespace hr::workers
