// Makes a key revoked anywhere (`headroom keys revoke`, queue::revoke_api_keys) stop working in
// this API process at once rather than when its cached answer expires: a thread LISTENs on
// queue::kKeysChannel, which the revoking transaction NOTIFYs, and calls `on_revoked` for each
// notice, and also each time it has (re)connected, since notices sent while it was not listening
// are lost. Key creation NOTIFYs too, so that a key looked up as unknown works once it exists.
// While Postgres is down it retries with backoff (base/retry_pacer.h); cached answers then still
// expire after their 30 s.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace hr::api {

class KeyRevocationListener {
 public:
  KeyRevocationListener(std::string database_url, std::function<void()> on_revoked);
  ~KeyRevocationListener();  // stops and joins the thread
  KeyRevocationListener(const KeyRevocationListener&) = delete;
  KeyRevocationListener& operator=(const KeyRevocationListener&) = delete;

 private:
  void loop();

  std::string database_url_;
  std::function<void()> on_revoked_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace hr::api
