// The worker's internal sync endpoint and its registry heartbeat.
#include "workers/sync_server.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "base/cli.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/strings.h"
#include "http/status.h"
#include "queue/registry.h"
#include "wire/worker_protocol.h"
#include "workers/worker_metrics.h"

namespace hr::workers {

namespace beast_http = boost::beast::http;

namespace {

http::HttpResponse error_reply(const Status& st, bool retry_elsewhere = false) {
  return http::json_response(static_cast<unsigned>(http::http_status_for(st.code())),
                             wire::protocol_error(st, retry_elsewhere).dump());
}

}  // namespace

void SyncServerOptions::bind(CLI::App& app) {
  cli::add(app, "--sync-host", host, "Address of the worker's sync endpoint for the API");
  cli::add(app, "--sync-port", port, "Port of the worker's sync endpoint (0: any free port)");
  cli::add(app, "--advertise-url", advertise_url,
           "URL the API uses to reach this worker (default http://SYNC_HOST:PORT)");
  cli::add(app, "--internal-token", internal_token,
           "Shared secret the API must send with sync requests (empty: none)");
  cli::add(app, "--sync-threads", handler_threads,
           "Sync requests handled at once (-1: the engine's sequences, --max-num-seqs, and 8 more; "
           "64 at least)");
}

Status SyncServerOptions::validate() const {
  if (port < 0 || port > 65535)
    return invalid_argument("--sync-port must be 0..65535", "sync-port");
  if (handler_threads < 1 && handler_threads != -1) {
    return invalid_argument("--sync-threads must be -1 (by the engine's sequences) or at least 1",
                            "sync-threads");
  }
  if (!advertise_url.empty() && advertise_url.rfind("http://", 0) != 0) {
    return invalid_argument("--advertise-url must start with http://", "advertise-url");
  }
  if ((host == "0.0.0.0" || host == "::") && advertise_url.empty()) {
    return invalid_argument("--sync-host " + host + " needs --advertise-url", "advertise-url");
  }
  return Status::ok();
}

SyncServer::SyncServer(Worker& worker, SyncServerOptions options)
    : worker_(worker), options_(std::move(options)) {}

SyncServer::~SyncServer() { stop(); }

Status SyncServer::start() {
  http::HttpServerOptions o;
  o.host = options_.host;
  o.port = static_cast<uint16_t>(options_.port);
  o.io_threads = 1;
  // Every sequence the worker announces room for can be a blocking sync call.
  o.handler_threads = options_.handler_threads > 0
                          ? options_.handler_threads
                          : std::max(64, worker_.config().max_num_seqs + 8);
  // Answers are bounded by max_tokens; a stream may be quiet while the engine is busy.
  o.write_timeout_s = 300;
  // The server's own refusals in the shape the router reads. Those of a server shutting down or
  // full (503) never reached the worker: "out of capacity", like a stopping worker's own answer,
  // so that the router hands the call to another worker.
  o.error_body_for = [](std::string_view, const Status& st) {
    if (st.code() != StatusCode::kUnavailable) return wire::protocol_error(st).dump();
    return wire::protocol_error(
               Status(StatusCode::kResourceExhausted, "Out of capacity: " + st.message()), true)
        .dump();
  };
  server_ = std::make_unique<http::HttpServer>(
      o, http::StreamingHandler([this](const http::HttpRequest& r) { return handle(r); }));
  return server_->start();
}

std::string SyncServer::url() const {
  if (!options_.advertise_url.empty()) return options_.advertise_url;
  std::string host =
      options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
  return "http://" + host + ":" + std::to_string(server_ ? server_->port() : 0);
}

void SyncServer::stop() {
  if (server_) server_->stop();
}

http::Reply SyncServer::handle(const http::HttpRequest& req) {
  std::string_view target(req.target().data(), req.target().size());
  if (req.method() == beast_http::verb::get && target == "/healthz") {
    return {http::json_response(200, R"({"status":"ok"})"), nullptr};
  }
  if (req.method() == beast_http::verb::get && target == "/metrics") {
    http::HttpResponse res = http::json_response(200, metrics::render());
    res.set(beast_http::field::content_type, "text/plain; version=0.0.4");
    return {std::move(res), nullptr};
  }
  if (target != "/internal/sync" || req.method() != beast_http::verb::post) {
    return {error_reply(not_found("no such route on a worker")), nullptr};
  }
  if (!options_.internal_token.empty()) {
    auto it = req.find("x-headroom-internal-token");
    if (it == req.end() ||
        !constant_time_equal(std::string_view(it->value().data(), it->value().size()),
                             options_.internal_token)) {
      return {error_reply(Status(StatusCode::kUnauthenticated, "bad or missing internal token",
                                 "x-headroom-internal-token")),
              nullptr};
    }
  }
  Result<wire::ForwardedCall> call = wire::decode_forwarded_call(req.body());
  if (!call.is_ok()) return {error_reply(call.status()), nullptr};
  SyncOptions options;
  options.reject_if_busy = call->reject_if_busy;
  options.queue_timeout_ms = call->queue_timeout_ms;
  options.cache_namespace = call->cache_namespace;
  options.flex = call->flex;
  options.flex_timeout_ms = call->flex_timeout_ms;
  // The router closes its connection for a client gone.
  options.client_gone = http::current_client_gone;
  // A refusal for lack of room from a worker that is stopping, or a call its failed engine ended
  // (it gave up, or a step got stuck) before any of the answer left: any other worker will do.
  auto refusal = [&](const Status& st) {
    const bool elsewhere =
        (st.code() == StatusCode::kResourceExhausted && worker_.load().stopping) ||
        (st.code() == StatusCode::kUnavailable && worker_.failed());
    return error_reply(st, elsewhere);
  };
  if (!call->stream) {
    Result<wire::Answer> a = worker_.run(call->request, options);
    if (!a.is_ok()) return {refusal(a.status()), nullptr};
    return {http::json_response(200, wire::protocol_answer(*a).dump()), nullptr};
  }
  Result<std::unique_ptr<wire::AnswerStream>> started =
      worker_.start_stream(call->request, options);
  if (!started.is_ok()) return {refusal(started.status()), nullptr};
  std::shared_ptr<wire::AnswerStream> stream = std::move(started).value();
  auto done = std::make_shared<bool>(false);
  http::Reply reply;
  reply.response = http::json_response(200, "");
  reply.response.set(beast_http::field::content_type, "application/x-ndjson");
  reply.stream = [stream, done](std::string* out) -> bool {
    if (*done) return false;
    std::string delta;
    if (stream->next(&delta)) {
      *out =
          wire::protocol_delta_line(delta, stream->delta_logprobs(), stream->delta_tool_calls()) +
          "\n";
      return true;
    }
    *done = true;
    *out = (stream->status().is_ok()
                ? nlohmann::json{{"answer", wire::protocol_answer(stream->answer())}}
                : wire::protocol_error(stream->status()))
               .dump() +
           "\n";
    return true;
  };
  return reply;
}

Announcer::Announcer(const Worker& worker, std::string redis_url, std::string url)
    : worker_(worker), redis_url_(std::move(redis_url)), url_(std::move(url)) {}

Announcer::~Announcer() { stop(); }

void Announcer::start() {
  thread_ = std::thread([this] { loop(); });
}

void Announcer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

queue::WorkerInfo describe_worker(const Worker& worker, const std::string& url, bool draining) {
  const WorkerConfig& config = worker.config();
  WorkerLoad l = worker.load();
  queue::WorkerInfo w;
  w.id = config.worker_name;
  w.model = config.model_name;
  w.url = url;
  w.capacity = l.capacity;
  w.sync_load = l.sync_load;
  w.async_running = l.async_running;
  w.free_kv_blocks = l.free_kv_blocks;
  w.total_kv_blocks = l.total_kv_blocks;
  w.utilization = l.utilization;
  w.draining = draining || l.stopping;
  w.heartbeat_ms = SystemClock::instance().now_unix_ms();
  w.totals = worker_totals();
  return w;
}

void Announcer::loop() {
  const WorkerConfig& config = worker_.config();
  const int ttl_ms = 3 * config.heartbeat_ms;
  std::unique_ptr<queue::WorkerRegistry> registry;
  auto info = [&](bool draining) { return describe_worker(worker_, url_, draining); };
  bool announced = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    if (!registry) {
      auto r = queue::WorkerRegistry::connect(redis_url_);
      if (r.is_ok()) registry = std::move(r).value();
    }
    if (registry) {
      Status st = registry->announce(info(false), ttl_ms);
      if (!st.is_ok()) {
        log::warn("worker.announce_failed", {{"error", st}});
        registry.reset();
      } else if (!announced) {
        announced = true;
        log::info("worker.announced", {{"model", config.model_name}, {"url", url_}});
      }
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(config.heartbeat_ms), [&] { return stop_; });
  }
  lock.unlock();
  if (!registry) {
    auto r = queue::WorkerRegistry::connect(redis_url_);
    if (r.is_ok()) registry = std::move(r).value();
  }
  if (registry) {
    Status st = registry->withdraw(config.model_name, config.worker_name);
    if (!st.is_ok()) log::warn("worker.withdraw_failed", {{"error", st}});
  }
}

}  // namespace hr::workers
