// The API's front: the route table, authentication, and the request metrics.
#include "api/api.h"

#include <pqxx/pqxx>

#include "api/internal/api_impl.h"
#include "api/openapi.h"
#include "api/operator_stats.h"
#include "base/clock.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/strings.h"
#include "base/url.h"
#include "queue/accounts.h"
#include "web/assets.h"
#include "wire/json_text.h"

namespace hr::api {

namespace beast_http = boost::beast::http;

// The routes of OpenAI's API answer errors in OpenAI's shape (what its SDKs parse).
bool is_openai_path(std::string_view path) {
  return path == "/v1/chat/completions" || path == "/v1/models" || OpenAiBatchApi::serves(path);
}

http::HttpResponse shaped_error(const Status& st, ErrorShape shape) {
  return shape == ErrorShape::kOpenAi ? openai_error_response(st) : error_response(st);
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

thread_local int64_t Api::Impl::parse_ns_ = 0;

Api::Api(ApiConfig config, queue::StoreConfig store) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->store = std::move(store);
  impl_->models = impl_->config.model_specs().value();
  impl_->large_answers =
      std::make_unique<ResponseSlots>(impl_->config.max_large_answers_per_account);
  impl_->key_lookups = std::make_unique<TokenBucket>(impl_->config.key_lookups_per_s,
                                                     2.0 * impl_->config.key_lookups_per_s);
  impl_->pool =
      std::make_unique<queue::PgPool>(impl_->store.database_url, impl_->config.db_connections,
                                      std::chrono::milliseconds(impl_->config.db_wait_ms));
  impl_->forecasts = std::make_unique<QueueForecasts>(impl_->pool.get(), impl_->store.redis_url);
  OperatorStatsOptions stats;
  stats.database_url = impl_->store.database_url;
  stats.redis_url = impl_->store.redis_url;
  for (const ModelSpec& m : impl_->models) stats.models.push_back(m.name);
  stats.interval_ms = impl_->config.stats_interval_ms;
  impl_->operator_stats = std::make_unique<OperatorStats>(std::move(stats));
  impl_->limits.max_requests = impl_->config.max_batch_requests;
  impl_->webhooks.policy = webhooks::AddressPolicy::parse(impl_->config.webhook_allow).value();
  impl_->webhooks.policy.set_lookup(impl_->config.webhook_lookup);
  impl_->webhooks.policy.refuse_services(impl_->config.refused_webhook_services);
  impl_->webhooks.policy.refuse_service(impl_->config.host,
                                        static_cast<uint16_t>(impl_->config.port));
  impl_->webhooks.pool = impl_->pool.get();
  OpenAiBatchContext ctx;
  ctx.authenticate = [impl = impl_.get()](const http::HttpRequest& r) {
    return impl->authenticate(r);
  };
  ctx.pool = impl_->pool.get();
  ctx.models = impl_->models;
  ctx.limits = impl_->limits;
  ctx.max_file_bytes = impl_->config.max_file_bytes;
  ctx.max_file_lines = impl_->config.max_file_lines;
  ctx.default_retain_seconds = impl_->config.retain_seconds();
  ctx.webhook_policy = impl_->webhooks.policy;
  ctx.large_answers = impl_->large_answers.get();
  ctx.forecasts = impl_->forecasts.get();
  impl_->openai = std::make_unique<OpenAiBatchApi>(std::move(ctx));
  SyncLimiterOptions limiter;
  limiter.redis_url = impl_->store.redis_url;
  limiter.lease_ms = impl_->config.sync_call_lease_ms;
  impl_->sync_limits = std::make_unique<SyncLimiter>(
      limiter, [impl = impl_.get()](const std::string& account) -> Result<queue::SyncLimits> {
        queue::PgPool::Bound quick(impl->pool.get(), kQuickDbCall);
        return impl->pool->with_connection<queue::SyncLimits>(
            [&](pqxx::connection& c) { return queue::get_sync_limits(c, account); });
      });
  impl_->revocations = std::make_unique<KeyRevocationListener>(
      impl_->store.database_url,
      [impl = impl_.get()] {
        std::lock_guard<std::mutex> lock(impl->auth_mu);
        impl->auth_cache.clear();
        impl->bad_keys.clear();
      },
      [impl = impl_.get()] {
        std::lock_guard<std::mutex> lock(impl->auth_mu);
        impl->bad_keys.clear();
      });
}

Api::~Api() = default;

void Api::set_sync_inference(SyncInference* sync) {
  impl_->sync = sync;
  std::function<std::vector<queue::WorkerInfo>()> local;  // none once the sync side is gone
  if (sync) local = [sync] { return sync->local_workers(); };
  impl_->operator_stats->set_local_workers(std::move(local));
}

http::HttpResponse Api::handle(const http::HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  if (!OpenAiBatchApi::serves(target.substr(0, target.find('?')))) {
    GiveBack done{impl_->pool.get()};
    return impl_->handle(req);
  }
  http::Reply reply = handle_streaming(req);  // a streamed file download, collected whole
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

// The routes answered without a key: the probes, the metrics, the API's contract, and the pages
// (which sign in with a key kept in the browser).
bool is_keyless_path(std::string_view path) {
  return path == "/healthz" || path == "/readyz" || path == "/metrics" || path == "/openapi.json" ||
         web::is_page_path(path);
}

// A page or one of its assets (web/assets.h), or 404.
http::HttpResponse page_response(std::string_view path) {
  std::optional<web::Asset> asset = web::find_asset(path);
  if (!asset) return error_response(not_found("no page at " + std::string(path)));
  http::HttpResponse res{beast_http::status::ok, 11};
  res.set(beast_http::field::content_type, std::string(asset->content_type));
  res.set(beast_http::field::server, "headroom");
  res.set(beast_http::field::cache_control, "no-cache");
  res.set("Content-Security-Policy", std::string(web::content_security_policy()));
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Referrer-Policy", "no-referrer");
  res.body() = std::string(asset->body);
  res.prepare_payload();
  return res;
}

// A coarse route name for request metrics (ids and models left out).
std::string route_of(std::string_view path) {
  for (const char* prefix : {"/ai/run", "/v1/async", "/v1/chat/completions", "/v1/models",
                             "/v1/files", "/v1/batches", "/v1/webhooks", "/v1/operator", "/healthz",
                             "/readyz", "/metrics", "/openapi.json", "/dashboard", "/docs"}) {
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

// The model of a run path, and the account the second form names.
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

}  // namespace

http::Reply Api::handle_streaming(const http::HttpRequest& req) {
  int64_t t0 = steady_now_ns();
  http::Reply reply;
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

http::HttpServerOptions Api::server_options() const {
  http::HttpServerOptions o = impl_->config.server_options();
  o.check_header =
      [impl = impl_.get()](const http::HttpRequest& header) -> std::optional<http::HttpResponse> {
    std::string_view target(header.target().data(), header.target().size());
    std::string_view path = target.substr(0, target.find('?'));
    if (is_keyless_path(path)) return std::nullopt;
    Result<std::string> account = [&] {
      GiveBack done{impl->pool.get()};
      return impl->authenticate(header);
    }();
    // A key known to be bad, or one that may not be looked up now, is refused here; the handler
    // answers a database outage.
    if (account.is_ok() || (account.status().code() != StatusCode::kUnauthenticated &&
                            account.status().code() != StatusCode::kResourceExhausted))
      return std::nullopt;
    http::HttpResponse res = shaped_error(
        account.status(), is_openai_path(path) ? ErrorShape::kOpenAi : ErrorShape::kWorkersAi);
    count_answer(path, res.result_int());
    return res;
  };
  return o;
}

http::Reply Api::route_streaming(const http::HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  size_t qpos = target.find('?');
  if (OpenAiBatchApi::serves(target.substr(0, qpos))) {
    return impl_->openai->handle(
        req, std::string(target.substr(0, qpos)),
        parse_query(qpos == std::string_view::npos ? "" : target.substr(qpos + 1)));
  }
  if (req.method() == beast_http::verb::post && target.substr(0, qpos) == "/v1/chat/completions") {
    json body = wire::parse_client_json(req.body());
    if (flag(body, "stream")) {
      Result<std::string> account = impl_->authenticate(req);
      if (!account.is_ok()) return {openai_error_response(account.status()), nullptr};
      return impl_->chat_completions_stream(req, *account, body);
    }
  }
  http::Reply reply;
  reply.response = impl_->handle(req, &reply.stream);
  return reply;
}

Result<std::string> Api::Impl::authenticate(const http::HttpRequest& req) {
  auto it = req.find(beast_http::field::authorization);
  if (it == req.end()) {
    return Status(StatusCode::kUnauthenticated, "missing API key: send Authorization: Bearer <key>",
                  "Authorization");
  }
  std::string_view v(it->value().data(), it->value().size());
  // The scheme is case-insensitive (RFC 9110), the key what follows its spaces.
  if (!starts_with_ignoring_case(v, "bearer ") || trim(v.substr(7)).empty()) {
    return Status(StatusCode::kUnauthenticated, "Authorization must be 'Bearer <key>'",
                  "Authorization");
  }
  std::string key(trim(v.substr(7)));
  std::string digest = to_hex(sha256(key));
  int64_t now = SystemClock::instance().now_unix_ms();
  {
    std::lock_guard<std::mutex> lock(auth_mu);
    auto c = auth_cache.find(digest);
    if (c != auth_cache.end() && c->second.expires_ms > now) return c->second.account_id;
    auto bad = bad_keys.find(digest);
    if (bad != bad_keys.end() && bad->second > now) {
      return Status(StatusCode::kUnauthenticated, "invalid API key", "Authorization");
    }
  }
  // A client's bad keys are limited on their own, first: one guesser cannot spend the lookups
  // every client shares, while a client whose keys are good is never held back by this.
  const std::string client = http::current_client_address();
  std::shared_ptr<TokenBucket> bad_from_client;
  {
    std::lock_guard<std::mutex> lock(auth_mu);
    if (client_bad_keys.size() > 100000) client_bad_keys.clear();
    std::shared_ptr<TokenBucket>& bucket = client_bad_keys[client];
    if (!bucket) {
      const double rate = config.key_lookups_per_client_per_s;
      bucket = std::make_shared<TokenBucket>(rate, 2 * rate);
    }
    bad_from_client = bucket;
  }
  const bool client_may = bad_from_client->has_token();
  if (!client_may) {
    metrics::counter("headroom_auth_client_refused_total",
                     "Unknown API keys answered 429: their client sent too many bad keys lately")
        .add();
    return Status(StatusCode::kResourceExhausted,
                  "too many invalid API keys from this address; retry shortly", "Authorization");
  }
  if (!key_lookups->take()) {
    metrics::counter("headroom_auth_lookups_refused_total",
                     "Unknown API keys answered 429: looked up faster than the database may be")
        .add();
    return Status(StatusCode::kResourceExhausted,
                  "too many requests with keys this server has not seen; retry shortly",
                  "Authorization");
  }
  metrics::counter("headroom_auth_lookups_total", "API keys looked up in the database").add();
  Result<std::string> account = [&] {
    queue::PgPool::Bound quick(pool.get(), kQuickDbCall);
    return pool->with_connection<std::string>(
        [&](pqxx::connection& c) { return queue::authenticate(c, key); });
  }();
  if (!account.is_ok()) {
    if (account.status().code() == StatusCode::kUnauthenticated) {
      bad_from_client->spend();
      std::lock_guard<std::mutex> lock(auth_mu);
      if (bad_keys.size() > 100000) bad_keys.clear();
      bad_keys[digest] = now + 10000;
      return Status(StatusCode::kUnauthenticated, "invalid API key", "Authorization");
    }
    return account.status();
  }
  std::lock_guard<std::mutex> lock(auth_mu);
  if (auth_cache.size() > 10000) auth_cache.clear();
  auth_cache[digest] = {*account, now + 30000};
  return account;
}
http::HttpResponse Api::Impl::handle(const http::HttpRequest& req, http::BodyStream* stream) {
  std::string_view target(req.target().data(), req.target().size());
  size_t qpos = target.find('?');
  std::string path = std::string(target.substr(0, qpos));
  auto query = parse_query(qpos == std::string_view::npos ? "" : target.substr(qpos + 1));
  if (path == "/healthz") return http::json_response(200, R"({"status":"ok"})");
  if (path == "/readyz") return readyz();
  if (path == "/metrics" && req.method() == beast_http::verb::get) return metrics_page();
  if (path == "/openapi.json" && req.method() == beast_http::verb::get) {
    return http::json_response(200, std::string(openapi_document()));
  }
  if (web::is_page_path(path)) {
    if (req.method() == beast_http::verb::get) return page_response(path);
    if (req.method() == beast_http::verb::head) {  // the same header, no body
      http::HttpResponse res = page_response(path);
      const std::size_t size = res.body().size();
      res.body().clear();
      res.content_length(size);
      return res;
    }
    return error_response(
        not_found("no route for " + std::string(req.method_string()) + " " + path));
  }

  Result<std::string> account = authenticate(req);
  if (!account.is_ok()) {
    ErrorShape shape = is_openai_path(path) ? ErrorShape::kOpenAi : ErrorShape::kWorkersAi;
    if (account.status().code() == StatusCode::kUnavailable) {
      return db_error(account.status(), shape);
    }
    return shaped_error(account.status(), shape);
  }
  const std::string& acct = *account;

  auto is_post = req.method() == beast_http::verb::post;
  auto is_get = req.method() == beast_http::verb::get;
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
  if (path == "/v1/chat/completions" && is_post) return chat_completions(req, acct);
  if (path == "/v1/models" && is_get) return models_list();
  if (path == "/v1/operator/stats" && is_get) return operator_view(acct);
  if (path.rfind("/v1/async/", 0) == 0) {
    std::string rest = path.substr(10);
    if (rest.size() > 7 && rest.ends_with("/cancel") && is_post) {
      return cancel(acct, rest.substr(0, rest.size() - 7));
    }
    if (rest.size() > 6 && rest.ends_with("/retry") && is_post) {
      return retry(req, acct, rest.substr(0, rest.size() - 6));
    }
    if (req.method() == beast_http::verb::delete_ && rest.find('/') == std::string::npos) {
      return remove(acct, rest);
    }
    if (is_get && rest.find('/') == std::string::npos) {
      return poll(acct, rest, query, stream);
    }
  }
  return error_response(not_found("no route for " + std::string(req.method_string()) + " " + path));
}

http::HttpResponse Api::Impl::operator_view(const std::string& account) {
  Result<bool> is_operator = [&] {
    queue::PgPool::Bound quick(pool.get(), kQuickDbCall);
    return pool->with_connection<bool>(
        [&](pqxx::connection& c) { return queue::is_operator(c, account); });
  }();
  if (!is_operator.is_ok()) return db_error(is_operator.status());
  if (!*is_operator) {
    return error_response(Status(StatusCode::kPermissionDenied,
                                 "this key's account is not an operator's (headroom accounts set "
                                 "--operator true)",
                                 "Authorization"));
  }
  return ok_response(operator_stats->view());
}

}  // namespace hr::api
