// Process-wide metrics in the Prometheus text format: counters, gauges and histograms, each a
// family (name, help, type) of series told apart by a label set written as `key="value",...`.
// Series are created on first use and live for the process; updates are lock-free atomics, so
// hot paths (every engine step, every token) may update them. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hr::metrics {

class Counter {
 public:
  void add(double v = 1);
  // For totals kept elsewhere (e.g. a cache's hit count): the series follows them.
  void set_total(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] (cumulative, as exposed).
  uint64_t cumulative(size_t i) const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bucket, not cumulative
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0};
};

// Latency buckets in seconds, 1 ms to 60 s.
const std::vector<double>& latency_buckets();

// The series of one family for `labels` (e.g. `class="sync"`; "" for none). The first call for a
// name fixes its help text (and buckets).
Counter& counter(const std::string& name, const std::string& help, const std::string& labels = "");
Gauge& gauge(const std::string& name, const std::string& help, const std::string& labels = "");
Histogram& histogram(const std::string& name, const std::string& help,
                     const std::string& labels = "",
                     const std::vector<double>& bounds = latency_buckets());

// Every family, in the Prometheus text exposition format (version 0.0.4).
std::string render();

}  // namespace hr::metrics
