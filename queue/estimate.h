// When a batch will finish, and where its queued requests stand, if the model's open work is
// shared as the relay shares it (queue/fair_share.h, docs/fair-share.md) at the rate the model's
// workers take work (RelayWindow::saturated_rate_per_s). Pure.
//
// Across accounts the relay keeps equal work in flight per unit of weight, so every account with
// work left progresses at the same rate per weight, and an account drops out when its work is
// done. Then the time until account a has done X of its requests has a closed form:
//     t(X) = (X + sum over other accounts i of min(R_i, w_i * X / w_a)) / rate,
// R_i an account's requests not yet ended, w its weight. Within an account, batches go by
// priority, then deadline; batches alike in both share its progress equally. A batch ends when
// its account has done the batches ahead of it, itself, and as much of each alike batch as its
// own size. A queued request's position is the same sum over requests not yet sent: how many
// of the model's queued requests go to workers before it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hr::queue {

// One open batch of the model.
struct OpenBatch {
  std::string id;
  std::string account_id;
  double weight = 1;  // its account's (> 0)
  int priority = 0;
  std::optional<int64_t> deadline_ms;
  int64_t remaining = 0;  // requests not yet ended (queued or running)
  int64_t queued = 0;     // requests not yet sent to workers
};

class QueueEstimate {
 public:
  explicit QueueEstimate(std::vector<OpenBatch> batches);

  // Seconds until batch `id` ends, at `rate_per_s` requests a second; none when the batch is
  // not among the open ones or the rate is not known (≤ 0).
  std::optional<double> seconds_to_finish(const std::string& id, double rate_per_s) const;

  // Positions of batch `id`'s queued requests. at(j): the position of its j-th request not yet
  // sent (0-based, in the order they are sent): how many queued requests of the model are sent
  // before it (0: next).
  class Positions {
   public:
    int64_t at(int64_t j) const;

   private:
    friend class QueueEstimate;
    int64_t ahead = 0;           // queued requests of the account's batches ahead
    std::vector<int64_t> alike;  // queued requests of each alike batch
    double weight = 1;           // the batch's account's
    std::vector<std::pair<int64_t, double>> others;  // other accounts: {queued, weight}
  };
  std::optional<Positions> positions(const std::string& id) const;

  // Both, from one pass over the open batches (what a poll shows). None when the batch is not
  // among the open ones; `seconds` none when the rate is not known (≤ 0).
  struct Outlook {
    std::optional<double> seconds;
    Positions positions;
  };
  std::optional<Outlook> outlook(const std::string& id, double rate_per_s) const;

 private:
  // The account's share of work done against the other accounts: the sum of min(work_i,
  // w_i * x / w) over the other accounts (`others` = {work, weight}).
  static double others_done(const std::vector<std::pair<int64_t, double>>& others, double weight,
                            double x);
  // The batch's account's batches ahead of it and alike, and the other accounts, counting one
  // measure of work (requests not ended, or not sent).
  struct Side {
    int64_t ahead = 0;
    std::vector<int64_t> alike;
    std::vector<std::pair<int64_t, double>> others;  // per other account: {work, weight}
  };

  std::vector<OpenBatch> batches_;
};

}  // namespace hr::queue
