// Loopback HTTP for the flex benchmark (see flex_client.h).
#include "tests/bench/flex_client.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

#include "tests/testing/http_client.h"

namespace hr::bench {

namespace beast = boost::beast;
namespace beast_http = beast::http;
using tcp = boost::asio::ip::tcp;
using nlohmann::json;

namespace {

beast_http::request<beast_http::string_body> make_request(beast_http::verb method,
                                                          const std::string& target,
                                                          const std::string& key,
                                                          const std::string& body) {
  beast_http::request<beast_http::string_body> req{method, target, 11};
  req.set(beast_http::field::host, "127.0.0.1");
  if (!key.empty()) req.set(beast_http::field::authorization, "Bearer " + key);
  if (method == beast_http::verb::post) {
    req.set(beast_http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
  }
  return req;
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Feeds server-sent events, in whatever pieces they arrive, into a StreamResult.
class SseReader {
 public:
  SseReader(StreamResult& out, Clock::time_point start) : out_(out), start_(start) {}

  void feed(const char* data, size_t size) {
    pending_.append(data, size);
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      std::string event = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      std::istringstream lines(event);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.rfind("data: ", 0) == 0) on_data(line.substr(6));
      }
    }
  }
  bool done() const { return done_; }
  bool saw_content() const { return out_.ttft_ms >= 0; }
  bool saw_usage() const { return saw_usage_; }

 private:
  void on_data(const std::string& payload) {
    if (payload == "[DONE]") {
      done_ = true;
      out_.e2e_ms = ms_since(start_);
      return;
    }
    json chunk = json::parse(payload, nullptr, false);
    if (chunk.is_discarded() || !chunk.is_object()) {
      if (out_.error.empty()) out_.error = "unparsable event: " + payload.substr(0, 200);
      return;
    }
    if (chunk.contains("error")) {
      if (out_.error.empty()) out_.error = "error event: " + chunk["error"].dump().substr(0, 200);
      return;
    }
    if (chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()) {
      const json& delta = chunk["choices"][0].value("delta", json::object());
      if (delta.is_object() && delta.contains("content") && delta["content"].is_string() &&
          !delta["content"].get<std::string>().empty() && out_.ttft_ms < 0) {
        out_.ttft_ms = ms_since(start_);
      }
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      saw_usage_ = true;
      out_.completion_tokens = chunk["usage"].value("completion_tokens", 0);
      out_.prompt_tokens = chunk["usage"].value("prompt_tokens", 0);
    }
  }

  StreamResult& out_;
  Clock::time_point start_;
  std::string pending_;
  bool done_ = false;
  bool saw_usage_ = false;
};

}  // namespace

HttpAnswer http_call(int port, const std::string& method, const std::string& target,
                     const std::string& key, const std::string& body) {
  std::map<std::string, std::string> headers;
  if (!key.empty()) headers["Authorization"] = "Bearer " + key;
  testing::HttpResult r = testing::http_call(method, port, target, body, headers);
  return {r.status, r.body};
}

StreamResult stream_chat(int port, const std::string& key, const std::string& body,
                         Clock::time_point start) {
  StreamResult out;
  try {
    boost::asio::io_context ioc;
    tcp::socket socket(ioc);
    socket.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                 static_cast<unsigned short>(port)));
    socket.set_option(tcp::no_delay(true));
    beast_http::write(socket,
                      make_request(beast_http::verb::post, "/v1/chat/completions", key, body));
    beast::flat_buffer buffer;
    beast_http::response_parser<beast_http::buffer_body> parser;
    parser.body_limit(1ull << 30);
    beast_http::read_header(socket, buffer, parser);
    out.status = static_cast<int>(parser.get().result_int());
    SseReader sse(out, start);
    std::string error_body;
    char piece[8192];
    while (!parser.is_done()) {
      parser.get().body().data = piece;
      parser.get().body().size = sizeof piece;
      beast::error_code ec;
      beast_http::read_some(socket, buffer, parser, ec);
      if (ec == beast_http::error::need_buffer) ec = {};
      if (ec) throw beast::system_error(ec);
      size_t n = sizeof piece - parser.get().body().size;
      if (out.status == 200) {
        sse.feed(piece, n);
      } else if (error_body.size() < 400) {
        error_body.append(piece, n);
      }
    }
    beast::error_code ec;
    socket.shutdown(tcp::socket::shutdown_both, ec);
    if (out.status != 200) {
      out.error = "HTTP " + std::to_string(out.status) + ": " + error_body.substr(0, 400);
    } else if (out.error.empty() && !sse.done()) {
      out.error = "the stream ended without data: [DONE]";
    } else if (out.error.empty() && !sse.saw_content()) {
      out.error = "no content in the stream";
    } else if (out.error.empty() && !sse.saw_usage()) {
      out.error = "no usage chunk in the stream";
    }
  } catch (const std::exception& e) {
    out.error = std::string("connection: ") + e.what();
  }
  out.ok = out.error.empty();
  return out;
}

