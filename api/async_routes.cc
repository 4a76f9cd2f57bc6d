// The async routes: submit a queued batch (POST /ai/run/{model} with queueRequest), poll it by
// request_id (GET /v1/async/{id}), cancel it and list the account's batches. Results are stored
// answers (wire/stored_answer.h), shown in Workers AI's shape.
#include <pqxx/pqxx>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "api/affinity.h"
#include "api/idempotency_key.h"
#include "api/internal/api_impl.h"
#include "api/paged_answer.h"
#include "api/query_params.h"
#include "api/retry_request.h"
#include "base/clock.h"
#include "base/duration.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "queue/lifecycle.h"
#include "wire/openai_chat.h"
#include "wire/workers_ai.h"

namespace hr::api {

namespace {

json progress_of(const queue::BatchInfo& b) {
  return {{"total", b.num_total},
          {"completed", b.num_completed},
          {"failed", b.num_failed},
          {"cancelled", b.num_cancelled},
          {"expired", b.num_expired}};
}

json summary_of(const queue::BatchInfo& b) {
  json j = {{"request_id", b.id},
            {"model", b.model},
            {"status", b.status},
            {"progress", progress_of(b)},
            {"created_at", b.created_at_ms / 1000}};
  if (b.finished_at_ms) j["finished_at"] = *b.finished_at_ms / 1000;
  if (b.deadline_ms) j["deadline"] = *b.deadline_ms / 1000;
  j["priority"] = b.priority;
  j["expires_at"] = b.expires_at_ms / 1000;
  if (b.retried_from) j["retried_from"] = *b.retried_from;
  if (!b.retries.empty()) j["retries"] = b.retries;
  return j;
}

json usage_of(const queue::BatchInfo& b) {
  return wire::usage_json({b.prompt_tokens, b.completion_tokens, b.cached_tokens});
}

json response_of(const queue::RequestResult& r) {
  json j = {{"id", r.idx},
            {"external_reference", r.custom_id ? json(*r.custom_id) : json(nullptr)},
            {"success", r.status == "completed"}};
  if (r.status == "completed" && r.result_json) {
    Result<json> result = wire::workers_ai_stored_result(*r.result_json);
    if (result.is_ok()) {
      j["result"] = std::move(result).value();
    } else {
      j["error"] = {{"code", "invalid_result"}, {"message", result.status().message()}};
    }
  } else if (r.error_json) {
    j["error"] = json::parse(*r.error_json, nullptr, false);
  } else if (r.status == "cancelled") {
    j["error"] = {{"code", "cancelled"}, {"message", "the batch was cancelled"}};
  } else if (r.status == "queued" || r.status == "running") {
    j["status"] = r.status;
  }
  if (r.status != "completed") j["status"] = r.status;
  return j;
}

}  // namespace

http::HttpResponse Api::Impl::submit(const http::HttpRequest& req, const std::string& account,
                                     const ModelSpec& model, const json& body) {
  static const std::unordered_set<std::string> kTopLevel = {
      "requests",    "queueRequest",   "options",        "completion_window", "metadata",
      "webhook_url", "webhook_events", "webhook_secret", "priority"};
  for (const auto& [key, value] : body.items()) {
    if (!kTopLevel.count(key)) {
      return error_response(invalid_argument("unknown field '" + key + "'", key));
    }
  }
  queue::NewBatch batch;
  batch.account_id = account;
  batch.model = model.name;
  batch.default_retain_seconds = config.retain_seconds();
  if (auto err = check_batch_envelope(body, limits)) return error_response(err->status, err->index);
  if (body.contains("completion_window")) {
    if (!body["completion_window"].is_string()) {
      return error_response(
          invalid_argument("'completion_window' must be a string like 24h", "completion_window"));
    }
    Result<int64_t> ms = parse_duration_ms(body["completion_window"], "completion_window");
    if (!ms.is_ok()) return error_response(ms.status());
    batch.deadline_unix_ms = SystemClock::instance().now_unix_ms() + *ms;
  }
  // The priority: in the body or in its options (the last one said wins, as for queueRequest).
  Result<std::optional<int>> priority = batch_priority(
      {{&body, ""}, {body.contains("options") ? &body.at("options") : nullptr, "options."}});
  if (!priority.is_ok()) return error_response(priority.status());
  batch.priority = *priority;
  if (body.contains("metadata")) {
    if (!body["metadata"].is_object()) {
      return error_response(invalid_argument("'metadata' must be an object", "metadata"));
    }
    batch.metadata_json = body["metadata"].dump();
    // Stored with the batch and shown on every poll: kept small, as OpenAI's 16 pairs of at most
    // 64 + 512 characters are.
    constexpr size_t kMaxMetadataBytes = 16 << 10;
    if (batch.metadata_json->size() > kMaxMetadataBytes) {
      return error_response(invalid_argument("'metadata' is " +
                                                 std::to_string(batch.metadata_json->size()) +
                                                 " bytes as JSON; at most 16384",
                                             "metadata"));
    }
  }
  pool->release();  // a webhook host's lookup may take seconds: hold no connection meanwhile
  Result<BatchWebhook> hook = parse_batch_webhook(body, webhooks.policy);
  if (!hook.is_ok()) return error_response(hook.status());
  batch.webhook_url = hook->url;
  batch.webhook_events = hook->events;
  batch.webhook_secret = hook->secret;
  Result<std::optional<std::string>> idem = idempotency_key(req);
  if (!idem.is_ok()) return error_response(idem.status());
  batch.idempotency_key = *idem;
  batch.request_hash = sha256(req.body());
  Result<pqxx::connection*> c = pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  // Each request is validated as it streams into COPY, so validation overlaps with the database
  // storing the rows before it; the first bad request rolls the whole batch back.
  const json& reqs = body["requests"];
  const std::unique_ptr<nlohmann::ordered_json> ordered = ordered_schemas(req.body());
  const nlohmann::ordered_json* ordered_reqs =
      ordered && ordered->is_object() && ordered->contains("requests") ? &(*ordered)["requests"]
                                                                       : nullptr;
  std::unordered_set<std::string> seen;
  std::optional<BatchError> bad_request;
  batch.num_requests = reqs.size();
  // x-session-affinity on the submit: every request of it goes to one worker (while it lives).
  std::optional<int64_t> session;
  if (auto it = req.find("x-session-affinity"); it != req.end() && !it->value().empty()) {
    session = session_affinity(std::string_view(it->value().data(), it->value().size()));
  }
  batch.produce = [&](size_t i, queue::NewRequest* out) -> Status {
    bad_request = parse_batch_request(reqs, i, model, limits, &seen, out, ordered_reqs);
    if (session) out->affinity = session;
    return bad_request ? bad_request->status : Status::ok();
  };
  int64_t t1 = steady_now_ns();
  const int64_t submitted_unix_ms = SystemClock::instance().now_unix_ms();
  Result<queue::SubmitResult> r = queue::submit_batch(**c, batch);
  int64_t store_ns = steady_now_ns() - t1;
  if (bad_request) return error_response(bad_request->status, bad_request->index);
  if (!r.is_ok()) {
    if (is_refusal(r.status())) return error_response(r.status());
    return db_error(r.status());
  }
  log::info("batch.submitted", {{"batch", r->batch_id},
                                {"model", model.name},
                                {"num_requests", static_cast<int64_t>(batch.size())},
                                {"replayed", r->replayed},
                                {"parse_ms", parse_ns_ / 1000000},
                                {"validate_and_store_ms", store_ns / 1000000}});
  json answer = {{"status", "queued"}, {"request_id", r->batch_id}, {"model", model.name}};
  if (std::optional<BatchForecast> f =
          forecasts->forecast(model.name, r->batch_id, submitted_unix_ms)) {
    QueueForecasts::describe(*f, batch.deadline_unix_ms, &answer);
  }
  return ok_response(std::move(answer));
}

namespace {

// Rows of a poll's results read per query: a poll of a batch of this many requests or fewer is
// answered whole; a larger one is sent a page at a time (api/paged_answer.h).
constexpr int kPollPage = 500;

// A poll's "responses", a page at a time, in input order; a queued request shows its
// queue_position when the batch has a forecast.
struct PollPages {
  queue::PgPool* pool;
  std::string batch_id;
  bool include_pending;
  std::vector<std::string> statuses;  // only these (none: all)
  std::optional<queue::QueueEstimate::Positions> positions;
  int next_idx = 0;
  int64_t left = -1;  // responses still to send (-1: all)
  bool first = true;
  int64_t queued_seen = 0;  // queued requests passed so far, in the order they are sent

