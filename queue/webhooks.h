// Webhooks on Postgres: account endpoints and signing secrets (with rotation grace periods), the
// fan-out of outbox events into deliveries (one per event and target), claiming due deliveries
// for sending (FOR UPDATE SKIP LOCKED, each claim bumps the attempt number and parks the delivery
// until the claim lapses, so a dispatcher that dies mid-send only delays the next attempt), and
// recording outcomes fenced by that attempt number. (The signature itself: webhooks/signature.h.)
// Every API-facing function is scoped to an account. Functions take a connection owned by the
// caller's thread.
#pragma once

#include <pqxx/pqxx>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace hr::queue {

// Event types a subscription may name.
const std::vector<std::string>& webhook_event_types();
// The events a subscription without a list gets: every batch.* event.
const std::vector<std::string>& default_webhook_events();
// Checks a JSON-ish list of event type names; errors name `field`.
[[nodiscard]] Status check_event_types(const std::vector<std::string>& types,
                                       const std::string& field);

// "whsec_" + base64 of 32 random bytes.
std::string new_webhook_secret();
// A caller-given secret must be whsec_<base64 of 24..64 bytes>.
[[nodiscard]] Status check_webhook_secret(const std::string& secret, const std::string& field);

struct WebhookEndpoint {
  std::string id;
  std::string url;
  std::string description;
  std::vector<std::string> event_types;
  bool enabled = true;
  std::optional<std::string> disabled_reason;
  int64_t created_at_ms = 0;
  int64_t updated_at_ms = 0;
  std::optional<int64_t> previous_secret_expires_at_ms;
  std::optional<std::string> secret;  // only right after creation or rotation
};

struct EndpointPatch {
  std::optional<std::string> url;
  std::optional<std::string> description;
  std::optional<std::vector<std::string>> event_types;
  std::optional<bool> enabled;
};

// Endpoints an account may have (as Stripe allows): each batch event goes to every enabled one,
// so the limit bounds the deliveries one submission can cause.
constexpr int kMaxWebhookEndpoints = 16;

// A conflict once the account has kMaxWebhookEndpoints.
[[nodiscard]] Result<WebhookEndpoint> create_endpoint(
    pqxx::connection& conn, const std::string& account_id, const std::string& url,
    const std::string& description, const std::vector<std::string>& event_types, bool enabled);
[[nodiscard]] Result<std::vector<WebhookEndpoint>> list_endpoints(pqxx::connection& conn,
                                                                  const std::string& account_id);
[[nodiscard]] Result<WebhookEndpoint> get_endpoint(pqxx::connection& conn,
                                                   const std::string& account_id,
                                                   const std::string& id);
[[nodiscard]] Result<WebhookEndpoint> update_endpoint(pqxx::connection& conn,
                                                      const std::string& account_id,
                                                      const std::string& id,
                                                      const EndpointPatch& patch);
[[nodiscard]] Status delete_endpoint(pqxx::connection& conn, const std::string& account_id,
                                     const std::string& id);
// A new secret; the old one keeps signing (alongside) for `grace_ms`.
[[nodiscard]] Result<WebhookEndpoint> rotate_endpoint_secret(pqxx::connection& conn,
                                                             const std::string& account_id,
                                                             const std::string& id,
                                                             int64_t grace_ms);

struct SigningSecret {
  std::string secret;
  int64_t created_at_ms = 0;
  std::optional<int64_t> rotated_at_ms;
  std::optional<int64_t> previous_secret_expires_at_ms;
};

// The account's secret for per-batch webhook_url deliveries, created on first use.
[[nodiscard]] Result<SigningSecret> get_signing_secret(pqxx::connection& conn,
                                                       const std::string& account_id);
[[nodiscard]] Result<SigningSecret> rotate_signing_secret(pqxx::connection& conn,
                                                          const std::string& account_id,
                                                          int64_t grace_ms);
// Inside a submit: makes sure the account has a signing secret.
void ensure_signing_secret(pqxx::work& tx, const std::string& account_id);

