// LoadSampler: rates and percentiles from workers' announced totals, restarts, the queue's depth.
#include "api/load_sampler.h"

#include <gtest/gtest.h>

#include "base/metrics.h"

namespace hr::api {
namespace {

queue::WorkerInfo worker(const std::string& id, int64_t heartbeat_ms, double sync_tokens,
                         double async_tokens, double credits) {
  queue::WorkerInfo w;
  w.id = id;
  w.model = "m";
  w.heartbeat_ms = heartbeat_ms;
  w.totals.started_ms = 1000;
  w.totals.sync_tokens = sync_tokens;
  w.totals.async_tokens = async_tokens;
  w.totals.credits_granted = credits;
  w.totals.sync_ttft.assign(metrics::latency_buckets().size(), 0);
  return w;
}

// Adds `n` sync first tokens of `seconds` to the worker's cumulative TTFT counts.
void add_ttft(queue::WorkerInfo& w, double seconds, uint64_t n) {
  const auto& bounds = metrics::latency_buckets();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (seconds <= bounds[i]) w.totals.sync_ttft[i] += n;
  }
}

TEST(HistogramQuantileTest, InterpolatesWithinTheBucketHoldingTheRank) {
  const std::vector<double> bounds = {1, 2, 4};
  EXPECT_EQ(histogram_quantile(bounds, {0, 0, 0}, 0.5), std::nullopt);
  EXPECT_DOUBLE_EQ(*histogram_quantile(bounds, {0, 10, 10}, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(*histogram_quantile(bounds, {10, 10, 20}, 0.75), 3.0);
  EXPECT_DOUBLE_EQ(*histogram_quantile(bounds, {4, 4, 4}, 0.5), 0.5);
}

TEST(LoadSamplerTest, RatesComeFromTwoAnnouncementsOfEachWorker) {
  LoadSampler sampler;
  queue::WorkerInfo a = worker("a", 10'000, 0, 0, 0);
  LoadSample first = sampler.add(10'000, {a}, {});
  EXPECT_EQ(first.workers, 1);
  EXPECT_EQ(first.sync_tokens_per_s, 0);  // one announcement: no rate yet
  EXPECT_EQ(first.sync_ttft_p50_ms, std::nullopt);

  queue::WorkerInfo a2 = worker("a", 12'000, 100, 1000, 40);
  add_ttft(a2, 0.003, 90);  // 90 first tokens in (2 ms, 5 ms], 10 much later
  add_ttft(a2, 0.9, 10);
  LoadSample second = sampler.add(12'100, {a2}, {});
  EXPECT_DOUBLE_EQ(second.sync_tokens_per_s, 50);
  EXPECT_DOUBLE_EQ(second.async_tokens_per_s, 500);
  EXPECT_DOUBLE_EQ(second.credits_per_s, 20);
  ASSERT_TRUE(second.sync_ttft_p50_ms && second.sync_ttft_p99_ms);
  EXPECT_GT(*second.sync_ttft_p50_ms, 1.0);
  EXPECT_LE(*second.sync_ttft_p50_ms, 5.0);
  EXPECT_GT(*second.sync_ttft_p99_ms, 500.0);
  ASSERT_EQ(sampler.workers().size(), 1u);
  EXPECT_DOUBLE_EQ(sampler.workers()[0].credits_per_s, 20);

  // Not announced again since: its last rates stand.
  LoadSample third = sampler.add(12'600, {a2}, {});
  EXPECT_DOUBLE_EQ(third.async_tokens_per_s, 500);
  EXPECT_TRUE(third.sync_ttft_p50_ms.has_value());
}

TEST(LoadSamplerTest, ARestartedWorkerCountsFromItsNewTotals) {
  LoadSampler sampler;
  sampler.add(0, {worker("a", 1000, 0, 0, 0)}, {});
  sampler.add(0, {worker("a", 2000, 0, 300, 0)}, {});
  queue::WorkerInfo restarted = worker("a", 3000, 0, 10, 0);
  restarted.totals.started_ms = 2500;
  LoadSample s = sampler.add(0, {restarted}, {});
  EXPECT_EQ(s.async_tokens_per_s, 0);  // not (10 - 300) / 1 s
  LoadSample next = sampler.add(0, {worker("a", 4000, 0, 110, 0)}, {});
  EXPECT_EQ(next.async_tokens_per_s, 0);  // its start moved back: a restart again
  queue::WorkerInfo later = worker("a", 5000, 0, 210, 0);
  LoadSample after = sampler.add(0, {later}, {});
  EXPECT_DOUBLE_EQ(after.async_tokens_per_s, 100);
}

TEST(LoadSamplerTest, SumsWorkersAndSplitsOpenRequestsIntoQueuedAndRunning) {
  LoadSampler sampler;
  queue::WorkerInfo a = worker("a", 1000, 0, 0, 0);
  a.async_running = 5;
  a.utilization = 1.0;
  a.total_kv_blocks = 100;
  a.free_kv_blocks = 25;
  queue::WorkerInfo b = worker("b", 1000, 0, 0, 0);
  b.async_running = 3;
  b.utilization = 0.5;
  b.total_kv_blocks = 100;
  b.free_kv_blocks = 75;
  LoadSample s = sampler.add(1000, {a, b}, {{"m", 20}, {"other", 4}});
  EXPECT_EQ(s.workers, 2);
  EXPECT_DOUBLE_EQ(s.utilization, 0.75);
  EXPECT_DOUBLE_EQ(s.kv_used, 0.5);
  EXPECT_EQ(s.running.at("m"), 8);
  EXPECT_EQ(s.queued.at("m"), 12);
  EXPECT_EQ(s.queued.at("other"), 4);

  // A worker gone is forgotten: back later, it starts without a rate.
  sampler.add(2000, {a}, {});
  queue::WorkerInfo b_back = worker("b", 3000, 0, 500, 0);
  LoadSample back = sampler.add(3000, {b_back}, {});
  EXPECT_EQ(back.async_tokens_per_s, 0);
}

}  // namespace
}  // namespace hr::api