  Result<bool> operator()(std::string* out) {
    const int n = left >= 0 ? static_cast<int>(std::min<int64_t>(kPollPage, left)) : kPollPage;
    if (n == 0) return false;
    Result<std::vector<queue::RequestResult>> rs =
        pool->with_connection<std::vector<queue::RequestResult>>([&](pqxx::connection& c) {
          return queue::get_results(c, batch_id, include_pending, next_idx, n, statuses);
        });
    if (!rs.is_ok()) return rs.status();
    for (const auto& r : *rs) {
      if (!first) out->push_back(',');
      first = false;
      json response = response_of(r);
      if (positions && r.status == "queued") {
        response["queue_position"] = positions->at(queued_seen++);
      }
      *out += response.dump();
    }
    if (!rs->empty()) next_idx = rs->back().idx + 1;
    if (left >= 0) left -= static_cast<int64_t>(rs->size());
    return static_cast<int>(rs->size()) == n && left != 0;
  }
};

}  // namespace

http::HttpResponse Api::Impl::poll(const std::string& account, const std::string& request_id,
                                   const std::map<std::string, std::string>& query,
                                   http::BodyStream* stream) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  const bool include_partial = query.count("include") && query.at("include") == "partial";
  // from=N and limit=M: a piece of the responses (limit 0: all of them).
  Result<int> from = int_param(query, "from", 0, 100'000'000, 0);
  if (!from.is_ok()) return error_response(from.status());
  Result<int> limit = int_param(query, "limit", 1, 100'000, 0);
  if (!limit.is_ok()) return error_response(limit.status());
  // status=failed,expired: only the responses of requests in those statuses.
  Result<std::vector<std::string>> statuses = list_param(query, "status");
  if (!statuses.is_ok()) return error_response(statuses.status());
  for (const std::string& s : *statuses) {
    if (!queue::is_request_status(s)) {
      return error_response(
          invalid_argument("unknown request status '" + s +
                               "' (queued, running, completed, failed, cancelled or expired)",
                           "status"));
    }
  }
  Result<queue::BatchInfo> b = [&] {
    queue::PgPool::Bound quick(pool.get(), kQuickDbCall);
    return pool->with_connection<queue::BatchInfo>(
        [&](pqxx::connection& c) { return queue::get_batch(c, account, request_id); });
  }();
  if (!b.is_ok()) return missing_or_db_error(b.status(), request_id);
  json result = summary_of(*b);
  std::optional<BatchForecast> forecast;
  if (!b->is_terminal() && !b->finished_at_ms) {
    forecast = forecasts->forecast(b->model, b->id, b->created_at_ms);
    if (forecast) QueueForecasts::describe(*forecast, b->deadline_ms, &result);
  }
  if (!b->is_terminal() && !include_partial) return ok_response(std::move(result));
  result["usage"] = usage_of(*b);
  // The envelope and summary, then the responses a page at a time: memory per poll stays at a
  // page however large the batch.
  std::string head = ok_response(std::move(result)).body();
  const std::string_view result_end = "},\"success\":true}";  // ok_response's keys, sorted
  if (!std::string_view(head).ends_with(result_end)) {
    return error_response(Status(StatusCode::kInternal, "unexpected poll envelope"));
  }
  head.resize(head.size() - result_end.size());
  head += ",\"responses\":[";
  std::string tail = "]},\"success\":true}";
  // Queue positions count from the batch's first queued request: given from the start only.
  PollPages pages{pool.get(), b->id, include_partial, std::move(statuses).value(),
                  forecast && *from == 0 ? forecast->positions : std::nullopt};
  pages.next_idx = *from;
  pages.left = *limit > 0 ? *limit : -1;
  std::string first_page;
  Result<bool> more = pages(&first_page);
  if (!more.is_ok()) return db_error(more.status());
  if (!*more) return http::json_response(200, head + first_page + tail);
  std::shared_ptr<void> slot = large_answers->take(account);
  if (!slot) {
    return error_response(Status(
        StatusCode::kResourceExhausted,
        "this account is downloading " + std::to_string(large_answers->per_account()) +
            " large results at once already (--max-large-answers-per-account); retry when one "
            "has finished",
        "request_id"));
  }
  head += first_page;
  http::BodyStream body =
      paged_body(std::move(head), std::move(pages), std::move(tail), std::move(slot));
  http::HttpResponse res = http::json_response(200, "");
  if (stream != nullptr) {
    *stream = std::move(body);
  } else {
    res.body() = collect_body(body);
    res.prepare_payload();
  }
  return res;
}

http::HttpResponse Api::Impl::cancel(const std::string& account, const std::string& request_id) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  Result<pqxx::connection*> c = pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Result<queue::CancelResult> r = queue::cancel_batch(**c, account, request_id);
  if (!r.is_ok()) return missing_or_db_error(r.status(), request_id);
  json result = summary_of(r->batch);
  result["cancelled_now"] = r->num_cancelled_now;
  result["already_cancelled"] = r->already_requested;
  if (r->batch.is_terminal() && !r->batch.cancel_requested) {
    result["message"] = "the batch had already finished; nothing to cancel";
  }
  return ok_response(std::move(result));
}

