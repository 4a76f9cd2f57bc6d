// Deleting and retrying batches.
#include "queue/lifecycle.h"

#include <nlohmann/json.hpp>

#include "base/hash.h"
#include "base/ids.h"
#include "base/secret_box.h"
#include "queue/internal/batch_row.h"
#include "queue/pg.h"
#include "queue/webhooks.h"

namespace hr::queue {

namespace {

// The visible batch `batch_id` of the account, locked for the transaction; its status Status when
// it is not there.
Result<BatchInfo> lock_batch(pqxx::work& tx, const std::string& account_id,
                             const std::string& batch_id) {
  pqxx::result r = tx.exec_params(std::string("SELECT ") + kBatchColumns +
                                      " FROM batches WHERE id = $1::uuid AND account_id = $2 "
                                      "FOR UPDATE",
                                  batch_id, account_id);
  if (r.empty()) return not_found("no such batch: " + batch_id);
  BatchInfo b = batch_from_row(r[0]);
  HR_RETURN_IF_ERROR(check_visible(b));
  return b;
}

Status not_ended(const BatchInfo& b, const std::string& what) {
  return Status(
      StatusCode::kConflict,
      "the batch is " + b.status + (b.cancel_requested ? " (cancelling)" : "") +
          ": only an ended batch can be " + what +
          (b.cancel_requested ? "; wait until its running requests end" : "; cancel it first"),
      "status");
}

}  // namespace

Status delete_batch(pqxx::connection& conn, const std::string& account_id,
                    const std::string& batch_id) {
  return pg_guard("delete batch", [&]() -> Status {
    pqxx::work tx(conn);
    HR_ASSIGN_OR_RETURN(BatchInfo b, lock_batch(tx, account_id, batch_id));
    if (!b.is_terminal()) return not_ended(b, "deleted");
    tx.exec_params("UPDATE batches SET deleted_at = now() WHERE id = $1::uuid", batch_id);
    // Its output files go with it, at once.
    tx.exec_params(
        "UPDATE files f SET deleted_at = now() FROM batches b WHERE b.id = $1::uuid "
        "AND f.id IN (b.output_file_id, b.error_file_id) AND f.deleted_at IS NULL",
        batch_id);
    tx.commit();
    return Status::ok();
  });
}

Result<SubmitResult> retry_batch(pqxx::connection& conn, const RetryRequest& retry) {
  SubmitResult out;
  Status st = pg_guard("retry batch", [&]() -> Status {
    pqxx::work tx(conn);
    HR_ASSIGN_OR_RETURN(BatchInfo b, lock_batch(tx, retry.account_id, retry.batch_id));
    std::string hash = to_hex(sha256("retry " + retry.batch_id));
    if (retry.idempotency_key) {
      pqxx::result prior = tx.exec_params(
          "SELECT id::text, encode(request_hash, 'hex') FROM batches "
          "WHERE account_id = $1 AND idempotency_key = $2",
          retry.account_id, *retry.idempotency_key);
      if (!prior.empty()) {
        if (prior[0][1].as<std::string>() != hash) {
          return Status(StatusCode::kConflict,
                        "Idempotency-Key was already used with a different request",
                        "Idempotency-Key");
        }
        out.batch_id = prior[0][0].as<std::string>();
        out.replayed = true;
        return Status::ok();
      }
    }
    if (!b.is_terminal()) return not_ended(b, "retried");
    int unsucceeded = b.num_failed + b.num_cancelled + b.num_expired;
    if (unsucceeded == 0) {
      return Status(StatusCode::kConflict,
                    "every request of the batch succeeded: there is nothing to retry", "status");
    }
    std::string id = new_uuid_v7().to_string();
    // The window, if any, runs again from now; the retention stays the original's.
    pqxx::row inserted = tx.exec_params1(
        "INSERT INTO batches (id, account_id, model, api_shape, status, num_total, priority, "
        "deadline, idempotency_key, request_hash, metadata, endpoint, input_file_id, "
        "completion_window, webhook_url, webhook_events, webhook_secret, request_events, "
        "retain_seconds, expires_at, retried_from, enqueued_tokens) "
        "SELECT $1, account_id, model, api_shape, 'queued', $3, priority, "
        "now() + (deadline - created_at), $4, decode($5, 'hex'), metadata, endpoint, "
        "input_file_id, completion_window, "
        "CASE WHEN $6 THEN $7 ELSE webhook_url END, "
        "CASE WHEN $6 THEN $8::text[] ELSE webhook_events END, "
        "CASE WHEN $6 THEN $9 ELSE webhook_secret END, "
        "request_events, retain_seconds, now() + retain_seconds * interval '1 second', id, "
        "enqueued_tokens * $3::integer / greatest(num_total, 1) "
        "FROM batches WHERE id = $2::uuid RETURNING model, account_id::text",
        id, retry.batch_id, unsucceeded, retry.idempotency_key, hash, retry.webhook_given,
        retry.webhook_url,
        retry.webhook_events ? std::optional<std::string>(pg_text_array(*retry.webhook_events))
                             : std::nullopt,
        retry.webhook_secret ? std::optional<std::string>(secrets::seal(*retry.webhook_secret))
                             : std::nullopt);
    HR_RETURN_IF_ERROR(enforce_enqueued_limit(tx, retry.account_id));
    if (retry.webhook_given && retry.webhook_url && !retry.webhook_secret) {
      ensure_signing_secret(tx, retry.account_id);
    }
    pqxx::result copied = tx.exec_params(
        "INSERT INTO requests (batch_id, idx, custom_id, body, affinity) "
        "SELECT $1::uuid, (row_number() OVER (ORDER BY idx) - 1)::integer, custom_id, body, "
        "  affinity "
        "FROM requests WHERE batch_id = $2::uuid "
        "AND status IN ('failed', 'expired', 'cancelled')",
        id, retry.batch_id);
    if (copied.affected_rows() != static_cast<size_t>(unsucceeded)) {
      return internal_error("batch " + retry.batch_id + " counts " + std::to_string(unsucceeded) +
                            " unsucceeded requests but holds " +
                            std::to_string(copied.affected_rows()));
    }
    announce_queued(tx, inserted[1].as<std::string>(), id, inserted[0].as<std::string>(),
                    unsucceeded, {{"retried_from", retry.batch_id}});
    tx.commit();
    out.batch_id = id;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

}  // namespace hr::queue
