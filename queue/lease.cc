// Worker-side leases.
#include "queue/lease.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "base/clock.h"
#include "base/log.h"
#include "queue/pg.h"
#include "queue/registry.h"
#include "queue/store.h"

namespace hr::queue {
namespace {

nlohmann::json lease_keys(const std::vector<Lease>& leases) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Lease& l : leases)
    arr.push_back({{"b", l.ref.batch_id}, {"i", l.ref.idx}, {"a", l.attempt}});
  return arr;
}

std::string key_of(const std::string& batch, int idx) { return batch + ":" + std::to_string(idx); }

}  // namespace

Result<std::unique_ptr<LeaseClient>> LeaseClient::create(const std::string& database_url,
                                                         const std::string& redis_url,
                                                         LeaseOptions options) {
  if (options.model.empty() || options.owner.empty()) {
    return invalid_argument("lease client needs a model and an owner");
  }
  HR_RETURN_IF_ERROR(pg_connect(database_url).status());  // fail fast when unreachable
  HR_ASSIGN_OR_RETURN(auto redis, RedisClient::connect(redis_url));
  return std::unique_ptr<LeaseClient>(
      new LeaseClient(database_url, std::move(redis), std::move(options)));
}

LeaseClient::LeaseClient(std::string database_url, std::unique_ptr<RedisClient> redis,
                         LeaseOptions options)
    : pg_(std::move(database_url)), redis_(std::move(redis)), options_(std::move(options)) {}

Status LeaseClient::read_stream(const std::string& key, int count, int block_ms,
                                std::vector<std::pair<std::string, StreamEntry>>* out) {
  if (count <= 0) return Status::ok();
  // BLOCK 0 would wait forever: without a wait, leave BLOCK out.
  std::vector<std::string> cmd = {"XREADGROUP",   "GROUP", kConsumerGroup,
                                  options_.owner, "COUNT", std::to_string(count)};
  if (block_ms > 0) {
    cmd.push_back("BLOCK");
    cmd.push_back(std::to_string(block_ms));
  }
  cmd.insert(cmd.end(), {"STREAMS", key, ">"});
  HR_ASSIGN_OR_RETURN(RedisReply reply, block_ms > 0 ? redis_->blocking_command(cmd, block_ms)
                                                     : redis_->command(cmd));
  if (reply.is_error()) {
    // No stream or group yet (nothing relayed there), or Redis lost them: a dispatcher creates
    // them and pushes again what is queued. Until then there is nothing to pull.
    if (reply.str.rfind("NOGROUP", 0) == 0) return Status::ok();
    return unavailable("redis XREADGROUP: " + reply.str);
  }
  if (reply.is_nil() || reply.elements.empty()) return Status::ok();
  // [[stream, [[id, [field, value, ...]], ...]]]
  for (StreamEntry& e : parse_entries(reply.elements[0].elements[1])) {
    out->emplace_back(key, std::move(e));
  }
  return Status::ok();
}

Status LeaseClient::read_listing() {
  if (listing_read_ns_ != 0 && steady_now_ns() - listing_read_ns_ < 1'000'000'000) {
    return Status::ok();
  }
  HR_ASSIGN_OR_RETURN(others_, workers_with_streams(*redis_, options_.model));
  own_listed_ = std::erase(others_, options_.owner) > 0;
  listing_read_ns_ = steady_now_ns();
  return Status::ok();
}

Status LeaseClient::ack(const std::vector<Lease>& leases) {
  std::map<std::string, std::vector<std::string>> by_stream;
  for (const Lease& l : leases) {
    if (!l.entry_id.empty()) by_stream[l.stream].push_back(l.entry_id);
  }
  for (const auto& [stream, ids] : by_stream) {
    HR_RETURN_IF_ERROR(ack_and_delete(*redis_, stream, ids));
  }
  return Status::ok();
}

