// The batch store on Postgres: accounts and API keys, submitting a batch (one transaction: batch
// row, request rows by COPY, outbox event), reading status and results, cancelling and listing.
// Every read and write is scoped to an account: another account's batch is kNotFound.
// Functions take a connection owned by the caller's thread.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <pqxx/pqxx>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::queue {

struct CreatedKey {
  std::string account_id;
  std::string key;  // shown once; only its SHA-256 is stored
};

// Creates the account if it does not exist and a new key for it.
[[nodiscard]] Result<CreatedKey> create_api_key(pqxx::connection& conn, const std::string& account);
// Stores a caller-chosen key for the account (e.g. HEADROOM_API_KEY in `serve`); idempotent.
[[nodiscard]] Result<std::string> ensure_api_key(pqxx::connection& conn, const std::string& account,
                                                 const std::string& key);
// The account id owning `key`; kUnauthenticated when unknown or revoked.
[[nodiscard]] Result<std::string> authenticate(pqxx::connection& conn, const std::string& key);

// The channel key changes are announced on (in the transaction that revokes or creates a key): API
// processes empty their caches of known and unknown keys when they hear it
// (api/key_revocations.h).
inline constexpr const char* kKeysChannel = "hr_keys";

// Revokes `key` (when not empty) or every key of the account named `account`; returns how many
// keys it revoked (0: none that was not already revoked). Not found when the key or the account
// is unknown.
[[nodiscard]] Result<int> revoke_api_keys(pqxx::connection& conn, const std::string& key,
                                          const std::string& account);

struct NewRequest {
  std::optional<std::string> custom_id;
  std::string body;    // normalized request JSON
  int64_t tokens = 0;  // its estimate: prompt bytes / 4 and max_tokens (max_enqueued_tokens)
  // What its prompt starts with, as a key (api/affinity.h): requests with one key go to one
  // worker while it lives (cache-aware dispatch). None: any worker.
  std::optional<int64_t> affinity;
};

struct NewBatch {
  std::string account_id;
  std::string model;
  std::string api_shape = "workers_ai";  // or "openai"
  std::optional<int> priority;  // orders the account's own batches; none: the account's default
  std::optional<int64_t> deadline_unix_ms;
  std::optional<std::string> idempotency_key;
  std::string request_hash;  // raw SHA-256 of the submitted body
  std::optional<std::string> metadata_json;
  // Completion webhook for this batch (checked by the caller), the events it receives (default:
  // every batch.* event) and its own secret (default: the account's signing secret).
  std::optional<std::string> webhook_url;
  std::optional<std::vector<std::string>> webhook_events;
  std::optional<std::string> webhook_secret;
  // OpenAI batches: the endpoint of every request, the input file, the window as written ("24h").
  std::optional<std::string> endpoint;
  std::optional<std::string> input_file_id;
  std::optional<std::string> completion_window;
  // Retention: these seconds from creation (output_expires_after), else the account's default,
  // else `default_retain_seconds` (the server's --retention-days).
  std::optional<int64_t> retain_seconds;
  int64_t default_retain_seconds = 30 * 86400;
  std::vector<NewRequest> requests;
  // Alternatively, a producer called for i = 0..num_requests-1 while the rows stream into COPY, so
  // validating request i overlaps with the database storing rows < i. A non-OK Status rolls the
  // whole batch back and is returned.
  std::function<Status(size_t i, NewRequest* out)> produce;
  size_t num_requests = 0;
  size_t size() const { return produce ? num_requests : requests.size(); }
};

struct SubmitResult {
  std::string batch_id;
  bool replayed = false;  // an earlier submit with the same Idempotency-Key and body
};

// Writes the batch durably. Returns after COMMIT. kConflict when the Idempotency-Key was used
// with a different body.
[[nodiscard]] Result<SubmitResult> submit_batch(pqxx::connection& conn, const NewBatch& batch);

struct BatchInfo {
  std::string id;
  std::string model;
  std::string api_shape;
  std::string status;
  int num_total = 0;
  int num_completed = 0;
  int num_failed = 0;
  int num_cancelled = 0;
  int num_expired = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t created_at_ms = 0;
  std::optional<int64_t> started_at_ms;
  std::optional<int64_t> finished_at_ms;
  std::optional<int64_t> deadline_ms;
  bool cancel_requested = false;
  int64_t expires_at_ms = 0;  // see migrations/0006_retention.sql
  bool deleted = false;
  bool expired = false;  // ended, and expires_at has passed
  std::optional<std::string> retried_from;
  std::vector<std::string> retries;  // batches that retry this one's unsucceeded requests
  int priority = 0;                  // orders the account's own batches (fair_share.h)
  bool is_terminal() const;
};

