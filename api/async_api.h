// The Workers-AI-shaped async API: submit with queueRequest, poll by request_id, cancel, list,
// plus /healthz and /readyz, sync routes, and the OpenAI Batch API (api/openai_batch.h).
// Authenticates every call (except health) with a Bearer key and scopes every query to the caller's
// account. Thread-safe: handle() runs on many threads at once, each with its own Postgres
// connection.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/batch_request.h"
#include "api/http_server.h"
#include "api/sync_inference.h"
#include "base/net.h"
#include "base/status.h"
#include "queue/config.h"

namespace hr::api {

struct ApiConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  int io_threads = 2;
  // A sync call (streamed or not) holds one while it is generated. Threads borrow database
  // connections from a pool of db_connections only while they query, so these may be many more.
  int handler_threads = 512;
  int db_connections = 16;
  int db_wait_ms = 5000;  // a request waits this long for a free connection, then gets 429
  int64_t body_limit_bytes = 10 << 20;
  int max_batch_requests = 100000;
  // OpenAI Batch API input files (POST /v1/files may carry up to this much, plus the form).
  int64_t max_file_bytes = 200 << 20;
  int max_file_lines = 100000;
  // Served models as NAME:CONTEXT_LENGTH; a batch for one of these is accepted even while no
  // worker for it is up.
  std::vector<std::string> models = {"@hr/tiny-reverse:128"};
  // Non-public webhook targets accepted anyway (CIDRs, "loopback", "private").
  std::vector<std::string> webhook_allow;
  // How webhook hosts are looked up when a batch names one (null: the system resolver).
  HostLookup webhook_lookup;
  // A sync request waits this long for a worker with room (unless options.rejectIfBusy), then
  // gets 429 with code 3040.
  int sync_queue_timeout_ms = 2000;
  // Sent to workers with each forwarded sync request (`api` only; workers check it when set).
  std::string internal_token;

  void bind(CLI::App& app);
  [[nodiscard]] Status validate() const;
  [[nodiscard]] Result<std::vector<ModelSpec>> model_specs() const;
  HttpServerOptions server_options() const;
};

class AsyncApi {
 public:
  AsyncApi(ApiConfig config, queue::StoreConfig store);
  ~AsyncApi();

  HttpResponse handle(const HttpRequest& req);
  // handle(), plus streamed answers (server-sent events) for `stream: true`.
  Reply handle_streaming(const HttpRequest& req);
  // The config's server options, plus a check of each request's API key before its body is read
  // (a request without a valid key is answered 401 unread). The server must not outlive this.
  HttpServerOptions server_options() const;
  // Where sync requests run (the in-process worker in `serve`); none: sync calls answer 429.
  void set_sync_inference(SyncInference* sync);

 private:
  Reply route_streaming(const HttpRequest& req);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "24h", "90m", "30s", "2d" → milliseconds; errors name `field`.
[[nodiscard]] Result<int64_t> parse_duration_ms(const std::string& text, const std::string& field);

}  // namespace hr::api
