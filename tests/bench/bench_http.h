// Shared by the queue-side benchmark drivers: a keep-alive HTTP connection to the API, a batch
// body of reversal requests, and percentiles.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hr::bench {

namespace beast = boost::beast;
namespace beast_http = beast::http;
using tcp = boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A keep-alive HTTP connection.
class Conn {
 public:
  explicit Conn(int port) : stream_(ioc_) {
    stream_.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                  static_cast<unsigned short>(port)));
  }
  std::pair<int, std::string> call(beast_http::verb verb, const std::string& target,
                                   const std::string& key, const std::string& body = "") {
    beast_http::request<beast_http::string_body> req{verb, target, 11};
    req.set(beast_http::field::host, "127.0.0.1");
    req.set(beast_http::field::authorization, "Bearer " + key);
    req.keep_alive(true);
    if (verb == beast_http::verb::post) {
      req.set(beast_http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    beast_http::write(stream_, req);
    beast_http::response_parser<beast_http::string_body> parser;
    parser.body_limit(1ull << 30);
    beast_http::read(stream_, buffer_, parser);
    auto res = parser.release();
    return {static_cast<int>(res.result_int()), res.body()};
  }

 private:
  boost::asio::io_context ioc_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
};

// The driver's command line, --name value pairs.
inline std::map<std::string, std::string> flags(int argc, char** argv) {
  std::map<std::string, std::string> out;
  for (int i = 1; i + 1 < argc; i += 2) out[argv[i]] = argv[i + 1];
  return out;
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline std::string batch_body(int n) {
  json reqs = json::array();
  for (int i = 0; i < n; ++i) {
    reqs.push_back(
        {{"messages", {{{"role", "user"}, {"content", "reverse: item " + std::to_string(i)}}}},
         {"max_tokens", 40}});
  }
  return json{{"requests", reqs}}.dump();
}

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace hr::bench