// kNotFound for another account's batch and a deleted one; kNotFound with field "expired" and
// a message saying when, for an expired one.
[[nodiscard]] Result<BatchInfo> get_batch(pqxx::connection& conn, const std::string& account_id,
                                          const std::string& batch_id);

struct RequestResult {
  int idx = 0;
  std::optional<std::string> custom_id;
  std::string status;
  std::optional<std::string> result_json;
  std::optional<std::string> error_json;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

// A request's statuses: queued, running, completed, failed, cancelled, expired.
bool is_request_status(std::string_view status);

// Finished requests of a batch in input order (with `include_pending`, every request), from
// index `from_idx` on, at most `limit` of them: a page, so that a large batch is read a page at a
// time (the next page starts after the last index returned). With `statuses` (names the caller
// has checked with is_request_status), only requests in one of them.
[[nodiscard]] Result<std::vector<RequestResult>> get_results(
    pqxx::connection& conn, const std::string& batch_id, bool include_pending, int from_idx,
    int limit, const std::vector<std::string>& statuses = {});

struct CancelResult {
  BatchInfo batch;
  bool already_requested = false;  // a second cancel: nothing changed
  int num_cancelled_now = 0;       // queued requests that this call cancelled
};

// Cancels the queued requests; running ones finish and keep their results. Idempotent.
[[nodiscard]] Result<CancelResult> cancel_batch(pqxx::connection& conn,
                                                const std::string& account_id,
                                                const std::string& batch_id);

struct ListQuery {
  std::optional<std::string> status;
  int limit = 20;
  std::optional<std::string> after;  // a batch id: list those older than it
};

[[nodiscard]] Result<std::vector<BatchInfo>> list_batches(pqxx::connection& conn,
                                                          const std::string& account_id,
                                                          const ListQuery& query);

// Requests of unfinished batches not yet ended (queued or running), per model: the queue depth.
struct PendingRequests {
  std::string model;
  int64_t num_pending = 0;
};
[[nodiscard]] Result<std::vector<PendingRequests>> pending_requests_by_model(
    pqxx::connection& conn);

// Moves the batch to its terminal status and writes the batch event to the outbox when every
// request has ended, and wakes the dispatchers (an OpenAI batch's output files are written next).
// Call inside the transaction that ended the last requests. Returns the terminal status, or
// nullopt when requests remain.
std::optional<std::string> finish_batch_if_done(pqxx::work& tx, const std::string& batch_id);

// request.completed events for the ended requests among `rows` (batch id, idx, status, prompt,
// completion and cached tokens, custom_id; rows still queued are skipped) whose batches asked
// for them.
void write_request_events(pqxx::work& tx, const pqxx::result& rows);

// A request put back in the queue (status queued, push_pending set; migrations/0005) at `attempt`.
struct Requeued {
  std::string batch_id;
  int idx = 0;
  int attempt = 0;
};
// After `requeued` were pushed to Redis: clears their push_pending, unless they moved on since
// (claimed, and maybe put back again, at a later attempt).
[[nodiscard]] Status mark_pushed(pqxx::connection& conn, const std::vector<Requeued>& requeued);

// Refuses (kResourceExhausted, field "max_enqueued_requests" or "max_enqueued_tokens") a
// transaction that has just written a new batch of the account when the account's requests queued
// or running, the new ones included, pass its max_enqueued_requests, or their token estimates its
// max_enqueued_tokens (a batch's open share of its estimate: requests not ended over all). Call
// after the batch's rows are written and before the commit: it serializes the account's submits on
// an advisory lock to the end of the transaction, so that concurrent submits through any number of
// API processes cannot pass the limit together; the count is read from the batches themselves, so
// there is no counter to drift.
[[nodiscard]] Status enforce_enqueued_limit(pqxx::work& tx, const std::string& account_id);

// Writes the batch.queued event of a new batch (with `extra` fields) and wakes the dispatchers at
// commit.
void announce_queued(pqxx::work& tx, const std::string& account_id, const std::string& batch_id,
                     const std::string& model, int64_t total, const nlohmann::json& extra);

// Writes one event to the outbox (and wakes the webhook dispatcher at commit). `data` is the
// event's small payload; the envelope {id, type, created_at, data} is added here.
void write_event(pqxx::work& tx, const std::string& type, const std::string& account_id,
                 const std::optional<std::string>& batch_id, const nlohmann::json& data);

}  // namespace hr::queue
