// The OpenAI Batch API over HTTP, on the same batch tables and queue as the Workers-AI shape:
//   POST /v1/files (multipart upload, purpose=batch), GET /v1/files, GET /v1/files/{id},
//   GET /v1/files/{id}/content, DELETE /v1/files/{id};
//   POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel, and
//   GET /v1/batches/{id}/output and /errors: the results so far, in the output and error file
//   formats, readable while the batch runs.
// A batch may ask for completion webhooks with the extra fields webhook_url, webhook_events and
// webhook_secret, or with webhook_url / webhook_events (comma-separated) in its metadata.
// Errors use OpenAI's shape (api/errors.h). Thread-safe: handle() runs on many threads at once,
// each on the Postgres connection the context gives it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "api/batch_request.h"
#include "api/queue_forecasts.h"
#include "api/response_slots.h"
#include "base/status.h"
#include "http/server.h"
#include "queue/pg_pool.h"
#include "webhooks/address_policy.h"

namespace hr::api {

// What these routes borrow from the API that hosts them.
struct OpenAiBatchContext {
  std::function<Result<std::string>(const http::HttpRequest&)>
      authenticate;  // the caller's account id
  // The handlers' connections: a thread borrows one on its first query and gives it back when
  // its request is answered, or while it waits on something else.
  queue::PgPool* pool = nullptr;
  std::vector<ModelSpec> models;
  BatchLimits limits;
  int64_t max_file_bytes = 200 << 20;
  int max_file_lines = 100000;
  webhooks::AddressPolicy webhook_policy;       // which webhook targets a batch may name
  int64_t default_retain_seconds = 30 * 86400;  // --retention-days
  // Large answers in flight per account (results so far of a large batch); owned by the API.
  ResponseSlots* large_answers = nullptr;
  // Open batches' estimated completion and deadline warnings; owned by the API. May be null.
  QueueForecasts* forecasts = nullptr;
};

class OpenAiBatchApi {
 public:
  explicit OpenAiBatchApi(OpenAiBatchContext context);

  // Whether `path` (without the query) belongs to these routes.
  static bool serves(std::string_view path);
  http::Reply handle(const http::HttpRequest& req, const std::string& path,
                     const std::map<std::string, std::string>& query);

 private:
  using Query = std::map<std::string, std::string>;
  http::Reply upload(const http::HttpRequest& req, const std::string& account);
  http::Reply list_files(const std::string& account, const Query& query);
  http::Reply get_file(const std::string& account, const std::string& id);
  http::Reply file_content(const std::string& account, const std::string& id);
  http::Reply delete_file(const std::string& account, const std::string& id);
  http::Reply create_batch(const http::HttpRequest& req, const std::string& account);
  http::Reply get_batch(const std::string& account, const std::string& id);
  http::Reply list_batches(const std::string& account, const Query& query);
  http::Reply cancel_batch(const std::string& account, const std::string& id);
  http::Reply delete_batch(const std::string& account, const std::string& id);
  http::Reply retry_batch(const http::HttpRequest& req, const std::string& account,
                          const std::string& id);
  http::Reply results_so_far(const std::string& account, const std::string& id, bool succeeded);

  // Runs fn(connection); when the connection turns out broken, reconnects and tries once more.
  http::Reply db_error(const Status& st);
  // kNotFound as the caller's error (404); anything else as a database failure.
  http::Reply failure(const Status& st);

  OpenAiBatchContext ctx_;
};

}  // namespace hr::api
