// OpenAI batches in the store.
#include "queue/openai_batches.h"

#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "base/ids.h"
#include "base/log.h"
#include "queue/files.h"
#include "queue/internal/batch_row.h"
#include "queue/internal/retention_choice.h"
#include "queue/pg.h"
#include "queue/webhooks.h"

namespace hr::queue {
namespace {

std::string openai_columns() {
  return std::string(kBatchColumns) +
         ", account_id::text, endpoint, input_file_id::text, output_file_id::text, "
         "error_file_id::text, errors::text, metadata::text, completion_window, "
         "(extract(epoch FROM cancel_requested_at) * 1000)::bigint, "
         "(extract(epoch FROM finalized_at) * 1000)::bigint";
}

std::optional<std::string> opt_str(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<std::string>();
}

std::optional<int64_t> opt_i64(const pqxx::field& f) {
  if (f.is_null()) return std::nullopt;
  return f.as<int64_t>();
}

OpenAiBatch openai_from_row(const pqxx::row& r) {
  OpenAiBatch b;
  b.info = batch_from_row(r);
  int k = kNumBatchColumns;
  b.account_id = r[k].as<std::string>();
  b.endpoint = opt_str(r[k + 1]);
  b.input_file_id = opt_str(r[k + 2]);
  b.output_file_id = opt_str(r[k + 3]);
  b.error_file_id = opt_str(r[k + 4]);
  b.errors_json = opt_str(r[k + 5]);
  b.metadata_json = opt_str(r[k + 6]);
  b.completion_window = opt_str(r[k + 7]);
  b.cancel_requested_at_ms = opt_i64(r[k + 8]);
  b.finalized_at_ms = opt_i64(r[k + 9]);
  return b;
}

constexpr const char* kResultColumns =
    "idx, custom_id, status, result, error, floor(extract(epoch FROM finished_at))::bigint";

// Requests read per query when a batch's files are written.
constexpr int kFinalizePageRows = 1000;

ResultRow result_from_row(const pqxx::row& r) {
  ResultRow out;
  out.idx = r[0].as<int>();
  out.custom_id = opt_str(r[1]);
  out.status = r[2].as<std::string>();
  out.result_json = opt_str(r[3]);
  out.error_json = opt_str(r[4]);
  out.finished_at_s = r[5].is_null() ? 0 : r[5].as<int64_t>();
  return out;
}

// The {code, message} of a request that ended without a result.

}  // namespace

Result<OpenAiBatch> get_openai_batch(pqxx::connection& conn, const std::string& account_id,
                                     const std::string& batch_id) {
  OpenAiBatch out;
  Status st = pg_guard("get openai batch", [&]() -> Status {
    conn.prepare("hr_get_openai_batch", "SELECT " + openai_columns() +
                                            " FROM batches WHERE id = $1::uuid AND account_id = $2 "
                                            "AND api_shape = 'openai'");
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_prepared("hr_get_openai_batch", batch_id, account_id);
    if (r.empty()) return not_found("no such batch: " + batch_id);
    out = openai_from_row(r[0]);
    return check_visible(out.info);
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::vector<OpenAiBatch>> list_openai_batches(pqxx::connection& conn,
                                                     const std::string& account_id, int limit,
                                                     const std::optional<std::string>& after) {
  std::vector<OpenAiBatch> out;
  Status st = pg_guard("list openai batches", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r =
        tx.exec_params("SELECT " + openai_columns() +
                           " FROM batches WHERE account_id = $1 AND api_shape = 'openai' "
                           "AND ($2::uuid IS NULL OR id < $2::uuid) AND " +
                           kBatchVisible + " ORDER BY id DESC LIMIT $3",
                       account_id, after, limit);
    for (const auto& row : r) out.push_back(openai_from_row(row));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::string> record_failed_batch(pqxx::connection& conn, const FailedBatch& batch) {
  std::string id = new_uuid_v7().to_string();
  Status st = pg_guard("record failed batch", [&]() -> Status {
    pqxx::work tx(conn);
    tx.exec_params(
        "INSERT INTO batches (id, account_id, model, api_shape, status, num_total, endpoint, "
        "input_file_id, completion_window, metadata, errors, finished_at, finalized_at, "
        "webhook_url, webhook_events, webhook_secret, retain_seconds, expires_at) "
        "SELECT $1, $2, $3, 'openai', 'failed', 0, $4, $5::uuid, $6, $7::jsonb, $8::jsonb, "
        "now(), now(), $9, $10::text[], $11, k.s, now() + k.s * interval '1 second' "
        "FROM (SELECT " +
            chosen_retention("$12", "$2", "$13") + " AS s) AS k",
        id, batch.account_id, batch.model, batch.endpoint, batch.input_file_id,
        batch.completion_window, batch.metadata_json, batch.errors_json, batch.webhook_url,
        batch.webhook_events ? std::optional<std::string>(pg_text_array(*batch.webhook_events))
                             : std::nullopt,
        batch.webhook_secret, batch.retain_seconds, batch.default_retain_seconds);
    if (batch.webhook_url && !batch.webhook_secret) ensure_signing_secret(tx, batch.account_id);
    write_event(tx, "batch.failed", batch.account_id, id,
                {{"id", id},
                 {"status", "failed"},
                 {"model", batch.model},
                 {"request_counts", {{"total", 0}, {"completed", 0}, {"failed", 0}}}});
    tx.commit();
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return id;
}

Result<std::vector<ResultRow>> read_result_rows(pqxx::connection& conn, const std::string& batch_id,
                                                ResultFilter filter, int from_idx, int limit) {
  std::vector<ResultRow> out;
  Status st = pg_guard("read results", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    std::string sql = std::string("SELECT ") + kResultColumns +
                      " FROM requests WHERE batch_id = $1::uuid AND idx >= $2 AND ";
    sql += filter == ResultFilter::kSucceeded ? "status = 'completed'"
                                              : "status IN ('failed', 'cancelled', 'expired')";
    sql += " ORDER BY idx LIMIT $3";
    pqxx::result r = tx.exec_params(sql, batch_id, from_idx, limit);
    out.reserve(r.size());
    for (const auto& row : r) out.push_back(result_from_row(row));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<bool> finalize_openai_batch(pqxx::connection& conn, const std::string& batch_id) {
  bool done = false;
  int64_t t0 = steady_now_ns();
  int num_output = 0;
  int num_errors = 0;
  Status st = pg_guard("finalize", [&]() -> Status {
    pqxx::work tx(conn);
    pqxx::result b = tx.exec_params(
        "SELECT account_id::text, model FROM batches WHERE id = $1::uuid AND api_shape = 'openai' "
        "AND finished_at IS NOT NULL AND finalized_at IS NULL FOR UPDATE SKIP LOCKED",
        batch_id);
    if (b.empty()) return Status::ok();
    std::string account = b[0][0].as<std::string>();
    std::string model = b[0][1].as<std::string>();
    // The requests a page at a time, their lines written out as file chunks fill: memory holds
    // a page of results and a chunk of each file however large the batch.
    std::optional<FileWriter> output_file;
    std::optional<FileWriter> error_file;
    auto writer = [&](std::optional<FileWriter>& w, const char* kind) -> FileWriter& {
      if (!w) {
        w.emplace(tx, NewFile{account,
                              "batch_output",
                              "batch_" + batch_id + "_" + kind + ".jsonl",
                              {},
                              0,
                              std::nullopt,
                              kDefaultRetainSeconds});
      }
      return *w;
    };
    std::string output;
    std::string errors;
    for (int from = 0;;) {
      pqxx::result rows = tx.exec_params(
          std::string("SELECT ") + kResultColumns +
              " FROM requests WHERE batch_id = $1::uuid AND idx >= $2 ORDER BY idx LIMIT $3",
          batch_id, from, kFinalizePageRows);
      int page_output = 0;
      int page_errors = 0;
      for (const auto& r : rows) {
        size_t before = output.size();
        wire::append_result_line(batch_id, model, result_from_row(r), &output, &errors);
        (output.size() > before ? page_output : page_errors) += 1;
        from = r[0].as<int>() + 1;
      }
      if (page_output > 0) writer(output_file, "output").append(output, page_output);
      if (page_errors > 0) writer(error_file, "error").append(errors, page_errors);
      num_output += page_output;
      num_errors += page_errors;
      output.clear();
      errors.clear();
      if (static_cast<int>(rows.size()) < kFinalizePageRows) break;
    }
    std::optional<std::string> output_id;
    std::optional<std::string> error_id;
    if (output_file) output_id = output_file->finish().id;
    if (error_file) error_id = error_file->finish().id;
    tx.exec_params(
        "UPDATE batches SET output_file_id = $2::uuid, error_file_id = $3::uuid, "
        "finalized_at = now() WHERE id = $1::uuid",
        batch_id, output_id, error_id);
    // The output files expire with their batch.
    tx.exec_params(
        "UPDATE files f SET expires_at = b.expires_at FROM batches b WHERE b.id = $1::uuid "
        "AND f.id IN (b.output_file_id, b.error_file_id)",
        batch_id);
    tx.commit();
    done = true;
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  if (done) {
    log::info("batch.finalized", {{"batch", batch_id},
                                  {"num_output", num_output},
                                  {"num_errors", num_errors},
                                  {"finalize_ms", (steady_now_ns() - t0) / 1000000}});
  }
  return done;
}

Result<int> finalize_openai_batches(pqxx::connection& conn, int max, std::string* cursor) {
  std::vector<std::string> due;
  Status st = pg_guard("finalize sweep", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    std::optional<std::string> after;
    if (!cursor->empty()) after = *cursor;
    for (const auto& row : tx.exec_params(
             "SELECT id::text FROM batches WHERE api_shape = 'openai' AND finished_at IS NOT NULL "
             "AND finalized_at IS NULL AND ($1::uuid IS NULL OR id > $1::uuid) ORDER BY id LIMIT "
             "$2",
             after, max)) {
      due.push_back(row[0].as<std::string>());
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  // A short page reached the last batch: the next call starts again from the first.
  *cursor = static_cast<int>(due.size()) < max ? std::string() : due.back();
  int n = 0;
  for (const std::string& id : due) {
    Result<bool> done = finalize_openai_batch(conn, id);
    if (!done.is_ok()) {
      if (done.status().code() == StatusCode::kUnavailable) return done.status();
      log::warn("batch.finalize_failed", {{"batch", id}, {"error", done.status()}});
      continue;
    }
    n += *done ? 1 : 0;
  }
  return n;
}

}  // namespace hr::queue
