// Webhook endpoints, secrets, fan-out, claims and outcomes.
#include "queue/webhooks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>

#include "base/hash.h"
#include "base/ids.h"
#include "base/secret_box.h"
#include "queue/pg.h"

namespace hr::queue {
namespace {

using nlohmann::json;

std::string ms_of(const char* column) {
  return std::string("(extract(epoch FROM ") + column + ") * 1000)::bigint";
}

std::optional<int64_t> opt_i64(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<int64_t>();
}

std::optional<std::string> opt_str(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<std::string>();
}

std::vector<std::string> strings_of(const std::string& json_text) {
  std::vector<std::string> out;
  json j = json::parse(json_text, nullptr, false);
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    if (e.is_string()) out.push_back(e.get<std::string>());
  }
  return out;
}

const std::string& endpoint_columns() {
  static const std::string cols =
      "id::text, url, description, to_json(event_types)::text, enabled, disabled_reason, " +
      ms_of("created_at") + ", " + ms_of("updated_at") +
      ", CASE WHEN previous_secret_expires_at > now() THEN " + ms_of("previous_secret_expires_at") +
      " END";
  return cols;
}

WebhookEndpoint endpoint_from_row(const pqxx::row& r) {
  WebhookEndpoint e;
  e.id = r[0].as<std::string>();
  e.url = r[1].as<std::string>();
  e.description = r[2].as<std::string>();
  e.event_types = strings_of(r[3].as<std::string>());
  e.enabled = r[4].as<bool>();
  e.disabled_reason = opt_str(r[5]);
  e.created_at_ms = r[6].as<int64_t>();
  e.updated_at_ms = r[7].as<int64_t>();
  e.previous_secret_expires_at_ms = opt_i64(r[8]);
  return e;
}

const std::string& secret_columns() {
  static const std::string cols = "secret, " + ms_of("created_at") + ", " + ms_of("rotated_at") +
                                  ", CASE WHEN previous_secret_expires_at > now() THEN " +
                                  ms_of("previous_secret_expires_at") + " END";
  return cols;
}

SigningSecret secret_from_row(const pqxx::row& r) {
  SigningSecret s;
  Result<std::string> secret = secrets::open(r[0].as<std::string>());
  if (!secret.is_ok()) throw std::runtime_error(secret.status().message());  // pg_guard's error
  s.secret = std::move(secret).value();
  s.created_at_ms = r[1].as<int64_t>();
  s.rotated_at_ms = opt_i64(r[2]);
  s.previous_secret_expires_at_ms = opt_i64(r[3]);
  return s;
}

const std::string& delivery_columns() {
  static const std::string cols =
      "d.id::text, d.event_id::text, d.event_type, d.batch_id::text, d.endpoint_id::text, d.url, "
      "d.status, d.attempts, d.last_status_code, d.last_error, "
      "CASE WHEN d.status = 'pending' THEN " +
      ms_of("d.next_attempt_at") + " END, " + ms_of("d.last_attempt_at") + ", " +
      ms_of("d.delivered_at") + ", " + ms_of("d.created_at") +
      ", (SELECT coalesce(json_agg(json_build_array(a.attempt, " + ms_of("a.started_at") +
      ", a.duration_ms, a.status_code, a.error, a.outcome) ORDER BY a.attempt), '[]') "
      "FROM webhook_attempts a WHERE a.delivery_id = d.id)::text";
  return cols;
}

DeliveryInfo delivery_from_row(const pqxx::row& r) {
  DeliveryInfo d;
  d.id = r[0].as<std::string>();
  d.event_id = r[1].as<std::string>();
  d.event_type = r[2].as<std::string>();
  d.batch_id = opt_str(r[3]);
  d.endpoint_id = opt_str(r[4]);
  d.url = r[5].as<std::string>();
  d.status = r[6].as<std::string>();
  d.attempts = r[7].as<int>();
  if (!r[8].is_null()) d.last_status_code = r[8].as<int>();
  d.last_error = opt_str(r[9]);
  d.next_attempt_at_ms = opt_i64(r[10]);
  d.last_attempt_at_ms = opt_i64(r[11]);
  d.delivered_at_ms = opt_i64(r[12]);
  d.created_at_ms = r[13].as<int64_t>();
  for (const auto& a : json::parse(r[14].as<std::string>())) {
    AttemptInfo info;
    info.attempt = a[0].get<int>();
    info.started_at_ms = a[1].get<int64_t>();
    info.duration_ms = a[2].get<int>();
    if (!a[3].is_null()) info.status_code = a[3].get<int>();
    if (!a[4].is_null()) info.error = a[4].get<std::string>();
    info.outcome = a[5].get<std::string>();
    d.attempt_log.push_back(std::move(info));
  }
  return d;
}

template <typename T, typename Fn>
Result<T> guarded(std::string_view op, Fn&& fn) {
  T out{};
  Status st = pg_guard(op, [&]() -> Status { return fn(&out); });
  if (!st.is_ok()) return st;
  return out;
}

}  // namespace

