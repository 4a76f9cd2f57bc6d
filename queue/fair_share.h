// The relay's choice of what enters a model's ready-queue (its Redis stream) when there is room for
// `room` more entries: weighted fair share over accounts, then an order over each account's
// batches. Pure: the dispatcher gathers the inputs (docs/fair-share.md).
//
// Across accounts: each unit of room goes to the account with the least work in flight (entries in
// the stream, waiting or leased) per unit of weight, counting what this pass already gave it.
// Work-conserving: an account with nothing left to send drops out and its share goes to the
// others. Since a worker runs every leased request at once (continuous batching: one token per
// running sequence per step), equal work in flight per weight is equal decode tokens per weight.
//
// Within an account: strictly by priority (higher first), then batches with a deadline before
// those without, earliest first; batches alike in both share by least work in flight, then the
// oldest. Priority orders an account's own batches only: raising it buys nothing against others.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hr::queue {

struct ShareBatch {
  std::string id;
  int priority = 0;
  std::optional<int64_t> deadline_ms;  // none: no deadline
  int64_t in_flight = 0;               // its entries in the stream
  int64_t remaining = 0;               // requests not yet sent
};

struct ShareAccount {
  std::string id;
  double weight = 1;      // > 0
  int64_t in_flight = 0;  // every entry of the account in the stream, of any batch
  std::vector<ShareBatch> batches;
};

struct ShareGrant {
  std::string batch_id;
  int64_t count = 0;
};

// Splits `room` among the accounts' batches. The grants come in the order given, in pieces of
// about `room / 64` at most, so that pushing them in that order interleaves the accounts in the
// stream. A batch may appear in several grants.
std::vector<ShareGrant> share_room(const std::vector<ShareAccount>& accounts, int64_t room);

}  // namespace hr::queue
