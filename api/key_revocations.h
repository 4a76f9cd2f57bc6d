// Keeps this API process's key caches true to the database while keys change elsewhere: a thread
// LISTENs on queue::kKeysChannel, which the transaction that revokes or creates a key NOTIFYs
// ("revoked" / "created"). A revocation calls `on_revoked` (forget every cached answer: the
// revoked key must stop working at once, not when its cached answer expires); a creation calls
// `on_created` (forget only the keys cached as unknown, so that a key looked up before it existed
// works now, while every cached good key stays: clearing those would make all clients look their
// keys up again at once). The first LISTEN happens in the constructor, before the API serves; after
// a lost connection, notices sent meanwhile are lost, so each reconnect counts as a revocation.
// While Postgres is down it retries with backoff (base/retry_pacer.h); cached answers then still
// expire after their 30 s.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace hr::api {

class KeyRevocationListener {
 public:
  KeyRevocationListener(std::string database_url, std::function<void()> on_revoked,
                        std::function<void()> on_created);
  ~KeyRevocationListener();  // stops and joins the thread
  KeyRevocationListener(const KeyRevocationListener&) = delete;
  KeyRevocationListener& operator=(const KeyRevocationListener&) = delete;

 private:
  struct Listening;
  // A connection LISTENing on the channel, or null when Postgres cannot be reached.
  std::unique_ptr<Listening> listen();
  void loop(std::unique_ptr<Listening> first);

  std::string database_url_;
  std::function<void()> on_revoked_;
  std::function<void()> on_created_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace hr::api
