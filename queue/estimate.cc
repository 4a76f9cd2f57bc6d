// The fair-share forecast of a batch's end and its requests' places.
#include "queue/estimate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace hr::queue {

namespace {

// The order of an account's batches, as the relay's (queue/fair_share.cc): priority (higher
// first), then a deadline (earliest first) before none.
std::tuple<int, bool, int64_t> rank(const OpenBatch& b) {
  return {-b.priority, !b.deadline_ms.has_value(), b.deadline_ms.value_or(0)};
}

}  // namespace

QueueEstimate::QueueEstimate(std::vector<OpenBatch> batches) : batches_(std::move(batches)) {}

std::optional<QueueEstimate::Split> QueueEstimate::split(const std::string& id, bool queued) const {
  auto it = std::find_if(batches_.begin(), batches_.end(),
                         [&](const OpenBatch& b) { return b.id == id; });
  if (it == batches_.end()) return std::nullopt;
  Split s;
  s.batch = &*it;
  std::map<std::string, std::pair<int64_t, double>> others;
  for (const OpenBatch& b : batches_) {
    const int64_t work = std::max<int64_t>(0, queued ? b.queued : b.remaining);
    if (&b == s.batch) continue;
    if (b.account_id != it->account_id) {
      auto& o = others[b.account_id];
      o.first += work;
      o.second = b.weight;
    } else if (rank(b) < rank(*it)) {
      s.ahead += work;
    } else if (rank(b) == rank(*it)) {
      s.alike.push_back(work);
    }
  }
  for (auto& [account, o] : others) {
    if (o.first > 0 && o.second > 0) s.others.push_back(o);
  }
  return s;
}

double QueueEstimate::others_done(const std::vector<std::pair<int64_t, double>>& others,
                                  double weight, double x) {
  double done = 0;
  for (const auto& [work, w] : others) {
    done += std::min(static_cast<double>(work), w * x / weight);
  }
  return done;
}

std::optional<double> QueueEstimate::seconds_to_finish(const std::string& id,
                                                       double rate_per_s) const {
  if (!(rate_per_s > 0)) return std::nullopt;
  std::optional<Split> s = split(id, /*queued=*/false);
  if (!s) return std::nullopt;
  const int64_t own = std::max<int64_t>(0, s->batch->remaining);
  double x = static_cast<double>(s->ahead + own);
  for (int64_t a : s->alike) x += static_cast<double>(std::min(a, own));
  const double weight = s->batch->weight > 0 ? s->batch->weight : 1;
  return (x + others_done(s->others, weight, x)) / rate_per_s;
}

std::optional<QueueEstimate::Positions> QueueEstimate::positions(const std::string& id) const {
  std::optional<Split> s = split(id, /*queued=*/true);
  if (!s) return std::nullopt;
  Positions p;
  p.ahead = s->ahead;
  p.alike = std::move(s->alike);
  p.weight = s->batch->weight > 0 ? s->batch->weight : 1;
  p.others = std::move(s->others);
  return p;
}

int64_t QueueEstimate::Positions::at(int64_t j) const {
  double x = static_cast<double>(ahead + j);
  for (int64_t a : alike) x += static_cast<double>(std::min(a, j));
  return static_cast<int64_t>(std::floor(x + others_done(others, weight, x)));
}

}  // namespace hr::queue
