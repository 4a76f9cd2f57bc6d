// Test HTTP client on Beast.
#include "tests/testing/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <poll.h>

namespace hr::testing {

namespace beast = boost::beast;
namespace beast_http = beast::http;
using tcp = boost::asio::ip::tcp;

HttpResult http_call(const std::string& method, int port, const std::string& target,
                     const std::string& body, const std::map<std::string, std::string>& headers) {
  HttpResult out;
  try {
    boost::asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    stream.connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                 static_cast<unsigned short>(port)));
    beast_http::request<beast_http::string_body> req{beast_http::string_to_verb(method), target,
                                                     11};
    req.set(beast_http::field::host, "127.0.0.1");
    for (const auto& [k, v] : headers) req.set(k, v);
    if (!body.empty() || method == "POST") {
      if (req.find(beast_http::field::content_type) == req.end()) {
        req.set(beast_http::field::content_type, "application/json");
      }
      req.body() = body;
      req.prepare_payload();
    }
    beast_http::write(stream, req);
    beast::flat_buffer buffer;
    beast_http::response_parser<beast_http::string_body> parser;
    parser.body_limit(1ull << 30);
    parser.skip(method == "HEAD");  // its Content-Length is GET's; no body follows
    beast_http::read(stream, buffer, parser);
    auto res = parser.release();
    out.status = static_cast<int>(res.result_int());
    out.body = res.body();
    for (const auto& f : res) out.headers[std::string(f.name_string())] = std::string(f.value());
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  } catch (const std::exception& e) {
    out.status = 0;
    out.body = e.what();
  }
  return out;
}

struct RawConnection::Impl {
  boost::asio::io_context ioc;
  tcp::socket socket{ioc};
  int timeout_ms = 0;
};

RawConnection::RawConnection(int port, int timeout_ms) : impl_(std::make_unique<Impl>()) {
  impl_->socket.connect(
      tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  impl_->timeout_ms = timeout_ms;
}

RawConnection::~RawConnection() = default;

void RawConnection::send(const std::string& bytes) {
  boost::asio::write(impl_->socket, boost::asio::buffer(bytes));
}

std::string RawConnection::receive(const std::string& until) {
  std::string got;
  char buf[4096];
  for (;;) {
    if (impl_->timeout_ms > 0) {
      pollfd p{impl_->socket.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, impl_->timeout_ms) <= 0) return got;  // nothing in time
    }
    boost::system::error_code ec;
    size_t n = impl_->socket.read_some(boost::asio::buffer(buf), ec);
    got.append(buf, n);
    if (ec || (!until.empty() && got.find(until) != std::string::npos)) return got;
  }
}

}  // namespace hr::testing
