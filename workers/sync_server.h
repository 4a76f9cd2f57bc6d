// A standalone worker's face to the API: an HTTP endpoint that runs the sync requests the API's
// router forwards (api/worker_router.h), and an announcer that keeps the worker's entry and load in
// the Redis registry (queue/registry.h) fresh.
//
// Protocol (internal; requests carry x-headroom-internal-token when one is configured):
//   POST /internal/sync  {"request": <normalized chat request>, "stream": bool,
//                         "reject_if_busy": bool, "queue_timeout_ms": int}
//     stream false → 200 {"text", "finish_reason", "prompt_tokens", "completion_tokens",
//                         "cached_tokens", "logprobs" (when asked for)}
//     stream true  → 200, chunked application/x-ndjson: {"delta": "...", "logprobs": [...] (the
//                    delta's tokens' entries, when asked for)} lines, then one
//                    {"answer": {...}} or {"error": {...}} line
//     failure      → the Status's HTTP code with {"error": {"code", "message", "field",
//                    "retry_elsewhere"}}; retry_elsewhere (true) when this worker takes no
//                    calls now (stopping, or its server refusing) but another may, whatever
//                    reject_if_busy says
//   GET /metrics (Prometheus text), GET /healthz
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"
#include "http/server.h"
#include "queue/registry.h"
#include "workers/worker.h"

namespace hr::workers {

struct SyncServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  // Where the API reaches this worker; default http://HOST:PORT (HOST must then be routable).
  std::string advertise_url;
  std::string internal_token;  // required from callers when set
  // Sync requests handled at once (each blocks while it generates); -1: as many as the worker
  // runs sequences (its announced capacity), and 8 more, 64 at least.
  int handler_threads = -1;

  void bind(CLI::App& app);
  [[nodiscard]] Status validate() const;
};

class SyncServer {
 public:
  SyncServer(Worker& worker, SyncServerOptions options);
  ~SyncServer();
  [[nodiscard]] Status start();
  // The URL the API should use (valid after start()).
  std::string url() const;
  // Waits for in-flight requests to finish (up to the HTTP server's drain timeout).
  void stop();

 private:
  http::Reply handle(const http::HttpRequest& req);
  Worker& worker_;
  SyncServerOptions options_;
  std::unique_ptr<http::HttpServer> server_;
};

// The worker as it announces itself: its load now and its totals (url: its sync endpoint's base
// URL; empty for a worker in the API's own process).
queue::WorkerInfo describe_worker(const Worker& worker, const std::string& url, bool draining);

// Announces the worker every heartbeat_ms (entry TTL: three heartbeats) until stop(), which
// withdraws it. Reconnects to Redis after failures; a worker whose Redis is down simply drops
// out of routing until it is back.
class Announcer {
 public:
  Announcer(const Worker& worker, std::string redis_url, std::string url);
  ~Announcer();
  void start();
  // Withdraws the worker, so the API stops picking it.
  void stop();

 private:
  void loop();
  const Worker& worker_;
  std::string redis_url_;
  std::string url_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace hr::workers