const std::vector<std::string>& webhook_event_types() {
  static const std::vector<std::string> types = {"batch.queued",  "batch.completed",
                                                 "batch.failed",  "batch.cancelled",
                                                 "batch.expired", "request.completed"};
  return types;
}

const std::vector<std::string>& default_webhook_events() {
  static const std::vector<std::string> types(webhook_event_types().begin(),
                                              webhook_event_types().end() - 1);
  return types;
}

Status check_event_types(const std::vector<std::string>& types, const std::string& field) {
  if (types.empty()) return invalid_argument(field + " must name at least one event type", field);
  const auto& known = webhook_event_types();
  for (const std::string& t : types) {
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      return invalid_argument("unknown event type '" + t + "' in " + field +
                                  "; known: batch.queued, batch.completed, batch.failed, "
                                  "batch.cancelled, batch.expired, request.completed",
                              field);
    }
  }
  return Status::ok();
}

std::string new_webhook_secret() {
  uint8_t bytes[32];
  random_bytes(bytes, sizeof(bytes));
  return "whsec_" + base64_encode(std::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
}

Status check_webhook_secret(const std::string& secret, const std::string& field) {
  std::optional<std::string> key;
  if (secret.rfind("whsec_", 0) == 0) key = base64_decode(secret.substr(6));
  if (!key || key->size() < 24 || key->size() > 64) {
    return invalid_argument(
        field + " must be whsec_ followed by the base64 of 24 to 64 random bytes", field);
  }
  return Status::ok();
}

Result<WebhookEndpoint> create_endpoint(pqxx::connection& conn, const std::string& account_id,
                                        const std::string& url, const std::string& description,
                                        const std::vector<std::string>& event_types, bool enabled) {
  return guarded<WebhookEndpoint>("create webhook", [&](WebhookEndpoint* out) -> Status {
    pqxx::work tx(conn);
    // Counted under a lock on the account's creations, so that concurrent creations (through
    // several API processes too) cannot pass the limit together.
    tx.exec_params("SELECT pg_advisory_xact_lock(hashtext('webhook_endpoints:' || $1))",
                   account_id);
    const int64_t have =
        tx.exec_params1("SELECT count(*) FROM webhook_endpoints WHERE account_id = $1",
                        account_id)[0]
            .as<int64_t>();
    if (have >= kMaxWebhookEndpoints) {
      return Status(StatusCode::kConflict,
                    "this account has " + std::to_string(have) + " webhook endpoints, the most " +
                        "allowed; delete one (DELETE /v1/webhooks/{id}) before creating another");
    }
    std::string secret = new_webhook_secret();
    *out = endpoint_from_row(tx.exec_params1(
        "INSERT INTO webhook_endpoints (id, account_id, url, description, event_types, enabled, "
        "secret) VALUES ($1, $2, $3, $4, $5::text[], $6, $7) RETURNING " +
            endpoint_columns(),
        new_uuid_v7().to_string(), account_id, url, description, pg_text_array(event_types),
        enabled, secrets::seal(secret)));
    tx.commit();
    out->secret = secret;
    return Status::ok();
  });
}

Result<std::vector<WebhookEndpoint>> list_endpoints(pqxx::connection& conn,
                                                    const std::string& account_id) {
  return guarded<std::vector<WebhookEndpoint>>(
      "list webhooks", [&](std::vector<WebhookEndpoint>* out) -> Status {
        pqxx::nontransaction tx(conn);
        for (const auto& r : tx.exec_params("SELECT " + endpoint_columns() +
                                                " FROM webhook_endpoints WHERE account_id = $1 "
                                                "ORDER BY id",
                                            account_id)) {
          out->push_back(endpoint_from_row(r));
        }
        return Status::ok();
      });
}

Result<WebhookEndpoint> get_endpoint(pqxx::connection& conn, const std::string& account_id,
                                     const std::string& id) {
  return guarded<WebhookEndpoint>("get webhook", [&](WebhookEndpoint* out) -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params("SELECT " + endpoint_columns() +
                                        " FROM webhook_endpoints WHERE id = $1::uuid AND "
                                        "account_id = $2",
                                    id, account_id);
    if (r.empty()) return not_found("no such webhook endpoint: " + id);
    *out = endpoint_from_row(r[0]);
    return Status::ok();
  });
}

