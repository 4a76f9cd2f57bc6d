// The HTTP API: Workers AI's async batches (submit with queueRequest, poll by request_id, cancel,
// list), sync chat in Workers AI's and OpenAI's shapes (streamed or not), OpenAI's Batch and Files
// API (api/openai_batch.h), webhook endpoints (api/webhooks_api.h), /healthz, /readyz, /metrics.
// Authenticates every call (except health) with a Bearer key and scopes every query to the
// caller's account. Thread-safe: handle() runs on many threads at once, each borrowing a
// Postgres connection from a shared pool while it queries.
// The routes live in api.cc (the route table and auth), sync_routes.cc, async_routes.cc and
// health.cc.
#pragma once

#include <memory>

#include "api/api_config.h"
#include "api/sync_inference.h"
#include "http/server.h"
#include "queue/config.h"

namespace hr::api {

class Api {
 public:
  Api(ApiConfig config, queue::StoreConfig store);
  ~Api();

  http::HttpResponse handle(const http::HttpRequest& req);
  // handle(), plus streamed answers (server-sent events) for `stream: true`.
  http::Reply handle_streaming(const http::HttpRequest& req);
  // The config's server options, plus a check of each request's API key before its body is read
  // (a request without a valid key is answered 401 unread). The server must not outlive this.
  http::HttpServerOptions server_options() const;
  // Where sync requests run (the in-process worker in `serve`); none: sync calls answer 429. The
  // operator view's sampling thread asks it for its workers while it is set: it must outlive
  // this Api, or be unset (nullptr) before it goes; once this returns, no call to the one before
  // is under way.
  void set_sync_inference(SyncInference* sync);

  struct Impl;  // api/internal/api_impl.h

 private:
  http::Reply route_streaming(const http::HttpRequest& req);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hr::api
