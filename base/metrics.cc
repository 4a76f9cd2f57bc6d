// The metrics registry.
#include "base/metrics.h"

#include <cstdio>

namespace hr::metrics {
namespace {

void atomic_add(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

struct Family {
  std::string help;
  std::string type;  // counter, gauge, histogram
  std::vector<double> bounds;
  std::map<std::string, std::unique_ptr<Counter>> counters;
  std::map<std::string, std::unique_ptr<Gauge>> gauges;
  std::map<std::string, std::unique_ptr<Histogram>> histograms;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Family> families;  // guarded by mu; series addresses are stable
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may update at exit
  return *r;
}

Family& family(const std::string& name, const std::string& help, const char* type) {
  Family& f = registry().families[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  return f;
}

std::string series(const std::string& name, const std::string& labels,
                   const std::string& extra = "") {
  std::string all = labels;
  if (!extra.empty()) all += (all.empty() ? "" : ",") + extra;
  return all.empty() ? name : name + "{" + all + "}";
}

}  // namespace

void Counter::add(double v) { atomic_add(value_, v); }
void Counter::set_total(double v) { value_.store(v, std::memory_order_relaxed); }
void Gauge::add(double v) { atomic_add(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i] = 0;
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  atomic_add(sum_, v);
}

uint64_t Histogram::cumulative(size_t i) const {
  uint64_t n = 0;
  for (size_t k = 0; k <= i && k <= bounds_.size(); ++k)
    n += buckets_[k].load(std::memory_order_relaxed);
  return n;
}

const std::vector<double>& latency_buckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
  return b;
}

Counter& counter(const std::string& name, const std::string& help, const std::string& labels) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto& slot = family(name, help, "counter").counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& gauge(const std::string& name, const std::string& help, const std::string& labels) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto& slot = family(name, help, "gauge").gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& histogram(const std::string& name, const std::string& help, const std::string& labels,
                     const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> lock(registry().mu);
  Family& f = family(name, help, "histogram");
  if (f.bounds.empty()) f.bounds = bounds;
  auto& slot = f.histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(f.bounds);
  return *slot;
}

std::string render() {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::string out;
  for (const auto& [name, f] : registry().families) {
    out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n";
    for (const auto& [labels, c] : f.counters) {
      out += series(name, labels) + " " + number(c->value()) + "\n";
    }
    for (const auto& [labels, g] : f.gauges) {
      out += series(name, labels) + " " + number(g->value()) + "\n";
    }
    for (const auto& [labels, h] : f.histograms) {
      for (size_t i = 0; i < h->bounds().size(); ++i) {
        out += series(name + "_bucket", labels, "le=\"" + number(h->bounds()[i]) + "\"") + " " +
               std::to_string(h->cumulative(i)) + "\n";
      }
      out +=
          series(name + "_bucket", labels, "le=\"+Inf\"") + " " + std::to_string(h->count()) + "\n";
      out += series(name + "_sum", labels) + " " + number(h->sum()) + "\n";
      out += series(name + "_count", labels) + " " + std::to_string(h->count()) + "\n";
    }
  }
  return out;
}

}  // namespace hr::metrics
