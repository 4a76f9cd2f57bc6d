// Routes and handlers of the async API.
#include "api/async_api.h"

#include <pqxx/pqxx>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_set>

#include "api/errors.h"
#include "api/openai_batch.h"
#include "api/webhooks_api.h"
#include "base/cli.h"
#include "base/clock.h"
#include "base/hash.h"
#include "base/ids.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/url.h"
#include "queue/pg.h"
#include "queue/pg_pool.h"
#include "queue/redis.h"
#include "queue/store.h"
#include "queue/webhooks.h"

namespace hr::api {

namespace http = boost::beast::http;
using nlohmann::json;

namespace {

// The routes of OpenAI's API answer errors in OpenAI's shape (what its SDKs parse).
bool is_openai_path(std::string_view path) {
  return path == "/v1/chat/completions" || path == "/v1/models" || OpenAiBatchApi::serves(path);
}

}  // namespace

void ApiConfig::bind(CLI::App& app) {
  cli::add(app, "--host", host, "Address to listen on");
  cli::add(app, "--port", port, "HTTP port to listen on (0: any free port)");
  cli::add(app, "--io-threads", io_threads, "Threads running HTTP I/O");
  cli::add(app, "--handler-threads", handler_threads,
           "Threads running request handlers (a sync call holds one while it is generated)");
  cli::add(app, "--db-connections", db_connections,
           "Most Postgres connections the handlers share (each borrowed only while querying)");
  cli::add(app, "--db-wait-ms", db_wait_ms,
           "How long a request waits for a free Postgres connection before 429");
  cli::add(app, "--body-limit-bytes", body_limit_bytes, "Largest accepted request body");
  cli::add(app, "--max-batch-requests", max_batch_requests, "Most requests in one batch");
  cli::add(app, "--max-file-bytes", max_file_bytes,
           "Largest OpenAI batch input file (POST /v1/files)");
  cli::add(app, "--max-file-lines", max_file_lines, "Most lines in an OpenAI batch input file");
  cli::add(app, "--served-model", models, "A served model as NAME:CONTEXT_LENGTH (repeatable)")
      ->delimiter(',');
  bind_webhook_allow(app, webhook_allow);
  cli::add(app, "--sync-queue-timeout-ms", sync_queue_timeout_ms,
           "How long a sync request waits for a worker with room before 429 (code 3040)");
  cli::add(app, "--internal-token", internal_token,
           "Shared secret sent to workers with forwarded sync requests (must match theirs)");
}

Status ApiConfig::validate() const {
  if (port < 0 || port > 65535) return invalid_argument("--port must be 0..65535", "port");
  if (io_threads < 1 || handler_threads < 1) {
    return invalid_argument("--io-threads and --handler-threads must be at least 1", "io-threads");
  }
  if (db_connections < 1 || db_connections > 10000) {
    return invalid_argument("--db-connections must be 1..10000", "db-connections");
  }
  if (db_wait_ms < 0 || db_wait_ms > 600000) {
    return invalid_argument("--db-wait-ms must be 0..600000", "db-wait-ms");
  }
  if (body_limit_bytes < 1024) {
    return invalid_argument("--body-limit-bytes must be at least 1024", "body-limit-bytes");
  }
  if (max_batch_requests < 1) {
    return invalid_argument("--max-batch-requests must be at least 1", "max-batch-requests");
  }
  HR_RETURN_IF_ERROR(AddressPolicy::parse(webhook_allow).status());
  if (max_file_bytes < 1 || max_file_bytes > (int64_t{1} << 40)) {
    return invalid_argument("--max-file-bytes must be 1 to 2^40", "max-file-bytes");
  }
  if (max_file_lines < 1) {
    return invalid_argument("--max-file-lines must be at least 1", "max-file-lines");
  }
  if (sync_queue_timeout_ms < 0 || sync_queue_timeout_ms > 600000) {
    return invalid_argument("--sync-queue-timeout-ms must be 0..600000", "sync-queue-timeout-ms");
  }
  return model_specs().status();
}

Result<std::vector<ModelSpec>> ApiConfig::model_specs() const {
  std::vector<ModelSpec> out;
  for (const std::string& m : models) {
    size_t colon = m.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return invalid_argument("--served-model must look like NAME:CONTEXT_LENGTH, got " + m,
                              "served-model");
    }
    ModelSpec spec;
    spec.name = m.substr(0, colon);
    try {
      spec.context_length = std::stoi(m.substr(colon + 1));
    } catch (...) {
      spec.context_length = 0;
    }
    if (spec.context_length < 1) {
      return invalid_argument("--served-model context length must be a positive integer: " + m,
                              "served-model");
    }
    out.push_back(spec);
  }
  return out;
}

HttpServerOptions ApiConfig::server_options() const {
  HttpServerOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(port);
  o.io_threads = io_threads;
  o.handler_threads = handler_threads;
  o.body_limit_bytes = static_cast<size_t>(body_limit_bytes);
  // File uploads may be larger than other bodies: the file plus room for the form around it.
  o.upload_limit_bytes = static_cast<size_t>(max_file_bytes) + (1 << 20);
  o.is_upload = [](http::verb method, std::string_view target) {
    return method == http::verb::post && target.substr(0, target.find('?')) == "/v1/files";
  };
  o.error_body_for = [](std::string_view target, const Status& st) {
    return is_openai_path(target.substr(0, target.find('?'))) ? openai_error_body(st).dump()
                                                              : error_body(st).dump();
  };
  return o;
}