Result<std::vector<Lease>> LeaseClient::pull(int max, int block_ms) {
  if (max <= 0) return std::vector<Lease>{};
  std::vector<std::pair<std::string, StreamEntry>> entries;  // {stream, entry}
  const auto left = [&] { return max - static_cast<int>(entries.size()); };
  HR_RETURN_IF_ERROR(read_listing());
  // What is owed at once first (any consumer takes it; pull_catch_up takes it past headroom).
  HR_RETURN_IF_ERROR(read_stream(catch_up_stream_key(options_.model), max, 0, &entries));
  if (own_listed_) {
    HR_RETURN_IF_ERROR(
        read_stream(worker_stream_key(options_.model, options_.owner), left(), 0, &entries));
  }
  HR_RETURN_IF_ERROR(read_stream(stream_key(options_.model), left(), 0, &entries));
  if (entries.empty()) {
    for (size_t k = 0; k < others_.size() && left() > 0; ++k) {
      const std::string& w = others_[(steal_from_ + k) % others_.size()];
      HR_RETURN_IF_ERROR(read_stream(worker_stream_key(options_.model, w), left(), 0, &entries));
    }
    ++steal_from_;
  }
  if (entries.empty() && block_ms > 0) {
    HR_RETURN_IF_ERROR(read_stream(stream_key(options_.model), max, block_ms, &entries));
  }
  return claim(entries);
}

Result<std::vector<Lease>> LeaseClient::pull_catch_up(int max) {
  std::vector<std::pair<std::string, StreamEntry>> entries;  // {stream, entry}
  if (max <= 0) return std::vector<Lease>{};
  const std::string key = catch_up_stream_key(options_.model);
  if (live_read_ns_ == 0 || steady_now_ns() - live_read_ns_ >= 1'000'000'000) {
    HR_ASSIGN_OR_RETURN(std::vector<std::string> live, live_worker_ids(*redis_, options_.model));
    live_workers_ = std::max<int>(1, static_cast<int>(live.size()));
    live_read_ns_ = steady_now_ns();
  }
  HR_ASSIGN_OR_RETURN(auto sizes,
                      redis_->pipeline({{"XLEN", key}, {"XPENDING", key, kConsumerGroup}}));
  const RedisReply& len = sizes[0];
  const RedisReply& pend = sizes[1];
  if (len.is_error()) return unavailable("redis XLEN: " + len.str);
  if (len.integer == 0 || pend.is_error()) return std::vector<Lease>{};  // none, or no group yet
  // Summary form: [pending, first id, last id, [[consumer, count], ...]].
  const int64_t pending = pend.elements.empty() ? 0 : pend.elements[0].integer;
  int64_t mine = 0;  // delivered here and not yet acknowledged: held by this worker
  if (pend.elements.size() >= 4) {
    for (const RedisReply& c : pend.elements[3].elements) {
      if (c.elements.size() >= 2 && c.elements[0].str == options_.owner) {
        mine = std::atoll(c.elements[1].str.c_str());
      }
    }
  }
  const int64_t waiting = len.integer - pending;
  if (waiting <= 0) return std::vector<Lease>{};
  // This worker's part of everything there (held or waiting) less what it holds; at least its
  // part of what waits, so that what another worker cannot take is still taken.
  const int64_t part = std::max((len.integer + live_workers_ - 1) / live_workers_ - mine,
                                (waiting + live_workers_ - 1) / live_workers_);
  HR_RETURN_IF_ERROR(read_stream(key, static_cast<int>(std::min<int64_t>(max, part)), 0, &entries));
  return claim(entries);
}

