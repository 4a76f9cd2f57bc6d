// Relay, janitor and resync.
#include "queue/dispatcher.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "base/clock.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/retry_pacer.h"
#include "queue/affinity_routing.h"
#include "queue/fair_share.h"
#include "queue/open_work.h"
#include "queue/openai_batches.h"
#include "queue/pg.h"
#include "queue/registry.h"
#include "queue/store.h"
#include "queue/stream.h"

namespace hr::queue {

Result<std::unique_ptr<Dispatcher>> Dispatcher::create(const std::string& database_url,
                                                       const std::string& redis_url,
                                                       DispatcherOptions options) {
  HR_RETURN_IF_ERROR(pg_connect(database_url).status());  // fail fast when unreachable
  HR_ASSIGN_OR_RETURN(auto redis, RedisClient::connect(redis_url));
  // A Redis that may evict keys can evict a stream: that is noticed (ensure_stream) and costs a
  // resend of everything queued for the model. Managed services may refuse CONFIG; then say
  // nothing.
  auto policy = redis->command({"CONFIG", "GET", "maxmemory-policy"});
  if (policy.is_ok() && policy->elements.size() == 2 && policy->elements[1].str != "noeviction") {
    log::warn(
        "dispatcher.redis_may_evict",
        {{"maxmemory_policy", policy->elements[1].str},
         {"advice", "set maxmemory-policy noeviction: an evicted stream is sent again whole"}});
  }
  return std::unique_ptr<Dispatcher>(
      new Dispatcher(database_url, std::move(redis), std::move(options)));
}

Dispatcher::Dispatcher(std::string database_url, std::unique_ptr<RedisClient> redis,
                       DispatcherOptions options)
    : database_url_(database_url),
      pg_(std::move(database_url)),
      redis_(std::move(redis)),
      options_(std::move(options)) {}

namespace {

// The advisory lock that gives one dispatcher a model to relay: (kRelayLockSpace,
// hashtext(model)). Two models whose names hash alike merely take turns.
constexpr int kRelayLockSpace = 0x4853;

// Holds the advisory lock of one model's relay on the connection `pg` for as long as it lives (if
// it got it); unlocked on every way out, and if the connection broke, the lock went with it.
class RelayLock {
 public:
  // wait: block until the lock is free; else try once.
  RelayLock(pqxx::connection& pg, const std::string& model, bool wait) : pg_(pg), model_(model) {
    pqxx::nontransaction tx(pg_);
    if (wait) {
      tx.exec_params("SELECT pg_advisory_lock($1, hashtext($2))", kRelayLockSpace, model_);
      held_ = true;
    } else {
      held_ = tx.exec_params1("SELECT pg_try_advisory_lock($1, hashtext($2))", kRelayLockSpace,
                              model_)[0]
                  .as<bool>();
    }
  }
  ~RelayLock() {
    if (!held_) return;
    try {
      pqxx::nontransaction tx(pg_);
      tx.exec_params("SELECT pg_advisory_unlock($1, hashtext($2))", kRelayLockSpace, model_);
    } catch (const std::exception&) {
    }
  }
  RelayLock(const RelayLock&) = delete;
  RelayLock& operator=(const RelayLock&) = delete;
  bool held() const { return held_; }

