// Weighted fair share of a ready-queue's room.
#include "queue/fair_share.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace hr::queue {

namespace {

// The order of an account's batches: priority (higher first), then a deadline (earliest first)
// before none. Batches of one class share by work in flight.
std::tuple<int, bool, int64_t> class_of(const ShareBatch& b) {
  return {-b.priority, !b.deadline_ms.has_value(), b.deadline_ms.value_or(0)};
}

struct AccountState {
  const ShareAccount* account = nullptr;
  std::vector<size_t> order;   // its batches, by class then as given
  std::vector<int64_t> given;  // per batch, this pass
  int64_t given_total = 0;
  int64_t left = 0;  // what its batches still have to send, less what was given

  double load() const {
    return static_cast<double>(account->in_flight + given_total) / account->weight;
  }
};

// The batch of `s` that gets the next piece: the first class with something left, and in it the
// batch with the least in flight (the earliest given on a tie).
size_t next_batch(const AccountState& s) {
  const auto& batches = s.account->batches;
  size_t best = s.order.size();
  for (size_t k = 0; k < s.order.size(); ++k) {
    const size_t i = s.order[k];
    if (batches[i].remaining - s.given[i] <= 0) continue;
    if (best == s.order.size()) {
      best = k;
      continue;
    }
    const size_t b = s.order[best];
    if (class_of(batches[i]) != class_of(batches[b])) break;  // a later class
    if (batches[i].in_flight + s.given[i] < batches[b].in_flight + s.given[b]) best = k;
  }
  return s.order[best];
}

}  // namespace

std::vector<ShareGrant> share_room(const std::vector<ShareAccount>& accounts, int64_t room,
                                   double catch_up_below) {
  std::vector<ShareGrant> out;
  if (room <= 0) return out;
  const int64_t step = std::max<int64_t>(1, room / 64);
  std::vector<AccountState> states;
  for (const ShareAccount& a : accounts) {
    if (!(a.weight > 0)) continue;
    AccountState s;
    s.account = &a;
    s.given.assign(a.batches.size(), 0);
    for (size_t i = 0; i < a.batches.size(); ++i) {
      if (a.batches[i].remaining <= 0) continue;
      s.order.push_back(i);
      s.left += a.batches[i].remaining;
    }
    std::stable_sort(s.order.begin(), s.order.end(), [&](size_t x, size_t y) {
      return class_of(a.batches[x]) < class_of(a.batches[y]);
    });
    // (Those with nothing to send stay: their load counts against the others' catching up.)
    states.push_back(std::move(s));
  }
  // What the most loaded other account held before this pass, per account (catch-up's measure).
  std::vector<double> most_before(states.size(), 0);
  for (size_t k = 0; k < states.size() && catch_up_below > 0; ++k) {
    for (size_t o = 0; o < states.size(); ++o) {
      if (o == k) continue;
      const ShareAccount& other = *states[o].account;
      most_before[k] =
          std::max(most_before[k], static_cast<double>(other.in_flight) / other.weight);
    }
  }
  while (room > 0) {
    AccountState* pick = nullptr;
    for (AccountState& s : states) {
      if (s.left <= 0) continue;
      if (!pick || s.load() < pick->load()) pick = &s;
    }
    if (!pick) break;  // nothing left to send
    const size_t i = next_batch(*pick);
    const ShareBatch& b = pick->account->batches[i];
    int64_t n = std::min({step, b.remaining - pick->given[i], room});
    // Far behind what another account held before this pass: this piece, up to where it no
    // longer is, catches up. (Not against what the pass gives: accounts starting together from
    // nothing are not behind each other.)
    bool catch_up = false;
    if (catch_up_below > 0) {
      const double most = most_before[static_cast<size_t>(pick - states.data())];
      const double below = catch_up_below * most * pick->account->weight -
                           static_cast<double>(pick->account->in_flight + pick->given_total);
      if (below > 0) {
        catch_up = true;
        n = std::min(n, static_cast<int64_t>(std::ceil(below)));
      }
    }
    pick->given[i] += n;
    pick->given_total += n;
    pick->left -= n;
    room -= n;
    if (!out.empty() && out.back().batch_id == b.id && out.back().catch_up == catch_up) {
      out.back().count += n;
    } else {
      out.push_back({b.id, n, catch_up});
    }
  }
  // Still far behind once all is given (a newcomer whose whole batch fits, say): all of it.
  if (catch_up_below > 0) {
    std::map<std::string, bool> behind;  // batch → its account is
    for (const AccountState& s : states) {
      double most = 0;
      for (const AccountState& o : states) {
        if (&o != &s) most = std::max(most, o.load());
      }
      if (s.load() < catch_up_below * most) {
        for (const ShareBatch& b : s.account->batches) behind[b.id] = true;
      }
    }
    for (ShareGrant& g : out) g.catch_up = g.catch_up || behind.count(g.batch_id) > 0;
  }
  return out;
}

std::vector<size_t> entries_to_withdraw(const std::vector<ShareAccount>& accounts,
                                        const std::vector<WaitingEntry>& waiting,
                                        int64_t min_deficit) {
  std::map<std::string, std::pair<size_t, size_t>> where;  // batch → {account, batch} positions
  std::map<std::string, size_t> account_at;
  for (size_t a = 0; a < accounts.size(); ++a) {
    account_at[accounts[a].id] = a;
    for (size_t b = 0; b < accounts[a].batches.size(); ++b) {
      where[accounts[a].batches[b].id] = {a, b};
    }
  }
  // How the waiting entries that can be taken back would be shared if they were pushed now (what
  // arrives later goes behind them either way); every waiting entry counts to what its account
  // holds.
  std::vector<ShareAccount> unwaited = accounts;
  std::vector<int64_t> held(accounts.size(), 0);     // every waiting entry of the account
  std::vector<int64_t> movable(accounts.size(), 0);  // those of batches looked at
  int64_t total = 0;
  for (const WaitingEntry& e : waiting) {
    auto owner = account_at.find(e.account_id);
    if (owner != account_at.end()) ++held[owner->second];
    auto it = where.find(e.batch_id);
    if (it == where.end()) continue;
    auto [a, b] = it->second;
    ++movable[a];
    ShareBatch& batch = unwaited[a].batches[b];
    --batch.in_flight;
    ++batch.remaining;
    --unwaited[a].in_flight;
    ++total;
  }
  std::vector<int64_t> share(accounts.size(), 0);
  for (const ShareGrant& g : share_room(unwaited, total)) share[where[g.batch_id].first] += g.count;
  // Taken back only when one account is owed entries that another holds (and could give).
  bool owed = false;
  bool over = false;
  for (size_t a = 0; a < accounts.size(); ++a) {
    const int64_t threshold = std::max<int64_t>(1, std::min(min_deficit, share[a] / 2));
    owed = owed || share[a] - held[a] >= threshold;
    over = over || movable[a] > share[a];
  }
  std::vector<size_t> out;
  if (!owed || !over) return out;
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (where.count(waiting[i].batch_id)) out.push_back(i);
  }
  return out;
}

}  // namespace hr::queue
