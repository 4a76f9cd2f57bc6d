// The test webhook receiver.
#include "tests/testing/webhook_receiver.h"

#include <cctype>
#include <chrono>
#include <thread>

namespace hr::testing {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Receiver::Receiver(std::function<Answer(int)> script, uint16_t port) : script_(std::move(script)) {
  http::HttpServerOptions o;
  o.port = port;
  o.handler_threads = 8;
  o.drain_timeout_s = 1;
  server_ = std::make_unique<http::HttpServer>(
      o, http::Handler([this](const http::HttpRequest& req) {
        Received r;
        for (const auto& f : req) {
          std::string name(f.name_string());
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          r.headers[name] = std::string(f.value());
        }
        r.body = req.body();
        r.at_ms = now_ms();
        int n = 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          n = static_cast<int>(received_.size());
          received_.push_back(r);
          cv_.notify_all();
        }
        Answer a = script_(n);
        if (a.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
        http::HttpResponse res = http::json_response(static_cast<unsigned>(a.status), "{}");
        if (!a.retry_after.empty()) res.set(boost::beast::http::field::retry_after, a.retry_after);
        return res;
      }));
  ok_ = server_->start().is_ok();
}

Receiver::~Receiver() { server_->stop(); }

std::string Receiver::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port()) + path;
}

std::vector<Received> Receiver::received() {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

bool Receiver::wait_for(size_t n, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return received_.size() >= n; });
}

}  // namespace hr::testing
