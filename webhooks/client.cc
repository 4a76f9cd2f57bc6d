// Webhook POSTs on Beast, one attempt at a time on the caller's thread.
#include "webhooks/client.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <chrono>
#include <cstring>
#include <ctime>

#include "base/url.h"

namespace hr::webhooks {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace beast_http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

std::vector<tcp::endpoint> endpoints_of(const std::vector<IpAddress>& addrs, uint16_t port) {
  std::vector<tcp::endpoint> out;
  for (const IpAddress& a : addrs) {
    if (a.v6) {
      asio::ip::address_v6::bytes_type b;
      std::memcpy(b.data(), a.bytes.data(), 16);
      out.emplace_back(asio::ip::address_v6(b), port);
    } else {
      asio::ip::address_v4::bytes_type b;
      std::memcpy(b.data(), a.bytes.data(), 4);
      out.emplace_back(asio::ip::address_v4(b), port);
    }
  }
  return out;
}

std::string describe(const beast::error_code& ec, int timeout_ms) {
  if (ec == beast::error::timeout) return "timed out after " + std::to_string(timeout_ms) + " ms";
  return ec.message();
}

// The tenant's view of a failure before any HTTP answer (PostResult::error), and the cause.
void failed(PostResult& res, const char* step, const beast::error_code& ec, int timeout_ms) {
  res.detail = std::string(step) + ": " + describe(ec, timeout_ms);
  if (ec == beast::error::timeout) {
    res.error = "no HTTP answer within " + std::to_string(timeout_ms) + " ms";
  } else if (std::string_view(step) == "TLS handshake") {
    res.error = "TLS handshake failed";
  } else {
    res.error = "no HTTP answer: the connection failed or was closed";
  }
}

}  // namespace

std::optional<int64_t> parse_retry_after(const std::string& value, int64_t now_ms) {
  if (value.empty()) return std::nullopt;
  if (value.find_first_not_of("0123456789") == std::string::npos) {
    if (value.size() > 9) return std::nullopt;
    return std::stoll(value) * 1000;
  }
  std::tm tm{};
  const char* end = strptime(value.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  int64_t at_ms = static_cast<int64_t>(timegm(&tm)) * 1000;
  return std::max<int64_t>(0, at_ms - now_ms);
}

Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (options_.user_agent.empty()) options_.user_agent = "Headroom-Webhooks/" HEADROOM_VERSION;
  tls_ = std::make_unique<ssl::context>(ssl::context::tls_client);
  beast::error_code ec;
  tls_->set_default_verify_paths(ec);
  if (!ec && !options_.ca_file.empty()) tls_->load_verify_file(options_.ca_file, ec);
  if (ec)
    tls_status_ = invalid_argument("cannot load trusted CAs: " + ec.message(), "webhook-ca-file");
}

Client::~Client() = default;

PostResult Client::post(const std::string& url, const std::map<std::string, std::string>& headers,
                        const std::string& body) {
  auto t0 = std::chrono::steady_clock::now();
  PostResult res;
  auto done = [&]() {
    res.duration_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    return res;
  };
  Result<Url> u = parse_url(url);
  if (!u.is_ok() || (u->scheme != "http" && u->scheme != "https") || u->host.empty()) {
    res.refused = true;
    res.error = "not an http(s) URL";
    return done();
  }
  bool https = u->scheme == "https";
  if (https && !tls_status_.is_ok()) {
    res.error = tls_status_.message();
    return done();
  }
  uint16_t port = u->port != 0 ? u->port : (https ? 443 : 80);
  Result<std::vector<IpAddress>> addrs =
      resolve_checked(u->host, options_.policy, "url", std::chrono::seconds(5), port);
  if (!addrs.is_ok()) {
    res.refused = addrs.status().code() == StatusCode::kInvalidArgument;
    res.error = addrs.status().message();
    return done();
  }
  std::vector<tcp::endpoint> eps = endpoints_of(*addrs, port);

  std::string target = u->path.empty() ? "/" : u->path;
  if (!u->query.empty()) target += "?" + u->query;
  beast_http::request<beast_http::string_body> req{beast_http::verb::post, target, 11};
  std::string host = u->host.find(':') != std::string::npos ? "[" + u->host + "]" : u->host;
  if (u->port != 0) host += ":" + std::to_string(u->port);
  req.set(beast_http::field::host, host);
  req.set(beast_http::field::user_agent, options_.user_agent);
  req.set(beast_http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.keep_alive(false);
  req.body() = body;
  req.prepare_payload();

  auto deadline = std::chrono::milliseconds(options_.timeout_ms);
  beast::error_code ec;
  auto run = [&]() {
    ioc_.restart();
    ioc_.run();
  };
  // Connect (the deadline covers every later step too), optionally TLS, send, read the header.
  auto exchange = [&](auto& stream, auto& lowest) -> bool {
    lowest.expires_after(deadline);
    lowest.async_connect(eps, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    run();
    if (ec) {
      failed(res, "connect", ec, options_.timeout_ms);
      return false;
    }
    if constexpr (!std::is_same_v<std::decay_t<decltype(stream)>, beast::tcp_stream>) {
      stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
      run();
      if (ec) {
        failed(res, "TLS handshake", ec, options_.timeout_ms);
        return false;
      }
    }
    beast_http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
    run();
    if (ec) {
      failed(res, "send", ec, options_.timeout_ms);
      return false;
    }
    beast::flat_buffer buffer;
    beast_http::response_parser<beast_http::empty_body> parser;
    parser.skip(true);
    beast_http::async_read_header(stream, buffer, parser,
                                  [&](beast::error_code e, size_t) { ec = e; });
    run();
    if (ec) {
      failed(res, "answer", ec, options_.timeout_ms);
      return false;
    }
    const auto& msg = parser.get();
    res.status = static_cast<int>(msg.result_int());
    auto ra = msg.find(beast_http::field::retry_after);
    if (ra != msg.end()) {
      int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
      res.retry_after_ms = parse_retry_after(std::string(ra->value()), now_ms);
    }
    return true;
  };
  if (https) {
    beast::ssl_stream<beast::tcp_stream> stream(ioc_, *tls_);
    bool is_ip = parse_ip(u->host).is_ok();
    if (!is_ip && !SSL_set_tlsext_host_name(stream.native_handle(), u->host.c_str())) {
      res.error = "cannot set TLS server name";
      return done();
    }
    stream.set_verify_mode(ssl::verify_peer);
    stream.set_verify_callback(ssl::host_name_verification(u->host));
    exchange(stream, beast::get_lowest_layer(stream));
  } else {
    beast::tcp_stream stream(ioc_);
    exchange(stream, stream);
  }
  return done();
}

}  // namespace hr::webhooks