Result<int64_t> parse_duration_ms(const std::string& text, const std::string& field) {
  if (text.size() < 2) return invalid_argument("duration must look like 24h, 90m or 30s", field);
  char unit = text.back();
  int64_t mult = unit == 's'   ? 1000
                 : unit == 'm' ? 60000
                 : unit == 'h' ? 3600000
                 : unit == 'd' ? 86400000
                               : 0;
  int64_t n = 0;
  for (size_t i = 0; i + 1 < text.size() && mult != 0; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(text[i])) || n > 1000000) {
      mult = 0;  // stop before n can overflow
    } else {
      n = n * 10 + (text[i] - '0');
    }
  }
  if (mult == 0 || n <= 0)
    return invalid_argument("duration must look like 24h, 90m or 30s", field);
  int64_t ms = n * mult;
  if (ms > 7LL * 86400000) return invalid_argument("duration must be at most 7d", field);
  return ms;
}

namespace {

// Errors in the project's shape, or in OpenAI's on the OpenAI routes.
enum class ErrorShape { kWorkersAi, kOpenAi };

HttpResponse openai_error(const Status& st) {
  HttpResponse res = json_response(static_cast<unsigned>(http_status_for(st.code())),
                                   openai_error_body(st).dump());
  if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kResourceExhausted) {
    res.set(http::field::retry_after, "1");
  }
  return res;
}

HttpResponse shaped_error(const Status& st, ErrorShape shape) {
  return shape == ErrorShape::kOpenAi ? openai_error(st) : error_response(st);
}

// Names the worker that answered a sync call (x-headroom-worker), when it was a remote one.
void mark_worker(HttpResponse& res, const std::string& worker) {
  if (!worker.empty()) res.set("x-headroom-worker", worker);
}