struct AttemptInfo {
  int attempt = 0;
  int64_t started_at_ms = 0;
  int duration_ms = 0;
  std::optional<int> status_code;
  std::optional<std::string> error;
  std::string outcome;  // delivered, retry, failed
};

struct DeliveryInfo {
  std::string id;
  std::string event_id;
  std::string event_type;
  std::optional<std::string> batch_id;
  std::optional<std::string> endpoint_id;
  std::string url;
  std::string status;  // pending, delivered, failed
  int attempts = 0;
  std::optional<int> last_status_code;
  std::optional<std::string> last_error;
  std::optional<int64_t> next_attempt_at_ms;  // pending only
  std::optional<int64_t> last_attempt_at_ms;
  std::optional<int64_t> delivered_at_ms;
  int64_t created_at_ms = 0;
  std::vector<AttemptInfo> attempt_log;
};

struct DeliveryQuery {
  std::optional<std::string> endpoint_id;
  std::optional<std::string> batch_id;
  std::optional<std::string> status;
  std::optional<std::string> after;  // a delivery id: list older ones
  int limit = 20;
};

// Newest first. kNotFound when the endpoint is not the account's.
[[nodiscard]] Result<std::vector<DeliveryInfo>> list_deliveries(pqxx::connection& conn,
                                                                const std::string& account_id,
                                                                const DeliveryQuery& query);
// Schedules one more attempt now (a manual replay, also of a delivered event).
// kFailedPrecondition while an attempt is already pending or the endpoint is disabled.
[[nodiscard]] Result<DeliveryInfo> retry_delivery(pqxx::connection& conn,
                                                  const std::string& account_id,
                                                  const std::string& delivery_id);

// --- the dispatcher's side ---

// Turns up to `limit` unprocessed outbox events into deliveries (the batch's webhook_url when the
// event is among its webhook_events, and every enabled endpoint of the account subscribed to it),
// in one short transaction. Returns the number of events processed.
[[nodiscard]] Result<int> fan_out_events(pqxx::connection& conn, int limit);

// Deletes (up to `limit`) outbox events fanned out more than `keep_hours` ago, and deliveries
// that ended (delivered or failed) more than that ago with their attempts. Returns rows deleted.
[[nodiscard]] Result<int> prune_webhook_history(pqxx::connection& conn, int keep_hours, int limit);

struct ClaimedDelivery {
  std::string id;
  std::string event_id;
  std::string url;
  std::string payload;
  int attempt = 0;  // this attempt's number, 1-based
  bool manual = false;
  std::optional<std::string> endpoint_id;
  bool endpoint_enabled = true;
  std::vector<std::string> secrets;  // current first, then one in its grace period
};

// Claims up to `limit` due deliveries: bumps their attempt number and parks them `lease_ms` ahead,
// so no other dispatcher sends the same attempt and a lost one is retried after the lease.
[[nodiscard]] Result<std::vector<ClaimedDelivery>> claim_deliveries(pqxx::connection& conn,
                                                                    int limit, int64_t lease_ms);

// Gives back claimed deliveries that were never sent (at shutdown): due now, attempt undone.
[[nodiscard]] Status release_claims(pqxx::connection& conn,
                                    const std::vector<ClaimedDelivery>& claims);

struct AttemptOutcome {
  std::string delivery_id;
  int attempt = 0;
  std::string outcome;  // delivered, retry, failed
  std::optional<int> status_code;
  std::string error;
  int64_t started_at_ms = 0;
  int duration_ms = 0;
  int64_t retry_in_ms = 0;                      // for retry
  std::optional<std::string> disable_endpoint;  // an endpoint id to disable (410 Gone)
};

// Records outcomes in one transaction; an outcome whose attempt is no longer the delivery's
// latest (a later claim took over) is ignored. Returns how many were applied.
[[nodiscard]] Result<int> record_attempts(pqxx::connection& conn,
                                          const std::vector<AttemptOutcome>& outcomes);

}  // namespace hr::queue
