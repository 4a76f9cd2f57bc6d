// A webhook receiver for tests: an HTTP server on loopback that records every request (headers,
// body, arrival time) and answers as a script says (status, Retry-After, a delay).
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "http/server.h"

namespace hr::testing {

int64_t now_ms();

struct Received {
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
  int64_t at_ms = 0;
};

class Receiver {
 public:
  struct Answer {
    Answer() = default;
    // (A constructor rather than an aggregate: GCC warns of every member left out of a brace list.)
    explicit Answer(int status_code, std::string retry_after_value = "", int sleep = 0)
        : status(status_code), retry_after(std::move(retry_after_value)), sleep_ms(sleep) {}
    int status = 200;
    std::string retry_after;
    int sleep_ms = 0;
  };

  // Answers request n (counting from 0) as script(n) says; port 0: any free port.
  explicit Receiver(std::function<Answer(int)> script, uint16_t port = 0);
  ~Receiver();

  bool ok() const { return ok_; }
  int port() const { return server_->port(); }
  std::string url(const std::string& path = "/hook") const;
  std::vector<Received> received();
  // Waits until `n` requests have arrived; false on timeout.
  bool wait_for(size_t n, int timeout_ms);

 private:
  std::function<Answer(int)> script_;
  std::unique_ptr<http::HttpServer> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Received> received_;
  bool ok_ = false;
};

}  // namespace hr::testing