Result<WebhookEndpoint> update_endpoint(pqxx::connection& conn, const std::string& account_id,
                                        const std::string& id, const EndpointPatch& patch) {
  return guarded<WebhookEndpoint>("update webhook", [&](WebhookEndpoint* out) -> Status {
    pqxx::work tx(conn);
    std::optional<std::string> types;
    if (patch.event_types) types = pg_text_array(*patch.event_types);
    // Re-enabling clears the reason it was disabled.
    pqxx::result r = tx.exec_params(
        "UPDATE webhook_endpoints SET url = coalesce($3, url), "
        "description = coalesce($4, description), event_types = coalesce($5::text[], event_types), "
        "enabled = coalesce($6, enabled), "
        "disabled_reason = CASE WHEN $6 IS TRUE THEN NULL ELSE disabled_reason END, "
        "updated_at = now() WHERE id = $1::uuid AND account_id = $2 RETURNING " +
            endpoint_columns(),
        id, account_id, patch.url, patch.description, types, patch.enabled);
    if (r.empty()) return not_found("no such webhook endpoint: " + id);
    *out = endpoint_from_row(r[0]);
    tx.commit();
    return Status::ok();
  });
}

Status delete_endpoint(pqxx::connection& conn, const std::string& account_id,
                       const std::string& id) {
  return pg_guard("delete webhook", [&]() -> Status {
    pqxx::work tx(conn);
    pqxx::result r = tx.exec_params(
        "DELETE FROM webhook_endpoints WHERE id = $1::uuid AND account_id = $2", id, account_id);
    if (r.affected_rows() == 0) return not_found("no such webhook endpoint: " + id);
    tx.commit();
    return Status::ok();
  });
}

Result<WebhookEndpoint> rotate_endpoint_secret(pqxx::connection& conn,
                                               const std::string& account_id, const std::string& id,
                                               int64_t grace_ms) {
  return guarded<WebhookEndpoint>("rotate webhook secret", [&](WebhookEndpoint* out) -> Status {
    pqxx::work tx(conn);
    std::string secret = new_webhook_secret();
    pqxx::result r = tx.exec_params(
        "UPDATE webhook_endpoints SET previous_secret = secret, secret = $3, "
        "previous_secret_expires_at = now() + $4 * interval '1 millisecond', updated_at = now() "
        "WHERE id = $1::uuid AND account_id = $2 RETURNING " +
            endpoint_columns(),
        id, account_id, secrets::seal(secret), grace_ms);
    if (r.empty()) return not_found("no such webhook endpoint: " + id);
    *out = endpoint_from_row(r[0]);
    tx.commit();
    out->secret = secret;
    return Status::ok();
  });
}

void ensure_signing_secret(pqxx::work& tx, const std::string& account_id) {
  tx.exec_params(
      "INSERT INTO account_webhook_secrets (account_id, secret) VALUES ($1, $2) "
      "ON CONFLICT (account_id) DO NOTHING",
      account_id, secrets::seal(new_webhook_secret()));
}

Result<SigningSecret> get_signing_secret(pqxx::connection& conn, const std::string& account_id) {
  return guarded<SigningSecret>("signing secret", [&](SigningSecret* out) -> Status {
    pqxx::work tx(conn);
    ensure_signing_secret(tx, account_id);
    *out = secret_from_row(tx.exec_params1(
        "SELECT " + secret_columns() + " FROM account_webhook_secrets WHERE account_id = $1",
        account_id));
    tx.commit();
    return Status::ok();
  });
}

