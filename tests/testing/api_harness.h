// An in-process API server on a free port over a migrated database, with two accounts ("alice"
// and "bob") and a model name unique to the test, so tests can share one Redis.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "api/api.h"
#include "http/server.h"
#include "tests/testing/http_client.h"
#include "tests/testing/test_db.h"

namespace hr::testing {

class ApiHarness {
 public:
  // Uses a fresh TestDatabase on the shared test server and the shared test Redis.
  ApiHarness();
  // The same with limits for the API (0 keeps the default).
  ApiHarness(int max_batch_requests, int64_t body_limit_bytes);
  // The same with the API configuration adjusted by `configure` before the API starts, and the
  // HTTP server's options by `configure_server` (e.g. no key check before bodies, so that a test
  // sees what a handler does with a key it has not seen).
  explicit ApiHarness(
      const std::function<void(api::ApiConfig&)>& configure,
      const std::function<void(http::HttpServerOptions&)>& configure_server = nullptr);
  // Uses the given service locations (e.g. a PrivateStack's).
  ApiHarness(const std::string& database_url, const std::string& redis_url);
  ~ApiHarness();

  bool ok() const { return ok_; }
  int port() const { return server_ ? server_->port() : 0; }
  const std::string& model() const { return model_; }
  const std::string& database_url() const { return database_url_; }
  const std::string& redis_url() const { return redis_url_; }
  const std::string& key_a() const { return key_a_; }
  const std::string& key_b() const { return key_b_; }
  api::ApiConfig& config() { return config_; }
  api::Api& api() { return *api_; }

  HttpResult post(const std::string& target, const std::string& body, const std::string& key,
                  std::map<std::string, std::string> headers = {});
  HttpResult get(const std::string& target, const std::string& key);
  HttpResult del(const std::string& target, const std::string& key);
  HttpResult call(const std::string& method, const std::string& target, const std::string& body,
                  const std::string& key, std::map<std::string, std::string> headers);
  // Submits {"requests": [...]} for the harness model; returns the request_id or "".
  std::string submit(const nlohmann::json& requests, const std::string& key);
  // Runs a single-value SQL query on the harness database.
  int64_t scalar(const std::string& sql);

 private:
  void init();
  std::function<void(api::ApiConfig&)> configure_;
  std::function<void(http::HttpServerOptions&)> configure_server_;
  std::unique_ptr<TestDatabase> db_;
  std::string database_url_;
  std::string redis_url_;
  std::string model_;
  std::string key_a_;
  std::string key_b_;
  api::ApiConfig config_;
  std::unique_ptr<api::Api> api_;
  std::unique_ptr<http::HttpServer> server_;
  bool ok_ = false;
};

// The API's sync side for a scope: set when made, unset when the scope ends (also when an ASSERT
// returns early), so that a sync side declared before it outlives the API's use of it.
class ScopedSyncSide {
 public:
  ScopedSyncSide(api::Api& api, api::SyncInference* sync) : api_(api) {
    api_.set_sync_inference(sync);
  }
  ~ScopedSyncSide() { api_.set_sync_inference(nullptr); }
  ScopedSyncSide(const ScopedSyncSide&) = delete;
  ScopedSyncSide& operator=(const ScopedSyncSide&) = delete;

 private:
  api::Api& api_;
};

}  // namespace hr::testing