Result<std::vector<Lease>> LeaseClient::claim(
    std::vector<std::pair<std::string, StreamEntry>>& entries) {
  std::vector<Lease> out;
  if (entries.empty()) return out;
  nlohmann::json keys = nlohmann::json::array();
  for (const auto& [stream, e] : entries) {
    if (!e.ref.batch_id.empty()) keys.push_back({{"b", e.ref.batch_id}, {"i", e.ref.idx}});
  }
  std::map<std::string, Lease> claimed;
  Status st = pg_.run("claim", [&](pqxx::connection& pg) -> Status {
    // Prepared: planned once per connection rather than once per pull, which matters on the
    // partitioned requests table (its planning grows with the partitions; migrations/0007).
    pg.prepare(
        "hr_claim",
        "WITH t AS (SELECT DISTINCT b, i FROM jsonb_to_recordset($1::jsonb) AS t(b uuid, i int)), "
        "claimed AS ("
        "  UPDATE requests r SET status = 'running', attempt = r.attempt + 1, lease_owner = $2, "
        "    push_pending = false, "
        "    lease_expires_at = now() + make_interval(secs => $3::double precision / 1000), "
        "    started_at = coalesce(r.started_at, now()) "
        "  FROM t, batches bt "
        "  WHERE r.batch_id = t.b AND r.idx = t.i AND r.status = 'queued' AND bt.id = r.batch_id "
        "    AND bt.cancel_requested_at IS NULL AND (bt.deadline IS NULL OR bt.deadline > now()) "
        "  RETURNING r.batch_id, r.idx, r.attempt, r.num_failures, r.body, bt.api_shape, "
        "    (extract(epoch FROM bt.created_at) * 1000)::bigint AS submitted_ms, "
        "    bt.account_id::text AS account_id), "
        "started AS ("
        "  UPDATE batches SET status = 'running', started_at = now() "
        "  WHERE id IN (SELECT DISTINCT batch_id FROM claimed) AND status = 'queued' RETURNING 1) "
        "SELECT batch_id::text, idx, attempt, num_failures, body, api_shape, submitted_ms, "
        "account_id FROM claimed");
    pqxx::work tx(pg);
    pqxx::result r = tx.exec_prepared("hr_claim", keys.dump(), options_.owner, options_.lease_ms);
    tx.commit();
    for (const auto& row : r) {
      Lease l;
      l.ref.batch_id = row[0].as<std::string>();
      l.ref.idx = row[1].as<int>();
      l.attempt = row[2].as<int>();
      l.num_failures = row[3].as<int>();
      l.body = row[4].as<std::string>();
      l.api_shape = row[5].as<std::string>();
      l.submitted_at_ms = row[6].as<int64_t>();
      l.account_id = row[7].as<std::string>();
      claimed.emplace(key_of(l.ref.batch_id, l.ref.idx), std::move(l));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  std::vector<Lease> dropped;
  const std::string catch_up_key = catch_up_stream_key(options_.model);
  for (auto& [stream, e] : entries) {
    auto it = claimed.find(key_of(e.ref.batch_id, e.ref.idx));
    if (it == claimed.end() || !it->second.entry_id.empty()) {
      // Ended, leased elsewhere, cancelled, past deadline, or a duplicate.
      Lease drop;
      drop.entry_id = e.id;
      drop.stream = stream;
      dropped.push_back(std::move(drop));
      continue;
    }
    it->second.entry_id = e.id;
    it->second.stream = stream;
    it->second.catch_up = stream == catch_up_key;
    out.push_back(it->second);
  }
  // The claims are committed: they are this worker's now, whatever Redis answers. Entries left
  // pending are reclaimed later.
  if (Status acked = ack(dropped); !acked.is_ok()) {
    log::warn("lease.ack_failed", {{"error", acked}});
  }
  return out;
}

Result<std::vector<RequestRef>> LeaseClient::renew(const std::vector<Lease>& leases) {
  std::vector<RequestRef> lost;
  if (leases.empty()) return lost;
  std::map<std::string, bool> kept;
  Status st = pg_.run("renew", [&](pqxx::connection& pg) -> Status {
    pg.prepare(
        "hr_renew",
        "UPDATE requests r SET lease_expires_at = now() + make_interval(secs => "
        "  $3::double precision / 1000) "
        "FROM jsonb_to_recordset($1::jsonb) AS t(b uuid, i int, a int) "
        "WHERE r.batch_id = t.b AND r.idx = t.i AND r.attempt = t.a AND r.status = 'running' "
        "  AND r.lease_owner = $2 "
        "RETURNING r.batch_id::text, r.idx");
    pqxx::work tx(pg);
    pqxx::result r =
        tx.exec_prepared("hr_renew", lease_keys(leases).dump(), options_.owner, options_.lease_ms);
    tx.commit();
    for (const auto& row : r) kept[key_of(row[0].as<std::string>(), row[1].as<int>())] = true;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  for (const Lease& l : leases) {
    if (!kept.count(key_of(l.ref.batch_id, l.ref.idx))) lost.push_back(l.ref);
  }
  return lost;
}

Result<std::vector<bool>> LeaseClient::finish(const std::vector<Lease>& leases,
                                              const std::vector<std::string>& statuses,
                                              const std::vector<std::string>& results,
                                              const std::vector<std::string>& errors,
                                              const std::vector<std::array<int, 3>>& usage) {
  std::vector<bool> accepted(leases.size(), false);
  if (leases.empty()) return accepted;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t k = 0; k < leases.size(); ++k) {
    nlohmann::json row = {{"b", leases[k].ref.batch_id},
                          {"i", leases[k].ref.idx},
                          {"a", leases[k].attempt},
                          {"s", statuses[k]},
                          {"pt", usage[k][0]},
                          {"ct", usage[k][1]},
                          {"cc", usage[k][2]}};
    row["res"] = results[k].empty() ? nlohmann::json(nullptr) : nlohmann::json(results[k]);
    row["err"] = errors[k].empty() ? nlohmann::json(nullptr) : nlohmann::json(errors[k]);
    rows.push_back(std::move(row));
  }
  std::map<std::string, bool> done;
  Status st = pg_.run("finish", [&](pqxx::connection& pg) -> Status {
    pg.prepare("hr_finish",
               "WITH t AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS t(b uuid, i int, a int, "
               "  s text, res text, err text, pt int, ct int, cc int)) "
               "UPDATE requests r SET status = t.s, result = t.res, error = t.err, "
               "  prompt_tokens = t.pt, completion_tokens = t.ct, cached_tokens = t.cc, "
               "  finished_at = now(), lease_owner = NULL, lease_expires_at = NULL "
               "FROM t WHERE r.batch_id = t.b AND r.idx = t.i AND r.attempt = t.a "
               "  AND r.status = 'running' "
               "RETURNING r.batch_id::text, r.idx, r.status, t.pt, t.ct, t.cc, r.custom_id");
    pqxx::work tx(pg);
    pqxx::result r = tx.exec_prepared("hr_finish", rows.dump());
    struct Delta {
      int completed = 0, failed = 0;
      int64_t pt = 0, ct = 0, cc = 0;
    };
    std::map<std::string, Delta> per_batch;  // ordered: batch rows are locked in id order
    for (const auto& row : r) {
      std::string b = row[0].as<std::string>();
      done[key_of(b, row[1].as<int>())] = true;
      Delta& d = per_batch[b];
      (row[2].as<std::string>() == "completed" ? d.completed : d.failed) += 1;
      d.pt += row[3].as<int64_t>();
      d.ct += row[4].as<int64_t>();
      d.cc += row[5].as<int64_t>();
    }
    write_request_events(tx, r);
    for (const auto& [b, d] : per_batch) {
      tx.exec_params(
          "UPDATE batches SET num_completed = num_completed + $2, num_failed = num_failed + $3, "
          "prompt_tokens = prompt_tokens + $4, completion_tokens = completion_tokens + $5, "
          "cached_tokens = cached_tokens + $6 WHERE id = $1::uuid",
          b, d.completed, d.failed, d.pt, d.ct, d.cc);
      finish_batch_if_done(tx, b);
    }
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  for (size_t k = 0; k < leases.size(); ++k) {
    accepted[k] = done.count(key_of(leases[k].ref.batch_id, leases[k].ref.idx)) > 0;
  }
  // The results are committed: these requests are done, whatever Redis answers (an error here
  // would have the caller write them again and again while Redis is down). Entries left pending
  // are reclaimed later, and a pull drops them: their requests have ended.
  if (Status acked = ack(leases); !acked.is_ok()) {
    log::warn("lease.ack_failed", {{"error", acked}});
  }
  return accepted;
}

Result<std::vector<bool>> LeaseClient::complete(const std::vector<Completion>& completions) {
  std::vector<Lease> leases;
  std::vector<std::string> statuses, results, errors;
  std::vector<std::array<int, 3>> usage;
  for (const Completion& c : completions) {
    leases.push_back(c.lease);
    statuses.push_back("completed");
    results.push_back(c.result_json);
    errors.emplace_back();
    usage.push_back({c.prompt_tokens, c.completion_tokens, c.cached_tokens});
  }
  return finish(leases, statuses, results, errors, usage);
}

Result<std::vector<bool>> LeaseClient::fail(const std::vector<Failure>& failures) {
  std::vector<Lease> final_leases, retry;
  std::vector<std::string> statuses, results, errors;
  std::vector<std::array<int, 3>> usage;
  std::vector<size_t> final_index, retry_index;
  for (size_t k = 0; k < failures.size(); ++k) {
    const Failure& f = failures[k];
    std::string err = nlohmann::json{{"code", f.code}, {"message", f.message}}.dump();
    if (f.retryable && f.lease.num_failures + 1 < options_.max_attempts) {
      retry.push_back(f.lease);
      retry_index.push_back(k);
      continue;
    }
    final_leases.push_back(f.lease);
    final_index.push_back(k);
    statuses.push_back("failed");
    results.emplace_back();
    errors.push_back(err);
    usage.push_back({0, 0, 0});
  }
  std::vector<bool> accepted(failures.size(), false);
  HR_ASSIGN_OR_RETURN(auto fin, finish(final_leases, statuses, results, errors, usage));
  for (size_t k = 0; k < fin.size(); ++k) accepted[final_index[k]] = fin[k];
  if (!retry.empty()) {
    HR_RETURN_IF_ERROR(requeue(retry, /*count_failure=*/true));
    for (size_t k : retry_index) accepted[k] = true;
  }
  return accepted;
}

Status LeaseClient::release(const std::vector<Lease>& leases) {
  return requeue(leases, /*count_failure=*/false);
}

Status LeaseClient::requeue(const std::vector<Lease>& leases, bool count_failure) {
  if (leases.empty()) return Status::ok();
  std::vector<Requeued> requeued;
  Status st = pg_.run("release", [&](pqxx::connection& pg) -> Status {
    pqxx::work tx(pg);
    pqxx::result r = tx.exec_params(
        "UPDATE requests r SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, "
        "  num_failures = r.num_failures + $2, push_pending = true "
        "FROM jsonb_to_recordset($1::jsonb) AS t(b uuid, i int, a int) "
        "WHERE r.batch_id = t.b AND r.idx = t.i AND r.attempt = t.a AND r.status = 'running' "
        "RETURNING r.batch_id::text, r.idx, r.attempt",
        lease_keys(leases).dump(), count_failure ? 1 : 0);
    tx.commit();
    for (const auto& row : r)
      requeued.push_back({row[0].as<std::string>(), row[1].as<int>(), row[2].as<int>()});
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  // Committed with push_pending: if this push fails (or the process dies first), the janitor
  // pushes them instead.
  if (Status pushed = push_requeued(*redis_, pg_, options_.model, requeued); !pushed.is_ok()) {
    log::warn("lease.requeue_push_failed",
              {{"requests", static_cast<int>(requeued.size())}, {"error", pushed}});
  }
  return ack(leases);
}

}  // namespace hr::queue