json answer_usage(const SyncAnswer& a) {
  return {{"prompt_tokens", a.prompt_tokens},
          {"completion_tokens", a.completion_tokens},
          {"total_tokens", a.prompt_tokens + a.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", a.cached_tokens}}}};
}

// obj[key] as a flag: absent, null or not a boolean is false (check_sync_fields refuses the last).
bool flag(const json& obj, const char* key) {
  if (!obj.is_object()) return false;
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

// The sync routes' own fields, checked before they are read: flags are booleans (or null), the
// option groups objects, and n (OpenAI's number of choices) one.
Status check_sync_fields(const json& body) {
  auto check_flag = [](const json& obj, const char* key, const std::string& field) -> Status {
    auto it = obj.find(key);
    if (it != obj.end() && !it->is_null() && !it->is_boolean()) {
      return invalid_argument("'" + field + "' must be true or false", field);
    }
    return Status::ok();
  };
  HR_RETURN_IF_ERROR(check_flag(body, "stream", "stream"));
  for (const char* group : {"options", "stream_options"}) {
    auto it = body.find(group);
    if (it != body.end() && !it->is_null() && !it->is_object()) {
      return invalid_argument(std::string("'") + group + "' must be an object", group);
    }
  }
  if (auto o = body.find("options"); o != body.end() && o->is_object()) {
    HR_RETURN_IF_ERROR(check_flag(*o, "rejectIfBusy", "options.rejectIfBusy"));
  }
  if (auto o = body.find("stream_options"); o != body.end() && o->is_object()) {
    HR_RETURN_IF_ERROR(check_flag(*o, "include_usage", "stream_options.include_usage"));
  }
  if (auto n = body.find("n");
      n != body.end() && !n->is_null() && !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    return invalid_argument("'n' must be 1: one choice per request is served", "n");
  }
  return Status::ok();
}

// An answer without the log probabilities its request asked for: from a worker of an earlier
// release, which ignores logprobs (every answer of this one carries them, empty or not).
Status no_logprobs_from_worker() {
  return unavailable(
      "the worker that answered does not serve log probabilities (an earlier release)");
}

// Whether a /ai/run call asks to be queued: ?queueRequest=true, "queueRequest": true or
// "options": {"queueRequest": true} (the last one said wins).
bool queue_requested(const json& body, const std::map<std::string, std::string>& query) {
  bool queued = query.count("queueRequest") && query.at("queueRequest") == "true";
  if (body.contains("queueRequest")) queued = body["queueRequest"] == true;
  if (body.contains("options") && body["options"].is_object() &&
      body["options"].contains("queueRequest")) {
    queued = body["options"]["queueRequest"] == true;
  }
  return queued;
}

// The model of a /ai/run/{model} or /accounts/{account}/ai/run/{model} path, and the account
// the second form names.
std::optional<std::pair<std::string, std::string>> run_path(const std::string& path) {
  if (path.rfind("/ai/run/", 0) == 0)
    return std::make_pair(percent_decode(path.substr(8)), std::string());
  if (path.rfind("/accounts/", 0) == 0) {
    size_t run = path.find("/ai/run/");
    if (run != std::string::npos) {
      return std::make_pair(percent_decode(path.substr(run + 8)), path.substr(10, run - 10));
    }
  }
  return std::nullopt;
}

std::map<std::string, std::string> parse_query(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    size_t amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    size_t eq = kv.find('=');
    out[percent_decode(kv.substr(0, eq))] =
        eq == std::string_view::npos ? "" : percent_decode(kv.substr(eq + 1));
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
  }
  return out;
}

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
  return j;
}

json usage_of(const queue::BatchInfo& b) {
  return {{"prompt_tokens", b.prompt_tokens},
          {"completion_tokens", b.completion_tokens},
          {"total_tokens", b.prompt_tokens + b.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", b.cached_tokens}}}};
}

json response_of(const queue::RequestResult& r) {
  json j = {{"id", r.idx},
            {"external_reference", r.custom_id ? json(*r.custom_id) : json(nullptr)},
            {"success", r.status == "completed"}};
  if (r.status == "completed" && r.result_json) {
    j["result"] = json::parse(*r.result_json, nullptr, false);
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

// A check that callers without a key may ask for (/readyz, /metrics): one caller at a time runs
// it, and those who arrive meanwhile take its answer, so that however many callers there are,
// the check runs once at a time (and holds at most one pooled database connection). A check that
// throws answers an internal error, to its caller and to those waiting on it.
class SharedCheck {
 public:
  Status run(const std::function<Status()>& check) {
    std::unique_lock<std::mutex> lock(mu_);
    if (running_) {
      const uint64_t seen = finished_;
      cv_.wait(lock, [&] { return finished_ != seen; });
      return last_;
    }
    running_ = true;
    lock.unlock();
    Status result;
    try {
      result = check();
    } catch (const std::exception& e) {
      result = internal_error(e.what());
    }
    lock.lock();
    last_ = result;
    running_ = false;
    ++finished_;
    cv_.notify_all();
    return result;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool running_ = false;   // guarded by mu_
  uint64_t finished_ = 0;  // guarded by mu_: checks run to their end
  Status last_;            // guarded by mu_: the answer of the last one
};

}  // namespace

struct AsyncApi::Impl {
  static thread_local int64_t parse_ns_;  // JSON parse time of the current request, for logs
  std::atomic<SyncInference*> sync{nullptr};
  ApiConfig config;
  queue::StoreConfig store;
  WebhookApiContext webhooks;
  std::vector<ModelSpec> models;
  BatchLimits limits;
  std::unique_ptr<OpenAiBatchApi> openai;  // /v1/files and /v1/batches

  std::mutex auth_mu;
  struct CachedKey {
    std::string account_id;
    int64_t expires_ms;
  };
  std::unordered_map<std::string, CachedKey> auth_cache;  // guarded by auth_mu; key = sha256 hex

  // Database connections shared by the handler threads: a thread borrows one on its first query
  // and gives it back when its request is answered, or before it waits on an inference.
  std::unique_ptr<queue::PgPool> pool;
  // /readyz and /metrics: the queue depth read from Postgres (which also shows that it answers),
  // and a ping of Redis over one connection of their own (used inside redis_check only).
  SharedCheck database_check;
  SharedCheck redis_check;
  std::unique_ptr<queue::RedisClient> probe_redis;
  Result<pqxx::connection*> conn() { return pool->connection(); }

  // Runs a read on this thread's connection; if the connection turns out to be broken (e.g. the
  // server restarted since it was opened), reconnects and tries once more.
  template <typename T, typename Fn>
  Result<T> read_with_retry(Fn&& fn) {
    for (int attempt = 0;; ++attempt) {
      Result<pqxx::connection*> c = conn();
      if (!c.is_ok()) return c.status();
      Result<T> r = fn(**c);
      if (r.is_ok() || r.status().code() != StatusCode::kUnavailable || attempt == 1) return r;
      pool->drop();
    }
  }

  // A database error drops the thread's connection so the next call reconnects.
  HttpResponse db_error(const Status& st, ErrorShape shape = ErrorShape::kWorkersAi) {
    log::warn("api.db_error", {{"error", st}});
    if (st.code() == StatusCode::kUnavailable) {
      pool->drop();
      return shaped_error(
          Status(StatusCode::kUnavailable, "the database is unavailable; retry later"), shape);
    }
    return shaped_error(st, shape);
  }

  Result<std::string> authenticate(const HttpRequest& req) {
    auto it = req.find(http::field::authorization);
    if (it == req.end()) {
      return Status(StatusCode::kUnauthenticated,
                    "missing API key: send Authorization: Bearer <key>", "Authorization");
    }
    std::string_view v(it->value().data(), it->value().size());
    if (v.size() < 8 || (v.substr(0, 7) != "Bearer " && v.substr(0, 7) != "bearer ")) {
      return Status(StatusCode::kUnauthenticated, "Authorization must be 'Bearer <key>'",
                    "Authorization");
    }
    std::string key(v.substr(7));
    std::string digest = to_hex(sha256(key));
    int64_t now = SystemClock::instance().now_unix_ms();
    {
      std::lock_guard<std::mutex> lock(auth_mu);
      auto c = auth_cache.find(digest);
      if (c != auth_cache.end() && c->second.expires_ms > now) return c->second.account_id;
    }
    Result<std::string> account = read_with_retry<std::string>(
        [&](pqxx::connection& c) { return queue::authenticate(c, key); });
    if (!account.is_ok()) {
      if (account.status().code() == StatusCode::kUnauthenticated) {
        return Status(StatusCode::kUnauthenticated, "invalid API key", "Authorization");
      }
      return account.status();
    }
    std::lock_guard<std::mutex> lock(auth_mu);
    if (auth_cache.size() > 10000) auth_cache.clear();
    auth_cache[digest] = {*account, now + 30000};
    return account;
  }

  const ModelSpec* find_model(const std::string& name) const {
    for (const auto& m : models) {
      if (m.name == name) return &m;
    }
    return nullptr;
  }

  // Answers `req`; a streamed answer's body goes to *stream (nullptr: this caller cannot stream,
  // and stream: true is refused).
  HttpResponse handle(const HttpRequest& req, BodyStream* stream = nullptr);
  HttpResponse readyz();
  // The checks behind database_check and redis_check.
  Status read_queue_depth();
  Status ping_redis();
  // Prometheus text: this process's metrics plus the queue depth per model from Postgres.
  HttpResponse metrics_page();
  HttpResponse run_model(const HttpRequest& req, const std::string& account,
                         const std::string& model, const std::map<std::string, std::string>& query,
                         BodyStream* stream);
  HttpResponse submit(const HttpRequest& req, const std::string& account, const ModelSpec& model,
                      const json& body);
  HttpResponse poll(const std::string& account, const std::string& request_id,
                    bool include_partial);
  HttpResponse cancel(const std::string& account, const std::string& request_id);
  HttpResponse list(const std::string& account, const std::map<std::string, std::string>& query);
  // Validates and runs one sync request; on success returns the answer and the normalized body.
  Result<SyncAnswer> run_sync(const HttpRequest& req, const json& body, const ModelSpec& model);
  HttpResponse chat_completions(const HttpRequest& req);
  Reply chat_completions_stream(const HttpRequest& req, json body);
  // Workers-AI text generation with stream: true: {"response": delta} events, then the usage.
  Reply run_model_stream(const HttpRequest& req, json body, const ModelSpec& model);
  // Where and how a sync call runs: the model, the x-session-affinity header, options.rejectIfBusy.
  SyncCall sync_call(const HttpRequest& req, const json& body, const ModelSpec& model) const;
  Result<SyncInference*> sync_for(const ModelSpec& model) const;
  HttpResponse models_list();
};

thread_local int64_t AsyncApi::Impl::parse_ns_ = 0;

AsyncApi::AsyncApi(ApiConfig config, queue::StoreConfig store) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->store = std::move(store);
  impl_->models = impl_->config.model_specs().value();
  impl_->pool =
      std::make_unique<queue::PgPool>(impl_->store.database_url, impl_->config.db_connections,
                                      std::chrono::milliseconds(impl_->config.db_wait_ms));
  impl_->limits.max_requests = impl_->config.max_batch_requests;
  Impl* impl = impl_.get();
  impl_->webhooks.policy = AddressPolicy::parse(impl_->config.webhook_allow).value();
  impl_->webhooks.policy.set_lookup(impl_->config.webhook_lookup);
  impl_->webhooks.conn = [impl] { return impl->conn(); };
  impl_->webhooks.db_error = [impl](const Status& st) { return impl->db_error(st); };
  impl_->webhooks.release_conn = [impl] { impl->pool->release(); };
  OpenAiBatchContext ctx;
  ctx.authenticate = [impl = impl_.get()](const HttpRequest& r) { return impl->authenticate(r); };
  ctx.conn = [impl = impl_.get()] { return impl->conn(); };
  ctx.drop_conn = [impl] { impl->pool->drop(); };
  ctx.release_conn = [impl] { impl->pool->release(); };
  ctx.models = impl_->models;
  ctx.limits = impl_->limits;
  ctx.max_file_bytes = impl_->config.max_file_bytes;
  ctx.max_file_lines = impl_->config.max_file_lines;
  ctx.webhook_policy = impl_->webhooks.policy;
  impl_->openai = std::make_unique<OpenAiBatchApi>(std::move(ctx));
}

AsyncApi::~AsyncApi() = default;

void AsyncApi::set_sync_inference(SyncInference* sync) { impl_->sync = sync; }

namespace {

// Gives the thread's database connection back to the pool when it goes out of scope.
struct GiveBack {
  queue::PgPool* pool;
  ~GiveBack() { pool->release(); }
};

}  // namespace

HttpResponse AsyncApi::handle(const HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  if (!OpenAiBatchApi::serves(target.substr(0, target.find('?')))) {
    GiveBack done{impl_->pool.get()};
    return impl_->handle(req);
  }
  Reply reply = handle_streaming(req);  // a streamed file download, collected whole
  if (reply.stream) {
    std::string piece;
    while (reply.stream(&piece)) {
      reply.response.body() += piece;
      piece.clear();
    }
    reply.response.prepare_payload();
  }
  return std::move(reply.response);
}

namespace {

// A coarse route name for request metrics (ids and models left out).
std::string route_of(std::string_view path) {
  for (const char* prefix :
       {"/ai/run", "/v1/async", "/v1/chat/completions", "/v1/models", "/v1/files", "/v1/batches",
        "/v1/webhooks", "/healthz", "/readyz", "/metrics"}) {
    if (path.rfind(prefix, 0) == 0) return prefix;
  }
  if (path.rfind("/accounts/", 0) == 0 && path.find("/ai/run/") != std::string_view::npos) {
    return "/ai/run";
  }
  return "other";
}

// Counts an answer in the request metrics; returns its route.
std::string count_answer(std::string_view path, unsigned code) {
  std::string route = route_of(path);
  metrics::counter("headroom_http_requests_total", "HTTP requests answered, by route and status",
                   "route=\"" + route + "\",code=\"" + std::to_string(code) + "\"")
      .add();
  return route;
}

}  // namespace

Reply AsyncApi::handle_streaming(const HttpRequest& req) {
  int64_t t0 = steady_now_ns();
  Reply reply;
  {
    GiveBack done{impl_->pool.get()};
    reply = route_streaming(req);
  }
  if (reply.stream) {  // each piece may borrow a connection (file downloads) and gives it back
    reply.stream = [next = std::move(reply.stream), pool = impl_->pool.get()](std::string* piece) {
      GiveBack done{pool};
      return next(piece);
    };
  }
  std::string_view target(req.target().data(), req.target().size());
  std::string route = count_answer(target.substr(0, target.find('?')), reply.response.result_int());
  metrics::histogram("headroom_http_response_seconds",
                     "Time to the response header (a streamed body continues after)",
                     "route=\"" + route + "\"")
      .observe(static_cast<double>(steady_now_ns() - t0) / 1e9);
  return reply;
}

HttpServerOptions AsyncApi::server_options() const {
  HttpServerOptions o = impl_->config.server_options();
  o.check_header = [impl = impl_.get()](const HttpRequest& header) -> std::optional<HttpResponse> {
    std::string_view target(header.target().data(), header.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    if (path == "/healthz" || path == "/readyz" || path == "/metrics") return std::nullopt;
    Result<std::string> account = [&] {
      GiveBack done{impl->pool.get()};
      return impl->authenticate(header);
    }();
    // Only a key known to be bad is refused here; the handler answers a database outage.
    if (account.is_ok() || account.status().code() != StatusCode::kUnauthenticated)
      return std::nullopt;
    HttpResponse res = shaped_error(
        account.status(), is_openai_path(path) ? ErrorShape::kOpenAi : ErrorShape::kWorkersAi);
    count_answer(path, res.result_int());
    return res;
  };
  return o;
}

Reply AsyncApi::route_streaming(const HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  size_t qpos = target.find('?');
  if (OpenAiBatchApi::serves(target.substr(0, qpos))) {
    return impl_->openai->handle(
        req, std::string(target.substr(0, qpos)),
        parse_query(qpos == std::string_view::npos ? "" : target.substr(qpos + 1)));
  }
  if (req.method() == http::verb::post && target.substr(0, qpos) == "/v1/chat/completions") {
    json body = parse_client_json(req.body());
    if (flag(body, "stream")) {
      Result<std::string> account = impl_->authenticate(req);
      if (!account.is_ok()) return {openai_error(account.status()), nullptr};
      return impl_->chat_completions_stream(req, body);
    }
  }
  Reply reply;
  reply.response = impl_->handle(req, &reply.stream);
  return reply;
}

HttpResponse AsyncApi::Impl::metrics_page() {
  // The handlers' database connections as this scrape found them (before it borrowed one).
  const int lent = pool->lent(), open = pool->open();
  const char* kPoolHelp =
      "Postgres connections of the API's handlers: lent to a request, or open and idle";
  metrics::gauge("headroom_api_db_connections", kPoolHelp, "state=\"lent\"").set(lent);
  metrics::gauge("headroom_api_db_connections", kPoolHelp, "state=\"idle\"").set(open - lent);
  Status st = database_check.run([this] { return read_queue_depth(); });
  metrics::gauge("headroom_metrics_database_up", "Whether the queue depth could be read")
      .set(st.is_ok() ? 1 : 0);
  HttpResponse res = json_response(200, metrics::render());
  res.set(http::field::content_type, "text/plain; version=0.0.4");
  return res;
}

Status AsyncApi::Impl::read_queue_depth() {
  Result<pqxx::connection*> c = conn();
  if (!c.is_ok()) return c.status();
  Status read = queue::pg_guard("queue depth", [&]() -> Status {
    pqxx::nontransaction tx(**c);
    for (const auto& row :
         tx.exec("SELECT model, sum(num_total - num_completed - num_failed - num_cancelled - "
                 "num_expired) FROM batches WHERE finished_at IS NULL GROUP BY model")) {
      metrics::gauge("headroom_async_pending_requests",
                     "Requests of unfinished batches not yet ended (queued or running)",
                     "model=\"" + row[0].as<std::string>() + "\"")
          .set(row[1].as<double>());
    }
    return Status::ok();
  });
  if (read.code() == StatusCode::kUnavailable)
    pool->drop();
  else
    pool->release();
  return read;
}

Status AsyncApi::Impl::ping_redis() {
  if (!probe_redis) {
    auto r = queue::RedisClient::connect(store.redis_url, 1000);
    if (!r.is_ok()) return r.status();
    probe_redis = std::move(r).value();
  }
  auto pong = probe_redis->command({"PING"});
  if (!pong.is_ok()) pong = probe_redis->command({"PING"});  // stale (Redis restarted): reconnects
  return pong.status();
}

HttpResponse AsyncApi::Impl::readyz() {
  const Status pg = database_check.run([this] { return read_queue_depth(); });
  const Status rs = redis_check.run([this] { return ping_redis(); });
  json checks = {{"postgres", pg.is_ok() ? "ok" : pg.message()},
                 {"redis", rs.is_ok() ? "ok" : rs.message()}};
  const bool ok = pg.is_ok() && rs.is_ok();
  return json_response(ok ? 200 : 503, json{{"ready", ok}, {"checks", checks}}.dump());
}

HttpResponse AsyncApi::Impl::handle(const HttpRequest& req, BodyStream* stream) {
  std::string_view target(req.target().data(), req.target().size());
  size_t qpos = target.find('?');
  std::string path = std::string(target.substr(0, qpos));
  auto query = parse_query(qpos == std::string_view::npos ? "" : target.substr(qpos + 1));
  if (path == "/healthz") return json_response(200, R"({"status":"ok"})");
  if (path == "/readyz") return readyz();
  if (path == "/metrics" && req.method() == http::verb::get) return metrics_page();

  Result<std::string> account = authenticate(req);
  if (!account.is_ok()) {
    ErrorShape shape = is_openai_path(path) ? ErrorShape::kOpenAi : ErrorShape::kWorkersAi;
    if (account.status().code() == StatusCode::kUnavailable) {
      return db_error(account.status(), shape);
    }
    return shaped_error(account.status(), shape);
  }
  const std::string& acct = *account;

  auto is_post = req.method() == http::verb::post;
  auto is_get = req.method() == http::verb::get;
  if (auto run = run_path(path); run && is_post) {
    if (!run->second.empty() && run->second != acct) {
      return error_response(not_found("unknown account " + run->second));
    }
    return run_model(req, acct, run->first, query, stream);
  }
  if (path == "/v1/async" && is_get) return list(acct, query);
  if (path.rfind("/v1/webhooks", 0) == 0) {
    if (auto r = handle_webhooks(req, path, query, acct, webhooks)) return std::move(*r);
  }
  if (path == "/v1/chat/completions" && is_post) return chat_completions(req);
  if (path == "/v1/models" && is_get) return models_list();
  if (path.rfind("/v1/async/", 0) == 0) {
    std::string rest = path.substr(10);
    if (rest.size() > 7 && rest.ends_with("/cancel") && is_post) {
      return cancel(acct, rest.substr(0, rest.size() - 7));
    }
    if (is_get && rest.find('/') == std::string::npos) {
      return poll(acct, rest, query.count("include") && query.at("include") == "partial");
    }
  }
  return error_response(not_found("no route for " + std::string(req.method_string()) + " " + path));
}

HttpResponse AsyncApi::Impl::run_model(const HttpRequest& req, const std::string& account,
                                       const std::string& model_name,
                                       const std::map<std::string, std::string>& query,
                                       BodyStream* stream) {
  int64_t t0 = steady_now_ns();
  std::string why;
  json body = parse_client_json(req.body(), &why);
  parse_ns_ = steady_now_ns() - t0;
  if (body.is_discarded()) return error_response(invalid_argument("body " + why, "body"));
  if (!body.is_object())
    return error_response(invalid_argument("body must be a JSON object", "body"));
  if (body.contains("request_id")) {
    if (!body["request_id"].is_string()) {
      return error_response(invalid_argument("'request_id' must be a string", "request_id"));
    }
    return poll(account, body["request_id"],
                query.count("include") && query.at("include") == "partial");
  }
  const ModelSpec* model = find_model(model_name);
  if (model == nullptr) {
    return error_response(invalid_argument("unknown model '" + model_name + "'", "model"));
  }
  if (queue_requested(body, query)) return submit(req, account, *model, body);
  if (Status st = check_sync_fields(body); !st.is_ok()) return error_response(st);
  if (body.contains("stream") && body["stream"] == true && stream != nullptr) {
    Reply r = run_model_stream(req, std::move(body), *model);
    *stream = std::move(r.stream);
    return std::move(r.response);
  }
  json request = body;
  request.erase("queueRequest");
  Result<SyncAnswer> answer = run_sync(req, request, *model);
  if (!answer.is_ok()) return error_response(answer.status());
  json result = {{"response", answer->text}, {"usage", answer_usage(*answer)}};
  if (!answer->logprobs.is_null()) result["logprobs"] = answer->logprobs;
  HttpResponse res = ok_response(result);
  mark_worker(res, answer->worker);
  return res;
}

SyncCall AsyncApi::Impl::sync_call(const HttpRequest& req, const json& body,
                                   const ModelSpec& model) const {
  SyncCall call;
  call.model = model.name;
  call.reject_if_busy = body.contains("options") && flag(body["options"], "rejectIfBusy");
  call.queue_timeout_ms = config.sync_queue_timeout_ms;
  auto it = req.find("x-session-affinity");
  if (it != req.end()) call.affinity = std::string(it->value());
  call.client_gone = current_client_gone;
  return call;
}

Result<SyncInference*> AsyncApi::Impl::sync_for(const ModelSpec& model) const {
  pool->release();  // the caller waits on the inference next: it needs no database meanwhile
  SyncInference* s = sync.load();
  if (s == nullptr) {
    return Status(StatusCode::kResourceExhausted,
                  "Out of capacity: no worker is serving " + model.name + " here");
  }
  return s;
}

Result<SyncAnswer> AsyncApi::Impl::run_sync(const HttpRequest& req, const json& body,
                                            const ModelSpec& model) {
  SyncCall call = sync_call(req, body, model);
  json request = body;
  request.erase("options");
  if (request.contains("stream") && request["stream"] == true) {
    return invalid_argument("stream: true needs a streaming connection; send stream: false",
                            "stream");
  }
  request.erase("stream");
  Result<json> norm = normalize_chat_request(request, model, limits);
  if (!norm.is_ok()) return norm.status();
  HR_ASSIGN_OR_RETURN(SyncInference * s, sync_for(model));
  HR_ASSIGN_OR_RETURN(SyncAnswer answer, s->run(*norm, call));
  // A worker of an earlier release ignores logprobs: its answer must not pass for one with them.
  if (norm->value("logprobs", false) && answer.logprobs.is_null()) return no_logprobs_from_worker();
  return answer;
}

HttpResponse AsyncApi::Impl::chat_completions(const HttpRequest& req) {
  std::string why;
  json body = parse_client_json(req.body(), &why);
  if (body.is_discarded()) return openai_error(invalid_argument("body " + why, "body"));
  if (!body.is_object()) return openai_error(invalid_argument("body is not a JSON object", "body"));
  if (Status st = check_sync_fields(body); !st.is_ok()) return openai_error(st);
  if (!body.contains("model") || !body["model"].is_string()) {
    return openai_error(invalid_argument("'model' is required", "model"));
  }
  const ModelSpec* model = find_model(body["model"]);
  if (model == nullptr) {
    return openai_error(
        invalid_argument("unknown model '" + body["model"].get<std::string>() + "'", "model"));
  }
  // OpenAI fields this server does not use but clients commonly send.
  for (const char* key : {"n", "user", "stream_options"}) body.erase(key);
  Result<SyncAnswer> a = run_sync(req, body, *model);
  if (!a.is_ok()) return openai_error(a.status());
  json out = {{"id", "chatcmpl-" + new_uuid_v4().to_string()},
              {"object", "chat.completion"},
              {"created", SystemClock::instance().now_unix_ms() / 1000},
              {"model", model->name},
              {"choices", json::array({{{"index", 0},
                                        {"message", {{"role", "assistant"}, {"content", a->text}}},
                                        {"finish_reason", a->finish_reason},
                                        {"logprobs", a->logprobs}}})},
              {"usage", answer_usage(*a)}};
  HttpResponse res = json_response(200, out.dump());
  mark_worker(res, a->worker);
  return res;
}

// OpenAI chat.completion.chunk events over SSE, ending with data: [DONE].
Reply AsyncApi::Impl::chat_completions_stream(const HttpRequest& req, json body) {
  if (!body.contains("model") || !body["model"].is_string()) {
    return {openai_error(invalid_argument("'model' is required", "model")), nullptr};
  }
  const ModelSpec* model = find_model(body["model"]);
  if (model == nullptr) {
    return {openai_error(invalid_argument(
                "unknown model '" + body["model"].get<std::string>() + "'", "model")),
            nullptr};
  }
  if (Status st = check_sync_fields(body); !st.is_ok()) return {openai_error(st), nullptr};
  bool include_usage =
      body.contains("stream_options") && flag(body["stream_options"], "include_usage");
  SyncCall call = sync_call(req, body, *model);
  for (const char* key : {"n", "user", "stream_options", "stream", "options"}) {
    body.erase(key);
  }
  Result<json> norm = normalize_chat_request(body, *model, limits);
  if (!norm.is_ok()) return {openai_error(norm.status()), nullptr};
  Result<SyncInference*> s = sync_for(*model);
  if (!s.is_ok()) return {openai_error(s.status()), nullptr};
  Result<std::unique_ptr<SyncStream>> started = (*s)->start_stream(*norm, call);
  if (!started.is_ok()) return {openai_error(started.status()), nullptr};
  struct State {
    std::unique_ptr<SyncStream> stream;
    std::string id = "chatcmpl-" + new_uuid_v4().to_string();
    int64_t created = SystemClock::instance().now_unix_ms() / 1000;
    std::string model;
    bool include_usage = false;
    bool logprobs = false;  // asked for
    int phase = 0;          // 0: role, 1: deltas, 2: usage, 3: done
  };
  auto st = std::make_shared<State>();
  st->logprobs = norm->value("logprobs", false);
  st->stream = std::move(started).value();
  st->model = model->name;
  st->include_usage = include_usage;
  auto event = [st](json delta, json finish_reason, json usage, json logprobs = nullptr) {
    json chunk = {{"id", st->id},
                  {"object", "chat.completion.chunk"},
                  {"created", st->created},
                  {"model", st->model},
                  {"choices", json::array()}};
    if (!delta.is_null()) {
      chunk["choices"].push_back({{"index", 0},
                                  {"delta", delta},
                                  {"finish_reason", finish_reason},
                                  {"logprobs", std::move(logprobs)}});
    }
    if (!usage.is_null()) chunk["usage"] = usage;
    return "data: " + chunk.dump() + "\n\n";
  };
  Reply reply;
  reply.response = json_response(200, "");
  reply.response.set(http::field::content_type, "text/event-stream");
  reply.response.set(http::field::cache_control, "no-cache");
  mark_worker(reply.response, st->stream->worker());
  reply.stream = [st, event](std::string* out) -> bool {
    switch (st->phase) {
      case 0:
        st->phase = 1;
        *out = event({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
        return true;
      case 1: {
        std::string delta;
        if (st->stream->next(&delta)) {
          const json& lp = st->stream->delta_logprobs();
          if (st->logprobs && lp.is_null()) {
            *out = "data: " + openai_error_body(no_logprobs_from_worker()).dump() +
                   "\n\ndata: [DONE]\n\n";
            st->phase = 3;
            st->stream.reset();  // the generation stops
            return true;
          }
          *out = event({{"content", delta}}, nullptr, nullptr,
                       lp.is_null() ? json(nullptr) : json{{"content", lp}, {"refusal", nullptr}});
          return true;
        }
        st->phase = 2;
        if (!st->stream->status().is_ok()) {
          *out = "data: " + openai_error_body(st->stream->status()).dump() + "\n\n";
          st->phase = 3;
          *out += "data: [DONE]\n\n";
          return true;
        }
        const SyncAnswer& a = st->stream->answer();
        *out = event(json::object(), a.finish_reason, nullptr);
        return true;
      }
      case 2: {
        st->phase = 3;
        const SyncAnswer& a = st->stream->answer();
        if (st->include_usage) {
          *out = event(nullptr, nullptr, answer_usage(a));
        }
        *out += "data: [DONE]\n\n";
        return true;
      }
      default:
        return false;
    }
  };
  return reply;
}

// Server-sent events in Workers AI's shape: data: {"response": "<delta>"} per piece, then
// data: {"response": "", "usage": {...}, "finish_reason": ...}, then data: [DONE].
Reply AsyncApi::Impl::run_model_stream(const HttpRequest& req, json body, const ModelSpec& model) {
  SyncCall call = sync_call(req, body, model);
  for (const char* key : {"stream", "options", "queueRequest"}) body.erase(key);
  Result<json> norm = normalize_chat_request(body, model, limits);
  if (!norm.is_ok()) return {error_response(norm.status()), nullptr};
  Result<SyncInference*> s = sync_for(model);
  if (!s.is_ok()) return {error_response(s.status()), nullptr};
  Result<std::unique_ptr<SyncStream>> started = (*s)->start_stream(*norm, call);
  if (!started.is_ok()) return {error_response(started.status()), nullptr};
  struct State {
    std::unique_ptr<SyncStream> stream;
    bool logprobs = false;  // asked for
    bool done = false;
  };
  auto st = std::make_shared<State>();
  st->stream = std::move(started).value();
  st->logprobs = norm->value("logprobs", false);
  Reply reply;
  reply.response = json_response(200, "");
  reply.response.set(http::field::content_type, "text/event-stream");
  reply.response.set(http::field::cache_control, "no-cache");
  mark_worker(reply.response, st->stream->worker());
  reply.stream = [st](std::string* out) -> bool {
    if (st->done) return false;
    std::string delta;
    if (st->stream->next(&delta)) {
      json piece = {{"response", delta}};
      const json& lp = st->stream->delta_logprobs();
      if (st->logprobs && lp.is_null()) {
        *out = "data: " + error_body(no_logprobs_from_worker()).dump() + "\n\ndata: [DONE]\n\n";
        st->done = true;
        st->stream.reset();  // the generation stops
        return true;
      }
      if (!lp.is_null()) piece["logprobs"] = {{"content", lp}, {"refusal", nullptr}};
      *out = "data: " + piece.dump() + "\n\n";
      return true;
    }
    st->done = true;
    if (!st->stream->status().is_ok()) {
      *out = "data: " + error_body(st->stream->status()).dump() + "\n\n";
    } else {
      const SyncAnswer& a = st->stream->answer();
      *out = "data: " +
             json{{"response", ""}, {"usage", answer_usage(a)}, {"finish_reason", a.finish_reason}}
                 .dump() +
             "\n\n";
    }
    *out += "data: [DONE]\n\n";
    return true;
  };
  return reply;
}

HttpResponse AsyncApi::Impl::models_list() {
  json data = json::array();
  for (const auto& m : models) {
    data.push_back({{"id", m.name},
                    {"object", "model"},
                    {"created", 0},
                    {"owned_by", "headroom"},
                    {"context_length", m.context_length}});
  }
  return json_response(200, json{{"object", "list"}, {"data", data}}.dump());
}

HttpResponse AsyncApi::Impl::submit(const HttpRequest& req, const std::string& account,
                                    const ModelSpec& model, const json& body) {
  static const std::unordered_set<std::string> kTopLevel = {
      "requests", "queueRequest", "options",        "completion_window",
      "metadata", "webhook_url",  "webhook_events", "webhook_secret"};
  for (const auto& [key, value] : body.items()) {
    if (!kTopLevel.count(key)) {
      return error_response(invalid_argument("unknown field '" + key + "'", key));
    }
  }
  queue::NewBatch batch;
  batch.account_id = account;
  batch.model = model.name;
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
  if (body.contains("metadata")) {
    if (!body["metadata"].is_object()) {
      return error_response(invalid_argument("'metadata' must be an object", "metadata"));
    }
    batch.metadata_json = body["metadata"].dump();
  }
  pool->release();  // a webhook host's lookup may take seconds: hold no connection meanwhile
  Result<BatchWebhook> hook = parse_batch_webhook(body, webhooks.policy);
  if (!hook.is_ok()) return error_response(hook.status());
  batch.webhook_url = hook->url;
  batch.webhook_events = hook->events;
  batch.webhook_secret = hook->secret;
  auto idem = req.find("Idempotency-Key");
  if (idem != req.end()) {
    std::string key(idem->value());
    if (key.empty() || key.size() > 255) {
      return error_response(
          invalid_argument("Idempotency-Key must be 1 to 255 characters", "Idempotency-Key"));
    }
    batch.idempotency_key = key;
  }
  batch.request_hash = sha256(req.body());
  Result<pqxx::connection*> c = conn();
  if (!c.is_ok()) return db_error(c.status());
  // Each request is validated as it streams into COPY, so validation overlaps with the database
  // storing the rows before it; the first bad request rolls the whole batch back.
  const json& reqs = body["requests"];
  std::unordered_set<std::string> seen;
  std::optional<BatchError> bad_request;
  batch.num_requests = reqs.size();
  batch.produce = [&](size_t i, queue::NewRequest* out) -> Status {
    bad_request = parse_batch_request(reqs, i, model, limits, &seen, out);
    return bad_request ? bad_request->status : Status::ok();
  };
  int64_t t1 = steady_now_ns();
  Result<queue::SubmitResult> r = queue::submit_batch(**c, batch);
  int64_t store_ns = steady_now_ns() - t1;
  if (bad_request) return error_response(bad_request->status, bad_request->index);
  if (!r.is_ok()) {
    if (r.status().code() == StatusCode::kConflict) return error_response(r.status());
    return db_error(r.status());
  }
  log::info("batch.submitted", {{"batch", r->batch_id},
                                {"model", model.name},
                                {"num_requests", static_cast<int64_t>(batch.size())},
                                {"replayed", r->replayed},
                                {"parse_ms", parse_ns_ / 1000000},
                                {"validate_and_store_ms", store_ns / 1000000}});
  return ok_response({{"status", "queued"}, {"request_id", r->batch_id}, {"model", model.name}});
}

HttpResponse AsyncApi::Impl::poll(const std::string& account, const std::string& request_id,
                                  bool include_partial) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  Result<queue::BatchInfo> b = read_with_retry<queue::BatchInfo>(
      [&](pqxx::connection& c) { return queue::get_batch(c, account, request_id); });
  if (!b.is_ok()) {
    if (b.status().code() == StatusCode::kNotFound) {
      return error_response(not_found("no such request_id: " + request_id));
    }
    return db_error(b.status());
  }
  json result = summary_of(*b);
  if (b->is_terminal() || include_partial) {
    Result<std::vector<queue::RequestResult>> rs =
        read_with_retry<std::vector<queue::RequestResult>>(
            [&](pqxx::connection& c) { return queue::get_results(c, b->id, include_partial); });
    if (!rs.is_ok()) return db_error(rs.status());
    json responses = json::array();
    for (const auto& r : *rs) responses.push_back(response_of(r));
    result["responses"] = std::move(responses);
    result["usage"] = usage_of(*b);
  }
  return ok_response(std::move(result));
}

HttpResponse AsyncApi::Impl::cancel(const std::string& account, const std::string& request_id) {
  if (!parse_uuid(request_id).is_ok()) {
    return error_response(invalid_argument("request_id is not a valid id", "request_id"));
  }
  Result<pqxx::connection*> c = conn();
  if (!c.is_ok()) return db_error(c.status());
  Result<queue::CancelResult> r = queue::cancel_batch(**c, account, request_id);
  if (!r.is_ok()) {
    if (r.status().code() == StatusCode::kNotFound) {
      return error_response(not_found("no such request_id: " + request_id));
    }
    return db_error(r.status());
  }
  json result = summary_of(r->batch);
  result["cancelled_now"] = r->num_cancelled_now;
  result["already_cancelled"] = r->already_requested;
  if (r->batch.is_terminal() && !r->batch.cancel_requested) {
    result["message"] = "the batch had already finished; nothing to cancel";
  }
  return ok_response(std::move(result));
}

HttpResponse AsyncApi::Impl::list(const std::string& account,
                                  const std::map<std::string, std::string>& query) {
  queue::ListQuery q;
  if (auto it = query.find("limit"); it != query.end()) {
    try {
      q.limit = std::stoi(it->second);
    } catch (...) {
      q.limit = 0;
    }
    if (q.limit < 1 || q.limit > 100) {
      return error_response(invalid_argument("limit must be 1 to 100", "limit"));
    }
  }
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
  Result<std::vector<queue::BatchInfo>> r = read_with_retry<std::vector<queue::BatchInfo>>(
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
