// The listener that keeps key caches true to the database (key_revocations.h).
#include "api/key_revocations.h"

#include <pqxx/pqxx>

#include "base/log.h"
#include "base/retry_pacer.h"
#include "queue/pg.h"
#include "queue/store.h"

namespace hr::api {

// A connection and its receiver (pqxx delivers notices to receivers while it waits).
struct KeyRevocationListener::Listening {
  struct Receiver final : pqxx::notification_receiver {
    Receiver(pqxx::connection& c, KeyRevocationListener* owner)
        : pqxx::notification_receiver(c, queue::kKeysChannel), owner(owner) {}
    void operator()(const std::string& payload, int) override {
      if (payload == "created") {
        owner->on_created_();
      } else {
        owner->on_revoked_();  // "revoked", or anything else: forget everything
      }
    }
    KeyRevocationListener* owner;
  };
  std::unique_ptr<pqxx::connection> conn;
  std::unique_ptr<Receiver> receiver;
};

KeyRevocationListener::KeyRevocationListener(std::string database_url,
                                             std::function<void()> on_revoked,
                                             std::function<void()> on_created)
    : database_url_(std::move(database_url)),
      on_revoked_(std::move(on_revoked)),
      on_created_(std::move(on_created)) {
  std::unique_ptr<Listening> first = listen();  // before the API answers anyone
  thread_ = std::thread([this, first = std::move(first)]() mutable { loop(std::move(first)); });
}

KeyRevocationListener::~KeyRevocationListener() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<KeyRevocationListener::Listening> KeyRevocationListener::listen() {
  auto c = queue::pg_connect(database_url_);
  if (!c.is_ok()) return nullptr;
  try {
    auto l = std::make_unique<Listening>();
    l->conn = std::move(c).value();
    l->receiver = std::make_unique<Listening::Receiver>(*l->conn, this);  // LISTENs
    return l;
  } catch (const std::exception& e) {
    log::warn("api.key_listener_failed", {{"error", e.what()}});
    return nullptr;
  }
}

void KeyRevocationListener::loop(std::unique_ptr<Listening> l) {
  RetryPacer pacer;
  while (!stop_.load()) {
    if (!l) {
      l = listen();
      if (!l) {
        sleep_unless_stopped(
            stop_, pacer.failed("api.key_listener_failed", unavailable("cannot LISTEN for keys")));
        continue;
      }
      pacer.succeeded();
      on_revoked_();  // notices sent while this was not listening are lost
    }
    try {
      while (!stop_.load()) l->conn->await_notification(0, 200000);
    } catch (const std::exception& e) {
      log::warn("api.key_listener_failed", {{"error", e.what()}});
      l.reset();
    }
  }
}

}  // namespace hr::api
