// HTTP calls to the API with Beast.
#include "cmd/api_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <limits>

#include "base/url.h"

namespace hr::cmd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;

Result<ApiClient> ApiClient::create(const std::string& base_url, std::string api_key,
                                    int timeout_ms) {
  if (base_url.rfind("https://", 0) == 0) {
    return invalid_argument(
        "HEADROOM_URL " + base_url +
            ": https is not spoken by this client; reach the API over http (TLS belongs to the "
            "proxy in front of it)",
        "HEADROOM_URL");
  }
  Result<Url> url = parse_url(base_url);
  if (!url.is_ok() || url->scheme != "http" || url->host.empty() || !url->query.empty()) {
    return invalid_argument(
        "HEADROOM_URL must be an http://host[:port][/prefix] URL, not '" + base_url + "'",
        "HEADROOM_URL");
  }
  ApiClient c;
  c.host_ = url->host;
  c.port_ = std::to_string(url->port != 0 ? url->port : 80);
  c.prefix_ = url->path;
  while (!c.prefix_.empty() && c.prefix_.back() == '/') c.prefix_.pop_back();
  c.base_url_ = base_url;
  c.api_key_ = std::move(api_key);
  c.timeout_ms_ = timeout_ms;
  return c;
}

Result<ApiReply> ApiClient::call(const std::string& method, const std::string& target,
                                 const std::string& body, const std::string& content_type) const {
  try {
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::milliseconds(timeout_ms_));
    asio::ip::tcp::resolver resolver(ioc);
    stream.connect(resolver.resolve(host_, port_));
    bhttp::request<bhttp::string_body> req(bhttp::string_to_verb(method), prefix_ + target, 11);
    req.set(bhttp::field::host, host_ + ":" + port_);
    req.set(bhttp::field::user_agent, "headroom-batch");
    if (!api_key_.empty()) req.set(bhttp::field::authorization, "Bearer " + api_key_);
    if (!body.empty() || method == "POST") {
      req.set(bhttp::field::content_type, content_type);
      req.body() = body;
      req.prepare_payload();
    }
    bhttp::write(stream, req);
    beast::flat_buffer buffer;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    bhttp::read(stream, buffer, parser);
    ApiReply out;
    out.status = static_cast<int>(parser.get().result_int());
    out.body = std::move(parser.get().body());
    for (const auto& f : parser.get()) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      out.headers[name] = std::string(f.value());
    }
    beast::error_code ec;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    return out;
  } catch (const std::exception& e) {
    return unavailable("cannot reach the API at " + base_url_ + ": " + e.what());
  }
}

std::string api_error_message(const ApiReply& reply) {
  nlohmann::json j = nlohmann::json::parse(reply.body, nullptr, false);
  std::string message;
  if (j.is_object()) {
    if (j.contains("errors") && j["errors"].is_array() && !j["errors"].empty()) {
      const auto& e = j["errors"][0];
      message = e.value("message", "");
      if (e.contains("field")) message += " (" + e["field"].get<std::string>() + ")";
    } else if (j.contains("error") && j["error"].is_object()) {
      message = j["error"].value("message", "");
      if (j["error"].contains("param") && j["error"]["param"].is_string()) {
        message += " (" + j["error"]["param"].get<std::string>() + ")";
      }
    }
  }
  if (message.empty()) message = "HTTP " + std::to_string(reply.status);
  return message;
}

}  // namespace hr::cmd
