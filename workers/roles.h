// The long-running roles of the headroom binary: api, dispatcher and serve (everything in one
// process). Each runs until SIGINT or SIGTERM, then shuts down gracefully, and returns an exit
// code.
#pragma once

#include <string>

#include "api/async_api.h"
#include "api/webhook_dispatcher.h"
#include "queue/config.h"
#include "queue/dispatcher.h"
#include "workers/sync_server.h"
#include "workers/worker_config.h"

namespace hr::workers {

struct ServeConfig {
  api::ApiConfig api;
  queue::StoreConfig store;
  queue::DispatcherOptions dispatcher;
  api::WebhookOptions webhooks;  // its allow-list is the API's --webhook-allow
  WorkerConfig worker;
  std::string api_key;  // HEADROOM_API_KEY: the default account's key
  std::string account = "default";
  bool migrate = true;  // apply migrations at start
};

// Routes sync requests to the live workers announced in Redis (api/worker_router.h).
int run_api(const api::ApiConfig& api, const queue::StoreConfig& store);
// Serves sync requests on its sync endpoint and announces itself in Redis while it runs; with
// `metrics_port` > 0, also serves GET /metrics there.
int run_worker(const WorkerConfig& worker, const queue::StoreConfig& store,
               const SyncServerOptions& sync, int metrics_port);
int run_dispatcher(const queue::StoreConfig& store, const queue::DispatcherOptions& options,
                   const api::WebhookOptions& webhooks);
int run_serve(const ServeConfig& config);

// `headroom keys create --account NAME`: prints a new key once.
int run_keys_create(const queue::StoreConfig& store, const std::string& account);

}  // namespace hr::workers