Result<SigningSecret> rotate_signing_secret(pqxx::connection& conn, const std::string& account_id,
                                            int64_t grace_ms) {
  return guarded<SigningSecret>("rotate signing secret", [&](SigningSecret* out) -> Status {
    pqxx::work tx(conn);
    ensure_signing_secret(tx, account_id);
    *out = secret_from_row(tx.exec_params1(
        "UPDATE account_webhook_secrets SET previous_secret = secret, secret = $2, "
        "previous_secret_expires_at = now() + $3 * interval '1 millisecond', rotated_at = now() "
        "WHERE account_id = $1 RETURNING " +
            secret_columns(),
        account_id, secrets::seal(new_webhook_secret()), grace_ms));
    tx.commit();
    return Status::ok();
  });
}

Result<std::vector<DeliveryInfo>> list_deliveries(pqxx::connection& conn,
                                                  const std::string& account_id,
                                                  const DeliveryQuery& q) {
  return guarded<std::vector<DeliveryInfo>>(
      "list deliveries", [&](std::vector<DeliveryInfo>* out) -> Status {
        pqxx::nontransaction tx(conn);
        if (q.endpoint_id &&
            tx.exec_params(
                  "SELECT 1 FROM webhook_endpoints WHERE id = $1::uuid AND account_id = $2",
                  *q.endpoint_id, account_id)
                .empty()) {
          return not_found("no such webhook endpoint: " + *q.endpoint_id);
        }
        pqxx::result r = tx.exec_params(
            "SELECT " + delivery_columns() +
                " FROM webhook_deliveries d WHERE d.account_id = $1 "
                "AND ($2::uuid IS NULL OR d.endpoint_id = $2::uuid) "
                "AND ($3::uuid IS NULL OR d.batch_id = $3::uuid) "
                "AND ($4::text IS NULL OR d.status = $4) "
                "AND ($5::uuid IS NULL OR d.seq < (SELECT seq FROM webhook_deliveries "
                "  WHERE id = $5::uuid)) ORDER BY d.seq DESC LIMIT $6",
            account_id, q.endpoint_id, q.batch_id, q.status, q.after, q.limit);
        for (const auto& row : r) out->push_back(delivery_from_row(row));
        return Status::ok();
      });
}

Result<DeliveryInfo> retry_delivery(pqxx::connection& conn, const std::string& account_id,
                                    const std::string& delivery_id) {
  return guarded<DeliveryInfo>("retry delivery", [&](DeliveryInfo* out) -> Status {
    pqxx::work tx(conn);
    pqxx::result cur = tx.exec_params(
        "SELECT d.status, coalesce(e.enabled, true) FROM webhook_deliveries d "
        "LEFT JOIN webhook_endpoints e ON e.id = d.endpoint_id "
        "WHERE d.id = $1::uuid AND d.account_id = $2 FOR UPDATE OF d",
        delivery_id, account_id);
    if (cur.empty()) return not_found("no such delivery: " + delivery_id);
    if (cur[0][0].as<std::string>() == "pending") {
      return Status(StatusCode::kFailedPrecondition, "this delivery already has an attempt pending",
                    "delivery");
    }
    if (!cur[0][1].as<bool>()) {
      return Status(StatusCode::kFailedPrecondition,
                    "the endpoint is disabled; enable it with PATCH first", "endpoint");
    }
    tx.exec_params(
        "UPDATE webhook_deliveries SET status = 'pending', manual = true, next_attempt_at = now() "
        "WHERE id = $1::uuid",
        delivery_id);
    *out = delivery_from_row(tx.exec_params1(
        "SELECT " + delivery_columns() + " FROM webhook_deliveries d WHERE d.id = $1::uuid",
        delivery_id));
    tx.exec("NOTIFY hr_webhook");
    tx.commit();
    return Status::ok();
  });
}

