// Bounded-load rendezvous placement of the relay's pushes.
#include "queue/affinity_routing.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "base/hash.h"

namespace hr::queue {

uint64_t routing_key(std::string_view account_id, int64_t affinity) {
  return mix64(fnv1a64(account_id) ^ static_cast<uint64_t>(affinity));
}

std::vector<int> route_by_affinity(const std::vector<std::optional<uint64_t>>& keys,
                                   const std::vector<std::string>& workers,
                                   std::vector<int64_t>* waiting, int64_t cap) {
  std::vector<int> out(keys.size(), kSharedStream);
  if (workers.empty()) return out;
  waiting->resize(workers.size(), 0);
  std::unordered_map<uint64_t, std::vector<int>> ranks;  // key → workers, best first
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!keys[i]) continue;
    auto [it, fresh] = ranks.try_emplace(*keys[i]);
    std::vector<int>& order = it->second;
    if (fresh) {
      const std::string key = std::to_string(*keys[i]);
      std::vector<uint64_t> score(workers.size());
      for (size_t w = 0; w < workers.size(); ++w) score[w] = rendezvous_score(key, workers[w]);
      order.resize(workers.size());
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return score[a] != score[b] ? score[a] > score[b] : a < b; });
    }
    for (int w : order) {
      if ((*waiting)[w] < cap) {
        ++(*waiting)[w];
        out[i] = w;
        break;
      }
    }
  }
  return out;
}

int64_t worker_stream_cap(int64_t window, int num_workers) {
  if (num_workers <= 0) return 0;
  return std::max<int64_t>(1, (window * 5 + 4LL * num_workers - 1) / (4LL * num_workers));
}

}  // namespace hr::queue
