// Load samples from workers' announced totals.
#include "api/load_sampler.h"

#include <algorithm>
#include <set>

#include "base/metrics.h"

namespace hr::api {

std::optional<double> histogram_quantile(const std::vector<double>& bounds,
                                         const std::vector<uint64_t>& cumulative, double q) {
  const size_t n = std::min(bounds.size(), cumulative.size());
  if (n == 0 || cumulative[n - 1] == 0) return std::nullopt;
  const double rank = q * static_cast<double>(cumulative[n - 1]);
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<double>(cumulative[i]) < rank) continue;
    const double lo = i == 0 ? 0 : bounds[i - 1];
    const double below = i == 0 ? 0 : static_cast<double>(cumulative[i - 1]);
    const double in_bucket = static_cast<double>(cumulative[i]) - below;
    if (in_bucket <= 0) return lo;
    return lo + (bounds[i] - lo) * (rank - below) / in_bucket;
  }
  return bounds[n - 1];
}

namespace {

bool restarted(const queue::WorkerTotals& before, const queue::WorkerTotals& now) {
  if (before.started_ms != now.started_ms) return true;
  if (now.sync_tokens < before.sync_tokens || now.async_tokens < before.async_tokens ||
      now.credits_granted < before.credits_granted ||
      now.sync_ttft.size() != before.sync_ttft.size()) {
    return true;
  }
  for (size_t i = 0; i < now.sync_ttft.size(); ++i) {
    if (now.sync_ttft[i] < before.sync_ttft[i]) return true;
  }
  return false;
}

}  // namespace

LoadSample LoadSampler::add(int64_t t_ms, const std::vector<queue::WorkerInfo>& workers,
                            const std::map<std::string, int64_t>& open_by_model) {
  LoadSample s;
  s.t_ms = t_ms;
  const std::vector<double>& bounds = metrics::latency_buckets();
  std::vector<uint64_t> ttft(bounds.size(), 0);  // cumulative, summed over the workers
  std::set<std::string> live;
  int64_t kv_used = 0;
  int64_t kv_total = 0;
  now_.clear();
  for (const queue::WorkerInfo& w : workers) {
    const std::string key = w.model + "\n" + w.id;
    live.insert(key);
    auto it = seen_.find(key);
    if (it == seen_.end() || restarted(it->second.totals, w.totals)) {
      Seen first;
      first.heartbeat_ms = w.heartbeat_ms;
      first.totals = w.totals;
      it = seen_.insert_or_assign(key, std::move(first)).first;
    } else if (w.heartbeat_ms > it->second.heartbeat_ms) {
      Seen& was = it->second;
      const double dt = static_cast<double>(w.heartbeat_ms - was.heartbeat_ms) / 1000.0;
      was.sync_tokens_per_s = (w.totals.sync_tokens - was.totals.sync_tokens) / dt;
      was.async_tokens_per_s = (w.totals.async_tokens - was.totals.async_tokens) / dt;
      was.credits_per_s = (w.totals.credits_granted - was.totals.credits_granted) / dt;
      was.ttft_delta.assign(w.totals.sync_ttft.size(), 0);
      for (size_t i = 0; i < w.totals.sync_ttft.size(); ++i) {
        was.ttft_delta[i] = w.totals.sync_ttft[i] - was.totals.sync_ttft[i];
      }
      was.heartbeat_ms = w.heartbeat_ms;
      was.totals = w.totals;
    }
    const Seen& seen = it->second;
    s.sync_tokens_per_s += seen.sync_tokens_per_s;
    s.async_tokens_per_s += seen.async_tokens_per_s;
    s.credits_per_s += seen.credits_per_s;
    if (seen.ttft_delta.size() == ttft.size()) {
      for (size_t i = 0; i < ttft.size(); ++i) ttft[i] += seen.ttft_delta[i];
    }
    s.running[w.model] += w.async_running;
    s.utilization += w.utilization;
    kv_used += std::max(0, w.total_kv_blocks - w.free_kv_blocks);
    kv_total += w.total_kv_blocks;
    now_.push_back({w, seen.credits_per_s});
  }
  for (auto it = seen_.begin(); it != seen_.end();) {  // workers gone: forgotten
    it = live.count(it->first) ? std::next(it) : seen_.erase(it);
  }
  s.workers = static_cast<int>(workers.size());
  if (!workers.empty()) s.utilization /= static_cast<double>(workers.size());
  if (kv_total > 0) s.kv_used = static_cast<double>(kv_used) / static_cast<double>(kv_total);
  if (auto p = histogram_quantile(bounds, ttft, 0.5)) s.sync_ttft_p50_ms = *p * 1000;
  if (auto p = histogram_quantile(bounds, ttft, 0.99)) s.sync_ttft_p99_ms = *p * 1000;
  for (const auto& [model, open] : open_by_model) {
    auto r = s.running.find(model);
    s.queued[model] = std::max<int64_t>(0, open - (r == s.running.end() ? 0 : r->second));
  }
  return s;
}

}  // namespace hr::api