http::HttpResponse Api::Impl::remove(const std::string& account, const std::string& request_id) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  Result<pqxx::connection*> c = pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Status st = queue::delete_batch(**c, account, request_id);
  if (st.code() == StatusCode::kConflict) return error_response(st);
  if (!st.is_ok()) return missing_or_db_error(st, request_id);
  log::info("batch.deleted", {{"batch", request_id}});
  return ok_response({{"request_id", request_id}, {"deleted", true}});
}

http::HttpResponse Api::Impl::retry(const http::HttpRequest& req, const std::string& account,
                                    const std::string& request_id) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  pool->release();  // a webhook host's lookup may take seconds: hold no connection meanwhile
  Result<queue::RetryRequest> retry = parse_retry(req, account, request_id, webhooks.policy);
  if (!retry.is_ok()) return error_response(retry.status());
  Result<pqxx::connection*> c = pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Result<queue::SubmitResult> r = queue::retry_batch(**c, *retry);
  if (!r.is_ok() && is_refusal(r.status())) return error_response(r.status());
  if (!r.is_ok()) return missing_or_db_error(r.status(), request_id);
  log::info("batch.retried",
            {{"batch", r->batch_id}, {"retried_from", request_id}, {"replayed", r->replayed}});
  Result<queue::BatchInfo> b = queue::get_batch(**c, account, r->batch_id);
  if (!b.is_ok()) return db_error(b.status());
  json result = summary_of(*b);
  result["status"] = b->status;
  return ok_response(std::move(result));
}