double metric_sum(const std::string& text, const std::string& name,
                  std::initializer_list<const char*> labels) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    size_t rest = name.size();
    std::string label_text;
    if (rest < line.size() && line[rest] == '{') {
      size_t close = line.find('}', rest);
      if (close == std::string::npos) continue;
      label_text = line.substr(rest + 1, close - rest - 1);
      rest = close + 1;
    }
    if (rest >= line.size() || line[rest] != ' ') continue;  // a longer name sharing the prefix
    bool match = true;
    for (const char* l : labels) match = match && label_text.find(l) != std::string::npos;
    if (match) sum += std::strtod(line.c_str() + rest + 1, nullptr);
  }
  return sum;
}

void Sampler::start() {
  thread_ = std::thread([this] {
    auto next = Clock::now();
    while (!stop_) {
      Sample s;
      if (fetch(&s)) {
        std::lock_guard<std::mutex> lock(mu_);
        samples_.push_back(s);
      }
      // Keep the cadence; after a slow answer, wait a whole period rather than sampling again
      // at once (a very short interval turns one engine step's tokens into a spike).
      next = std::max(next + std::chrono::milliseconds(500),
                      Clock::now() + std::chrono::milliseconds(250));
      std::this_thread::sleep_until(next);
    }
  });
}

void Sampler::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Sample Sampler::latest() {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_.empty() ? Sample{} : samples_.back();
}

std::vector<Sample> Sampler::all() {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

bool Sampler::fetch(Sample* s) {
  HttpAnswer a = http_call(port_, "GET", "/metrics", "");
  s->t = std::chrono::duration<double>(Clock::now() - t0_).count();
  if (a.status != 200) {
    ++failures_;
    return false;
  }
  const std::string& m = a.body;
  const char* kAsync = "class=\"async\"";
  const char* kSync = "class=\"sync\"";
  auto generated = [&](const char* cls) {
    return metric_sum(m, "headroom_time_to_first_token_seconds_count", {cls}) +
           metric_sum(m, "headroom_inter_token_latency_seconds_count", {cls});
  };
  s->async_tokens = generated(kAsync);
  s->sync_tokens = generated(kSync);
  s->async_finished_tokens = metric_sum(m, "headroom_generation_tokens_total", {kAsync});
  s->sync_finished_tokens = metric_sum(m, "headroom_generation_tokens_total", {kSync});
  s->async_finished = metric_sum(m, "headroom_requests_finished_total", {kAsync});
  s->running_async = metric_sum(m, "headroom_requests_running", {kAsync});
  s->waiting_async = metric_sum(m, "headroom_requests_waiting", {kAsync});
  s->running_sync = metric_sum(m, "headroom_requests_running", {kSync});
  s->steps = metric_sum(m, "headroom_engine_steps_total");
  s->preemptions = metric_sum(m, "headroom_preemptions_total");
  s->utilization = metric_sum(m, "headroom_device_utilization_ratio");
  s->sync_queue_sum = metric_sum(m, "headroom_queue_time_seconds_sum", {kSync});
  s->sync_queue_count = metric_sum(m, "headroom_queue_time_seconds_count", {kSync});
  s->sync_ttft_sum = metric_sum(m, "headroom_time_to_first_token_seconds_sum", {kSync});
  s->sync_ttft_count = metric_sum(m, "headroom_time_to_first_token_seconds_count", {kSync});
  return true;
}

}  // namespace hr::bench
