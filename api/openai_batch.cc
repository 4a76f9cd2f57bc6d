// Routes and handlers of the OpenAI Batch API.
#include "api/openai_batch.h"

#include <pqxx/pqxx>

#include <nlohmann/json.hpp>

#include "api/batch_file.h"
#include "api/errors.h"
#include "api/idempotency_key.h"
#include "api/multipart.h"
#include "api/openai_objects.h"
#include "api/paged_answer.h"
#include "api/query_params.h"
#include "api/retry_request.h"
#include "api/webhooks_api.h"
#include "base/clock.h"
#include "base/duration.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/strings.h"
#include "queue/files.h"
#include "queue/lifecycle.h"
#include "queue/openai_batches.h"
#include "wire/json_text.h"

namespace hr::api {
namespace {

namespace beast_http = boost::beast::http;
using nlohmann::json;
using ojson = nlohmann::ordered_json;  // answers keep OpenAI's field order

constexpr const char* kEndpoint = "/v1/chat/completions";
constexpr size_t kMaxLineErrors = 100;  // validation errors reported per batch
// Rows read per query for results so far: a batch with more is sent a page at a time.
constexpr int kResultPage = 500;

http::Reply error_reply(const Status& st) { return {openai_error_response(st), nullptr}; }

http::Reply ok(const ojson& body) { return {http::json_response(200, body.dump()), nullptr}; }

http::Reply raw_reply(std::string body, const char* content_type) {
  http::HttpResponse res = http::json_response(200, "");
  res.set(beast_http::field::content_type, content_type);
  res.body() = std::move(body);
  res.prepare_payload();
  return {std::move(res), nullptr};
}

Result<std::optional<std::string>> after_param(const std::map<std::string, std::string>& query) {
  auto it = query.find("after");
  if (it == query.end() || it->second.empty()) return std::optional<std::string>();
  if (!parse_uuid(it->second).is_ok()) return invalid_argument("after must be an id", "after");
  return std::optional<std::string>(it->second);
}

ojson list_object(ojson data, bool has_more) {
  ojson first = data.empty() ? ojson(nullptr) : data.front()["id"];
  ojson last = data.empty() ? ojson(nullptr) : data.back()["id"];
  return {{"object", "list"},
          {"data", std::move(data)},
          {"first_id", std::move(first)},
          {"last_id", std::move(last)},
          {"has_more", has_more}};
}

// A list page from `rows`, fetched with one row more than `limit` (which only says whether there
// are more).
template <typename T, typename Fn>
ojson page_of(const std::vector<T>& rows, int limit, Fn&& object_of) {
  ojson data = ojson::array();
  for (int i = 0; i < std::min<int>(limit, static_cast<int>(rows.size())); ++i) {
    data.push_back(object_of(rows[static_cast<size_t>(i)]));
  }
  return list_object(std::move(data), static_cast<int>(rows.size()) > limit);
}

// OpenAI's metadata rules: at most 16 pairs, keys up to 64 characters, string values up to 512.
Status check_metadata(const json& m) {
  if (m.is_null()) return Status::ok();
  if (!m.is_object()) return invalid_argument("'metadata' must be an object", "metadata");
  if (m.size() > 16) return invalid_argument("'metadata' holds at most 16 pairs", "metadata");
  for (const auto& [key, value] : m.items()) {
    if (key.empty() || key.size() > 64) {
      return invalid_argument("metadata keys must be 1 to 64 characters", "metadata");
    }
    if (!value.is_string() || value.get_ref<const std::string&>().size() > 512) {
      return invalid_argument("metadata values must be strings of at most 512 characters",
                              "metadata." + key);
    }
  }
  return Status::ok();
}

// OpenAI's expiration policy {anchor: "created_at", seconds: 3600..2592000}, given as its two
// values (from a JSON object or from form fields `field[anchor]`, `field[seconds]`); the seconds.
Result<int64_t> expiration_seconds(const json& anchor, const json& seconds,
                                   const std::string& field) {
  if (!anchor.is_string() || anchor.get<std::string>() != "created_at") {
    return invalid_argument(field + ".anchor must be \"created_at\"", field + ".anchor");
  }
  constexpr int64_t kMin = 3600;
  constexpr int64_t kMax = 30 * 86400;
  if (!seconds.is_number_integer() || seconds.get<int64_t>() < kMin ||
      seconds.get<int64_t>() > kMax) {
    return invalid_argument(field +
                                ".seconds must be an integer from 3600 (1 hour) to 2592000 "
                                "(30 days)",
                            field + ".seconds");
  }
  return seconds.get<int64_t>();
}

Result<std::optional<int64_t>> expiration_object(const json& body, const std::string& field) {
  if (!body.contains(field)) return std::optional<int64_t>();
  const json& policy = body[field];
  if (!policy.is_object()) {
    return invalid_argument(field + " must be an object {anchor, seconds}", field);
  }
  for (const auto& [key, value] : policy.items()) {
    if (key != "anchor" && key != "seconds") {
      return invalid_argument("unknown field '" + key + "' in " + field, field + "." + key);
    }
  }
  HR_ASSIGN_OR_RETURN(int64_t seconds, expiration_seconds(policy.value("anchor", json()),
                                                          policy.value("seconds", json()), field));
  return std::optional<int64_t>(seconds);
}

}  // namespace

OpenAiBatchApi::OpenAiBatchApi(OpenAiBatchContext context) : ctx_(std::move(context)) {}

bool OpenAiBatchApi::serves(std::string_view path) {
  return path == "/v1/files" || path.starts_with("/v1/files/") || path == "/v1/batches" ||
         path.starts_with("/v1/batches/");
}

http::Reply OpenAiBatchApi::failure(const Status& st) {
  return st.code() == StatusCode::kNotFound ? error_reply(st) : db_error(st);
}

http::Reply OpenAiBatchApi::db_error(const Status& st) {
  return error_reply(ctx_.pool->client_status(st));
}

http::Reply OpenAiBatchApi::handle(const http::HttpRequest& req, const std::string& path,
                                   const std::map<std::string, std::string>& query) {
  Result<std::string> account = ctx_.authenticate(req);
  if (!account.is_ok()) {
    if (account.status().code() == StatusCode::kUnavailable) return db_error(account.status());
    return error_reply(account.status());
  }
  const std::string& acct = *account;
  beast_http::verb m = req.method();
  if (path == "/v1/files") {
    if (m == beast_http::verb::post) return upload(req, acct);
    if (m == beast_http::verb::get) return list_files(acct, query);
  } else if (path == "/v1/batches") {
    if (m == beast_http::verb::post) return create_batch(req, acct);
    if (m == beast_http::verb::get) return list_batches(acct, query);
  } else if (path.starts_with("/v1/files/")) {
    std::string rest = path.substr(10);
    size_t slash = rest.find('/');
    std::string id = rest.substr(0, slash);
    std::string sub = slash == std::string::npos ? "" : rest.substr(slash);
    if (sub.empty() && m == beast_http::verb::get) return get_file(acct, id);
    if (sub.empty() && m == beast_http::verb::delete_) return delete_file(acct, id);
    if (sub == "/content" && m == beast_http::verb::get) return file_content(acct, id);
  } else if (path.starts_with("/v1/batches/")) {
    std::string rest = path.substr(12);
    size_t slash = rest.find('/');
    std::string id = rest.substr(0, slash);
    std::string sub = slash == std::string::npos ? "" : rest.substr(slash);
    if (sub.empty() && m == beast_http::verb::get) return get_batch(acct, id);
    if (sub == "/cancel" && m == beast_http::verb::post) return cancel_batch(acct, id);
    if (sub == "/retry" && m == beast_http::verb::post) return retry_batch(req, acct, id);
    if (sub.empty() && m == beast_http::verb::delete_) return delete_batch(acct, id);
    if (sub == "/output" && m == beast_http::verb::get) return results_so_far(acct, id, true);
    if (sub == "/errors" && m == beast_http::verb::get) return results_so_far(acct, id, false);
  }
  return error_reply(not_found("no route for " + std::string(req.method_string()) + " " + path));
}

http::Reply OpenAiBatchApi::upload(const http::HttpRequest& req, const std::string& account) {
  int64_t start = steady_now_ns();
  auto ct = req.find(beast_http::field::content_type);
  if (ct == req.end()) {
    return error_reply(invalid_argument("Content-Type must be multipart/form-data with a boundary",
                                        "Content-Type"));
  }
  Result<std::string> boundary =
      multipart_boundary(std::string_view(ct->value().data(), ct->value().size()));
  if (!boundary.is_ok()) return error_reply(boundary.status());
  Result<std::vector<MultipartPart>> parts = parse_multipart(req.body(), *boundary);
  if (!parts.is_ok()) return error_reply(parts.status());
  const MultipartPart* purpose = find_part(*parts, "purpose");
  if (purpose == nullptr) return error_reply(invalid_argument("'purpose' is required", "purpose"));
  if (trim(purpose->data) != "batch") {
    return error_reply(invalid_argument(
        "purpose must be 'batch': this server stores input files for the Batch API", "purpose"));
  }
  // expires_after, as the SDKs send an object in a form: expires_after[anchor], [seconds].
  std::optional<int64_t> retain_seconds;
  const MultipartPart* anchor = find_part(*parts, "expires_after[anchor]");
  const MultipartPart* secs = find_part(*parts, "expires_after[seconds]");
  if (anchor != nullptr || secs != nullptr) {
    json seconds_value;
    if (secs != nullptr) {
      std::string text(trim(secs->data));
      bool digits = !text.empty() && text.size() < 12 &&
                    text.find_first_not_of("0123456789") == std::string::npos;
      seconds_value = digits ? json(std::stoll(text)) : json(text);
    }
    Result<int64_t> seconds = expiration_seconds(
        anchor ? json(std::string(trim(anchor->data))) : json(), seconds_value, "expires_after");
    if (!seconds.is_ok()) return error_reply(seconds.status());
    retain_seconds = *seconds;
  }
  const MultipartPart* file = find_part(*parts, "file");
  if (file == nullptr) {
    return error_reply(
        invalid_argument("'file' is required: the JSONL input as a file part", "file"));
  }
  std::string filename = file->filename.value_or("");
  size_t sep = filename.find_last_of("/\\");
  if (sep != std::string::npos) filename = filename.substr(sep + 1);
  if (filename.empty()) filename = "upload.jsonl";
  if (filename.size() > 255) {
    return error_reply(invalid_argument("the file name must be at most 255 bytes", "file"));
  }
  std::string_view data = file->data;
  if (static_cast<int64_t>(data.size()) > ctx_.max_file_bytes) {
    return error_reply(Status(StatusCode::kTooLarge,
                              "the file is " + std::to_string(data.size()) +
                                  " bytes; the limit is " + std::to_string(ctx_.max_file_bytes),
                              "file"));
  }
  int num_lines = count_jsonl_lines(data);
  if (num_lines == 0) {
    return error_reply(
        invalid_argument("the file is empty: it must hold one JSON request per line", "file"));
  }
  if (num_lines > ctx_.max_file_lines) {
    return error_reply(Status(StatusCode::kTooLarge,
                              "the file has " + std::to_string(num_lines) +
                                  " lines; the limit is " + std::to_string(ctx_.max_file_lines),
                              "file"));
  }
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  int64_t t0 = steady_now_ns();
  Result<queue::FileInfo> f = queue::create_file(
      **c,
      {account, "batch", filename, data, num_lines, retain_seconds, ctx_.default_retain_seconds});
  if (!f.is_ok()) return db_error(f.status());
  double seconds = static_cast<double>(steady_now_ns() - t0) / 1e9;
  log::info("file.uploaded", {{"file", f->id},
                              {"bytes", f->bytes},
                              {"num_lines", num_lines},
                              {"check_ms", (t0 - start) / 1000000},
                              {"store_ms", static_cast<int64_t>(seconds * 1000)},
                              {"store_mb_per_s",
                               seconds > 0 ? static_cast<double>(f->bytes) / 1e6 / seconds : 0.0}});
  return ok(file_object(*f));
}

http::Reply OpenAiBatchApi::list_files(const std::string& account, const Query& query) {
  queue::FileListQuery q;
  Result<int> limit = int_param(query, "limit", 1, 10000, 10000);
  if (!limit.is_ok()) return error_reply(limit.status());
  Result<std::optional<std::string>> after = after_param(query);
  if (!after.is_ok()) return error_reply(after.status());
  if (auto it = query.find("order"); it != query.end() && !it->second.empty()) {
    if (it->second != "asc" && it->second != "desc") {
      return error_reply(invalid_argument("order must be asc or desc", "order"));
    }
    q.ascending = it->second == "asc";
  }
  if (auto it = query.find("purpose"); it != query.end() && !it->second.empty()) {
    q.purpose = it->second;
  }
  q.after = *after;
  q.limit = *limit + 1;
  Result<std::vector<queue::FileInfo>> r = ctx_.pool->with_connection<std::vector<queue::FileInfo>>(
      [&](pqxx::connection& c) { return queue::list_files(c, account, q); });
  if (!r.is_ok()) return db_error(r.status());
  return ok(page_of(*r, *limit, file_object));
}

http::Reply OpenAiBatchApi::get_file(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such file: " + id));
  Result<queue::FileInfo> f = ctx_.pool->with_connection<queue::FileInfo>(
      [&](pqxx::connection& c) { return queue::get_file(c, account, id); });
  if (!f.is_ok()) {
    return failure(f.status());
  }
  return ok(file_object(*f));
}

http::Reply OpenAiBatchApi::file_content(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such file: " + id));
  Result<queue::FileInfo> f = ctx_.pool->with_connection<queue::FileInfo>(
      [&](pqxx::connection& c) { return queue::get_file(c, account, id); });
  if (!f.is_ok()) {
    return failure(f.status());
  }
  if (f->num_chunks() <= 1) {
    Result<std::string> content = ctx_.pool->with_connection<std::string>(
        [&](pqxx::connection& c) { return queue::read_file(c, *f); });
    if (!content.is_ok()) {
      return failure(content.status());
    }
    return raw_reply(std::move(content).value(), "application/octet-stream");
  }
  // Larger files go out one stored chunk at a time, so memory stays at one chunk per download.
  http::Reply reply = raw_reply("", "application/octet-stream");
  reply.stream_bytes = static_cast<uint64_t>(f->bytes);
  auto next_seq = std::make_shared<int>(0);
  reply.stream = [this, file = *f, next_seq](std::string* out) -> bool {
    if (*next_seq >= file.num_chunks()) return false;
    Result<bool> read = ctx_.pool->with_connection<bool>(
        [&](pqxx::connection& c) { return queue::read_file_chunk(c, file.id, *next_seq, out); });
    if (!read.is_ok() || !*read) {
      log::warn("file.read_failed",
                {{"file", file.id},
                 {"seq", *next_seq},
                 {"error", read.is_ok() ? Status(StatusCode::kNotFound, "deleted while read")
                                        : read.status()}});
      return false;  // the connection closes short of the Content-Length
    }
    ++*next_seq;
    return true;
  };
  return reply;
}

http::Reply OpenAiBatchApi::delete_file(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such file: " + id));
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Status st = queue::delete_file(**c, account, id);
  if (!st.is_ok()) {
    return failure(st);
  }
  return ok({{"id", id}, {"object", "file"}, {"deleted", true}});
}

http::Reply OpenAiBatchApi::create_batch(const http::HttpRequest& req, const std::string& account) {
  std::string why;
  json body = wire::parse_client_json(req.body(), &why);
  if (body.is_discarded()) return error_reply(invalid_argument("body " + why, "body"));
  if (!body.is_object()) return error_reply(invalid_argument("body must be a JSON object", "body"));
  for (const auto& [key, value] : body.items()) {
    if (key != "input_file_id" && key != "endpoint" && key != "completion_window" &&
        key != "metadata" && key != "webhook_url" && key != "webhook_events" &&
        key != "webhook_secret" && key != "output_expires_after" && key != "priority") {
      return error_reply(invalid_argument("unknown field '" + key + "'", key));
    }
  }
  for (const char* key : {"input_file_id", "endpoint", "completion_window"}) {
    if (!body.contains(key) || !body[key].is_string()) {
      return error_reply(
          invalid_argument(std::string("'") + key + "' is required (a string)", key));
    }
  }
  std::string file_id = body["input_file_id"];
  std::string endpoint = body["endpoint"];
  std::string window = body["completion_window"];
  if (endpoint != kEndpoint) {
    return error_reply(invalid_argument(
        std::string("endpoint must be ") + kEndpoint + ", the one endpoint served here",
        "endpoint"));
  }
  Result<int64_t> window_ms = parse_duration_ms(window, "completion_window");
  if (!window_ms.is_ok()) return error_reply(window_ms.status());
  Result<std::optional<int64_t>> retain_seconds = expiration_object(body, "output_expires_after");
  if (!retain_seconds.is_ok()) return error_reply(retain_seconds.status());
  json metadata = body.contains("metadata") ? body["metadata"] : json();
  if (Status st = check_metadata(metadata); !st.is_ok()) return error_reply(st);
  std::optional<std::string> metadata_json;
  if (metadata.is_object()) metadata_json = metadata.dump();
  // The priority: an extra top-level field, else in the metadata (as a string there).
  Result<std::optional<int>> priority = batch_priority({{&metadata, "metadata."}, {&body, ""}});
  if (!priority.is_ok()) return error_reply(priority.status());
  // Webhook fields: extra top-level fields, else in the metadata (no secret there: it is echoed).
  bool hook_in_body = body.contains("webhook_url") || body.contains("webhook_events") ||
                      body.contains("webhook_secret");
  if (metadata.is_object() && metadata.contains("webhook_secret")) {
    return error_reply(invalid_argument(
        "send webhook_secret as a top-level field; metadata is shown to anyone reading the batch",
        "metadata.webhook_secret"));
  }
  ctx_.pool->release();  // a webhook host's lookup may take seconds
  Result<BatchWebhook> hook = hook_in_body
                                  ? parse_batch_webhook(body, ctx_.webhook_policy)
                                  : parse_batch_webhook(metadata, ctx_.webhook_policy, "metadata.");
  if (!hook.is_ok()) return error_reply(hook.status());
  Result<std::optional<std::string>> idem = idempotency_key(req);
  if (!idem.is_ok()) return error_reply(idem.status());
  if (!parse_uuid(file_id).is_ok()) {
    return error_reply(Status(StatusCode::kNotFound, "no such file: " + file_id, "input_file_id"));
  }
  Result<queue::FileInfo> file = ctx_.pool->with_connection<queue::FileInfo>(
      [&](pqxx::connection& c) { return queue::get_file(c, account, file_id); });
  if (!file.is_ok()) {
    if (file.status().code() != StatusCode::kNotFound) return db_error(file.status());
    return error_reply(Status(StatusCode::kNotFound, file.status().message(), "input_file_id"));
  }
  if (file->purpose != "batch") {
    return error_reply(invalid_argument(
        "input_file_id must name a file uploaded with purpose 'batch'", "input_file_id"));
  }
  int64_t t0 = steady_now_ns();
  Result<std::string> content = ctx_.pool->with_connection<std::string>(
      [&](pqxx::connection& c) { return queue::read_file(c, *file); });
  if (!content.is_ok()) return db_error(content.status());
  int64_t read_ns = steady_now_ns() - t0;
  std::vector<InputLine> lines = split_jsonl(*content);
  std::vector<LineError> errors;
  const ModelSpec* model = nullptr;
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  if (lines.empty()) {
    errors.push_back({"empty_file", "the input file has no requests", "", std::nullopt});
  } else if (static_cast<int64_t>(lines.size()) > ctx_.limits.max_requests) {
    errors.push_back({"too_many_requests",
                      "the input file has " + std::to_string(lines.size()) +
                          " requests; a batch holds at most " +
                          std::to_string(ctx_.limits.max_requests),
                      "", std::nullopt});
  } else {
    InputValidator validator(ctx_.models, ctx_.limits, endpoint);
    model = validator.pick_model(lines);
    size_t next = 0;  // the first line not yet checked
    if (model != nullptr) {
      queue::NewBatch batch;
      batch.account_id = account;
      batch.model = model->name;
      batch.api_shape = "openai";
      batch.deadline_unix_ms = SystemClock::instance().now_unix_ms() + *window_ms;
      batch.idempotency_key = *idem;
      batch.request_hash = sha256(req.body());
      batch.metadata_json = metadata_json;
      batch.priority = *priority;
      batch.endpoint = endpoint;
      batch.input_file_id = file_id;
      batch.completion_window = window;
      batch.retain_seconds = *retain_seconds;
      batch.default_retain_seconds = ctx_.default_retain_seconds;
      batch.webhook_url = hook->url;
      batch.webhook_events = hook->events;
      batch.webhook_secret = hook->secret;
      batch.num_requests = lines.size();
      // Each line is validated as it streams into COPY; the first bad one rolls everything back.
      batch.produce = [&](size_t i, queue::NewRequest* out) -> Status {
        next = i + 1;
        std::optional<LineError> e = validator.check(lines[i], out);
        if (!e) return Status::ok();
        errors.push_back(*e);
        return invalid_argument(e->message, e->param);
      };
      int64_t t1 = steady_now_ns();
      Result<queue::SubmitResult> r = queue::submit_batch(**c, batch);
      if (errors.empty()) {
        if (!r.is_ok()) {
          return is_refusal(r.status()) ? error_reply(r.status()) : db_error(r.status());
        }
        log::info("batch.submitted", {{"batch", r->batch_id},
                                      {"model", model->name},
                                      {"api_shape", "openai"},
                                      {"num_requests", static_cast<int64_t>(lines.size())},
                                      {"replayed", r->replayed},
                                      {"read_file_ms", read_ns / 1000000},
                                      {"validate_and_store_ms", (steady_now_ns() - t1) / 1000000}});
        return get_batch(account, r->batch_id);
      }
    }
    // The input is bad: report every bad line (up to a limit), enqueue nothing.
    queue::NewRequest scratch;
    for (size_t i = next; i < lines.size() && errors.size() < kMaxLineErrors; ++i) {
      if (std::optional<LineError> e = validator.check(lines[i], &scratch)) errors.push_back(*e);
    }
    if (errors.empty()) {  // no line named a served model, yet none failed: cannot happen
      errors.push_back(
          {"model_not_found", "no request names a served model", "body.model", std::nullopt});
    }
  }
  queue::FailedBatch failed;
  failed.account_id = account;
  failed.model = model ? model->name : "";
  failed.endpoint = endpoint;
  failed.input_file_id = file_id;
  failed.completion_window = window;
  failed.retain_seconds = *retain_seconds;
  failed.default_retain_seconds = ctx_.default_retain_seconds;
  failed.metadata_json = metadata_json;
  failed.errors_json = errors_object(errors).dump();
  failed.webhook_url = hook->url;
  failed.webhook_events = hook->events;
  failed.webhook_secret = hook->secret;
  Result<std::string> id = queue::record_failed_batch(**c, failed);
  if (!id.is_ok()) return db_error(id.status());
  log::info("batch.validation_failed", {{"batch", *id},
                                        {"num_errors", static_cast<int64_t>(errors.size())},
                                        {"first_error", errors.front().message}});
  return get_batch(account, *id);
}

http::Reply OpenAiBatchApi::get_batch(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such batch: " + id));
  Result<queue::OpenAiBatch> b = ctx_.pool->with_connection<queue::OpenAiBatch>(
      [&](pqxx::connection& c) { return queue::get_openai_batch(c, account, id); });
  if (!b.is_ok()) {
    return failure(b.status());
  }
  ojson object = batch_object(*b);
  // Extensions while it is open: when it should finish, and whether its window looks at risk.
  if (ctx_.forecasts && !b->info.is_terminal() && !b->info.finished_at_ms) {
    if (std::optional<BatchForecast> f =
            ctx_.forecasts->forecast(b->info.model, b->info.id, b->info.created_at_ms)) {
      nlohmann::json extra;
      QueueForecasts::describe(*f, b->info.deadline_ms, &extra);
      for (auto& [key, value] : extra.items()) object[key] = ojson(value);
    }
  }
  return ok(object);
}

http::Reply OpenAiBatchApi::list_batches(const std::string& account, const Query& query) {
  Result<int> limit = int_param(query, "limit", 1, 100, 20);
  if (!limit.is_ok()) return error_reply(limit.status());
  Result<std::optional<std::string>> after = after_param(query);
  if (!after.is_ok()) return error_reply(after.status());
  Result<std::vector<queue::OpenAiBatch>> r =
      ctx_.pool->with_connection<std::vector<queue::OpenAiBatch>>([&](pqxx::connection& c) {
        return queue::list_openai_batches(c, account, *limit + 1, *after);
      });
  if (!r.is_ok()) return db_error(r.status());
  return ok(page_of(*r, *limit, batch_object));
}

http::Reply OpenAiBatchApi::cancel_batch(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such batch: " + id));
  Result<queue::OpenAiBatch> b = ctx_.pool->with_connection<queue::OpenAiBatch>(
      [&](pqxx::connection& c) { return queue::get_openai_batch(c, account, id); });
  if (!b.is_ok()) {
    return failure(b.status());
  }
  // Queued requests end now; running ones finish and keep their results. Idempotent.
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Result<queue::CancelResult> r = queue::cancel_batch(**c, account, id);
  if (!r.is_ok()) return db_error(r.status());
  if (!r->already_requested && !b->info.is_terminal()) {
    log::info("batch.cancel_requested", {{"batch", id}, {"cancelled_now", r->num_cancelled_now}});
  }
  return get_batch(account, id);
}

http::Reply OpenAiBatchApi::delete_batch(const std::string& account, const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such batch: " + id));
  Result<queue::OpenAiBatch> b = ctx_.pool->with_connection<queue::OpenAiBatch>(
      [&](pqxx::connection& c) { return queue::get_openai_batch(c, account, id); });
  if (!b.is_ok()) return failure(b.status());
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Status st = queue::delete_batch(**c, account, id);
  if (st.code() == StatusCode::kConflict) {
    return error_reply(Status(StatusCode::kConflict,
                              "the batch is " + openai_batch_status(*b) +
                                  ": only an ended batch can be deleted; cancel it first",
                              "status"));
  }
  if (!st.is_ok()) return failure(st);
  log::info("batch.deleted", {{"batch", id}});
  return ok({{"id", id}, {"object", "batch.deleted"}, {"deleted", true}});
}

http::Reply OpenAiBatchApi::retry_batch(const http::HttpRequest& req, const std::string& account,
                                        const std::string& id) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such batch: " + id));
  // Only OpenAI batches are found here (a Workers-AI batch is retried on its own route).
  Result<queue::OpenAiBatch> b = ctx_.pool->with_connection<queue::OpenAiBatch>(
      [&](pqxx::connection& c) { return queue::get_openai_batch(c, account, id); });
  if (!b.is_ok()) return failure(b.status());
  ctx_.pool->release();  // a webhook host's lookup may take seconds
  Result<queue::RetryRequest> retry = parse_retry(req, account, id, ctx_.webhook_policy);
  if (!retry.is_ok()) return error_reply(retry.status());
  Result<pqxx::connection*> c = ctx_.pool->connection();
  if (!c.is_ok()) return db_error(c.status());
  Result<queue::SubmitResult> r = queue::retry_batch(**c, *retry);
  if (!r.is_ok()) {
    return is_refusal(r.status()) ? error_reply(r.status()) : failure(r.status());
  }
  log::info("batch.retried",
            {{"batch", r->batch_id}, {"retried_from", id}, {"replayed", r->replayed}});
  return get_batch(account, r->batch_id);
}

