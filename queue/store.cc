// The batch store.
#include "queue/store.h"

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "base/clock.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/secret_box.h"
#include "queue/internal/batch_row.h"
#include "queue/internal/retention_choice.h"
#include "queue/pg.h"
#include "queue/webhooks.h"

namespace hr::queue {

const char* const kBatchColumns =
    "id::text, model, api_shape, status, num_total, num_completed, num_failed, num_cancelled, "
    "num_expired, prompt_tokens, completion_tokens, cached_tokens, "
    "(extract(epoch FROM created_at) * 1000)::bigint, "
    "(extract(epoch FROM started_at) * 1000)::bigint, "
    "(extract(epoch FROM finished_at) * 1000)::bigint, "
    "(extract(epoch FROM deadline) * 1000)::bigint, cancel_requested_at IS NOT NULL, "
    "(extract(epoch FROM expires_at) * 1000)::bigint, deleted_at IS NOT NULL, "
    "finished_at IS NOT NULL AND expires_at <= now(), retried_from::text, "
    "(SELECT string_agg(r.id::text, ',' ORDER BY r.id) FROM batches r "
    " WHERE r.retried_from = batches.id AND r.deleted_at IS NULL), priority";

const char* const kBatchVisible =
    "deleted_at IS NULL AND NOT (finished_at IS NOT NULL AND expires_at <= now())";

namespace {

std::optional<int64_t> opt_i64(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<int64_t>();
}

}  // namespace

BatchInfo batch_from_row(const pqxx::row& r) {
  BatchInfo b;
  b.id = r[0].as<std::string>();
  b.model = r[1].as<std::string>();
  b.api_shape = r[2].as<std::string>();
  b.status = r[3].as<std::string>();
  b.num_total = r[4].as<int>();
  b.num_completed = r[5].as<int>();
  b.num_failed = r[6].as<int>();
  b.num_cancelled = r[7].as<int>();
  b.num_expired = r[8].as<int>();
  b.prompt_tokens = r[9].as<int64_t>();
  b.completion_tokens = r[10].as<int64_t>();
  b.cached_tokens = r[11].as<int64_t>();
  b.created_at_ms = r[12].as<int64_t>();
  b.started_at_ms = opt_i64(r[13]);
  b.finished_at_ms = opt_i64(r[14]);
  b.deadline_ms = opt_i64(r[15]);
  b.cancel_requested = r[16].as<bool>();
  b.expires_at_ms = r[17].as<int64_t>();
  b.deleted = r[18].as<bool>();
  b.expired = r[19].as<bool>();
  if (!r[20].is_null()) b.retried_from = r[20].as<std::string>();
  if (!r[21].is_null()) {
    std::string ids = r[21].as<std::string>();
    for (size_t at = 0; at < ids.size();) {
      size_t comma = std::min(ids.find(',', at), ids.size());
      b.retries.push_back(ids.substr(at, comma - at));
      at = comma + 1;
    }
  }
  b.priority = r[22].as<int>();
  return b;
}

Status check_visible(const BatchInfo& b) {
  if (b.deleted) return not_found("no such batch: " + b.id);
  if (b.expired) {
    return Status(StatusCode::kNotFound,
                  "batch " + b.id + " expired at " + iso8601_utc(b.expires_at_ms) +
                      "; its requests and results were deleted",
                  "expired");
  }
  return Status::ok();
}

namespace {

std::string event_type_for(const std::string& status) {
  if (status == "completed" || status == "completed_with_errors") return "batch.completed";
  return "batch." + status;
}

}  // namespace

void write_event(pqxx::work& tx, const std::string& type, const std::string& account_id,
                 const std::optional<std::string>& batch_id, const nlohmann::json& data) {
  std::string event_id = new_uuid_v7().to_string();
  nlohmann::json payload = {{"id", event_id},
                            {"type", type},
                            {"created_at", SystemClock::instance().now_unix_ms() / 1000},
                            {"data", data}};
  tx.exec_params(
      "INSERT INTO outbox (event_id, event_type, account_id, batch_id, payload) "
      "VALUES ($1, $2, $3, $4, $5::jsonb)",
      event_id, type, account_id, batch_id, payload.dump());
  tx.exec("NOTIFY hr_webhook");
}

bool BatchInfo::is_terminal() const { return finished_at_ms.has_value(); }

Result<CreatedKey> create_api_key(pqxx::connection& conn, const std::string& account) {
  CreatedKey out;
  out.key = "hr_" + random_hex(24);
  HR_ASSIGN_OR_RETURN(out.account_id, ensure_api_key(conn, account, out.key));
  return out;
}

Result<std::string> ensure_api_key(pqxx::connection& conn, const std::string& account,
                                   const std::string& key) {
  if (account.empty() || account.size() > 128) {
    return invalid_argument("account name must be 1 to 128 characters", "account");
  }
  if (key.size() < 16) return invalid_argument("API keys must be at least 16 characters", "key");
  std::string account_id;
  Status st = pg_guard("create key", [&]() -> Status {
    pqxx::work tx(conn);
    tx.exec_params("INSERT INTO accounts (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                   new_uuid_v4().to_string(), account);
    account_id = tx.exec_params1("SELECT id::text FROM accounts WHERE name = $1", account)[0]
                     .as<std::string>();
    pqxx::result existing =
        tx.exec_params("SELECT account_id::text FROM api_keys WHERE key_hash = decode($1, 'hex')",
                       to_hex(sha256(key)));
    if (!existing.empty()) {
      if (existing[0][0].as<std::string>() != account_id) {
        return Status(StatusCode::kConflict, "this key belongs to another account", "key");
      }
      tx.commit();
      return Status::ok();
    }
    tx.exec_params(
        "INSERT INTO api_keys (id, account_id, key_hash, prefix) "
        "VALUES ($1, $2, decode($3, 'hex'), $4)",
        new_uuid_v4().to_string(), account_id, to_hex(sha256(key)), key.substr(0, 7));
    // APIs that cached it as unknown forget that.
    tx.exec(std::string("NOTIFY ") + kKeysChannel + ", 'created'");
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return account_id;
}

Result<int> revoke_api_keys(pqxx::connection& conn, const std::string& key,
                            const std::string& account) {
  if (key.empty() == account.empty()) {
    return invalid_argument("name either a key or an account", key.empty() ? "key" : "account");
  }
  int revoked = 0;
  Status st = pg_guard("revoke keys", [&]() -> Status {
    pqxx::work tx(conn);
    pqxx::result known =
        key.empty() ? tx.exec_params(
                          "SELECT k.id FROM api_keys k JOIN accounts a ON a.id = k.account_id "
                          "WHERE a.name = $1",
                          account)
                    : tx.exec_params("SELECT id FROM api_keys WHERE key_hash = decode($1, 'hex')",
                                     to_hex(sha256(key)));
    if (known.empty()) {
      return key.empty() ? not_found("no account named '" + account + "' with keys")
                         : not_found("no such key");
    }
    pqxx::result r =
        key.empty()
            ? tx.exec_params(
                  "UPDATE api_keys k SET revoked_at = now() FROM accounts a "
                  "WHERE a.id = k.account_id AND a.name = $1 AND k.revoked_at IS NULL RETURNING 1",
                  account)
            : tx.exec_params(
                  "UPDATE api_keys SET revoked_at = now() "
                  "WHERE key_hash = decode($1, 'hex') AND revoked_at IS NULL RETURNING 1",
                  to_hex(sha256(key)));
    revoked = static_cast<int>(r.size());
    tx.exec(std::string("NOTIFY ") + kKeysChannel + ", 'revoked'");
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return revoked;
}

Result<std::string> authenticate(pqxx::connection& conn, const std::string& key) {
  std::string account_id;
  Status st = pg_guard("authenticate", [&]() -> Status {
    conn.prepare("hr_authenticate",
                 "SELECT account_id::text FROM api_keys WHERE key_hash = decode($1, 'hex') "
                 "AND revoked_at IS NULL");
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_prepared("hr_authenticate", to_hex(sha256(key)));
    if (r.empty()) return Status(StatusCode::kUnauthenticated, "invalid API key");
    account_id = r[0][0].as<std::string>();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return account_id;
}

Result<SubmitResult> submit_batch(pqxx::connection& conn, const NewBatch& batch) {
  SubmitResult out;
  Status st = pg_guard("submit", [&]() -> Status {
    pqxx::work tx(conn);
    std::string id = new_uuid_v7().to_string();
    std::optional<std::string> deadline;
    if (batch.deadline_unix_ms) deadline = std::to_string(*batch.deadline_unix_ms);
    std::optional<std::string> events;
    bool wants_request_events = false;
    if (batch.webhook_events) {
      events = pg_text_array(*batch.webhook_events);  // checked names: no quoting needed
      for (const std::string& e : *batch.webhook_events) {
        wants_request_events = wants_request_events || e == "request.completed";
      }
    }
    // Request-level events are written for batches whose webhook asks for them, or when an
    // enabled endpoint of the account subscribes to them.
    pqxx::result inserted = tx.exec_params(
        "INSERT INTO batches (id, account_id, model, api_shape, status, num_total, priority, "
        "deadline, idempotency_key, request_hash, metadata, endpoint, input_file_id, "
        "completion_window, webhook_url, webhook_events, webhook_secret, request_events, "
        "retain_seconds, expires_at) "
        "SELECT $1, $2, $3, $4, 'queued', $5, "
        "coalesce($6, (SELECT default_priority FROM accounts WHERE id = $2)), "
        "to_timestamp($7::bigint / 1000.0), $8, "
        "decode($9, 'hex'), $10::jsonb, $11, $12::uuid, $13, $14, $15::text[], $16, "
        "$17 OR EXISTS (SELECT 1 FROM webhook_endpoints WHERE account_id = $2 AND enabled "
        "AND 'request.completed' = ANY (event_types)), k.s, now() + k.s * interval '1 second' "
        "FROM (SELECT " +
            chosen_retention("$18", "$2", "$19") +
            " AS s) AS k "
            "ON CONFLICT (account_id, idempotency_key) WHERE idempotency_key IS NOT NULL "
            "DO NOTHING RETURNING id::text",
        id, batch.account_id, batch.model, batch.api_shape, static_cast<int>(batch.size()),
        batch.priority, deadline, batch.idempotency_key, to_hex(batch.request_hash),
        batch.metadata_json, batch.endpoint, batch.input_file_id, batch.completion_window,
        batch.webhook_url, events,
        batch.webhook_secret ? std::optional<std::string>(secrets::seal(*batch.webhook_secret))
                             : std::nullopt,
        wants_request_events && batch.webhook_url.has_value(), batch.retain_seconds,
        batch.default_retain_seconds);
    if (inserted.empty()) {
      pqxx::row prior = tx.exec_params1(
          "SELECT id::text, encode(request_hash, 'hex'), model FROM batches "
          "WHERE account_id = $1 AND idempotency_key = $2",
          batch.account_id, batch.idempotency_key);
      // The same body for another model (named in the path, not the body) is another request.
      if (prior[1].as<std::string>() != to_hex(batch.request_hash) ||
          prior[2].as<std::string>() != batch.model) {
        return Status(StatusCode::kConflict,
                      "Idempotency-Key was already used with a different request body or model",
                      "Idempotency-Key");
      }
      out.batch_id = prior[0].as<std::string>();
      out.replayed = true;
      return Status::ok();
    }
    {
      pqxx::stream_to copy(
          tx, "requests",
          std::vector<std::string>{"batch_id", "idx", "custom_id", "body", "affinity"});
      NewRequest produced;
      int64_t tokens = 0;
      for (size_t idx = 0; idx < batch.size(); ++idx) {
        const NewRequest* r = &produced;
        if (batch.produce) {
          Status st = batch.produce(idx, &produced);
          if (!st.is_ok()) return st;  // rolls back: nothing of the batch is stored
        } else {
          r = &batch.requests[idx];
        }
        tokens += r->tokens;
        // A null pointer is NULL in COPY's text.
        const std::string affinity = r->affinity ? std::to_string(*r->affinity) : std::string();
        copy << std::make_tuple(id, static_cast<int>(idx),
                                r->custom_id ? r->custom_id->c_str() : nullptr, r->body,
                                r->affinity ? affinity.c_str() : nullptr);
      }
      copy.complete();
      if (tokens > 0) {
        tx.exec_params("UPDATE batches SET enqueued_tokens = $2 WHERE id = $1::uuid", id, tokens);
      }
    }
    HR_RETURN_IF_ERROR(enforce_enqueued_limit(tx, batch.account_id));  // rolls back when over
    if (batch.webhook_url && !batch.webhook_secret) ensure_signing_secret(tx, batch.account_id);
    announce_queued(tx, batch.account_id, id, batch.model, static_cast<int64_t>(batch.size()),
                    nlohmann::json::object());
    tx.commit();
    out.batch_id = id;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Status enforce_enqueued_limit(pqxx::work& tx, const std::string& account_id) {
  pqxx::result limit = tx.exec_params(
      "SELECT max_enqueued_requests, max_enqueued_tokens FROM accounts WHERE id = $1 "
      "AND (max_enqueued_requests IS NOT NULL OR max_enqueued_tokens IS NOT NULL)",
      account_id);
  if (limit.empty()) return Status::ok();
  tx.exec_params("SELECT pg_advisory_xact_lock(hashtextextended('hr_enqueued:' || $1, 0))",
                 account_id);
  // A batch's open tokens: its estimate's share of requests not yet ended.
  pqxx::row pending = tx.exec_params1(
      "SELECT coalesce(sum(n), 0), coalesce(sum(enqueued_tokens * n / greatest(num_total, 1)), 0) "
      "FROM (SELECT num_total - num_completed - num_failed - num_cancelled - num_expired AS n, "
      "  num_total, enqueued_tokens FROM batches WHERE account_id = $1 AND finished_at IS NULL) b",
      account_id);
  if (!limit[0][0].is_null()) {
    const int64_t max = limit[0][0].as<int64_t>();
    const int64_t now = pending[0].as<int64_t>();
    if (now > max) {
      return Status(StatusCode::kResourceExhausted,
                    "this would make " + std::to_string(now) +
                        " of the account's requests queued or running, past its limit of " +
                        std::to_string(max) +
                        " (max_enqueued_requests); submit again when some have finished",
                    "max_enqueued_requests");
    }
  }
  if (!limit[0][1].is_null()) {
    const int64_t max = limit[0][1].as<int64_t>();
    const int64_t now = pending[1].as<int64_t>();
    if (now > max) {
      return Status(StatusCode::kResourceExhausted,
                    "this would make " + std::to_string(now) +
                        " tokens of the account's requests queued or running (prompt bytes / 4 "
                        "plus max_tokens), past its limit of " +
                        std::to_string(max) +
                        " (max_enqueued_tokens); submit again when some have finished, or ask "
                        "for fewer max_tokens",
                    "max_enqueued_tokens");
    }
  }
  return Status::ok();
}

void announce_queued(pqxx::work& tx, const std::string& account_id, const std::string& batch_id,
                     const std::string& model, int64_t total, const nlohmann::json& extra) {
  nlohmann::json data = {{"id", batch_id},
                         {"status", "queued"},
                         {"model", model},
                         {"request_counts", {{"total", total}, {"completed", 0}, {"failed", 0}}}};
  data.update(extra);
  write_event(tx, "batch.queued", account_id, batch_id, data);
  tx.exec("NOTIFY hr_dispatch");
}

Result<BatchInfo> get_batch(pqxx::connection& conn, const std::string& account_id,
                            const std::string& batch_id) {
  BatchInfo out;
  Status st = pg_guard("get batch", [&]() -> Status {
    // Polling is the hottest read: a prepared statement skips parsing and planning.
    conn.prepare("hr_get_batch", std::string("SELECT ") + kBatchColumns +
                                     " FROM batches WHERE id = $1::uuid AND account_id = $2");
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_prepared("hr_get_batch", batch_id, account_id);
    if (r.empty()) return not_found("no such batch: " + batch_id);
    out = batch_from_row(r[0]);
    return check_visible(out);
  });
  if (!st.is_ok()) return st;
  return out;
}

bool is_request_status(std::string_view status) {
  for (std::string_view s : {"queued", "running", "completed", "failed", "cancelled", "expired"}) {
    if (status == s) return true;
  }
  return false;
}

Result<std::vector<RequestResult>> get_results(pqxx::connection& conn, const std::string& batch_id,
                                               bool include_pending, int from_idx, int limit,
                                               const std::vector<std::string>& statuses) {
  std::optional<std::string> only;  // the statuses as a Postgres array literal (none: all)
  if (!statuses.empty()) {
    only = "{";
    for (const std::string& s : statuses) *only += "\"" + s + "\",";
    only->back() = '}';
  }
  std::vector<RequestResult> out;
  Status st = pg_guard("get results", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    std::string sql =
        "SELECT idx, custom_id, status, result, error, coalesce(prompt_tokens, 0), "
        "coalesce(completion_tokens, 0), coalesce(cached_tokens, 0) FROM requests "
        "WHERE batch_id = $1::uuid AND idx >= $2";
    if (!include_pending) sql += " AND status NOT IN ('queued', 'running')";
    sql += " AND ($4::text[] IS NULL OR status = ANY($4::text[])) ORDER BY idx LIMIT $3";
    pqxx::result r = tx.exec_params(sql, batch_id, from_idx, limit, only);
    out.reserve(r.size());
    for (const auto& row : r) {
      RequestResult rr;
      rr.idx = row[0].as<int>();
      if (!row[1].is_null()) rr.custom_id = row[1].as<std::string>();
      rr.status = row[2].as<std::string>();
      if (!row[3].is_null()) rr.result_json = row[3].as<std::string>();
      if (!row[4].is_null()) rr.error_json = row[4].as<std::string>();
      rr.prompt_tokens = row[5].as<int>();
      rr.completion_tokens = row[6].as<int>();
      rr.cached_tokens = row[7].as<int>();
      out.push_back(std::move(rr));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

std::optional<std::string> finish_batch_if_done(pqxx::work& tx, const std::string& batch_id) {
  pqxx::result r = tx.exec_params(
      "UPDATE batches SET finished_at = now(), "
      "expires_at = greatest(expires_at, now() + least(retain_seconds, 3600) * interval '1 "
      "second'), "
      "status = CASE "
      "  WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' "
      "  WHEN num_expired > 0 THEN 'expired' "
      "  WHEN num_failed = num_total THEN 'failed' "
      "  WHEN num_failed > 0 THEN 'completed_with_errors' "
      "  ELSE 'completed' END "
      "WHERE id = $1::uuid AND finished_at IS NULL "
      "  AND num_completed + num_failed + num_cancelled + num_expired = num_total "
      "RETURNING status, account_id::text, model, num_total, num_completed, num_failed, "
      "  num_cancelled, num_expired, prompt_tokens, completion_tokens, cached_tokens",
      batch_id);
  if (r.empty()) return std::nullopt;
  const pqxx::row& row = r[0];
  std::string status = row[0].as<std::string>();
  nlohmann::json data = {{"id", batch_id},
                         {"status", status},
                         {"model", row[2].as<std::string>()},
                         {"request_counts",
                          {{"total", row[3].as<int>()},
                           {"completed", row[4].as<int>()},
                           {"failed", row[5].as<int>()},
                           {"cancelled", row[6].as<int>()},
                           {"expired", row[7].as<int>()}}},
                         {"usage",
                          {{"prompt_tokens", row[8].as<int64_t>()},
                           {"completion_tokens", row[9].as<int64_t>()},
                           {"cached_tokens", row[10].as<int64_t>()}}}};
  write_event(tx, event_type_for(status), row[1].as<std::string>(), batch_id, data);
  tx.exec("NOTIFY hr_dispatch");
  return status;
}

void write_request_events(pqxx::work& tx, const pqxx::result& rows) {
  std::set<std::string> batch_ids;
  for (const auto& row : rows) {
    if (row[2].as<std::string>() != "queued") batch_ids.insert(row[0].as<std::string>());
  }
  if (batch_ids.empty()) return;
  std::map<std::string, std::string> account_of;
  for (const auto& row :
       tx.exec_params("SELECT id::text, account_id::text FROM batches WHERE request_events "
                      "AND id IN (SELECT jsonb_array_elements_text($1::jsonb)::uuid)",
                      nlohmann::json(batch_ids).dump())) {
    account_of[row[0].as<std::string>()] = row[1].as<std::string>();
  }
  if (account_of.empty()) return;
  for (const auto& row : rows) {
    auto it = account_of.find(row[0].as<std::string>());
    if (it == account_of.end() || row[2].as<std::string>() == "queued") continue;
    nlohmann::json data = {
        {"batch_id", it->first},
        {"id", row[1].as<int>()},
        {"custom_id",
         row[6].is_null() ? nlohmann::json(nullptr) : nlohmann::json(row[6].as<std::string>())},
        {"status", row[2].as<std::string>()},
        {"usage",
         {{"prompt_tokens", row[3].as<int>()},
          {"completion_tokens", row[4].as<int>()},
          {"cached_tokens", row[5].as<int>()}}}};
    write_event(tx, "request.completed", it->second, it->first, data);
  }
}

Status mark_pushed(pqxx::connection& conn, const std::vector<Requeued>& requeued) {
  if (requeued.empty()) return Status::ok();
  nlohmann::json keys = nlohmann::json::array();
  for (const Requeued& r : requeued)
    keys.push_back({{"b", r.batch_id}, {"i", r.idx}, {"a", r.attempt}});
  return pg_guard("mark pushed", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    tx.exec_params(
        "UPDATE requests r SET push_pending = false "
        "FROM jsonb_to_recordset($1::jsonb) AS t(b uuid, i int, a int) "
        "WHERE r.batch_id = t.b AND r.idx = t.i AND r.attempt = t.a AND r.push_pending",
        keys.dump());
    return Status::ok();
  });
}

Result<CancelResult> cancel_batch(pqxx::connection& conn, const std::string& account_id,
                                  const std::string& batch_id) {
  CancelResult out;
  Status st = pg_guard("cancel", [&]() -> Status {
    // Lock order everywhere: request rows first, then batch rows (in id order).
    pqxx::work tx(conn);
    pqxx::result owned = tx.exec_params(
        std::string("SELECT cancel_requested_at IS NOT NULL, finished_at IS NOT NULL FROM batches "
                    "WHERE id = $1::uuid AND account_id = $2 AND ") +
            kBatchVisible,
        batch_id, account_id);
    if (owned.empty()) return not_found("no such batch: " + batch_id);
    out.already_requested = owned[0][0].as<bool>();
    if (!out.already_requested && !owned[0][1].as<bool>()) {
      pqxx::result cancelled = tx.exec_params(
          "UPDATE requests SET status = 'cancelled', finished_at = now(), push_pending = false "
          "WHERE batch_id = $1::uuid AND status = 'queued'",
          batch_id);
      out.num_cancelled_now = static_cast<int>(cancelled.affected_rows());
      tx.exec_params(
          "UPDATE batches SET num_cancelled = num_cancelled + $2, "
          "cancel_requested_at = coalesce(cancel_requested_at, now()) WHERE id = $1::uuid",
          batch_id, out.num_cancelled_now);
      finish_batch_if_done(tx, batch_id);
    }
    out.batch = batch_from_row(tx.exec_params1(
        std::string("SELECT ") + kBatchColumns + " FROM batches WHERE id = $1::uuid", batch_id));
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::vector<BatchInfo>> list_batches(pqxx::connection& conn, const std::string& account_id,
                                            const ListQuery& query) {
  std::vector<BatchInfo> out;
  Status st = pg_guard("list", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params(
        std::string("SELECT ") + kBatchColumns +
            " FROM batches WHERE account_id = $1 AND ($2::text IS NULL OR status = $2) AND " +
            kBatchVisible +
            " "
            "AND ($3::uuid IS NULL OR id < $3::uuid) ORDER BY id DESC LIMIT $4",
        account_id, query.status, query.after, query.limit);
    for (const auto& row : r) out.push_back(batch_from_row(row));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::vector<PendingRequests>> pending_requests_by_model(pqxx::connection& conn) {
  std::vector<PendingRequests> out;
  Status st = pg_guard("queue depth", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    for (const auto& row :
         tx.exec("SELECT model, sum(num_total - num_completed - num_failed - num_cancelled - "
                 "num_expired) FROM batches WHERE finished_at IS NULL GROUP BY model")) {
      out.push_back({row[0].as<std::string>(), row[1].as<int64_t>()});
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

}  // namespace hr::queue