Result<int> fan_out_events(pqxx::connection& conn, int limit) {
  return guarded<int>("fan out events", [&](int* out) -> Status {
    pqxx::work tx(conn);
    pqxx::row r = tx.exec_params1(
        "WITH ev AS ("
        "  SELECT id, event_id, event_type, account_id, batch_id, payload::text AS body "
        "  FROM outbox WHERE processed_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED), "
        "marked AS (UPDATE outbox o SET processed_at = now() FROM ev WHERE o.id = ev.id "
        "  RETURNING 1), "
        "to_batch AS (INSERT INTO webhook_deliveries (event_id, event_type, account_id, batch_id, "
        "    url, payload, next_attempt_at) "
        "  SELECT ev.event_id, ev.event_type, ev.account_id, ev.batch_id, b.webhook_url, ev.body, "
        "    now() FROM ev JOIN batches b ON b.id = ev.batch_id "
        "  WHERE b.webhook_url IS NOT NULL "
        "    AND ev.event_type = ANY (coalesce(b.webhook_events, $2::text[])) "
        "  ORDER BY ev.id RETURNING 1), "
        "to_endpoints AS (INSERT INTO webhook_deliveries (event_id, event_type, account_id, "
        "    batch_id, endpoint_id, url, payload, next_attempt_at) "
        "  SELECT ev.event_id, ev.event_type, ev.account_id, ev.batch_id, e.id, e.url, ev.body, "
        "    now() FROM ev JOIN webhook_endpoints e ON e.account_id = ev.account_id "
        "    AND e.enabled AND ev.event_type = ANY (e.event_types) "
        "  ORDER BY ev.id, e.id RETURNING 1) "
        "SELECT (SELECT count(*) FROM marked), "
        "  (SELECT count(*) FROM to_batch) + (SELECT count(*) FROM to_endpoints)",
        limit, pg_text_array(default_webhook_events()));
    *out = r[0].as<int>();
    if (r[1].as<int>() > 0) tx.exec("NOTIFY hr_webhook");
    tx.commit();
    return Status::ok();
  });
}

Result<int> prune_webhook_history(pqxx::connection& conn, int keep_hours, int limit) {
  return guarded<int>("prune webhook history", [&](int* out) -> Status {
    pqxx::work tx(conn);
    // Oldest first by primary key, so the scan stops at the first young row's neighbourhood.
    pqxx::result events = tx.exec_params(
        "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE processed_at IS NOT NULL "
        "AND processed_at < now() - $1 * interval '1 hour' ORDER BY id LIMIT $2)",
        keep_hours, limit);
    pqxx::result deliveries = tx.exec_params(
        "DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries "
        "WHERE status <> 'pending' AND coalesce(last_attempt_at, created_at) < "
        "now() - $1 * interval '1 hour' ORDER BY seq LIMIT $2)",
        keep_hours, limit);
    tx.commit();
    *out = static_cast<int>(events.affected_rows() + deliveries.affected_rows());
    return Status::ok();
  });
}

Result<std::vector<ClaimedDelivery>> claim_deliveries(pqxx::connection& conn, int limit,
                                                      int64_t lease_ms) {
  return guarded<std::vector<
      ClaimedDelivery>>("claim deliveries", [&](std::vector<ClaimedDelivery>* out) -> Status {
    pqxx::work tx(conn);
    pqxx::result r = tx.exec_params(
        "WITH c AS (SELECT id FROM webhook_deliveries WHERE status = 'pending' "
        "  AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT $1 "
        "  FOR UPDATE SKIP LOCKED) "
        "UPDATE webhook_deliveries d SET attempts = d.attempts + 1, "
        "  next_attempt_at = now() + $2 * interval '1 millisecond', last_attempt_at = now() "
        "FROM c WHERE d.id = c.id "
        "RETURNING d.id::text, d.event_id::text, d.url, d.payload, d.attempts, d.manual, "
        "  d.endpoint_id::text, "
        "  coalesce((SELECT e.enabled FROM webhook_endpoints e WHERE e.id = d.endpoint_id), "
        "    true), "
        "  (CASE WHEN d.endpoint_id IS NOT NULL THEN "
        "    (SELECT json_build_array(e.secret, CASE WHEN e.previous_secret_expires_at > now() "
        "       THEN e.previous_secret END) FROM webhook_endpoints e WHERE e.id = d.endpoint_id) "
        "  ELSE coalesce("
        "    (SELECT json_build_array(b.webhook_secret) FROM batches b "
        "       WHERE b.id = d.batch_id AND b.webhook_secret IS NOT NULL), "
        "    (SELECT json_build_array(s.secret, CASE WHEN s.previous_secret_expires_at > now() "
        "       THEN s.previous_secret END) FROM account_webhook_secrets s "
        "       WHERE s.account_id = d.account_id)) END)::text",
        limit, lease_ms);
    tx.commit();
    for (const auto& row : r) {
      ClaimedDelivery c;
      c.id = row[0].as<std::string>();
      c.event_id = row[1].as<std::string>();
      c.url = row[2].as<std::string>();
      c.payload = row[3].as<std::string>();
      c.attempt = row[4].as<int>();
      c.manual = row[5].as<bool>();
      c.endpoint_id = opt_str(row[6]);
      c.endpoint_enabled = row[7].as<bool>();
      if (!row[8].is_null()) {
        for (const std::string& sealed : strings_of(row[8].as<std::string>())) {
          Result<std::string> secret = secrets::open(sealed);
          if (!secret.is_ok()) return secret.status();  // no key here: sign nothing wrongly
          c.secrets.push_back(std::move(secret).value());
        }
      }
      out->push_back(std::move(c));
    }
    return Status::ok();
  });
}