http::Reply OpenAiBatchApi::results_so_far(const std::string& account, const std::string& id,
                                           bool succeeded) {
  if (!parse_uuid(id).is_ok()) return error_reply(not_found("no such batch: " + id));
  Result<queue::OpenAiBatch> b = ctx_.pool->with_connection<queue::OpenAiBatch>(
      [&](pqxx::connection& c) { return queue::get_openai_batch(c, account, id); });
  if (!b.is_ok()) {
    return failure(b.status());
  }
  // Lines a page at a time (api/paged_answer.h): memory per download stays at a page.
  struct Lines {
    queue::PgPool* pool;
    std::string batch_id;
    std::string model;
    queue::ResultFilter filter;
    int next_idx = 0;
    Result<bool> operator()(std::string* out) {
      Result<std::vector<queue::ResultRow>> rows =
          pool->with_connection<std::vector<queue::ResultRow>>([&](pqxx::connection& c) {
            return queue::read_result_rows(c, batch_id, filter, next_idx, kResultPage);
          });
      if (!rows.is_ok()) return rows.status();
      std::string other;  // the filter leaves none: every row is a line of `out`'s kind
      for (const queue::ResultRow& row : *rows) {
        wire::append_result_line(batch_id, model, row,
                                 filter == queue::ResultFilter::kSucceeded ? out : &other,
                                 filter == queue::ResultFilter::kSucceeded ? &other : out);
      }
      if (!rows->empty()) next_idx = rows->back().idx + 1;
      return static_cast<int>(rows->size()) == kResultPage;
    }
  };
  Lines lines{ctx_.pool, id, b->info.model,
              succeeded ? queue::ResultFilter::kSucceeded : queue::ResultFilter::kUnsucceeded};
  std::string first;
  Result<bool> more = lines(&first);
  if (!more.is_ok()) return db_error(more.status());
  http::Reply reply = raw_reply(*more ? std::string() : std::move(first), "application/jsonl");
  if (*more) {
    std::shared_ptr<void> slot =
        ctx_.large_answers ? ctx_.large_answers->take(account) : std::shared_ptr<void>();
    if (ctx_.large_answers && !slot) {
      return error_reply(Status(StatusCode::kResourceExhausted,
                                "this account is downloading " +
                                    std::to_string(ctx_.large_answers->per_account()) +
                                    " large results at once already; retry when one has finished",
                                "batch"));
    }
    reply.stream = paged_body(std::move(first), std::move(lines), "", std::move(slot));
  }
  reply.response.set("x-batch-status", openai_batch_status(*b));
  return reply;
}

}  // namespace hr::api
