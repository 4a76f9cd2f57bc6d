// The in-process API harness.
#include "tests/testing/api_harness.h"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include "base/ids.h"
#include "queue/migrate.h"
#include "queue/store.h"

namespace hr::testing {

ApiHarness::ApiHarness() {
  db_ = std::make_unique<TestDatabase>();
  database_url_ = db_->url();
  redis_url_ = hr::testing::redis_url();
  if (!db_->ok() || redis_url_.empty()) return;
  init();
}

ApiHarness::ApiHarness(int max_batch_requests, int64_t body_limit_bytes) {
  if (max_batch_requests > 0) config_.max_batch_requests = max_batch_requests;
  if (body_limit_bytes > 0) config_.body_limit_bytes = body_limit_bytes;
  db_ = std::make_unique<TestDatabase>();
  database_url_ = db_->url();
  redis_url_ = hr::testing::redis_url();
  if (!db_->ok() || redis_url_.empty()) return;
  init();
}

ApiHarness::ApiHarness(const std::function<void(api::ApiConfig&)>& configure,
                       const std::function<void(http::HttpServerOptions&)>& configure_server)
    : configure_(configure), configure_server_(configure_server) {
  db_ = std::make_unique<TestDatabase>();
  database_url_ = db_->url();
  redis_url_ = hr::testing::redis_url();
  if (!db_->ok() || redis_url_.empty()) return;
  init();
}

ApiHarness::ApiHarness(const std::string& database_url, const std::string& redis_url)
    : database_url_(database_url), redis_url_(redis_url) {
  init();
}

void ApiHarness::init() {
  auto m = queue::migrate(database_url_, queue::bundled_migrations());
  if (!m.is_ok()) {
    ADD_FAILURE() << m.status().to_string();
    return;
  }
  pqxx::connection c(database_url_);
  auto a = queue::create_api_key(c, "alice");
  auto b = queue::create_api_key(c, "bob");
  if (!a.is_ok() || !b.is_ok()) {
    ADD_FAILURE() << "cannot create keys";
    return;
  }
  key_a_ = a->key;
  key_b_ = b->key;
  model_ = "@test/m-" + random_hex(4);
  config_.port = 0;
  config_.handler_threads = 4;
  config_.models = {model_ + ":128"};
  if (configure_) configure_(config_);
  queue::StoreConfig store;
  store.database_url = database_url_;
  store.redis_url = redis_url_;
  api_ = std::make_unique<api::Api>(config_, store);
  http::HttpServerOptions server_options = api_->server_options();
  if (configure_server_) configure_server_(server_options);
  server_ = std::make_unique<http::HttpServer>(
      server_options, http::StreamingHandler([this](const http::HttpRequest& r) {
        return api_->handle_streaming(r);
      }));
  Status st = server_->start();
  if (!st.is_ok()) {
    ADD_FAILURE() << st.to_string();
    return;
  }
  ok_ = true;
}

ApiHarness::~ApiHarness() {
  if (server_) server_->stop();
  server_.reset();
  api_.reset();
}

HttpResult ApiHarness::call(const std::string& method, const std::string& target,
                            const std::string& body, const std::string& key,
                            std::map<std::string, std::string> headers) {
  if (!key.empty()) headers["Authorization"] = "Bearer " + key;
  return http_call(method, port(), target, body, headers);
}

HttpResult ApiHarness::post(const std::string& target, const std::string& body,
                            const std::string& key, std::map<std::string, std::string> headers) {
  return call("POST", target, body, key, std::move(headers));
}

HttpResult ApiHarness::get(const std::string& target, const std::string& key) {
  return call("GET", target, "", key, {});
}

HttpResult ApiHarness::del(const std::string& target, const std::string& key) {
  return call("DELETE", target, "", key, {});
}

std::string ApiHarness::submit(const nlohmann::json& requests, const std::string& key) {
  HttpResult r = post("/ai/run/" + model_ + "?queueRequest=true",
                      nlohmann::json{{"requests", requests}}.dump(), key);
  if (r.status != 200) {
    ADD_FAILURE() << "submit failed: " << r.status << " " << r.body;
    return "";
  }
  return r.json()["result"]["request_id"];
}

int64_t ApiHarness::scalar(const std::string& sql) {
  pqxx::connection c(database_url_);
  pqxx::nontransaction tx(c);
  return tx.exec1(sql)[0].as<int64_t>();
}

}  // namespace hr::testing
