// The listener that clears cached keys on revocation (key_revocations.h).
#include "api/key_revocations.h"

#include <pqxx/pqxx>

#include "base/retry_pacer.h"
#include "queue/store.h"

namespace hr::api {

KeyRevocationListener::KeyRevocationListener(std::string database_url,
                                             std::function<void()> on_revoked)
    : database_url_(std::move(database_url)), on_revoked_(std::move(on_revoked)) {
  thread_ = std::thread([this] { loop(); });
}

KeyRevocationListener::~KeyRevocationListener() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void KeyRevocationListener::loop() {
  RetryPacer pacer;
  while (!stop_.load()) {
    try {
      pqxx::connection conn(database_url_);
      pqxx::nontransaction(conn).exec(std::string("LISTEN ") + queue::kKeysChannel);
      pacer.succeeded();
      on_revoked_();  // anything revoked while this was not listening
      while (!stop_.load()) {
        if (conn.await_notification(0, 200000) > 0) on_revoked_();
      }
    } catch (const std::exception& e) {
      sleep_unless_stopped(stop_, pacer.failed("api.key_listener_failed", unavailable(e.what())));
    }
  }
}

}  // namespace hr::api
