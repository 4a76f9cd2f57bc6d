// api, dispatcher, serve and keys.
#include "cmd/roles.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "api/worker_router.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/secret_box.h"
#include "cmd/worker_sync.h"
#include "http/server.h"
#include "queue/accounts.h"
#include "queue/migrate.h"
#include "queue/pg.h"
#include "queue/store.h"
#include "workers/sync_server.h"
#include "workers/worker.h"

namespace hr::cmd {
namespace {

// Says at start when webhook secrets will be stored as given (no --secret-key-file).
void warn_without_secret_key() {
  if (secrets::has_key()) return;
  log::warn("secrets.not_sealed",
            {{"note",
              "webhook signing secrets are stored in Postgres as given; pass --secret-key-file "
              "(HEADROOM_SECRET_KEY_FILE) to seal them"}});
}

// Blocks SIGINT/SIGTERM in every thread started after this, so the main thread can wait for them.
sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// A worker whose engine gave up wakes wait_for_stop_signal as a SIGTERM would, so that the
// process stops as on a signal and exits with 1.
void stop_process_on_failure(workers::Worker& worker) {
  worker.set_on_failure([] { kill(getpid(), SIGTERM); });
}

int wait_for_stop_signal(const sigset_t& set) {
  int sig = 0;
  sigwait(&set, &sig);
  log::info("process.stopping", {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  return sig;
}

// Delivers webhooks until `stop` (nothing when disabled), reconnecting after failures.
std::thread start_webhooks(const std::string& database_url,
                           const webhooks::DeliveryOptions& options,
                           const std::atomic<bool>& stop) {
  if (options.disabled) return std::thread();
  return std::thread([database_url, options, &stop] {
    while (!stop) {
      auto d = webhooks::Deliverer::create(database_url, options);
      if (d.is_ok()) {
        (*d)->run(stop);
        return;
      }
      log::warn("webhooks.start_failed", {{"error", d.status()}});
      for (int i = 0; i < 10 && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

}  // namespace

int run_keys_create(const queue::StoreConfig& store, const std::string& account) {
  auto conn = queue::pg_connect(store.database_url);
  if (!conn.is_ok()) {
    std::fprintf(stderr, "headroom: %s\n", conn.status().to_string().c_str());
    return 1;
  }
  auto key = queue::create_api_key(**conn, account);
  if (!key.is_ok()) {
    std::fprintf(stderr, "headroom: %s\n", key.status().to_string().c_str());
    return 1;
  }
  std::printf("%s\n", key->key.c_str());
  std::fprintf(stderr, "account %s (%s): store this key now, it is not shown again\n",
               account.c_str(), key->account_id.c_str());
  return 0;
}

int run_keys_revoke(const queue::StoreConfig& store, const std::string& key,
                    const std::string& account) {
  auto conn = queue::pg_connect(store.database_url);
  if (!conn.is_ok()) {
    std::fprintf(stderr, "headroom: %s\n", conn.status().to_string().c_str());
    return 1;
  }
  auto n = queue::revoke_api_keys(**conn, key, account);
  if (!n.is_ok()) {
    std::fprintf(stderr, "headroom: %s\n", n.status().to_string().c_str());
    return 1;
  }
  std::printf("revoked %d key%s%s\n", *n, *n == 1 ? "" : "s",
              *n == 0 ? " (already revoked)" : "; API processes refuse them now");
  return 0;
}

int run_api(const api::ApiConfig& given, const queue::StoreConfig& store) {
  sigset_t set = block_stop_signals();
  warn_without_secret_key();
  api::ApiConfig config = given;
  for (const std::string& e : store.service_endpoints())
    config.refused_webhook_services.push_back(e);
  api::Api async_api(config, store);
  api::RouterOptions ro;
  ro.redis_url = store.redis_url;
  ro.internal_token = config.internal_token;
  api::WorkerRouter router(ro);
  async_api.set_sync_inference(&router);
  http::HttpServer server(async_api.server_options(),
                          http::StreamingHandler([&](const http::HttpRequest& r) {
                            return async_api.handle_streaming(r);
                          }));
  Status st = server.start();
  if (!st.is_ok()) {
    log::error("api.start_failed", {{"error", st}});
    return 1;
  }
  log::info("api.listening", {{"host", config.host}, {"port", static_cast<int>(server.port())}});
  wait_for_stop_signal(set);
  server.stop();
  log::info("api.stopped");
  return 0;
}

int run_worker(const workers::WorkerConfig& config, const queue::StoreConfig& store,
               const workers::SyncServerOptions& sync, int metrics_port) {
  sigset_t set = block_stop_signals();
  std::unique_ptr<http::HttpServer> metrics_server;
  if (metrics_port > 0) {
    http::HttpServerOptions o;
    o.port = static_cast<uint16_t>(metrics_port);
    o.handler_threads = 1;
    metrics_server = std::make_unique<http::HttpServer>(
        o, http::Handler([](const http::HttpRequest& r) {
          if (r.target() != "/metrics")
            return http::json_response(404, R"({"error":"only /metrics here"})");
          http::HttpResponse res = http::json_response(200, metrics::render());
          res.set(boost::beast::http::field::content_type, "text/plain; version=0.0.4");
          return res;
        }));
    Status st = metrics_server->start();
    if (!st.is_ok()) {
      log::error("worker.metrics_failed", {{"error", st}});
      return 1;
    }
  }
  auto worker = workers::Worker::create(config, store);
  if (!worker.is_ok()) {
    log::error("worker.start_failed", {{"error", worker.status()}});
    return 1;
  }
  workers::SyncServer sync_server(**worker, sync);
  stop_process_on_failure(**worker);
  Status st = (*worker)->start();
  if (st.is_ok()) st = sync_server.start();
  if (!st.is_ok()) {
    log::error("worker.start_failed", {{"error", st}});
    return 1;
  }
  workers::Announcer announcer(**worker, store.redis_url, sync_server.url());
  announcer.start();
  log::info("worker.started", {{"model", config.model_name}, {"sync_url", sync_server.url()}});
  wait_for_stop_signal(set);
  // Out of routing and no new work first, then the sync requests in flight finish, then the
  // async leases.
  announcer.stop();
  (*worker)->begin_drain();
  sync_server.stop();
  (*worker)->stop();
  if ((*worker)->failed()) {
    log::error("worker.exiting", {{"reason", "the engine failed; a fresh process starts clean"}});
    return 1;
  }
  return 0;
}

int run_dispatcher(const queue::StoreConfig& store, const queue::DispatcherOptions& options,
                   const webhooks::DeliveryOptions& given) {
  sigset_t set = block_stop_signals();
  warn_without_secret_key();
  webhooks::DeliveryOptions webhooks = given;
  webhooks.refused_services = store.service_endpoints();
  std::atomic<bool> stop{false};
  std::thread webhook_thread = start_webhooks(store.database_url, webhooks, stop);
  std::thread loop([&] {
    for (;;) {
      auto d = queue::Dispatcher::create(store.database_url, store.redis_url, options);
      if (d.is_ok()) {
        (*d)->run(stop);
        return;
      }
      log::warn("dispatcher.connect_failed", {{"error", d.status()}});
      for (int i = 0; i < 10 && !stop; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (stop) return;
    }
  });
  log::info("dispatcher.started", {{"name", options.name}, {"webhooks", !webhooks.disabled}});
  wait_for_stop_signal(set);
  stop = true;
  loop.join();
  if (webhook_thread.joinable()) webhook_thread.join();
  return 0;
}

int run_serve(const ServeConfig& config) {
  sigset_t set = block_stop_signals();
  if (config.migrate) {
    auto report = queue::migrate(config.store.database_url, queue::bundled_migrations());
    if (!report.is_ok()) {
      log::error("serve.migrate_failed", {{"error", report.status()}});
      return 1;
    }
  }
  {
    auto conn = queue::pg_connect(config.store.database_url);
    if (!conn.is_ok()) {
      log::error("serve.db_unavailable", {{"error", conn.status()}});
      return 1;
    }
    if (config.api_key.empty()) {
      auto key = queue::create_api_key(**conn, config.account);
      if (!key.is_ok()) {
        log::error("serve.key_failed", {{"error", key.status()}});
        return 1;
      }
      std::printf("API key for account '%s' (set HEADROOM_API_KEY to choose your own): %s\n",
                  config.account.c_str(), key->key.c_str());
      std::fflush(stdout);
    } else {
      auto id = queue::ensure_api_key(**conn, config.account, config.api_key);
      if (!id.is_ok()) {
        log::error("serve.key_failed", {{"error", id.status()}});
        return 1;
      }
    }
    // One machine, one owner: the account of serve's key sees the operator's view too.
    Status op = queue::set_account_operator(**conn, config.account, true);
    if (!op.is_ok()) {
      log::error("serve.operator_failed", {{"error", op}});
      return 1;
    }
  }
  std::atomic<bool> stop{false};
  warn_without_secret_key();
  webhooks::DeliveryOptions webhooks = config.webhooks;
  webhooks.allow = config.api.webhook_allow;
  // Loopback may be allowed here, but never the product's own ports on it: the API, Postgres
  // and Redis.
  webhooks.refused_services = config.store.service_endpoints();
  webhooks.refused_services.push_back(config.api.host + ":" + std::to_string(config.api.port));
  if (webhooks::AddressPolicy::parse(webhooks.allow).value().allows_loopback()) {
    log::warn("serve.webhooks_allow_loopback",
              {{"allow", config.api.webhook_allow.empty() ? "" : config.api.webhook_allow[0]},
               {"note",
                "webhook targets on this machine are allowed (development default); "
                "set --webhook-allow '' in production"}});
  }
  std::thread webhook_thread = start_webhooks(config.store.database_url, webhooks, stop);
  auto stop_background = [&] {
    stop = true;
    if (webhook_thread.joinable()) webhook_thread.join();
  };
  std::thread dispatcher([&] {
    while (!stop) {
      auto d = queue::Dispatcher::create(config.store.database_url, config.store.redis_url,
                                         config.dispatcher);
      if (d.is_ok()) {
        (*d)->run(stop);
        return;
      }
      log::warn("dispatcher.connect_failed", {{"error", d.status()}});
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  });
  auto worker = workers::Worker::create(config.worker, config.store);
  if (!worker.is_ok()) {
    log::error("serve.worker_failed", {{"error", worker.status()}});
    stop_background();
    dispatcher.join();
    return 1;
  }
  // The API serves exactly the worker's model, with its context length.
  api::ApiConfig api_config = config.api;
  api_config.models = {config.worker.model_name + ":" +
                       std::to_string((*worker)->context_length())};
  api_config.refused_webhook_services = webhooks.refused_services;
  // (The sync side first: it outlives the API, whose operator view asks it for its workers.)
  WorkerSync sync(**worker);
  api::Api async_api(api_config, config.store);
  async_api.set_sync_inference(&sync);
  http::HttpServer server(async_api.server_options(),
                          http::StreamingHandler([&](const http::HttpRequest& r) {
                            return async_api.handle_streaming(r);
                          }));
  stop_process_on_failure(**worker);
  Status st = server.start();
  if (st.is_ok()) st = (*worker)->start();
  if (!st.is_ok()) {
    log::error("serve.start_failed", {{"error", st}});
    stop_background();
    dispatcher.join();
    return 1;
  }
  log::info("serve.listening",
            {{"url", "http://" + config.api.host + ":" + std::to_string(server.port())}});
  wait_for_stop_signal(set);
  (*worker)->begin_drain();
  server.stop();
  (*worker)->stop();
  stop_background();
  dispatcher.join();
  log::info("serve.stopped");
  if ((*worker)->failed()) {
    log::error("serve.exiting", {{"reason", "the engine failed; a fresh process starts clean"}});
    return 1;
  }
  return 0;
}

}  // namespace hr::cmd
