// The roles of the headroom binary: the long-running api, worker, dispatcher and serve (everything
// in one process), each running until SIGINT or SIGTERM, then shutting down gracefully; and keys.
// Each returns an exit code.
#pragma once

#include <string>

#include "api/api.h"
#include "queue/config.h"
#include "queue/dispatcher.h"
#include "webhooks/deliverer.h"
#include "workers/sync_server.h"
#include "workers/worker_config.h"

namespace hr::cmd {

struct ServeConfig {
  api::ApiConfig api;
  queue::StoreConfig store;
  queue::DispatcherOptions dispatcher;
  webhooks::DeliveryOptions webhooks;  // its allow-list is the API's --webhook-allow
  workers::WorkerConfig worker;
  std::string api_key;  // HEADROOM_API_KEY: the default account's key
  std::string account = "default";
  bool migrate = true;  // apply migrations at start
};

// Routes sync requests to the live workers announced in Redis (api/worker_router.h).
int run_api(const api::ApiConfig& api, const queue::StoreConfig& store);
// Serves sync requests on its sync endpoint and announces itself in Redis while it runs; with
// `metrics_port` > 0, also serves GET /metrics there.
int run_worker(const workers::WorkerConfig& worker, const queue::StoreConfig& store,
               const workers::SyncServerOptions& sync, int metrics_port);
int run_dispatcher(const queue::StoreConfig& store, const queue::DispatcherOptions& options,
                   const webhooks::DeliveryOptions& webhooks);
int run_serve(const ServeConfig& config);

// `headroom keys create --account NAME`: prints a new key once.
int run_keys_create(const queue::StoreConfig& store, const std::string& account);
// Revokes `key`, or every key of `account` (one of them empty); prints how many.
int run_keys_revoke(const queue::StoreConfig& store, const std::string& key,
                    const std::string& account);

}  // namespace hr::cmd