http::HttpResponse Api::Impl::missing_or_db_error(const Status& st, const std::string& request_id) {
  if (st.code() != StatusCode::kNotFound) return db_error(st);
  // An expired batch says so and when; any other missing one is simply not there.
  if (st.field() == "expired") return error_response(st);
  return error_response(not_found("no such request_id: " + request_id));
}

http::HttpResponse Api::Impl::list(const std::string& account,
                                   const std::map<std::string, std::string>& query) {
  queue::ListQuery q;
  Result<int> limit = int_param(query, "limit", 1, 100, q.limit);
  if (!limit.is_ok()) return error_response(limit.status());
  q.limit = *limit;
  if (auto it = query.find("status"); it != query.end() && !it->second.empty()) {
    static const std::unordered_set<std::string> kStatuses = {
        "queued", "running",   "completed", "completed_with_errors",
        "failed", "cancelled", "expired"};
    if (!kStatuses.count(it->second)) {
      return error_response(invalid_argument("unknown status '" + it->second + "'", "status"));
    }
    q.status = it->second;
  }
  if (auto it = query.find("after"); it != query.end() && !it->second.empty()) {
    if (!parse_uuid(it->second).is_ok()) {
      return error_response(invalid_argument("after must be a request_id", "after"));
    }
    q.after = it->second;
  }
  int want = q.limit;
  q.limit = want + 1;
  queue::PgPool::Bound quick(pool.get(), kQuickDbCall);
  Result<std::vector<queue::BatchInfo>> r = pool->with_connection<std::vector<queue::BatchInfo>>(
      [&](pqxx::connection& c) { return queue::list_batches(c, account, q); });
  if (!r.is_ok()) return db_error(r.status());
  bool has_more = static_cast<int>(r->size()) > want;
  json data = json::array();
  for (int i = 0; i < std::min<int>(want, static_cast<int>(r->size())); ++i) {
    data.push_back(summary_of((*r)[i]));
  }
  json result = {{"data", data}, {"has_more", has_more}};
  if (!data.empty()) result["last_id"] = data.back()["request_id"];
  return ok_response(std::move(result));
}

}  // namespace hr::api
