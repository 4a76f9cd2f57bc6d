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
  // Given to an account far behind its share (catch_up_below): to start at once, ahead of the
  // others' work already running (docs/fair-share.md, "A newcomer starts at once").
  bool catch_up = false;
};

// Splits `room` among the accounts' batches. The grants come in the order given, in pieces of
// about `room / 64` at most, so that pushing them in that order interleaves the accounts in the
// stream. A batch may appear in several grants.
// With `catch_up_below` > 0, what an account gets while its work in flight per weight is below
// that fraction of another account's, or all it gets when it is still below once everything is
// given, is marked catch_up (a newcomer's, say, or one back from idle): an account near its
// share never is, so two saturating accounts never preempt each other.
std::vector<ShareGrant> share_room(const std::vector<ShareAccount>& accounts, int64_t room,
                                   double catch_up_below = 0);

// An entry waiting in the stream (not yet delivered to a worker), with its batch's account (empty
// when unknown).
struct WaitingEntry {
  std::string entry_id;
  std::string batch_id;
  std::string account_id;
  int idx = 0;
};

// The waiting entries to take back (indices into `waiting`, which is in stream order) so that an
// account owed a place among them (a newcomer, say) need not wait for the others' entries ahead
// of it to drain: the entries that can be taken back (those of the accounts' batches) are shared
// as share_room would share them, and when an account's share exceeds what it holds by
// `min_deficit` (or half its share, if less) while another holds more than its share, all of
// them are taken back, to be pushed again shared and interleaved. None otherwise.
// The accounts' in_flight and their batches' in_flight include their waiting entries.
std::vector<size_t> entries_to_withdraw(const std::vector<ShareAccount>& accounts,
                                        const std::vector<WaitingEntry>& waiting,
                                        int64_t min_deficit);

}  // namespace hr::queue
