// The worker's metrics.
#include "workers/worker_metrics.h"

#include <memory>
#include <utility>

#include "base/clock.h"

namespace hr::workers {

ClassMetrics::ClassMetrics(const std::string& cls)
    : labels("class=\"" + cls + "\""),
      ttft(metrics::histogram("headroom_time_to_first_token_seconds",
                              "Time from arrival at the worker to the first generated token",
                              labels)),
      itl(metrics::histogram("headroom_inter_token_latency_seconds",
                             "Time between consecutive generated tokens", labels)),
      e2e(metrics::histogram("headroom_e2e_latency_seconds",
                             "Time from arrival at the worker to the last token", labels)),
      queue(metrics::histogram("headroom_queue_time_seconds",
                               "Sync: waiting for the step loop; async: from batch submit to "
                               "being pulled by a worker",
                               labels)),
      prompt(metrics::counter("headroom_prompt_tokens_total", "Prompt tokens of finished requests",
                              labels)),
      cached(metrics::counter("headroom_cached_prompt_tokens_total",
                              "Prompt tokens served from the prefix cache", labels)),
      generated(metrics::counter("headroom_generation_tokens_total",
                                 "Generated tokens of finished requests", labels)),
      running(metrics::gauge("headroom_requests_running", "Requests in the engine, generating",
                             labels)),
      waiting(metrics::gauge("headroom_requests_waiting",
                             "Requests in the engine, waiting to be scheduled", labels)) {}

ClassMetrics& class_metrics(engine::RequestClass cls) {
  static ClassMetrics sync("sync");
  static ClassMetrics async("async");
  return cls == engine::RequestClass::kSync ? sync : async;
}

std::function<void(const engine::TokenEvent&)> timed(
    std::function<void(const engine::TokenEvent&)> inner, engine::RequestClass cls,
    int64_t arrival_ns) {
  auto last_ns = std::make_shared<int64_t>(0);
  ClassMetrics* m = &class_metrics(cls);
  const char* cls_name = cls == engine::RequestClass::kSync ? "sync" : "async";
  return
      [inner = std::move(inner), last_ns, m, arrival_ns, cls_name](const engine::TokenEvent& ev) {
        int64_t now = steady_now_ns();
        if (ev.token >= 0) {
          if (*last_ns == 0) {
            m->ttft.observe(static_cast<double>(now - arrival_ns) / 1e9);
          } else {
            m->itl.observe(static_cast<double>(now - *last_ns) / 1e9);
          }
          *last_ns = now;
        }
        if (ev.finished) {
          m->e2e.observe(static_cast<double>(now - arrival_ns) / 1e9);
          m->prompt.add(ev.usage.prompt_tokens);
          m->cached.add(ev.usage.cached_tokens);
          m->generated.add(ev.usage.completion_tokens);
          metrics::counter("headroom_requests_finished_total", "Requests that left the engine",
                           std::string("class=\"") + cls_name + "\",reason=\"" +
                               engine::finish_reason_name(ev.finish_reason) + "\"")
              .add();
        }
        inner(ev);
      };
}

namespace {

metrics::Counter& credits_counter() {
  return metrics::counter("headroom_async_credits_granted_total",
                          "Async requests the worker had headroom to pull");
}

}  // namespace

queue::WorkerTotals worker_totals() {
  static const int64_t started_ms = SystemClock::instance().now_unix_ms();
  queue::WorkerTotals t;
  t.started_ms = started_ms;
  t.sync_tokens = class_metrics(engine::RequestClass::kSync).generated.value();
  t.async_tokens = class_metrics(engine::RequestClass::kAsync).generated.value();
  t.credits_granted = credits_counter().value();
  const metrics::Histogram& ttft = class_metrics(engine::RequestClass::kSync).ttft;
  t.sync_ttft.reserve(ttft.bounds().size());
  for (size_t i = 0; i < ttft.bounds().size(); ++i) t.sync_ttft.push_back(ttft.cumulative(i));
  return t;
}

LoopMetrics::LoopMetrics()
    : credits_granted(credits_counter()),
      pulled(
          metrics::counter("headroom_async_pulled_total", "Async requests pulled from the queue")),
      steps(metrics::counter("headroom_engine_steps_total", "Engine steps run")),
      step_seconds(metrics::histogram("headroom_engine_step_seconds",
                                      "Time of each engine step, planning to its tokens")),
      preemptions(
          metrics::counter("headroom_preemptions_total",
                           "Async sequences preempted to make room for sync or catch-up ones")),
      prefix_queries(metrics::counter("headroom_prefix_cache_queries_total",
                                      "Full prompt blocks looked up in the prefix cache")),
      prefix_hits(metrics::counter("headroom_prefix_cache_hits_total",
                                   "Full prompt blocks found in the prefix cache")),
      kv_used(metrics::gauge("headroom_kv_cache_blocks_used", "KV cache blocks in use")),
      kv_total(metrics::gauge("headroom_kv_cache_blocks_total", "KV cache blocks")),
      kv_usage(metrics::gauge("headroom_kv_cache_usage_ratio", "Fraction of the KV cache in use")),
      utilization(metrics::gauge(
          "headroom_device_utilization_ratio",
          "Busy fraction of the device (engine steps, or NVML on a GPU), smoothed over ~1 s")),
      braked(metrics::counter("headroom_async_pulls_braked_total",
                              "Times the utilization brake (--max-utilization) held back a pull")),
      streams_cancelled(metrics::counter("headroom_streams_cancelled_total",
                                         "Streamed answers stopped because the client went away")),
      calls_cancelled(
          metrics::counter("headroom_sync_calls_cancelled_total",
                           "Sync answers (not streamed) stopped because the client went away")),
      flex_expired(metrics::counter(
          "headroom_flex_expired_total",
          "service_tier flex calls answered 429 resource_unavailable: not started in time")) {}

void LoopMetrics::publish(const engine::Engine& eng) {
  engine::Headroom h = eng.headroom();
  ClassMetrics& sync = class_metrics(engine::RequestClass::kSync);
  ClassMetrics& async = class_metrics(engine::RequestClass::kAsync);
  sync.running.set(h.running_sync);
  sync.waiting.set(h.waiting_sync);
  async.running.set(h.running_async);
  async.waiting.set(h.waiting_async);
  int used = h.total_kv_blocks - h.free_kv_blocks;
  kv_used.set(used);
  kv_total.set(h.total_kv_blocks);
  kv_usage.set(h.total_kv_blocks > 0 ? static_cast<double>(used) / h.total_kv_blocks : 0);
  prefix_queries.set_total(static_cast<double>(eng.blocks().num_prefix_queries()));
  prefix_hits.set_total(static_cast<double>(eng.blocks().num_prefix_hit_blocks()));
}

}  // namespace hr::workers
