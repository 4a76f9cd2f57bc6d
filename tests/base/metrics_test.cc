#include "base/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace hr::metrics {
namespace {

TEST(MetricsTest, RendersPrometheusText) {
  counter("test_things_total", "Things counted", "kind=\"a\"").add(2);
  counter("test_things_total", "ignored: the first help wins", "kind=\"b\"").add();
  gauge("test_level", "A level").set(0.5);
  Histogram& h = histogram("test_seconds", "Durations", "", {0.1, 1});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(7);
  std::string text = render();
  EXPECT_NE(text.find("# HELP test_things_total Things counted\n# TYPE test_things_total counter\n"
                      "test_things_total{kind=\"a\"} 2\ntest_things_total{kind=\"b\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE test_level gauge\ntest_level 0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("test_seconds_bucket{le=\"0.10000000000000001\"} 1\n"
                      "test_seconds_bucket{le=\"1\"} 2\ntest_seconds_bucket{le=\"+Inf\"} 3\n"
                      "test_seconds_sum 7.5499999999999998\ntest_seconds_count 3\n"),
            std::string::npos)
      << text;
}

TEST(MetricsTest, ConcurrentUpdatesAddUp) {
  Counter& c = counter("test_concurrent_total", "Concurrent adds");
  Histogram& h = histogram("test_concurrent_seconds", "Concurrent observations");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.add();
        h.observe(0.002);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
  EXPECT_EQ(h.count(), 40000u);
  EXPECT_NEAR(h.sum(), 80, 1e-6);
  EXPECT_EQ(h.cumulative(0), 0u);      // 1 ms
  EXPECT_EQ(h.cumulative(1), 40000u);  // 2.5 ms
}

}  // namespace
}  // namespace hr::metrics