 private:
  pqxx::connection& pg_;
  std::string model_;
  bool held_ = false;
};

// The Redis instance the database last saw (see resync_if_redis_lost); "" before the first.
std::string observed_redis(pqxx::transaction_base& tx, bool lock) {
  pqxx::result r = tx.exec(std::string("SELECT value FROM redis_state WHERE key = 'observed'") +
                           (lock ? " FOR SHARE" : ""));
  return r.empty() ? std::string() : r[0][0].as<std::string>();
}

}  // namespace

Result<int> Dispatcher::rewind(const std::string& model) {
  int rewound = 0;
  Status st = pg_.run("rewind", [&](pqxx::connection& pg) -> Status {
    RelayLock lock(pg, model, /*wait=*/true);
    pqxx::nontransaction tx(pg);
    rewound = static_cast<int>(
        tx.exec_params("UPDATE batches SET num_dispatched = 0 WHERE model = $1 AND finished_at IS "
                       "NULL AND num_dispatched > 0",
                       model)
            .affected_rows());
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return rewound;
}

Result<bool> Dispatcher::ensure_stream(const std::string& model) {
  if (streams_checked_.count(model)) return false;
  HR_ASSIGN_OR_RETURN(bool exists, group_exists(*redis_, model));
  if (exists) {
    streams_checked_.insert(model);
    return false;
  }
  // Only dispatchers create groups, and a batch's cursor moves only after its entries were
  // pushed: a group missing where batches of the model were pushed means that Redis lost the
  // stream (evicted it, say) or its group. Those batches are sent again, and the group is created
  // only once that is recorded, so that a failure in between is retried by the next look.
  // The batches are rewound under the model's relay lock: a relay of it under way finishes first
  // (it may have pushed into the lost stream, its cursors still unmoved when the look began).
  HR_ASSIGN_OR_RETURN(int rewound, rewind(model));
  HR_RETURN_IF_ERROR(create_group(*redis_, model));
  streams_checked_.insert(model);
  if (rewound > 0) log::warn("dispatcher.stream_lost", {{"model", model}, {"batches", rewound}});
  return true;
}

bool Dispatcher::stream_ready(const std::string& model) {
  Result<bool> ensured = ensure_stream(model);
  if (!ensured.is_ok()) {
    log::warn("dispatcher.stream_check_failed", {{"model", model}, {"error", ensured.status()}});
  }
  return ensured.is_ok();
}

// The relay holds no row lock while it talks to Redis: workers update their batches' rows with
// every result, and a slow Redis must not stall them. Instead:
//  - an advisory lock per model, held by the relaying connection, keeps two dispatchers from
//    relaying one model (and so from both filling its window), and a rewind after a lost stream
//    (ensure_stream) from racing a relay;
//  - the cursors move only if no resync happened during the pushes (a resync rewinds every
//    cursor, since what was pushed may be lost): the Redis instance recorded in the database is
//    read before the pushes and again, under FOR SHARE, with the cursors' update. Resync takes it
//    FOR UPDATE, so the two serialise.
// A push whose cursor did not move is pushed again later; a duplicate entry is harmless (a claim
// takes only queued requests).
Result<int> Dispatcher::relay_once() {
  relay_waiting_ = false;
  // Streams first, outside any relay lock (ensure_stream may wait for those of other dispatchers).
  std::set<std::string> models;
  Status st = pg_.run("relay", [&](pqxx::connection& pg) -> Status {
    pqxx::nontransaction tx(pg);
    for (const auto& row : tx.exec(
             "SELECT DISTINCT model FROM batches WHERE num_dispatched < num_total AND status IN "
             "('queued', 'running')")) {
      models.insert(row[0].as<std::string>());
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  std::erase_if(models, [this](const std::string& model) { return !stream_ready(model); });
  int relayed = 0;
  for (const std::string& model : models) {
    HR_ASSIGN_OR_RETURN(int n, relay_model(model));
    relayed += n;
  }
  return relayed;
}

namespace {

// The most batches of one account a relay pass looks at (by priority, deadline, age).
constexpr int kBatchesPerAccount = 16;

// The entries of `key`'s stream not yet delivered to the workers' group, oldest first (at most
// `cap`).
Result<std::vector<WaitingEntry>> waiting_entries(RedisClient& redis, const std::string& key,
                                                  int64_t cap) {
  HR_ASSIGN_OR_RETURN(RedisReply groups, redis.command({"XINFO", "GROUPS", key}));
  if (groups.is_error()) return unavailable("redis XINFO GROUPS: " + groups.str);
  std::string last = "0-0";
  for (const RedisReply& g : groups.elements) {
    bool ours = false;
    std::string delivered;
    for (size_t f = 0; f + 1 < g.elements.size(); f += 2) {
      if (g.elements[f].str == "name") ours = g.elements[f + 1].str == kConsumerGroup;
      if (g.elements[f].str == "last-delivered-id") delivered = g.elements[f + 1].str;
    }
    if (ours && !delivered.empty()) last = delivered;
  }
  HR_ASSIGN_OR_RETURN(
      RedisReply r, redis.command({"XRANGE", key, "(" + last, "+", "COUNT", std::to_string(cap)}));
  if (r.is_error()) return unavailable("redis XRANGE: " + r.str);
  std::vector<WaitingEntry> out;
  for (StreamEntry& e : parse_entries(r)) {
    WaitingEntry w;
    w.entry_id = std::move(e.id);
    w.batch_id = std::move(e.ref.batch_id);
    w.idx = e.ref.idx;
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

namespace {

// The room given to the batches in order of creation (their ids), each whole: first in, first out.
std::vector<ShareGrant> oldest_first(const std::vector<ShareAccount>& accounts, int64_t room) {
  std::vector<const ShareBatch*> batches;
  for (const ShareAccount& a : accounts) {
    for (const ShareBatch& b : a.batches) batches.push_back(&b);
  }
  std::sort(batches.begin(), batches.end(),
            [](const ShareBatch* x, const ShareBatch* y) { return x->id < y->id; });
  std::vector<ShareGrant> out;
  for (const ShareBatch* b : batches) {
    const int64_t n = std::min(room, b->remaining);
    if (n <= 0) continue;
    out.push_back({b->id, n});
    room -= n;
  }
  return out;
}

}  // namespace

Result<std::vector<std::string>> Dispatcher::routable_workers(const std::string& model) {
  LiveWorkers& live = live_[model];
  if (live.read_ns == 0 || steady_now_ns() - live.read_ns >= 1'000'000'000) {
    HR_ASSIGN_OR_RETURN(live.ids, live_worker_ids(*redis_, model));
    live.read_ns = steady_now_ns();
  }
  return live.ids;
}

Result<int> Dispatcher::relay_model(const std::string& model) {
  const std::string key = stream_key(model);
  // The room: the window less what waits undelivered (every entry is waiting or pending), in the
  // shared stream and in the workers' own.
  HR_ASSIGN_OR_RETURN(std::vector<std::string> with_streams, workers_with_streams(*redis_, model));
  std::vector<std::vector<std::string>> size_cmds = {{"XLEN", key},
                                                     {"XPENDING", key, kConsumerGroup}};
  for (const std::string& w : with_streams) {
    size_cmds.push_back({"XLEN", worker_stream_key(model, w)});
    size_cmds.push_back({"XPENDING", worker_stream_key(model, w), kConsumerGroup});
  }
  size_cmds.push_back({"XLEN", catch_up_stream_key(model)});
  size_cmds.push_back({"XPENDING", catch_up_stream_key(model), kConsumerGroup});
  HR_ASSIGN_OR_RETURN(auto sizes, redis_->pipeline(size_cmds));
  auto waiting_in = [&](size_t k) -> Result<int64_t> {
    const RedisReply& len = sizes[2 * k];
    const RedisReply& pend = sizes[2 * k + 1];
    // A worker's stream moved back by the janitor since the listing (or lost: the janitor's
    // reclaim_worker_streams notices), or no catch-up stream yet: empty.
    if (k > 0 && pend.is_error() && pend.str.rfind("NOGROUP", 0) == 0) return 0;
    if (len.is_error() || pend.is_error()) {
      return unavailable("redis XLEN/XPENDING: " + (len.is_error() ? len.str : pend.str));
    }
    const int64_t pending = pend.elements.empty() ? 0 : pend.elements[0].integer;
    return std::max<int64_t>(0, len.integer - pending);
  };
  HR_ASSIGN_OR_RETURN(int64_t waiting, waiting_in(0));
  std::map<std::string, int64_t> waiting_for;  // worker → entries waiting in its own stream
  for (size_t k = 0; k < with_streams.size(); ++k) {
    HR_ASSIGN_OR_RETURN(int64_t n, waiting_in(k + 1));
    waiting_for[with_streams[k]] = n;
    waiting += n;
  }
  HR_ASSIGN_OR_RETURN(int64_t catching_up, waiting_in(with_streams.size() + 1));
  waiting += catching_up;
  std::vector<std::string> routable;
  if (options_.dispatch_by_prefix) {
    HR_ASSIGN_OR_RETURN(routable, routable_workers(model));
  }
  RelayWindow& window = windows_.try_emplace(model, options_.window).first->second;
  window.observe(steady_now_ns(), waiting, std::exchange(pushed_since_[model], 0));
  // The model's throughput, for the API's forecasts (queue/open_work.h), about once a second.
  if (int64_t& published = rate_published_ns_[model];
      window.saturated_rate_per_s() > 0 && steady_now_ns() - published >= 1'000'000'000) {
    published = steady_now_ns();
    Status st = publish_model_rate(*redis_, model, window.saturated_rate_per_s());
    if (!st.is_ok()) return st;
  }
  int64_t room = std::max<int64_t>(
      0, (options_.fair_share ? window.size() : std::numeric_limits<int>::max()) - waiting);
  // Short of room, a pass can only take entries back for a newcomer: that is looked at every
  // newcomer_check_ms, not at every poll.
  const bool short_of_room = room == 0 || (waiting > 0 && room < window.size() / 4);
  int64_t& last_full_pass = last_full_pass_ns_[model];
  if (short_of_room &&
      steady_now_ns() - last_full_pass < int64_t{options_.newcomer_check_ms} * 1000000) {
    relay_waiting_ = true;
    return 0;
  }
  last_full_pass = steady_now_ns();
  int relayed = 0;
  Status st = pg_.run("relay", [&](pqxx::connection& pg) -> Status {
    RelayLock lock(pg, model, /*wait=*/false);
    if (!lock.held()) return Status::ok();  // another dispatcher is relaying the model
    std::string observed;
    std::map<std::string, ShareAccount> accounts;
    std::map<std::string, std::pair<int, int>> cursors;  // batch → {num_dispatched, num_total}
    std::map<std::string, std::string> account_of;       // batch → account, of those read
    {
      pqxx::read_transaction tx(pg);
      observed = observed_redis(tx, false);
      // Every open batch of the model with requests in flight (sent and not ended: waiting in
      // the stream or leased; a request put back in the queue is pushed again outside the
      // cursor and is still in flight), and the first batches of each account with requests
      // still to send.
      for (const auto& row : tx.exec_params(
               "SELECT id::text, account_id::text, weight, priority, deadline_ms, num_dispatched, "
               "num_total, in_flight, due, n FROM ("
               "  SELECT b.id, b.account_id, a.weight, b.priority, b.num_dispatched, b.num_total, "
               "    (extract(epoch FROM b.deadline) * 1000)::bigint AS deadline_ms, "
               "    greatest(0, b.num_dispatched - b.num_completed - b.num_failed - "
               "      b.num_cancelled - b.num_expired) AS in_flight, d.due, "
               "    row_number() OVER (PARTITION BY b.account_id, d.due "
               "      ORDER BY b.priority DESC, b.deadline NULLS LAST, b.id) AS n "
               "  FROM batches b JOIN accounts a ON a.id = b.account_id, "
               "    LATERAL (SELECT b.num_dispatched < b.num_total "
               "      AND b.status IN ('queued', 'running') AS due) d "
               "  WHERE b.model = $1 AND b.finished_at IS NULL) o "
               "WHERE (due AND n <= $2) OR in_flight > 0",
               model, kBatchesPerAccount)) {
        ShareAccount& a = accounts[row[1].as<std::string>()];
        a.id = row[1].as<std::string>();
        account_of[row[0].as<std::string>()] = a.id;
        a.weight = row[2].as<double>();
        a.in_flight += row[7].as<int64_t>();
        if (!row[8].as<bool>()) continue;  // all sent: counts only as work in flight
        // The last batch of an account that is looked at may have more behind it.
        if (row[9].as<int64_t>() == kBatchesPerAccount) relay_waiting_ = true;
        ShareBatch b;
        b.id = row[0].as<std::string>();
        b.priority = row[3].as<int>();
        if (!row[4].is_null()) b.deadline_ms = row[4].as<int64_t>();
        b.remaining = row[6].as<int>() - row[5].as<int>();
        b.in_flight = row[7].as<int64_t>();
        cursors[b.id] = {row[5].as<int>(), row[6].as<int>()};
        a.batches.push_back(std::move(b));
      }
    }
    std::vector<ShareAccount> shares;
    for (auto& [id, a] : accounts) shares.push_back(std::move(a));
    // When an account holds more of the waiting entries than its share, they are taken back and
    // pushed again shared and interleaved, so that a newcomer need not wait for them to drain:
    // cursors first (a crash after it only duplicates entries), then the entries.
    // The entries waiting in the shared stream and in the workers' own: a newcomer's requests
    // routed to a worker's stream would otherwise start behind the others' waiting there.
    int64_t withdrawn = 0;
    if (options_.fair_share && shares.size() > 1 && waiting > 0) {
      std::vector<WaitingEntry> entries;
      std::vector<std::string> stream_of;  // alongside entries
      std::vector<std::string> streams = {key};
      for (const std::string& w : with_streams) {
        if (waiting_for[w] > 0) streams.push_back(worker_stream_key(model, w));
      }
      for (const std::string& stream : streams) {
        HR_ASSIGN_OR_RETURN(std::vector<WaitingEntry> some,
                            waiting_entries(*redis_, stream, 2 * window.size()));
        for (WaitingEntry& e : some) {
          entries.push_back(std::move(e));
          stream_of.push_back(stream);
        }
      }
      for (WaitingEntry& e : entries) {
        if (auto it = account_of.find(e.batch_id); it != account_of.end())
          e.account_id = it->second;
      }
      const std::vector<size_t> back =
          entries_to_withdraw(shares, entries, std::max<int64_t>(1, window.size() / 8));
      if (!back.empty()) {
        std::map<std::string, std::pair<int, int64_t>> per_batch;  // batch → {lowest idx, count}
        std::map<std::string, std::vector<std::string>> ids;       // stream → entries
        for (size_t i : back) {
          auto [it, fresh] = per_batch.try_emplace(entries[i].batch_id, entries[i].idx, 0);
          it->second.first = std::min(it->second.first, entries[i].idx);
          ++it->second.second;
          ids[stream_of[i]].push_back(entries[i].entry_id);
        }
        {
          pqxx::work tx(pg);
          for (const auto& [batch, low] : per_batch) {
            tx.exec_params(
                "UPDATE batches SET num_dispatched = least(num_dispatched, $2) WHERE id = $1::uuid",
                batch, low.first);
          }
          tx.commit();
        }
        std::vector<std::vector<std::string>> dels;
        for (const auto& [stream, mine] : ids) {
          dels.push_back({"XDEL", stream});
          dels.back().insert(dels.back().end(), mine.begin(), mine.end());
          // A worker's stream holds fewer now (the routing's room below).
          for (const std::string& w : with_streams) {
            if (stream == worker_stream_key(model, w)) {
              waiting_for[w] -= static_cast<int64_t>(mine.size());
            }
          }
        }
        HR_ASSIGN_OR_RETURN(auto deleted, redis_->pipeline(dels));
        for (const RedisReply& d : deleted) {
          if (d.is_error()) return unavailable("redis XDEL: " + d.str);
        }
        for (ShareAccount& a : shares) {
          for (ShareBatch& b : a.batches) {
            auto it = per_batch.find(b.id);
            if (it == per_batch.end()) continue;
            auto& [from, total] = cursors[b.id];
            from = std::min(from, it->second.first);
            b.remaining = total - from;
            b.in_flight -= it->second.second;
            a.in_flight -= it->second.second;
          }
        }
        withdrawn = static_cast<int64_t>(back.size());
        room += withdrawn;
        // Taken back, not taken by workers: the window's rate must not count them.
        pushed_since_[model] -= withdrawn;
        log::debug("relay.withdrawn", {{"model", model}, {"entries", withdrawn}});
      }
    }
    // Pushing in larger pieces costs fewer passes; an empty queue is filled at once.
    if (room == 0 || (waiting - withdrawn > 0 && room < window.size() / 4)) {
      relay_waiting_ = true;
      return Status::ok();
    }
    const std::vector<ShareGrant> grants = options_.fair_share
                                               ? share_room(shares, room, options_.catch_up_below)
                                               : oldest_first(shares, room);
    int64_t to_send = 0;
    for (const ShareAccount& a : shares) {
      for (const ShareBatch& b : a.batches) to_send += b.remaining;
    }
    int64_t granted = 0;
    for (const ShareGrant& g : grants) granted += g.count;
    if (to_send > granted) relay_waiting_ = true;  // the rest waits for room
    // Each granted batch's next queued requests, then pushed in the grants' order.
    std::map<std::string, int64_t> wanted;
    for (const ShareGrant& g : grants) wanted[g.batch_id] += g.count;
    std::map<std::string, std::vector<int>> rows;
    std::map<std::string, std::vector<std::optional<int64_t>>> affinities;  // alongside rows
    {
      pqxx::read_transaction tx(pg);
      for (const auto& [batch, n] : wanted) {
        std::vector<int>& idx = rows[batch];
        std::vector<std::optional<int64_t>>& aff = affinities[batch];
        for (const auto& r : tx.exec_params(
                 "SELECT idx, affinity FROM requests WHERE batch_id = $1::uuid AND idx >= $2 "
                 "AND status = 'queued' ORDER BY idx LIMIT $3",
                 batch, cursors[batch].first, n)) {
          idx.push_back(r[0].as<int>());
          aff.push_back(r[1].is_null() ? std::nullopt : std::optional<int64_t>(r[1].as<int64_t>()));
        }
      }
    }
    std::vector<RequestRef> refs;
    std::vector<RequestRef> catch_up;  // to the catch-up stream, whatever their affinity
    std::vector<std::optional<uint64_t>> keys;
    std::map<std::string, size_t> used;
    for (const ShareGrant& g : grants) {
      const std::vector<int>& idx = rows[g.batch_id];
      const std::vector<std::optional<int64_t>>& aff = affinities[g.batch_id];
      size_t& u = used[g.batch_id];
      for (int64_t k = 0; k < g.count && u < idx.size(); ++k, ++u) {
        if (g.catch_up) {
          catch_up.push_back({g.batch_id, idx[u]});
          continue;
        }
        refs.push_back({g.batch_id, idx[u]});
        keys.push_back(aff[u]
                           ? std::optional<uint64_t>(routing_key(account_of[g.batch_id], *aff[u]))
                           : std::nullopt);
      }
    }
    // Each request with an affinity to its worker's own stream while that has room; the rest to
    // the shared stream. The cursors stay on failure; pushed again next time.
    std::vector<int64_t> worker_waiting;
    for (const std::string& w : routable) worker_waiting.push_back(waiting_for[w]);
    const std::vector<int> targets =
        route_by_affinity(keys, routable, &worker_waiting,
                          worker_stream_cap(window.size(), static_cast<int>(routable.size())));
    std::vector<RequestRef> shared;
    std::map<int, std::vector<RequestRef>> per_worker;
    for (size_t k = 0; k < refs.size(); ++k) {
      (targets[k] == kSharedStream ? shared : per_worker[targets[k]]).push_back(refs[k]);
    }
    HR_RETURN_IF_ERROR(enqueue_catch_up(*redis_, model, catch_up));
    if (!catch_up.empty()) {
      log::debug("relay.catch_up",
                 {{"model", model}, {"entries", static_cast<int64_t>(catch_up.size())}});
    }
    HR_RETURN_IF_ERROR(enqueue(*redis_, model, shared));
    for (const auto& [w, mine] : per_worker) {
      HR_RETURN_IF_ERROR(enqueue_for_worker(*redis_, model, routable[w], mine));
    }
    pushed_since_[model] += static_cast<int64_t>(refs.size() + catch_up.size());
    pqxx::work tx(pg);
    if (observed_redis(tx, true) != observed) {
      log::warn("dispatcher.relay_raced_resync", {{"model", model}});
      return Status::ok();  // the resync rewound the cursors: leave them there
    }
    for (const auto& [batch, idx] : rows) {
      const auto [from, total] = cursors[batch];
      // Fewer rows than asked for: none is queued after them.
      const int cursor = static_cast<int64_t>(idx.size()) < wanted[batch] ? total : idx.back() + 1;
      const auto moved = tx.exec_params(
                               "UPDATE batches SET num_dispatched = $2 WHERE id = $1::uuid AND "
                               "num_dispatched = $3",
                               batch, cursor, from)
                             .affected_rows();
      if (moved == 1) relayed += static_cast<int>(idx.size());
    }
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return relayed;
}

Result<std::pair<int, int>> Dispatcher::requeue_expired_leases() {
  std::map<std::string, std::vector<Requeued>> requeue;  // model → requests
  int num_failed = 0;
  int num_requeued = 0;
  Status st = pg_.run("requeue expired", [&](pqxx::connection& pg) -> Status {
    pqxx::work tx(pg);
    pqxx::result r = tx.exec_params(
        "WITH expired AS (SELECT batch_id, idx FROM requests "
        "  WHERE status = 'running' AND lease_expires_at < now() "
        "  ORDER BY lease_expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED) "
        "UPDATE requests r SET "
        "  status = CASE WHEN r.num_failures + 1 >= $1 THEN 'failed' ELSE 'queued' END, "
        "  error = CASE WHEN r.num_failures + 1 >= $1 THEN "
        "    '{\"code\":\"lease_expired\",\"message\":\"the worker running this request stopped "
        "responding too many times\"}' ELSE r.error END, "
        "  finished_at = CASE WHEN r.num_failures + 1 >= $1 THEN now() END, "
        "  num_failures = r.num_failures + 1, lease_owner = NULL, lease_expires_at = NULL, "
        "  push_pending = r.num_failures + 1 < $1 "
        "FROM expired e WHERE r.batch_id = e.batch_id AND r.idx = e.idx "
        "RETURNING r.batch_id::text, r.idx, r.status, coalesce(r.prompt_tokens, 0), "
        "  coalesce(r.completion_tokens, 0), coalesce(r.cached_tokens, 0), r.custom_id, "
        "  (SELECT model FROM batches WHERE id = r.batch_id), r.attempt",
        options_.max_attempts);
    std::map<std::string, int> failed_per_batch;
    for (const auto& row : r) {
      if (row[2].as<std::string>() == "failed") {
        ++failed_per_batch[row[0].as<std::string>()];
      } else {
        requeue[row[7].as<std::string>()].push_back(
            {row[0].as<std::string>(), row[1].as<int>(), row[8].as<int>()});
        ++num_requeued;
      }
    }
    write_request_events(tx, r);
    for (const auto& [batch, n] : failed_per_batch) {
      tx.exec_params("UPDATE batches SET num_failed = num_failed + $2 WHERE id = $1::uuid", batch,
                     n);
      finish_batch_if_done(tx, batch);
      num_failed += n;
    }
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  // Committed as queued with push_pending: if a push fails here, push_requeued() retries it.
  for (const auto& [model, requeued] : requeue)
    HR_RETURN_IF_ERROR(queue::push_requeued(*redis_, pg_, model, requeued));
  if (num_requeued + num_failed > 0) {
    log::info("janitor.leases_expired", {{"requeued", num_requeued}, {"failed", num_failed}});
  }
  return std::make_pair(num_requeued, num_failed);
}

Result<int> Dispatcher::push_requeued() {
  std::map<std::string, std::vector<Requeued>> pending;  // model → requests
  int n = 0;
  Status st = pg_.run("push pending", [&](pqxx::connection& pg) -> Status {
    pqxx::nontransaction tx(pg);
    for (const auto& row :
         tx.exec("SELECT r.batch_id::text, r.idx, r.attempt, b.model FROM requests r "
                 "JOIN batches b ON b.id = r.batch_id WHERE r.push_pending AND r.status = 'queued' "
                 "LIMIT 1000")) {
      pending[row[3].as<std::string>()].push_back(
          {row[0].as<std::string>(), row[1].as<int>(), row[2].as<int>()});
      ++n;
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  for (const auto& [model, requeued] : pending)
    HR_RETURN_IF_ERROR(queue::push_requeued(*redis_, pg_, model, requeued));
  if (n > 0) log::info("janitor.requeued_pushed", {{"requests", n}});
  return n;
}

Result<int> Dispatcher::cancel_requeued() {
  int cancelled = 0;
  Status st = pg_.run("cancel requeued", [&](pqxx::connection& pg) -> Status {
    // Lock order everywhere: request rows first, then batch rows (in id order).
    pqxx::work tx(pg);
    pqxx::result r = tx.exec(
        "WITH c AS (SELECT r.batch_id, r.idx FROM requests r JOIN batches b ON b.id = r.batch_id "
        "  WHERE b.cancel_requested_at IS NOT NULL AND b.finished_at IS NULL AND r.status = "
        "'queued' "
        "  ORDER BY r.batch_id, r.idx LIMIT 1000 FOR UPDATE OF r SKIP LOCKED) "
        "UPDATE requests r SET status = 'cancelled', finished_at = now(), push_pending = false "
        "FROM c WHERE r.batch_id = c.batch_id AND r.idx = c.idx RETURNING r.batch_id::text");
    std::map<std::string, int> per_batch;
    for (const auto& row : r) ++per_batch[row[0].as<std::string>()];
    for (const auto& [batch, n] : per_batch) {
      tx.exec_params("UPDATE batches SET num_cancelled = num_cancelled + $2 WHERE id = $1::uuid",
                     batch, n);
      finish_batch_if_done(tx, batch);
      cancelled += n;
    }
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  if (cancelled > 0) log::info("janitor.requeued_cancelled", {{"requests", cancelled}});
  return cancelled;
}

Result<int> Dispatcher::expire_deadlines() {
  int expired = 0;
  Status st = pg_.run("expire deadlines", [&](pqxx::connection& pg) -> Status {
    std::vector<std::string> due;
    {
      pqxx::nontransaction tx(pg);
      for (const auto& row : tx.exec("SELECT id::text FROM batches WHERE deadline IS NOT NULL "
                                     "AND finished_at IS NULL AND deadline < now() LIMIT 100")) {
        due.push_back(row[0].as<std::string>());
      }
    }
    for (const std::string& id : due) {
      pqxx::work tx(pg);
      pqxx::result r = tx.exec_params(
          "UPDATE requests SET status = 'expired', finished_at = now(), push_pending = false, "
          "error = "
          "'{\"code\":\"batch_expired\",\"message\":\"the batch deadline passed before this "
          "request ran\"}' WHERE batch_id = $1::uuid AND status = 'queued'",
          id);
      int n = static_cast<int>(r.affected_rows());
      if (n > 0) {
        tx.exec_params("UPDATE batches SET num_expired = num_expired + $2 WHERE id = $1::uuid", id,
                       n);
      }
      finish_batch_if_done(tx, id);
      tx.commit();
      expired += n;
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return expired;
}

namespace {

// The value of `field` in INFO's text (lines "field:value\r\n"); "" when absent.
std::string info_field(const std::string& info, const std::string& field) {
  const std::string line = field + ":";
  size_t p = info.rfind(line, 0) == 0 ? 0 : info.find("\n" + line);
  if (p == std::string::npos) return "";
  p += (p == 0 ? 0 : 1) + line.size();
  return info.substr(p, info.find_first_of("\r\n", p) - p);
}

}  // namespace

// What Redis held may be gone when its run id changes (a restart) or when the epoch marker is
// gone (a flush, or a restart that kept the run id): either rewinds every cursor. (A single lost
// stream is noticed by ensure_stream.)
Result<bool> Dispatcher::resync_if_redis_lost() {
  HR_ASSIGN_OR_RETURN(RedisReply server, redis_->command({"INFO", "server"}));
  HR_ASSIGN_OR_RETURN(RedisReply set,
                      redis_->command({"SET", "hr:epoch", new_uuid_v4().to_string(), "NX"}));
  (void)set;
  HR_ASSIGN_OR_RETURN(RedisReply epoch, redis_->command({"GET", "hr:epoch"}));
  std::string observed = info_field(server.str, "run_id") + "/" + epoch.str;
  bool resynced = false;
  int rewound = 0;
  Status st = pg_.run("resync", [&](pqxx::connection& pg) -> Status {
    pqxx::work tx(pg);
    pqxx::result r = tx.exec("SELECT value FROM redis_state WHERE key = 'observed' FOR UPDATE");
    if (!r.empty() && r[0][0].as<std::string>() == observed) return Status::ok();
    tx.exec_params(
        "INSERT INTO redis_state (key, value) VALUES ('observed', $1) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        observed);
    pqxx::result rw = tx.exec(
        "UPDATE batches SET num_dispatched = 0 WHERE finished_at IS NULL AND num_dispatched > 0");
    rewound = static_cast<int>(rw.affected_rows());
    tx.commit();
    resynced = true;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  if (resynced) {
    streams_checked_.clear();  // every stream is gone: create each one at its next use
    log::warn("dispatcher.redis_resync", {{"observed", observed}, {"batches", rewound}});
  }
  return resynced;
}

Result<std::vector<std::string>> Dispatcher::reclaim_worker_streams(const std::string& model,
                                                                    int64_t* moved) {
  HR_ASSIGN_OR_RETURN(std::vector<std::string> with_streams, workers_with_streams(*redis_, model));
  if (with_streams.empty()) return with_streams;
  // A worker's stream is created with its group and listed in one transaction, and deleted with
  // its listing in one script: listed but gone, Redis lost it (evicted the key, say). What it
  // held is sent again, as for a lost shared stream (ensure_stream).
  std::vector<std::vector<std::string>> exists;
  for (const std::string& w : with_streams)
    exists.push_back({"EXISTS", worker_stream_key(model, w)});
  HR_ASSIGN_OR_RETURN(auto there, redis_->pipeline(exists));
  std::vector<std::string> kept, lost;
  for (size_t k = 0; k < with_streams.size(); ++k) {
    if (there[k].is_error()) return unavailable("redis EXISTS: " + there[k].str);
    (there[k].integer == 0 ? lost : kept).push_back(with_streams[k]);
  }
  if (!lost.empty()) {
    // The rewind first: should the unlisting fail, the next look rewinds again (which only
    // duplicates entries; a claim drops the copies).
    HR_ASSIGN_OR_RETURN(int rewound, rewind(model));
    std::vector<std::string> unlist = {"SREM", worker_streams_key(model)};
    unlist.insert(unlist.end(), lost.begin(), lost.end());
    HR_ASSIGN_OR_RETURN(RedisReply r, redis_->command(unlist));
    if (r.is_error()) return unavailable("redis SREM: " + r.str);
    log::warn(
        "dispatcher.worker_stream_lost",
        {{"model", model}, {"workers", static_cast<int64_t>(lost.size())}, {"batches", rewound}});
  }
  // Departed (no longer in the registry) or draining (stopping: it takes no new work).
  HR_ASSIGN_OR_RETURN(std::vector<std::string> live, live_worker_ids(*redis_, model));
  const std::set<std::string> live_ids(live.begin(), live.end());
  std::vector<std::string> staying;
  for (const std::string& w : kept) {
    if (live_ids.count(w)) {
      staying.push_back(w);
      continue;
    }
    HR_ASSIGN_OR_RETURN(int64_t n, move_worker_stream(*redis_, model, w));
    *moved += n;
    log::info("dispatcher.worker_stream_moved", {{"model", model}, {"worker", w}, {"entries", n}});
  }
  return staying;
}

Status Dispatcher::check_catch_up_stream(const std::string& model) {
  HR_ASSIGN_OR_RETURN(auto there, redis_->pipeline({{"EXISTS", catch_up_made_key(model)},
                                                    {"EXISTS", catch_up_stream_key(model)}}));
  for (const RedisReply& r : there) {
    if (r.is_error()) return unavailable("redis EXISTS: " + r.str);
  }
  if (there[0].integer == 0 || there[1].integer == 1) return Status::ok();
  // Made with its marker in one transaction and never deleted: gone, Redis lost it. The rewind
  // first: should the marker's deletion fail, the next look rewinds again (which only duplicates
  // entries; a claim drops the copies).
  HR_ASSIGN_OR_RETURN(int rewound, rewind(model));
  HR_ASSIGN_OR_RETURN(RedisReply r, redis_->command({"DEL", catch_up_made_key(model)}));
  if (r.is_error()) return unavailable("redis DEL: " + r.str);
  log::warn("dispatcher.catch_up_stream_lost", {{"model", model}, {"batches", rewound}});
  return Status::ok();
}

Result<int> Dispatcher::reclaim_idle_entries() {
  std::vector<std::string> models;
  Status st = pg_.run("models", [&](pqxx::connection& pg) -> Status {
    pqxx::nontransaction tx(pg);
    for (const auto& row :
         tx.exec("SELECT DISTINCT model FROM batches WHERE finished_at IS NULL")) {
      models.push_back(row[0].as<std::string>());
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  int reclaimed = 0;
  for (const std::string& model : models) {
    if (!stream_ready(model)) continue;
    // A departed worker's own stream first: its entries go back to the shared stream.
    int64_t moved = 0;
    HR_ASSIGN_OR_RETURN(std::vector<std::string> staying, reclaim_worker_streams(model, &moved));
    reclaimed += static_cast<int>(moved);
    HR_RETURN_IF_ERROR(check_catch_up_stream(model));
    // Entries delivered and idle too long, in the shared, catch-up and live workers' streams.
    std::vector<std::string> keys = {stream_key(model), catch_up_stream_key(model)};
    for (const std::string& w : staying) keys.push_back(worker_stream_key(model, w));
    for (const std::string& key : keys) {
      HR_ASSIGN_OR_RETURN(
          RedisReply r,
          redis_->command({"XAUTOCLAIM", key, kConsumerGroup, options_.name,
                           std::to_string(options_.reclaim_idle_ms), "0", "COUNT", "1000"}));
      if (r.is_error() || r.elements.size() < 2 || r.elements[1].elements.empty()) continue;
      std::vector<std::string> ids;
      nlohmann::json refs = nlohmann::json::array();
      for (const StreamEntry& e : parse_entries(r.elements[1])) {
        ids.push_back(e.id);
        if (!e.ref.batch_id.empty()) refs.push_back({{"b", e.ref.batch_id}, {"i", e.ref.idx}});
      }
      std::vector<RequestRef> still_queued;
      Status q = pg_.run("reclaim", [&](pqxx::connection& pg) -> Status {
        pqxx::nontransaction tx(pg);
        for (
            const auto& row : tx.exec_params(
                "SELECT r.batch_id::text, r.idx FROM requests r JOIN jsonb_to_recordset($1::jsonb) "
                "AS t(b uuid, i int) ON r.batch_id = t.b AND r.idx = t.i WHERE r.status = 'queued'",
                refs.dump())) {
          still_queued.push_back({row[0].as<std::string>(), row[1].as<int>()});
        }
        return Status::ok();
      });
      if (!q.is_ok()) return q;
      HR_RETURN_IF_ERROR(enqueue(*redis_, model, still_queued));
      HR_RETURN_IF_ERROR(ack_and_delete(*redis_, key, ids));
      reclaimed += static_cast<int>(ids.size());
    }
  }
  return reclaimed;
}

Result<int> Dispatcher::finalize_openai_batches() {
  int finalized = 0;
  Status st = pg_.run("finalize", [&](pqxx::connection& pg) -> Status {
    HR_ASSIGN_OR_RETURN(finalized, queue::finalize_openai_batches(pg, 20, &finalize_cursor_));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return finalized;
}

Result<PurgeReport> Dispatcher::retain() {
  PurgeReport report;
  Status st = pg_.run("retention", [&](pqxx::connection& pg) -> Status {
    HR_ASSIGN_OR_RETURN(report.partitions_created,
                        ensure_request_partitions(pg, options_.retention));
    HR_ASSIGN_OR_RETURN(PurgeReport purged, purge_expired(pg, options_.retention));
    purged.partitions_created = report.partitions_created;
    report = purged;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  if (report.partitions_created + report.partitions_dropped + report.batches_purged +
          report.files_purged >
      0) {
    log::info("retention.purged", {{"partitions_created", report.partitions_created},
                                   {"partitions_dropped", report.partitions_dropped},
                                   {"bytes_freed", report.bytes_freed},
                                   {"requests_deleted", report.requests_deleted},
                                   {"batches", report.batches_purged},
                                   {"files", report.files_purged}});
  }
  return report;
}

Result<TickReport> Dispatcher::tick() {
  TickReport rep;
  streams_checked_.clear();  // each tick looks at each model's stream once
  HR_ASSIGN_OR_RETURN(rep.resynced, resync_if_redis_lost());
  HR_ASSIGN_OR_RETURN(auto leases, requeue_expired_leases());
  rep.requeued = leases.first;
  rep.failed = leases.second;
  HR_ASSIGN_OR_RETURN(rep.expired, expire_deadlines());
  HR_ASSIGN_OR_RETURN(rep.cancelled, cancel_requeued());
  HR_ASSIGN_OR_RETURN(rep.pushed, push_requeued());
  // A batch that cannot be finalized must not stop the relay: log it and go on.
  Result<int> finalized = finalize_openai_batches();
  if (finalized.is_ok()) {
    rep.finalized = *finalized;
  } else {
    log::warn("dispatcher.finalize_failed", {{"error", finalized.status()}});
  }
  HR_ASSIGN_OR_RETURN(rep.reclaimed, reclaim_idle_entries());
  // Retention is housekeeping: a failure is logged and tried again at its next turn.
  if (options_.purge_interval_ms > 0 && steady_now_ns() >= next_purge_ns_) {
    next_purge_ns_ = steady_now_ns() + int64_t{options_.purge_interval_ms} * 1000000;
    Result<PurgeReport> purged = retain();
    if (purged.is_ok()) {
      rep.purged = *purged;
    } else {
      log::warn("dispatcher.retention_failed", {{"error", purged.status()}});
    }
  }
  for (;;) {
    HR_ASSIGN_OR_RETURN(int n, relay_once());
    rep.relayed += n;
    if (n == 0) break;
  }
  return rep;
}

void Dispatcher::run(const std::atomic<bool>& stop) {
  std::unique_ptr<pqxx::connection> listener;
  int64_t listen_again_ns = 0;  // after a failed connection: not before the next tick
  // Waits up to `us` for a batch to be submitted or to finish (NOTIFY hr_dispatch); whether one
  // was. Without a listener (Postgres unreachable), it only waits.
  auto await_dispatch = [&](int64_t us) -> bool {
    try {
      if (!listener && steady_now_ns() >= listen_again_ns) {
        listener = std::make_unique<pqxx::connection>(database_url_);
        pqxx::nontransaction(*listener).exec("LISTEN hr_dispatch");
      }
      if (listener) {
        return listener->await_notification(static_cast<long>(us / 1000000),
                                            static_cast<long>(us % 1000000)) > 0;
      }
    } catch (const std::exception& e) {
      listener.reset();
      listen_again_ns = steady_now_ns() + int64_t{options_.tick_ms} * 1000000;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    return false;
  };
  RetryPacer pacer;  // while Postgres or Redis fail: backoff, and a few counted warnings
  while (!stop.load()) {
    Result<TickReport> r = tick();
    if (!r.is_ok()) {
      const int64_t delay = pacer.failed("dispatcher.tick_failed", r.status());
      pg_.reset();
      listener.reset();
      sleep_unless_stopped(stop, std::max<int64_t>(options_.tick_ms, delay));
      continue;
    }
    pacer.succeeded();
    if (r->relayed > 0) log::debug("dispatcher.relayed", {{"requests", r->relayed}});
    // While requests wait for room in a stream, the relay looks again every relay_poll_ms (the
    // workers empty a short window quickly); a failure here is left to the next tick.
    const int64_t next_tick = steady_now_ns() + int64_t{options_.tick_ms} * 1000000;
    // A batch submitted meanwhile has the next pass look at the shares at once, short of room
    // or not: a newcomer need not wait for newcomer_check_ms to have its share sent.
    while (relay_waiting_ && !stop.load() && steady_now_ns() < next_tick) {
      if (await_dispatch(int64_t{options_.relay_poll_ms} * 1000)) last_full_pass_ns_.clear();
      if (!relay_once().is_ok()) break;
    }
    const int64_t left_us = std::max<int64_t>(0, (next_tick - steady_now_ns()) / 1000);
    if (left_us > 0) await_dispatch(left_us);
  }
}

}  // namespace hr::queue
