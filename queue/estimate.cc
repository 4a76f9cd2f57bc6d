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

double QueueEstimate::others_done(const std::vector<std::pair<int64_t, double>>& others,
                                  double weight, double x) {
  double done = 0;
  for (const auto& [work, w] : others) {
    done += std::min(static_cast<double>(work), w * x / weight);
  }
  return done;
}

std::optional<QueueEstimate::Outlook> QueueEstimate::outlook(const std::string& id,
                                                             double rate_per_s) const {
  auto it = std::find_if(batches_.begin(), batches_.end(),
                         [&](const OpenBatch& b) { return b.id == id; });
  if (it == batches_.end()) return std::nullopt;
  // One pass: each other batch counts in both measures, by requests not ended and not sent.
  Side remaining, queued;
  std::map<std::string, std::pair<std::pair<int64_t, int64_t>, double>> others;
  for (const OpenBatch& b : batches_) {
    if (&b == &*it) continue;
    const int64_t r = std::max<int64_t>(0, b.remaining), q = std::max<int64_t>(0, b.queued);
    if (b.account_id != it->account_id) {
      auto& o = others[b.account_id];
      o.first.first += r;
      o.first.second += q;
      o.second = b.weight;
    } else if (rank(b) < rank(*it)) {
      remaining.ahead += r;
      queued.ahead += q;
    } else if (rank(b) == rank(*it)) {
      remaining.alike.push_back(r);
      queued.alike.push_back(q);
    }
  }
  for (const auto& [account, o] : others) {
    if (o.second <= 0) continue;
    if (o.first.first > 0) remaining.others.emplace_back(o.first.first, o.second);
    if (o.first.second > 0) queued.others.emplace_back(o.first.second, o.second);
  }
  const double weight = it->weight > 0 ? it->weight : 1;
  Outlook out;
  if (rate_per_s > 0) {
    const int64_t own = std::max<int64_t>(0, it->remaining);
    double x = static_cast<double>(remaining.ahead + own);
    for (int64_t a : remaining.alike) x += static_cast<double>(std::min(a, own));
    out.seconds = (x + others_done(remaining.others, weight, x)) / rate_per_s;
  }
  out.positions.ahead = queued.ahead;
  out.positions.alike = std::move(queued.alike);
  out.positions.weight = weight;
  out.positions.others = std::move(queued.others);
  return out;
}

std::optional<double> QueueEstimate::seconds_to_finish(const std::string& id,
                                                       double rate_per_s) const {
  std::optional<Outlook> o = outlook(id, rate_per_s);
  return o ? o->seconds : std::nullopt;
}

std::optional<QueueEstimate::Positions> QueueEstimate::positions(const std::string& id) const {
  std::optional<Outlook> o = outlook(id, 0);
  if (!o) return std::nullopt;
  return std::move(o->positions);
}

int64_t QueueEstimate::Positions::at(int64_t j) const {
  double x = static_cast<double>(ahead + j);
  for (int64_t a : alike) x += static_cast<double>(std::min(a, j));
  return static_cast<int64_t>(std::floor(x + others_done(others, weight, x)));
}

}  // namespace hr::queue