Status release_claims(pqxx::connection& conn, const std::vector<ClaimedDelivery>& claims) {
  if (claims.empty()) return Status::ok();
  json rows = json::array();
  for (const ClaimedDelivery& c : claims) rows.push_back({{"id", c.id}, {"attempt", c.attempt}});
  return pg_guard("release claims", [&]() -> Status {
    pqxx::work tx(conn);
    tx.exec_params(
        "UPDATE webhook_deliveries d SET attempts = d.attempts - 1, next_attempt_at = now() "
        "FROM jsonb_to_recordset($1::jsonb) AS r(id uuid, attempt int) "
        "WHERE d.id = r.id AND d.attempts = r.attempt AND d.status = 'pending'",
        rows.dump());
    tx.commit();
    return Status::ok();
  });
}

Result<int> record_attempts(pqxx::connection& conn, const std::vector<AttemptOutcome>& outcomes) {
  if (outcomes.empty()) return 0;
  json rows = json::array();
  json disable = json::array();
  for (const AttemptOutcome& o : outcomes) {
    rows.push_back({{"id", o.delivery_id},
                    {"attempt", o.attempt},
                    {"outcome", o.outcome},
                    {"code", o.status_code ? json(*o.status_code) : json(nullptr)},
                    {"error", o.error},
                    {"started", o.started_at_ms},
                    {"dur", o.duration_ms},
                    {"retry", o.retry_in_ms}});
    if (o.disable_endpoint) disable.push_back(*o.disable_endpoint);
  }
  return guarded<int>("record attempts", [&](int* out) -> Status {
    pqxx::work tx(conn);
    pqxx::row r = tx.exec_params1(
        "WITH r AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS t(id uuid, attempt int, "
        "  outcome text, code int, error text, started bigint, dur int, retry bigint)), "
        "upd AS (UPDATE webhook_deliveries d SET "
        "  status = CASE r.outcome WHEN 'retry' THEN 'pending' ELSE r.outcome END, "
        "  next_attempt_at = CASE WHEN r.outcome = 'retry' "
        "    THEN now() + r.retry * interval '1 millisecond' END, "
        "  last_status_code = r.code, last_error = nullif(r.error, ''), "
        "  delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() ELSE d.delivered_at END "
        "  FROM r WHERE d.id = r.id AND d.attempts = r.attempt AND d.status = 'pending' "
        "  RETURNING 1), "
        "ins AS (INSERT INTO webhook_attempts (delivery_id, attempt, started_at, duration_ms, "
        "    status_code, error, outcome) "
        "  SELECT r.id, r.attempt, to_timestamp(r.started / 1000.0), r.dur, r.code, "
        "    nullif(r.error, ''), r.outcome FROM r "
        "  WHERE EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.id = r.id) "
        "  ON CONFLICT DO NOTHING RETURNING 1) "
        "SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM ins)",
        rows.dump());
    *out = r[0].as<int>();
    if (!disable.empty()) {
      tx.exec_params(
          "UPDATE webhook_endpoints SET enabled = false, updated_at = now(), "
          "disabled_reason = 'the endpoint answered 410 Gone' "
          "WHERE id IN (SELECT jsonb_array_elements_text($1::jsonb)::uuid)",
          disable.dump());
    }
    tx.commit();
    return Status::ok();
  });
}

}  // namespace hr::queue
